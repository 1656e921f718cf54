"""LoRA runs and PEFT adapter folders, both ways (the tensors' layout is interop/peft.py's).

export_peft("runs/sft", "adapter")    `attnlab export RUN --to peft DIR`: adapter_config.json and
    adapter_model.safetensors; base_model_name_or_path names the HuggingFace folder the base run
    was converted from, else the base run itself (PEFT loads only the former: the base must
    then be exported with `attnlab export BASE --to hf`)
peft_run("adapter")                   a PEFT folder as a LoRA run (kind sft) over the base its
    base_model_name_or_path names (a local HuggingFace folder or attnlab run), written once into
    the cache: registered in runs.adapted.READERS, so `--init` and a run's base take one
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from attnlab.config import from_dict
from attnlab.data.chat import hf_template
from attnlab.errors import AttnlabError
from attnlab.interop.convert import is_hf_dir
from attnlab.interop.peft import CONFIG as PEFT_CONFIG
from attnlab.interop.peft import layout_of, read_peft, write_peft
from attnlab.interop.peft_config import read_peft_config
from attnlab.io import build_folder, cache_root, read_safetensors, write_json
from attnlab.models.gpt import GPTConfig
from attnlab.nn.lora import LoRAConfig, load_lora_state
from attnlab.runs.adapted import CHAT_TEMPLATE, READERS, adapter_of, as_run, build_adapted
from attnlab.runs.converters import as_records
from attnlab.runs.folder import (
    CONFIG,
    TOKENIZER,
    WEIGHTS,
    check_run_dir,
    describe,
    fresh_dir,
    has_weights,
    read_run_config,
)
from attnlab.runs.kind import kind_of
from attnlab.runs.marker import record
from attnlab.runs.weights import write_weights


def _gpt_config(config: dict[str, Any], what: str) -> GPTConfig:
    """The GPT of a run's config.json; PEFT's layouts are GPT-2's and a Llama's."""
    if not kind_of(config).generates:  # a language model's GPT: what GPT-2's and a Llama's layouts map
        raise AttnlabError(
            f"{what} is {kind_of(config).noun} run: PEFT adapters are mapped for GPT language "
            "models (as GPT-2 or a Llama)"
        )
    return from_dict(GPTConfig, config["model"], where="model config")


def peft_base(base: str) -> tuple[str, bool]:
    """base_model_name_or_path for a run's base, and whether PEFT loads it as it is: the HuggingFace
    folder itself, or the one the base run was converted from; else the attnlab run."""
    if is_hf_dir(Path(base)):
        return base, True
    source = read_run_config(as_run(base)).get("source")
    hf = source.get("hf") if isinstance(source, dict) else None
    return (hf, True) if isinstance(hf, str) and is_hf_dir(Path(hf)) else (base, False)


def _check_target(out: Path, force: bool) -> None:
    """A new folder, or with force a PEFT adapter folder (its two files are replaced, nothing else)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not force:
        raise AttnlabError(f"{out} already exists: choose another directory, or --force to replace it")
    if not (out / PEFT_CONFIG).is_file():
        raise AttnlabError(
            f"{out} is not a PEFT adapter folder ({describe(out)}): refusing to replace it; choose another directory"
        )


def export_peft(run_dir: str | Path, out_dir: str | Path, force: bool = False) -> dict[str, Any]:
    """Write LoRA run `run_dir`'s adapter as a PEFT adapter folder `out_dir`; returns a summary."""
    run, out = check_run_dir(run_dir), Path(out_dir)
    config = read_run_config(run)
    adapter = adapter_of(config)
    if adapter is None:
        raise AttnlabError(f"{run} is not a LoRA run: export it with --to hf")
    cfg, lora = _gpt_config(config, str(run)), LoRAConfig(**adapter["lora"])
    layout = layout_of(cfg)
    _check_target(out, force)
    tensors, _ = read_safetensors(run / WEIGHTS)
    base, loads = peft_base(adapter["base"])
    write_peft(out, tensors, cfg, lora, base)
    summary = {"out": str(out), "layout": layout.name, "targets": list(lora.targets), "base": base}
    if not loads:
        summary["note"] = (
            f"PEFT loads the base from base_model_name_or_path: export it with `attnlab export "
            f"{base} --to hf DIR` and set base_model_name_or_path to DIR"
        )
    return summary


def _base_of(src: Path) -> Path:
    """The run a PEFT folder's base_model_name_or_path names (a HuggingFace folder converted once)."""
    peft = read_peft_config(src)  # bounded, checked: a file from someone else
    name = peft.get("base_model_name_or_path") or ""
    if not isinstance(name, str) or not Path(name).is_dir():
        raise AttnlabError(
            f"{src / PEFT_CONFIG}: base_model_name_or_path {name!r} is not a local folder: attnlab "
            "downloads nothing; set it to the base model's folder (HuggingFace's, or an attnlab "
            "run)"
        )
    base = as_run(name)
    if adapter_of(read_run_config(base)) is not None:
        raise AttnlabError(f"{src}: its base {name} is a LoRA run; merge it first (attnlab merge {name} --out DIR)")
    return base


def _cache_folder(src: Path, base: Path) -> Path:
    """Where a PEFT folder's run is kept: keyed by its path, its files' sizes and times, and its base."""
    stamp = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in src.iterdir() if f.is_file())
    # "whole": a new key, so an entry an older attnlab wrote in place (maybe half, if killed) is never read
    key = hashlib.sha256(json.dumps(["whole", str(src.resolve()), stamp, str(base.resolve())]).encode()).hexdigest()
    return cache_root() / "peft" / f"{src.resolve().name}-{key[:16]}"


def peft_run(src: Path) -> Path | None:
    """A PEFT adapter folder as a LoRA run (a reader of runs.adapted.READERS; None for other folders),
    written once into the cache and reused after: into a temporary folder renamed into place when whole
    (io.build_folder), so a kill or a failure midway leaves nothing a later run would take for it."""
    if not (src / PEFT_CONFIG).is_file():
        return None
    base = _base_of(src)
    out = _cache_folder(src, base)
    if has_weights(out):
        return out
    based = read_run_config(base)
    lora, tensors = read_peft(src, _gpt_config(based, str(base)))
    config = {
        "family": based["family"],
        "model": based["model"],
        "train": based["train"],
        "data": based["data"],
        "task": {"kind": "sft"},
        "init": str(base),
        "source": {"peft": str(src)},
        "adapter": {"base": str(base), "also": []},
        "converters": as_records((lora,)),
    }
    load_lora_state(build_adapted(config), tensors)  # the adapter fits its base, before anything is written
    template = hf_template(src)  # the adapter's own chat template (saved beside it), else its base's
    copies = {n: base / n for n in (TOKENIZER, CHAT_TEMPLATE) if (base / n).is_file()}
    if template is not None:
        copies.pop(CHAT_TEMPLATE, None)

    def write(tmp: Path) -> None:
        print(f"reading {src} (PEFT adapter) into {out}, once", file=sys.stderr)
        fresh_dir(tmp)
        record(tmp, CONFIG, WEIGHTS, *copies, *[CHAT_TEMPLATE] * (template is not None))
        write_json(tmp / CONFIG, config)
        write_weights(tensors, tmp / WEIGHTS, {"step": "0"})
        for name, path in copies.items():
            shutil.copyfile(path, tmp / name)
        if template is not None:
            write_json(tmp / CHAT_TEMPLATE, template.to_dict())

    return build_folder(out, write, has_weights)


READERS.append(peft_run)
