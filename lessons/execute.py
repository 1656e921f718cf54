"""Run one lesson as a notebook: the percent-format .py opened by jupytext, executed by nbclient.

    python lessons/execute.py lessons/01_attention_from_scratch.py            # prints its time
    python lessons/execute.py lessons/[0-9]*.py --out build/lessons         # and writes the .ipynb files

The kernel starts in lessons/ (so `from checks.attention import ...` works) and is the Python that runs
this file. Each written notebook records, in its metadata under "attnlab", the SHA-256 of the lesson's
source: `is_current(ipynb, py)` tells a reader of build/lessons whether the notebook is out of date.

`settings` (the test suite's quick run) replace some of the values the lesson's first code cell sets,
by a cell of their own placed after it, shown in the notebook and recorded in its metadata: the same
cells run top to bottom, with fewer training steps. Such notebooks are not the lessons' own: the test
writes them to a temporary folder, never to build/lessons.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from jupyter_client import KernelManager
from nbclient import NotebookClient

LESSONS = Path(__file__).resolve().parent


def source_hash(path: Path) -> str:
    """SHA-256 of the lesson's text, as recorded in the executed notebook's metadata."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def with_settings(nb: nbformat.NotebookNode, settings: dict[str, int], name: str = "the lesson") -> None:
    """Insert, after the notebook's first code cell (the lesson's settings), a cell that sets each of
    `settings` (NAME: value) instead. A name that cell does not assign is an error, so that a renamed
    setting cannot leave a quick run silently at the lesson's own size."""
    first = next(i for i, cell in enumerate(nb.cells) if cell.cell_type == "code")
    unknown = [k for k in settings if not re.search(rf"^{re.escape(k)} *=", nb.cells[first].source, re.M)]
    if unknown:
        raise ValueError(f"{name}'s first code cell sets no {', '.join(unknown)}: nothing to replace")
    lines = [f"{k} = {v!r}" for k, v in settings.items()]
    cell = nbformat.v4.new_code_cell("# settings of a quick run, in place of the lesson's own\n" + "\n".join(lines))
    cell.metadata["tags"] = ["injected-settings"]
    nb.cells.insert(first + 1, cell)


def execute(
    path: Path,
    out: Path | None = None,
    timeout: int = 300,
    km: KernelManager | None = None,
    settings: dict[str, int] | None = None,
) -> tuple[nbformat.NotebookNode, float]:
    """Execute the lesson at `path` top to bottom; return the executed notebook and its seconds.

    A cell that raises stops the run with nbclient's CellExecutionError (it names the cell and the
    error). With `out`, the notebook is written to out/<lesson name>.ipynb.
    `timeout` is per cell, in seconds. `km`: a running kernel to execute in (execute_all), its
    namespace emptied first; without it, a kernel of the lesson's own. `settings`: values that replace
    the first cell's (with_settings)."""
    path = Path(path).resolve()
    nb = jupytext.read(path)
    if settings:
        with_settings(nb, settings, path.name)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(
        nb, km=km, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    if km is None:
        client.execute()
    else:
        with client.setup_kernel():
            client.kc.execute_interactive(_FRESH, timeout=timeout)
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
    seconds = time.perf_counter() - start
    nb.metadata["attnlab"] = {
        "lesson": path.name,
        "source_sha256": source_hash(path),
        "seconds": round(seconds, 1),
        **({"settings": dict(settings)} if settings else {}),
    }
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out / (path.stem + ".ipynb"))
    return nb, seconds


# Between lessons in one kernel: the previous lesson's names, checks modules and pictures gone, so a
# lesson cannot lean on another's state; what stays is what every lesson pays for again otherwise,
# the imports of torch, attnlab and torch._dynamo (about 11 s of a lesson's 15-50 s on 2 cores).
_FRESH = """
get_ipython().run_line_magic("reset", "-f")
import sys as _sys
_name = None
for _name in [n for n in _sys.modules if n == "checks" or n.startswith("checks.")]:
    del _sys.modules[_name]
import matplotlib.pyplot as _plt
_plt.close("all")
del _sys, _name, _plt
"""


def execute_all(
    paths: list[Path],
    out: Path | None = None,
    timeout: int = 300,
    settings: dict[str, dict[str, int]] | None = None,
    km: KernelManager | None = None,
) -> dict[Path, tuple[nbformat.NotebookNode, float] | Exception]:
    """Execute lessons one after another in one kernel (started in the first lesson's folder), each
    top to bottom on an emptied namespace: `make test` runs all of them this way. Each lesson's
    (notebook, seconds), or the error that stopped it (the next lesson still runs). Each lesson
    alone, in a kernel of its own, is `execute`. `settings`: {lesson name without .py: its settings}.
    `km`: a running kernel to use (and leave running), e.g. the test suite's one kernel; it must find
    lessons/ on its path (`from checks.attention import ...`)."""
    results: dict[Path, tuple[nbformat.NotebookNode, float] | Exception] = {}
    if not paths:
        return results
    own = km is None
    if own:
        km = KernelManager(kernel_name="python3")
        km.start_kernel(cwd=str(Path(paths[0]).resolve().parent))
    try:
        for path in paths:
            try:
                results[Path(path)] = execute(path, out, timeout, km, (settings or {}).get(Path(path).stem))
            except Exception as error:  # nbclient's CellExecutionError names the cell and the traceback
                results[Path(path)] = error
    finally:
        if own:
            km.shutdown_kernel(now=True)
    return results


def is_current(ipynb: Path, py: Path) -> bool:
    """Whether the executed notebook `ipynb` was made from the lesson `py` as it is now."""
    recorded = nbformat.read(ipynb, as_version=4).metadata.get("attnlab", {}).get("source_sha256")
    return recorded == source_hash(py)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute lessons as notebooks and print each one's time.")
    parser.add_argument("lessons", nargs="+", type=Path, help="lesson files, e.g. lessons/01_*.py")
    parser.add_argument("--out", type=Path, default=None, help="folder for the executed .ipynb (e.g. build/lessons)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per cell (default 300)")
    args = parser.parse_args(argv)
    failed = 0
    for lesson in args.lessons:
        try:
            _, seconds = execute(lesson, args.out, args.timeout)
        except Exception as error:  # nbclient's message names the cell and the traceback
            failed += 1
            print(f"{lesson}: FAILED\n{error}", file=sys.stderr)
            continue
        print(f"{lesson}: {seconds:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
