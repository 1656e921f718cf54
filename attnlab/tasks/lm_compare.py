"""What each part of the fast recipe buys: classic gpt-nano, gpt-nano-fast, and gpt-nano-fast with
one part taken out at a time, each trained for the same time budget on the same corpus.

compare_lm(out, budget="2m") -> one row per recipe: the held-out loss of the corpus (nats per
token; per character with the byte tokenizer), the loss on text none of them trained on (the
installed pip package's own source), steps made, tokens seen, and the difference to the full
fast recipe. Writes compare.json and the bar chart compare.png into `out`.

A time budget, not a step count, is the fair contest: a part that makes each step slower has to
buy more per step than it costs.

compare_lm(out, blocks=True) compares blocks instead of recipes: the classic block (gpt-nano), the
Llama block (llama-nano) and the mixture-of-experts block (moe-nano), all trained the classic way
(AdamW, cosine), with their total and active parameters and tokens per second beside the losses.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attnlab.data import DataConfig
from attnlab.engine.config import TrainConfig
from attnlab.engine.train import run
from attnlab.errors import AttnlabError
from attnlab.io import write_json
from attnlab.models.gpt import PRESET_TRAINING, PRESETS
from attnlab.runs.run import load
from attnlab.tasks import TASKS
from attnlab.tasks.lm_eval import evaluate
from attnlab.tasks.request import python_request
from attnlab.viz.ablation import plot_recipes

FAST = "gpt-nano-fast"
# The classic recipe: gpt-nano as the lectures build it, with the settings the demo used to train
# it (a sweep's best for two minutes on 2 cores: AdamW, lr 6e-3, batch 32, context 64).
CLASSIC_TRAINING = dict(batch_size=32, lr=6e-3, warmup_steps=50)

# Each part of the fast recipe -> the (model, training) settings that take it out again.
PARTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "rotary positions": ({"positions": "learned"}, {}),
    "QK-norm": ({"qk_norm": False}, {}),
    "ReLU^2": ({"activation": "gelu"}, {}),
    "untied head": ({"tie_weights": True}, {}),
    "zero-init": ({"zero_init": False}, {}),
    "logit soft-cap": ({"logit_softcap": None}, {}),
    "bigram embedding": ({"bigram_vocab": 0}, {}),
    "RMSNorm": ({"norm_kind": "layernorm"}, {}),
    "wsd schedule": ({}, {"schedule": "cosine"}),
    "Muon": ({}, {"optimizer": "adamw"}),
}
# The blocks `--blocks` compares: name -> preset, each trained with CLASSIC_TRAINING.
BLOCKS = {"classic block": "gpt-nano", "Llama block": "llama-nano", "MoE block": "moe-nano"}
EVAL_TOKENS = 200_000  # per corpus: enough for differences of 0.01 nats, seconds to compute


def recipes(parts: list[str] | None = None) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name -> (model config fields, training fields): classic, fast, and fast without each part."""
    fast_model, fast_train = asdict(PRESETS[FAST]), PRESET_TRAINING[FAST]
    out = {"gpt-nano": (asdict(PRESETS["gpt-nano"]), CLASSIC_TRAINING), FAST: (fast_model, fast_train)}
    for name in PARTS if parts is None else parts:
        if name not in PARTS:
            raise AttnlabError(f"unknown part {name!r}; choose from {', '.join(PARTS)}")
        model, train = PARTS[name]
        out[f"- {name}"] = ({**fast_model, **model}, {**fast_train, **train})
    return out


