"""`attnlab doctor`: what this machine runs on and what --dtype auto chose here, from what measurements;
--measure WIDTH measures now, --clear forgets the kept measurements (runtime/precision.py). It shows
the cache folder too: its size, and the models converted once into it (a HuggingFace or PEFT folder
given to --init), which --clear-cache removes."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from attnlab.cli import help_cache
from attnlab.cli.options import DoctorOptions
from attnlab.io import BUILDING, cache_root, leftover, mb, remove_path, tree_size
from attnlab.quant import pack_choice, row_kernels
from attnlab.runtime import precision
from attnlab.runtime.device import pick_device
from attnlab.runtime.threads import sharing_line
from attnlab.runtime.timing import Measurement, Timing
from attnlab.version import __version__

NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
CPU = torch.device("cpu")
# The cache's folders of converted models (interop/convert.py's `converted`, interop/adapter_runs.py's
# `peft_run`), by what they were converted from
CONVERTED = {"converted": "HuggingFace", "peft": "PEFT"}


def machine(device: torch.device) -> dict:
    """The device, PyTorch and its threads, the CPU and its bf16 instructions."""
    flags = precision.cpu_flags()
    cores = os.cpu_count()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "attnlab": __version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cores": cores,
        "device": str(device),
        "gpu": gpu,
        "cpu": precision.cpu_identity(),
        "bf16_instructions": precision.native_bf16(flags),
        "amx": None if flags is None else "amx_bf16" in flags,
        "cache": str(precision.cache_path()),
        "row_operators": row_kernels.status(),
        "sharing": sharing_line(),
    }


def cache_folder() -> dict:
    """The cache folder: where, its size, and the converted models in it (by sub-folder)."""
    root = cache_root()
    return {
        "path": str(root),
        "bytes": tree_size(root),
        "models": {name: len(models(root / name)) for name in CONVERTED},
        "models_bytes": sum(tree_size(root / name) for name in CONVERTED),
    }


def models(folder: Path) -> list[Path]:
    """The converted models of a cache sub-folder (not the temporary folder of a conversion under way)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not BUILDING.match(p.name))


def clear_converted() -> list[dict]:
    """Remove the converted models, and what killed conversions left; [{path, bytes}] of what went.
    A conversion under way (its temporary folder's process alive) is left to finish. A link is
    removed as a link: nothing outside the cache folder is touched."""
    root, removed = cache_root(), []
    for name in CONVERTED:
        folder = root / name
        for p in _removable(folder):
            removed.append({"path": str(p.relative_to(root)), "bytes": tree_size(p)})
            remove_path(p)
    return removed


def _removable(folder: Path) -> list[Path]:
    """What --clear-cache removes of one sub-folder: every entry but a conversion under way."""
    if folder.is_symlink():  # the link goes, what it points to stays
        return [folder]
    if not folder.is_dir():
        return []
    return [p for p in sorted(folder.iterdir()) if not BUILDING.match(p.name) or leftover(p)]


def cache_line(cache: dict) -> str:
    """The cache folder, its size and its converted models, in one line."""
    counts = [f"{CONVERTED[name]}: {n}" for name, n in cache["models"].items() if n]
    total = sum(cache["models"].values())
    held = (
        (
            f"{total} converted model{'s' * (total != 1)}, {mb(cache['models_bytes'])} ({', '.join(counts)}; "
            "--clear-cache removes them)"
        )
        if total
        else "no converted models"
    )
    return f"cache    {cache['path']}, {mb(cache['bytes'])}: {held}"


def cleared_lines(removed: list[dict]) -> list[str]:
    """What --clear-cache removed: a count and size, then each path inside the cache folder."""
    size = mb(sum(r["bytes"] for r in removed))
    left = sum(bool(BUILDING.match(Path(r["path"]).name)) for r in removed)  # temporary folders of killed ones
    n = len(removed) - left
    head = f"cleared  {n} converted model{'s' * (n != 1)}" + (f" and {left} left by killed conversions" if left else "")
    return [
        f"{head} removed from the cache" + (f" ({size}):" if removed else " (there were none)"),
        *[f"           {r['path']}" for r in removed],
    ]


def kept() -> list[dict]:
    """Every entry of dtype.json, with whether it applies here (this CPU, torch and thread count)."""
    rows = []
    for k, value in precision.read_cache().items():
        m = precision.entry(value)
        if m is None:
            rows.append({"key": k, "old": True})  # a single ratio of an older attnlab: never read
            continue
        here = k == precision.key(CPU, value.get("use"), value.get("width"))
        rows.append(
            {
                "key": k,
                "use": value.get("use"),
                "width": value.get("width"),
                "here": here,
                "dtype": NAMES[precision.chosen(m)],
                "measured": value.get("measured"),
                **m.to_json(),
            }
        )
    return sorted(rows, key=lambda r: (r.get("old", False), not r.get("here"), r.get("width") or 0, r.get("use") or ""))


