"""Every repository path a docstring under attnlab/ or benchmarks/ names must exist.

A docstring that points at `decoding/engine.py` or `docs/cpu.md` is a promise to the reader;
when a file moves and the pointer does not, the reader is sent nowhere. This test reads the
module, class and function docstrings of every file under attnlab/ and benchmarks/ and checks each
name that looks like one of ours:
  - `attnlab/...`, `tests/...`, `benchmarks/...`, `docs/...`, `lessons/...`, `examples/...`
    with a file extension or a closing `/` (so prose like "attnlab/torch processes" is not one);
  - `some/folder/file.py`, relative to attnlab/ (`nn/attention.py`);
  - a bare `file.py`, which must be some file under attnlab/, or (in benchmarks/) a file beside it.
A glob (`tests/test_sae*.py`) must match at least one file. Another project's file, named after
its owner's possessive (llama.cpp's docs/gguf.md), is not ours and is skipped.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("attnlab/", "tests/", "benchmarks/", "docs/", "lessons/", "examples/")
NAME = re.compile(
    r"(?<![\w./-])"  # not the tail of a longer name or of a URL
    r"((?:[\w*-]+/)*[\w*-]+\.(?:py|md|toml|ipynb|cpp|c|h|js|css|html)"  # a file
    r"|(?:attnlab|tests|benchmarks|docs|lessons|examples)/(?:[\w.*-]+/)*)"  # or a folder ending in /
    r"(?![\w/-])"
)
FOREIGN = re.compile(r"\w's $")  # "llama.cpp's docs/gguf.md": a path in someone else's repository


def named_paths(doc: str) -> list[str]:
    """The repository paths one docstring names (see the module docstring for what counts)."""
    found = []
    for m in NAME.finditer(doc):
        name = m.group(1)
        if FOREIGN.search(doc[max(0, m.start() - 40) : m.start()]):
            continue
        if name.startswith(TOPS) or name.endswith(".py"):
            found.append(name)
    return found


def exists(name: str, home: Path | None = None) -> bool:
    """Whether a named path exists: from the root, from attnlab/, (bare .py) anywhere in attnlab/, or
    beside the file that names it (`home`, its folder: a benchmark names its neighbours bare)."""
    if name.startswith(TOPS):
        return any(ROOT.glob(name.rstrip("/")))
    if "/" in name:
        return any((ROOT / "attnlab").glob(name))
    return any((ROOT / "attnlab").rglob(name)) or (home is not None and any(home.glob(name)))


def docstrings(path: Path) -> list[tuple[str, str]]:
    """(where, docstring) for the module and each class and function in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((getattr(node, "name", "<module>"), doc))
    return out


def all_named(top: str = "attnlab") -> list[tuple[Path, str, str]]:
    """(file, where, path) for every path named in a docstring under the folder `top`."""
    return [
        (py, where, name)
        for py in sorted((ROOT / top).rglob("*.py"))
        for where, doc in docstrings(py)
        for name in named_paths(doc)
    ]


def test_every_path_a_docstring_names_exists():
    named = all_named("attnlab") + all_named("benchmarks")
    assert len(named) > 300  # the scan reads the docstrings it should (about 380 names today)
    assert any(py.parent.name == "benchmarks" for py, _, _ in named)
    stale = [f"{py.relative_to(ROOT)}:{where} names {name}" for py, where, name in named if not exists(name, py.parent)]
    assert stale == [], "stale paths in docstrings:\n" + "\n".join(stale)


def test_the_finder_tells_a_path_from_prose():
    doc = (
        "See nn/attention.py, docs/cpu.md and tests/test_sae*.py; the layout is llama.cpp's docs/gguf.md;\n"
        "other attnlab/torch processes; config.json; https://example.org/docs/x.md; the old training.py."
    )
    assert named_paths(doc) == ["nn/attention.py", "docs/cpu.md", "tests/test_sae*.py", "training.py"]
    assert [exists(n) for n in named_paths(doc)] == [True, True, True, False]
    assert exists("attnlab/nn/") and not exists("attnlab/no_such_folder/")
    assert exists("random_run.py", ROOT / "benchmarks") and not exists("random_run.py")