def block_recipes() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name -> (model config fields, training fields) of each block BLOCKS names."""
    return {f"{name} ({preset})": (asdict(PRESETS[preset]), CLASSIC_TRAINING) for name, preset in BLOCKS.items()}


def held_out_corpus() -> Path | None:
    """The installed pip package's source: Python text none of the runs trained on (they read the
    standard library). None where pip is not installed. Found through its installed metadata, not
    importlib.util.find_spec("pip"): setuptools' distutils finder answers a search for "pip" by
    switching itself off for the rest of the process, and a later `import setuptools` (as
    torch.compile's C++ builder does) then fails on the standard library's distutils."""
    try:
        folder = Path(str(importlib.metadata.distribution("pip").locate_file("pip")))
    except importlib.metadata.PackageNotFoundError:
        return None
    return folder if (folder / "__init__.py").is_file() else None


def compare_lm(
    out: Path,
    budget: str = "2m",
    data: str = "stdlib",
    parts: list[str] | None = None,
    force: bool = False,
    progress: bool = True,
    blocks: bool = False,
) -> list[dict]:
    """Train every recipe (blocks: every block) for `budget` on `data` into out/<recipe>; rows as
    the module says."""

    try:
        TrainConfig(time_budget=budget)  # a bad budget fails now, not after the first run
    except ValueError as e:
        raise AttnlabError(str(e)) from None
    other = held_out_corpus()
    rows = []
    for name, (model, train) in (block_recipes() if blocks else recipes(parts)).items():
        if progress:
            print(f"== {name}")
        folder = out / name.split(" (")[0].replace("- ", "no-").replace(" ", "-").replace("^", "")
        cfg = TrainConfig(**{**train, "time_budget": budget, "max_steps": 10**9})  # the budget ends it
        req = python_request(TASKS["lm"], folder, "gpt", model, cfg, DataConfig(data), force=force, progress=progress)
        result = run(TASKS["lm"], req)

        trained = load(folder)
        row = {"recipe": name, "loss": evaluate(trained, data, max_tokens=EVAL_TOKENS, progress=False)["loss"]}
        if other is not None:
            row["other_loss"] = evaluate(trained, str(other), split="all", max_tokens=EVAL_TOKENS, progress=False)[
                "loss"
            ]
        block = cfg.block_size or model["context"]
        tokens = result["step"] * cfg.batch_size * block
        row.update(
            steps=result["step"],
            tokens=tokens,
            train_seconds=result["train_seconds"],
            parameters=result["parameters"],
            active_parameters=trained.model.num_params(active=True),
            tokens_per_s=tokens / max(result["train_seconds"], 1e-9),
        )
        rows.append(row)
    # The row the others are measured from: the full fast recipe, or (blocks) the classic block.
    fast = rows[0] if blocks and rows else next((r for r in rows if r["recipe"] == FAST), None)
    for r in rows:
        r["vs_fast"] = None if fast is None else r["loss"] - fast["loss"]
    write_json(
        out / "compare.json",
        {
            "task": "lm",
            "budget": budget,
            "data": data,
            "other": str(other),
            "compared": "blocks" if blocks else "recipes",
            "rows": rows,
        },
    )

    plot_recipes(rows, out / "compare.png", f"{data}, {budget} of training each: held-out loss (lower is better)")
    return rows


def format_lm_table(rows: list[dict], blocks: bool = False) -> str:
    """The table docs/gpt.md shows: one line per recipe (blocks: per block, with its parameters,
    total and active, and tokens/s; the difference is then to the first, classic, block)."""
    other = "other_loss" in rows[0] if rows else False
    width = 31 if blocks else 22
    head = f"{'block' if blocks else 'recipe':<{width}} {'val loss':>9} {'vs first' if blocks else 'vs fast':>8} "
    head += f"{'pip loss':>9} " if other else ""
    head += f"{'params':>10} {'active':>10} {'tok/s':>7} " if blocks else ""
    lines = [head + f"{'steps':>7} {'tokens':>11} {'train time':>10}"]
    for r in rows:
        vs = "" if r["vs_fast"] is None else f"{r['vs_fast']:+.4f}"
        cells = f"{r['recipe']:<{width}} {r['loss']:>9.4f} {vs:>8} " + (f"{r['other_loss']:>9.4f} " if other else "")
        if blocks:
            cells += f"{r['parameters']:>10,} {r['active_parameters']:>10,} {r['tokens_per_s']:>7,.0f} "
        lines.append(cells + f"{r['steps']:>7,} {r['tokens']:>11,} {r['train_seconds']:>9.0f}s")
    return "\n".join(lines)
