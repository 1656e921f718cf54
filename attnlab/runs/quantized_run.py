"""`attnlab quantize RUN --to int8 --out DIR`: a run whose language model is stored quantized for
inference, a folder every command loads (runs/quantized.py says which layers and how). Its summary
gives the weights files' sizes on disk before and after (bytes_before, bytes_after): the layers left
float32, the embeddings and the scales are in them too.

    quantize_run("runs/demo", "int8", "runs/demo-int8")
      -> the run loaded in float32, its decode-step linears packed (measured per shape here)
      -> config.json as the run's, with a "quantized" section; model.safetensors with each packed
         layer's codes and scales and the float weights of the rest; tokenizer and chat template copied
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from attnlab.io import write_json
from attnlab.runs.adapted import CHAT_TEMPLATE
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS, check_new_run, check_run_dir, fresh_dir
from attnlab.runs.marker import record
from attnlab.runs.quantized import QUANTIZED, describe
from attnlab.runs.run import load
from attnlab.runs.weights import tied_names, write_weights


def quantize_run(
    run: str | Path, kind: str, out: str | Path, force: bool = False, every_layer: bool = False
) -> dict[str, Any]:
    """Write run `run` with its language model quantized to `kind` as a new run `out` (every_layer:
    also the layers float32 ran faster here); returns a summary. An existing `out` is replaced only
    with force, and only if it is an attnlab run."""
    src, out = check_run_dir(run), Path(out)
    check_new_run(out, force, {src: "the run being quantized"})
    loaded = load(src, device="cpu", quantize=kind, every_layer=every_layer)
    report = loaded.quantization
    tied = tied_names(loaded.model)
    weights = {k: v.detach().contiguous() for k, v in loaded.model.state_dict().items() if k not in tied}
    copies = {name: src / name for name in (TOKENIZER, CHAT_TEMPLATE) if (src / name).is_file()}
    fresh_dir(out)  # only now: a failure above never costs an old run
    record(out, CONFIG, WEIGHTS, *copies)
    write_json(out / CONFIG, {**loaded.config, QUANTIZED: report.section(str(src))})
    write_weights(weights, out / WEIGHTS, {"step": str(loaded.step)})
    for name, path in copies.items():
        shutil.copyfile(path, out / name)
    before, after = (src / WEIGHTS).stat().st_size, (out / WEIGHTS).stat().st_size  # the files, as on disk
    return {
        "run": str(out),
        "kind": kind,
        "summary": describe(report),
        "packed": report.layers,
        "kept_float32": report.kept,
        "bytes_before": before,
        "bytes_after": after,
        "megabytes_before": round(before / 1e6, 3),
        "megabytes_after": round(after / 1e6, 3),
    }
