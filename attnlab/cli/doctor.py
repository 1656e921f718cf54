"""`attnlab doctor`: what this machine runs on and what --dtype auto chose here, from what measurements;
--measure WIDTH measures now, --clear forgets the kept measurements (runtime/precision.py)."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass

import torch

from attnlab.cli.options import Answers, OnDevice
from attnlab.config import option
from attnlab.nn import pack_choice, row_kernels
from attnlab.runtime import precision
from attnlab.runtime.device import pick_device
from attnlab.runtime.timing import Measurement, Timing
from attnlab.version import __version__

NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
CPU = torch.device("cpu")


@dataclass
class DoctorOptions(Answers, OnDevice):
    measure: int | None = option(None, "measure --dtype auto's choice at this width now, for training and for "
                                 "decoding (a few seconds), and keep what can be trusted", metavar="WIDTH",
                                 at_least=1)  # fmt: skip
    clear: bool = option(False, "forget every kept measurement (dtype.json: --dtype auto's; kernels.json: "
                         "--quantize's float32-or-packed choice per shape; nothing else in the cache folder is "
                         "touched) and say what was removed")  # fmt: skip


def machine(device: torch.device) -> dict:
    """The device, PyTorch and its threads, the CPU and its bf16 instructions."""
    flags = precision.cpu_flags()
    cores = os.cpu_count()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"attnlab": __version__, "torch": torch.__version__, "threads": torch.get_num_threads(), "cores": cores,
            "device": str(device), "gpu": gpu, "cpu": precision.cpu_model(), "bf16_instructions":
            precision.native_bf16(flags), "amx": None if flags is None else "amx_bf16" in flags,
            "cache": str(precision.cache_path()), "row_operators": row_kernels.status()}  # fmt: skip


def kept() -> list[dict]:
    """Every entry of dtype.json, with whether it applies here (this CPU, torch and thread count)."""
    rows = []
    for k, value in precision.read_cache().items():
        m = precision.entry(value)
        if m is None:
            rows.append({"key": k, "old": True})  # a single ratio of an older attnlab: never read
            continue
        here = k == precision.key(CPU, value.get("use"), value.get("width"))
        rows.append({"key": k, "use": value.get("use"), "width": value.get("width"), "here": here,
                     "dtype": NAMES[precision.chosen(m)], "measured": value.get("measured"),
                     **m.to_json()})  # fmt: skip
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
    return (f"  {r['width']:>5}  {r['use']:<6}  {r['dtype']:<8}  {m.ratio:>9.2f}x  {timing(r['float32']):<22}"
            f"{timing(r['bfloat16']):<22}{r.get('measured') or 'now'}")  # fmt: skip


HEAD = f"  {'width':>5}  {'use':<6}  {'choice':<8}  {'bf16 speed':>10}  {'float32':<22}{'bfloat16':<22}measured"


BF16 = {True: "yes", False: "no (float32 without measuring)", None: "unknown"}


def about(info: dict) -> list[str]:
    """The machine, in five lines."""
    return [f"attnlab {info['attnlab']}, PyTorch {info['torch']}, {info['threads']} threads on {info['cores']} cores",
             f"device   {info['device']}" + (f" ({info['gpu']}: --dtype auto trains in bf16 where it has it and "
                                              "decodes in float32; the measurements below serve --device cpu)"
                                              if info["gpu"] else ""),
             f"CPU      {info['cpu']}; bf16 instructions: {BF16[info['bf16_instructions']]}" +
             (", AMX" if info["amx"] else ""),
             f"cache    {info['cache']}",
             f"decode   attnlab's one-row operators: {info['row_operators']}"]  # fmt: skip


def show(info: dict, rows: list[dict], cleared: list[str] | None, now: list[dict]) -> str:
    """What doctor prints: the machine, what --clear removed, what --measure found, what is kept."""
    lines = about(info)
    if cleared is not None:
        lines.append(f"cleared  {len(cleared)} measurement{'s' * (len(cleared) != 1)} removed" +
                     (":" if cleared else " (there were none)"))  # fmt: skip
        lines += [f"           {k}" for k in cleared]
    if now:
        lines += ["", "measured now:", HEAD]
        lines += [row(r) if "float32" in r else f"  {r['width']:>5}  {r['use']:<6}  {r['dtype']:<8}" for r in now]
        lines += [f"  {r['use']}: not kept, float32 ({r['note']})" for r in now if not r["kept"]]
    here = [r for r in rows if r.get("here")]
    lines += ["", "--dtype auto, kept for this CPU, PyTorch and thread count: bf16 where it ran at least "
              f"{precision.BF16_MARGIN:g}x", "the speed of float32 (timings: median ±spread, the interquartile range "
              "over the median, of n samples)"]  # fmt: skip
    lines += [HEAD, *map(row, here)] if here else ["  nothing yet: the first run at a width measures it (or --measure)"]
    others, old = sum(not r.get("here") and not r.get("old") for r in rows), sum(bool(r.get("old")) for r in rows)
    also = [f"{others} for other CPUs, PyTorch versions or thread counts"] * bool(others) + \
           [f"{old} single timing{'s' * (old != 1)} of an older attnlab (never read)"] * bool(old)  # fmt: skip
    if also:
        lines.append(f"  also kept: {' and '.join(also)}; --clear removes them")
    return "\n".join(lines)


def run_doctor(opts: DoctorOptions) -> int:
    device = pick_device(opts.device)
    cleared = precision.clear_cache() + pack_choice.clear_cache() if opts.clear else None
    now = measure_now(opts.measure) if opts.measure else []
    info, rows = machine(device), kept()
    if opts.json:
        print(json.dumps({**info, "cleared": cleared, "measured_now": now, "kept": rows}))
    else:
        print(show(info, rows, cleared, now))
    return 0
