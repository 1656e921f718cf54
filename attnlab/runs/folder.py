"""Run folders: what makes a folder an attnlab run, and the checks before one is read or replaced.

A run folder holds
    attnlab.json              the run marker, written first, listing every name attnlab writes
                              here (runs/marker.py): --force removes those and nothing else
    config.json               family, model, training and data settings (JSON)
    model.safetensors         the weights
    tokenizer.json            the tokenizer
    train_state.safetensors   what resuming needs (runs/checkpoint.py)
    metrics.jsonl, loss.png   what training measured
Anything else in a folder is the user's: it is never removed, and a folder that is not a run is
never written into.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.io import read_json, read_metrics
from attnlab.runs.marker import read_marker, remove_owned, write_marker

CONFIG, WEIGHTS, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
STATE = "train_state.safetensors"
METRICS = "metrics.jsonl"  # a row a logged step: the losses every curve, listing and card reads
SECTIONS = ("model", "train", "data")


def read_run_config(run: Path) -> dict[str, Any]:
    """config.json of a run, checked to have its family and its three settings tables."""
    config = read_json(run / CONFIG)
    if not isinstance(config, dict) or not all(isinstance(config.get(k), dict) for k in SECTIONS):
        raise AttnlabError(f"{run / CONFIG} is corrupt: it needs model, train and data tables")
    config.setdefault("family", "gpt")
    return config


def started_folder(path: str | Path, restart: str) -> Path:
    """A folder that exists and is past its first checkpoint (else one line ending in `restart`)."""
    p = Path(path)
    if not p.is_dir():
        raise AttnlabError(f"run directory not found: {p}")
    if unstarted(p):
        raise AttnlabError(f"{p} has no checkpoint yet (its start did not finish): {restart}")
    return p


def check_run_dir(path: str | Path) -> Path:
    """A run that loads: its config and weights are there."""
    p = started_folder(path, "start it again with the command that made it")
    for name in (CONFIG, WEIGHTS):
        if not (p / name).is_file():
            raise AttnlabError(f"{p} is not a complete run: {name} is missing")
    return p


def check_resumable(path: str | Path) -> Path:
    """A run that --resume continues: its config and training state are there (the weights are in
    the state; a kill between writing the two leaves a run that still resumes)."""
    p = started_folder(path, "run the same command without --resume to start it again")
    if not (p / CONFIG).is_file():
        raise AttnlabError(f"{p} is not a complete run: {CONFIG} is missing")
    if not is_run(p):
        raise AttnlabError(f"{p} is not an attnlab run ({describe(p)}): nothing to resume")
    if not (p / STATE).is_file():
        raise AttnlabError(
            f"{p} has no training state ({STATE}), so it cannot be resumed; start a new run from "
            f"its weights with --init {p}"
        )
    return p


def is_marked(d: Path) -> bool:
    """The folder carries attnlab's run marker."""
    return read_marker(d) is not None


def is_run(d: Path) -> bool:
    """An attnlab run folder: marked, or made before markers: a config.json with attnlab's tables and
    the weights or training state beside it (a config.json alone with model/train/data keys may be
    anybody's)."""
    if not d.is_dir():
        return False
    if is_marked(d):
        return True
    try:
        read_run_config(d)
    except AttnlabError:
        return False
    return (d / WEIGHTS).is_file() or (d / STATE).is_file()


def has_weights(d: Path) -> bool:
    """An attnlab run with its weights: what a cache of converted models hands out (io.build_folder puts
    a folder there only whole; this also refuses one whose weights were removed by hand)."""
    return is_run(d) and (d / WEIGHTS).is_file()


def unstarted(d: Path) -> bool:
    """A run attnlab began and never checkpointed (killed or failed in its first seconds)."""
    return is_marked(d) and not (d / WEIGHTS).exists() and not (d / STATE).exists()


def check_dir(out: Path, resume: bool, force: bool) -> None:
    """Before a run starts: --resume needs a run in `out`; a new run needs `out` free (or holding
    a start of ours that never checkpointed), or --force and an attnlab run there. Anything else
    in `out` is the user's and is never replaced."""
    if resume:
        check_resumable(out)
        for tmp in out.glob(".*.tmp-*"):  # left by a kill in the middle of a save
            tmp.unlink(missing_ok=True)
        return
    if not out.exists() or (out.is_dir() and not any(out.iterdir())) or (out.is_dir() and unstarted(out)):
        return
    if not is_run(out):
        raise AttnlabError(
            f"{out} exists and is not an attnlab run ({describe(out)}): refusing to "
            f"{'replace' if force else 'write into'} it; choose another --out"
        )
    if not force:
        raise AttnlabError(f"run directory {out} already exists: use --resume to continue it or --force to replace it")


def check_new_run(out: Path, force: bool, sources: dict[Path, str]) -> None:
    """Before a command writes a new run from others (convert, merge): refuse an `out` that would
    replace one of `sources` ({path: what it is}), an existing `out` unless force, and never replace
    what is not an attnlab run (checked by its config.json's sections: a HuggingFace directory has a
    config.json too)."""
    for src, what in sources.items():
        if out.resolve() == src.resolve() or out.resolve() in src.resolve().parents:
            raise AttnlabError(f"--out {out} would replace {what}: choose another directory")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not force:
        raise AttnlabError(f"run directory {out} already exists: choose another --out, or --force to replace it")
    if not is_run(out):
        raise AttnlabError(
            f"{out} is not an attnlab run ({describe(out)}): refusing to replace it; choose another --out"
        )


def describe(p: Path) -> str:
    """What a folder holds, in a few words: "it holds config.json, src and 3 more"."""
    if not p.is_dir():
        return "it is a file"
    names = sorted(x.name for x in p.iterdir())
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"it holds {', '.join(names[:3])}{more}"


def fresh_dir(out: Path) -> None:
    """Called once the new run is ready to be written (after check_dir said `out` may be replaced),
    so a failed start never costs an old run. Of a run replaced with --force, only what attnlab wrote
    goes; the user's files stay, and are named. The marker comes first."""
    if out.is_dir():
        kept = remove_owned(out)
        if kept:
            more = f" and {len(kept) - 5} more" if len(kept) > 5 else ""
            warnings.warn(f"{out}: kept {', '.join(kept[:5])}{more} (not written by attnlab)", stacklevel=2)
    elif out.exists():
        out.unlink()
    out.mkdir(parents=True, exist_ok=True)
    write_marker(out)


def discard_unstarted(out: Path) -> None:
    """After a failed start: remove what it wrote, if it never reached its first checkpoint (and the
    folder too, unless something of the user's is in it)."""
    if out.is_dir() and unstarted(out) and not remove_owned(out):
        out.rmdir()


def losses(path: Path, max_rows: int | None = None) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step, train loss) and (step, validation loss) pairs of a run's metrics.jsonl (none if missing);
    max_rows thins the training rows as read_metrics does (every validation row is kept)."""
    rows = [r for r in read_metrics(Path(path) / METRICS, max_rows) if "step" in r]
    train = [(r["step"], float(r["loss"])) for r in rows if isinstance(r.get("loss"), (int, float))]
    val = [(r["step"], float(r["val_loss"])) for r in rows if isinstance(r.get("val_loss"), (int, float))]
    return train, val