def measure_now(width: int) -> list[dict]:
    """Both uses at `width`, measured afresh; what was chosen and whether it was kept."""
    rows = []
    with warnings.catch_warnings():  # the table says why an answer was not kept: no second line for it
        warnings.simplefilter("ignore")
        for use in precision.USES:
            d = precision.decide(CPU, use, width, fresh=True)
            m = d.measurement.to_json() if d.measurement else {}
            rows.append({"use": use, "width": width, "dtype": NAMES[d.dtype], "note": d.note, "kept": d.kept, **m})
    return rows


def timing(t: dict) -> str:
    s = Timing(**t)
    return f"{s.median * 1e3:.3g} ms ±{s.spread:.0%} n={s.samples}"


def row(r: dict) -> str:
    m = Measurement.from_json(r)
    return (
        f"  {r['width']:>5}  {r['use']:<6}  {r['dtype']:<8}  {m.ratio:>9.2f}x  {timing(r['float32']):<22}"
        f"{timing(r['bfloat16']):<22}{r.get('measured') or 'now'}"
    )


HEAD = f"  {'width':>5}  {'use':<6}  {'choice':<8}  {'bf16 speed':>10}  {'float32':<22}{'bfloat16':<22}measured"


BF16 = {True: "yes", False: "no (float32 without measuring)", None: "unknown"}


def about(info: dict) -> list[str]:
    """The machine, the cache, and whether other attnlab/torch processes are busy here, in six lines."""
    return [
        f"attnlab {info['attnlab']}, PyTorch {info['torch']}, {info['threads']} threads on {info['cores']} cores",
        f"device   {info['device']}"
        + (
            f" ({info['gpu']}: --dtype auto trains in bf16 where it has it and "
            "decodes in float32; the measurements below serve --device cpu)"
            if info["gpu"]
            else ""
        ),
        f"CPU      {info['cpu']}; bf16 instructions: {BF16[info['bf16_instructions']]}"
        + (", AMX" if info["amx"] else ""),
        cache_line(info["cache_folder"]),
        f"decode   attnlab's one-row operators: {info['row_operators']}",
        f"sharing  {info['sharing'] or 'no other attnlab or torch process is busy here'}",
    ]


def show(info: dict, rows: list[dict], cleared: list[str] | None, now: list[dict]) -> str:
    """What doctor prints: the machine, what --clear removed, what --measure found, what is kept."""
    lines = about(info)
    if info["cache_cleared"] is not None:
        lines += cleared_lines(info["cache_cleared"])
    if cleared is not None:
        lines.append(
            f"cleared  {len(cleared)} measurement{'s' * (len(cleared) != 1)} removed"
            + (":" if cleared else " (there were none)")
        )
        lines += [f"           {k}" for k in cleared]
    if now:
        lines += ["", "measured now:", HEAD]
        lines += [row(r) if "float32" in r else f"  {r['width']:>5}  {r['use']:<6}  {r['dtype']:<8}" for r in now]
        lines += [f"  {r['use']}: not kept, float32 ({r['note']})" for r in now if not r["kept"]]
    here = [r for r in rows if r.get("here")]
    lines += [
        "",
        "--dtype auto, kept for this CPU, PyTorch and thread count: bf16 where it ran at least "
        f"{precision.BF16_MARGIN:g}x",
        "the speed of float32 (timings: median ±spread, the interquartile range over the median, of n samples)",
    ]
    lines += [HEAD, *map(row, here)] if here else ["  nothing yet: the first run at a width measures it (or --measure)"]
    others, old = sum(not r.get("here") and not r.get("old") for r in rows), sum(bool(r.get("old")) for r in rows)
    also = [f"{others} for other CPUs, PyTorch versions or thread counts"] * bool(others) + [
        f"{old} single timing{'s' * (old != 1)} of an older attnlab (never read)"
    ] * bool(old)
    if also:
        lines.append(f"  also kept: {' and '.join(also)}; --clear removes them")
    return "\n".join(lines)


def run_doctor(opts: DoctorOptions) -> int:
    device = pick_device(opts.device)
    cleared = precision.clear_cache() + pack_choice.clear_cache() + help_cache.clear_cache() if opts.clear else None
    removed = clear_converted() if opts.clear_cache else None
    now = measure_now(opts.measure) if opts.measure else []
    info, rows = {**machine(device), "cache_folder": cache_folder(), "cache_cleared": removed}, kept()
    if opts.json:
        print(json.dumps({**info, "cleared": cleared, "measured_now": now, "kept": rows}))
    else:
        print(show(info, rows, cleared, now))
    return 0
