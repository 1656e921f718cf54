"""The help of a command whose parser needs torch to be built, kept as text once it is made, so that
asking again imports nothing: `attnlab train TASK --help` (a task's flags come from its Task object and
its models' config classes, which live beside torch code: building them imports torch, printing the
kept text does not; docs/cpu.md, "How fast a command starts").

The text is kept under the cache folder (ATTNLAB_CACHE, default ~/.cache/attnlab) in help/, one file
per command, named by a key over everything the text is made from: attnlab's version, the size and
modification time of every file of the attnlab package (an edit in an editable install makes it
stale), the Python version and the terminal's width (argparse wraps to it). A kept text of another key
is never printed; `attnlab doctor --clear` removes them all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from attnlab.io import cache_root
from attnlab.version import __version__

HELP_FLAGS = ("-h", "--help")
FOLDER = "help"


def asks_help(args: list[str]) -> bool:
    """argparse's reading: a -h/--help before any `--` asks for the help."""
    before = args[: args.index("--")] if "--" in args else args
    return any(a in HELP_FLAGS for a in before)


def source_stamp(root: Path | None = None) -> str:
    """A digest of the size and modification time of every file of the package under `root`."""
    root = root or Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                st = os.stat(path)
                h.update(f"{os.path.relpath(path, root)} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def help_path(prog: str) -> Path:
    width = shutil.get_terminal_size().columns
    key = f"{prog}\n{__version__}\n{sys.version}\n{width}\n{source_stamp()}"
    name = f"{prog.replace(' ', '-')}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.txt"
    return cache_root() / FOLDER / name


def kept_help(prog: str) -> str | None:
    """The kept help text of `prog` made from the code as it is now, or None."""
    try:
        return help_path(prog).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def keep_help(prog: str, text: str) -> None:
    """Keep `text` as prog's help, whole or not at all (written beside, then renamed into place); a
    cache folder that cannot be written costs the next help its torch import, nothing else."""
    path = help_path(prog)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.{os.getpid()}")
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    except OSError:
        pass


def clear_cache() -> list[str]:
    """Remove every kept help text; their names."""
    folder = cache_root() / FOLDER
    removed = sorted(p.name for p in folder.glob("*.txt")) if folder.is_dir() else []
    shutil.rmtree(folder, ignore_errors=True)
    return removed
