# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv if needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of PyTorch this project is tested with; override e.g. TORCH="torch" for the newest.
TORCH  ?= torch==2.13.0

.PHONY: demo test test-slow lint docs install clean

# Python keeps each module it compiles as bytecode beside it (__pycache__, ignored by git), so the next
# process loads it instead of compiling it again. An environment that sets PYTHONDONTWRITEBYTECODE turns
# that off, and then every process compiles torch anew: `import attnlab` took 14.7 s that way and 4.8 s
# with the cache on the 2-core Xeon, in each of the suite's dozens of processes (pytest's workers, the
# command-line tests, torchrun's ranks, the notebook kernels). These commands keep the cache on.
unexport PYTHONDONTWRITEBYTECODE

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# One pip call for torch and attnlab (one resolver run, not two); no check for a newer pip; no
# byte-compiling of every installed file (torch has thousands): Python compiles what it imports.
PIP    := $(BIN)/python -m pip install -q --disable-pip-version-check --no-compile

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) "$(TORCH)" -e .
	touch $@

# The test set-up in one pip call too (torch, attnlab and the dev extras resolved together).
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(PIP) "$(TORCH)" -e ".[dev]"
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/attnlab demo

# Two worker processes of one thread each (pytest-xdist; tests/conftest.py): the suite's models are tiny,
# so two processes use two cores better than one process with two threads. A module stays in one worker.
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# The learning-quality checks (the demo's loss, the ViT on digits): about 4.5 minutes on 2 cores.
test-slow: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m slow

# The documentation site, strictly (a warning fails it), into site/: open site/index.html, no server needed.
# The command reference and the lessons are generated into build/docs/ by docs/hooks.py (lessons executed
# only where build/lessons holds no notebook of their current source).
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site  # (the variable: no banner about Material's future)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) runs site build/docs
