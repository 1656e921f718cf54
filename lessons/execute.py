"""Run one lesson as a notebook: the percent-format .py opened by jupytext, executed by nbclient.

    python lessons/execute.py lessons/01_attention_from_scratch.py            # prints its time
    python lessons/execute.py lessons/0*.py --out build/lessons              # and writes the .ipynb files

The kernel starts in lessons/ (so `from checks.attention import ...` works) and is the Python that runs
this file. Each written notebook records, in its metadata under "attnlab", the SHA-256 of the lesson's
source: `is_current(ipynb, py)` tells a reader of build/lessons whether the notebook is out of date.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

LESSONS = Path(__file__).resolve().parent


def source_hash(path: Path) -> str:
    """SHA-256 of the lesson's text, as recorded in the executed notebook's metadata."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def execute(path: Path, out: Path | None = None, timeout: int = 300) -> tuple[nbformat.NotebookNode, float]:
    """Execute the lesson at `path` top to bottom; return the executed notebook and its seconds.

    A cell that raises stops the run with nbclient's CellExecutionError (it names the cell and the
    error). With `out`, the notebook is written to out/<lesson name>.ipynb.
    `timeout` is per cell, in seconds."""
    path = Path(path).resolve()
    nb = jupytext.read(path)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    nb.metadata["attnlab"] = {
        "lesson": path.name,
        "source_sha256": source_hash(path),
        "seconds": round(seconds, 1),
    }
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out / (path.stem + ".ipynb"))
    return nb, seconds


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
