"""Files a command writes for the user (a picture, a page, numbers, exported vectors): checked before
any work, so that nothing of the user's is replaced without --force, nothing is written inside a run
folder (a run holds only what attnlab writes there, and --force on it removes exactly that), and the
file is in the format its suffix names.

A command declares such a flag with `option(..., writes=(".png", ".svg", ".json"))`: `check_outputs`
finds every one of them on the command's options and checks the value given.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.runs.folder import is_run


def run_holding(path: Path) -> Path | None:
    """The run folder `path` lies inside (at any depth), if any."""
    return next((d for d in path.absolute().parents if is_run(d)), None)


def either(suffixes: tuple[str, ...]) -> str:
    """(".png", ".svg", ".json") -> ".png, .svg or .json"."""
    return ", ".join(suffixes[:-1]) + " or " + suffixes[-1] if len(suffixes) > 1 else suffixes[0]


def check_output(path: str | Path, force: bool, suffixes: tuple[str, ...] = (), flag: str = "--out") -> Path:
    """`path` as a file this command may write: a suffix it can write, outside every run folder, and
    new (or replaced with force, and then only a file)."""
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        named = f"'{p.suffix}'" if p.suffix else "no suffix"
        raise AttnlabError(f"{flag} {p}: the suffix picks the format, {either(suffixes)}; {named} is none of them")
    run = run_holding(p)
    if run is not None:
        raise AttnlabError(
            f"{flag} {p} is inside the run folder {run}, which holds only what attnlab writes there: "
            "choose a path outside it"
        )
    if p.is_dir():
        raise AttnlabError(f"{flag} {p} is a folder: give a file name")
    if p.exists() and not force:
        raise AttnlabError(f"{flag} {p} exists: choose another name, or add --force to replace it")
    return p


def check_output_folder(folder: str | Path, force: bool, names: tuple[str, ...], what: str = "") -> Path:
    """`folder` as one this command writes the files `names` to (an SAE, a circuit's graph): outside
    every run folder, not a file, and not holding any of them yet (unless force). what: how the
    refusal names what it holds (default: the file's name)."""
    out = Path(folder)
    if run_holding(out / "x") is not None:
        raise AttnlabError(
            f"--out {out} is inside a run folder, which holds only what attnlab writes there: "
            "choose a folder outside it"
        )
    if out.exists() and not out.is_dir():
        raise AttnlabError(f"--out {out} is a file: give a folder")
    for name in names:
        if (out / name).exists() and not force:
            held = what or name
            raise AttnlabError(f"--out {out} already holds {held}: choose another folder, or add --force to replace it")
    return out


def output_flags(options: Any) -> list[tuple[str, tuple[str, ...]]]:
    """(field name, suffixes) of every option that names a file the command writes."""
    return [(f.name, tuple(f.metadata["writes"])) for f in dataclasses.fields(options) if "writes" in f.metadata]


def check_outputs(options: Any) -> None:
    """check_output for every file flag given on a command's options (a dataclass with `force`), then
    the folders they go in made, as a user who names pics/attention.png expects."""
    force = getattr(options, "force", False)
    paths = [
        check_output(value, force, suffixes, "--" + name.replace("_", "-"))
        for name, suffixes in output_flags(options)
        if (value := getattr(options, name))
    ]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
