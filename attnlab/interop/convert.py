"""HuggingFace checkpoints in and out: a local HuggingFace directory -> an attnlab run, and back.

convert_from_hf("gpt2-dir", "runs/gpt2")
  -> read config.json, the weights and tokenizer.json (attnlab.interop.hf.io; nothing is downloaded)
  -> the family module for config.json's architecture maps the config and renames the weights
  -> the weights are loaded into the attnlab model (strictly) to prove they fit
  -> a run directory every attnlab command reads: config.json, model.safetensors, tokenizer.json
export_hf("runs/demo", "demo-hf")
  -> a directory transformers' from_pretrained loads (GPT runs as GPT2LMHeadModel, or with the
     Llama block's parts as LlamaForCausalLM / MixtralForCausalLM; encoder runs
     as BertForMaskedLM, BertForSequenceClassification or BertForTokenClassification, by head)
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from attnlab.config import from_dict
from attnlab.data import DataConfig
from attnlab.data.chat import ChatTemplate, hf_template
from attnlab.data.tokenizers import Tokenizer, load_tokenizer, tokenizer_from_json
from attnlab.engine.config import TrainConfig
from attnlab.errors import AttnlabError, one_line
from attnlab.interop.hf import bert, gpt2, llama, qwen3
from attnlab.interop.hf.bounds import checked_config
from attnlab.interop.hf.io import BIN_INDEX, PICKLES, SAFE_INDEX, read_hf_dir, read_json_file, write_hf_dir
from attnlab.interop.hf.tokenizer import hf_tokenizer_json, largest_id
from attnlab.io import build_folder, cache_root, write_json, write_text
from attnlab.models import build_model, family_classes
from attnlab.runs.adapted import CHAT_TEMPLATE, READERS, adapter_of
from attnlab.runs.folder import (
    CONFIG,
    TOKENIZER,
    WEIGHTS,
    check_new_run,
    check_run_dir,
    describe,
    fresh_dir,
    has_weights,
    read_run_config,
)
from attnlab.runs.marker import record
from attnlab.runs.weights import first_not_finite, load_weights, save_weights
from attnlab.tasks import Task, task_of

# Families that export, by the HuggingFace targets that may take a run, tried in order: a GPT goes
# out as GPT-2, as a Llama (a Mixtral with experts) or, with QK-norm, as a Qwen3, whichever expresses
# every one of its choices.
EXPORTERS: dict[str, tuple[ModuleType, ...]] = {"gpt": (gpt2, llama, qwen3), "encoder": (bert,)}


def exporter(family: str, cfg, run: Path | str = "this run") -> ModuleType:
    """The module that maps this run's config to HuggingFace: the first target that fits it; when
    none does, one line that says, for each target, what of the run it cannot express."""
    targets = EXPORTERS[family]
    needs = {m.target_name(cfg): m.export_problems(cfg) for m in targets}
    for m in targets:
        if not needs[m.target_name(cfg)]:
            return m
    said = " -- nor does it fit ".join(f"HuggingFace's {name}: {'; '.join(why)}" for name, why in needs.items())
    fast = getattr(cfg, "bigram_vocab", 0) or getattr(cfg, "logit_softcap", None) is not None
    hint = " (--preset qwen3-nano-fast is the fast recipe without them, as attnlab demo trains it)" if fast else ""
    raise AttnlabError(
        f"{run} does not fit {said}. Export it with --to onnx, or train a run without those choices{hint}"
    )


PADDING_ROWS = 128  # rows beyond the tokenizer's tokens that an embedding may have as padding


def convert_from_hf(src: str | Path, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Write the HuggingFace model in directory `src` as an attnlab run in `out`; returns a
    summary: family, architecture, parameters, run. An existing `out` is replaced only with
    force, and only if it is an attnlab run."""
    src, out = Path(src), Path(out)
    check_new_run(out, force, {src: "the model being converted"})
    hf, tensors, tokenizer_json = read_hf_dir(src)
    return convert_hf_parts(hf, tensors, tokenizer_json, src, out, {"hf": str(src)}, hf_template(src))


def convert_hf_parts(
    hf: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    tokenizer_json: str | None,
    src: Path,
    out: Path,
    source: dict[str, Any],
    template: ChatTemplate | None = None,
) -> dict[str, Any]:
    """A HuggingFace model's parts (config.json as a dict, its tensors by HuggingFace name, its
    tokenizer.json text, its chat template) as an attnlab run in `out`, which check_new_run has
    allowed: the one path every source of a HuggingFace-shaped model takes (a folder, a GGUF file).
    `source` is what config.json records of where the model came from."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    arch, module, family, cfg, task = checked_config(hf, shapes, src)  # every size against the files, first
    cfg = _as_loaded(cfg, src)
    weights = module.weights_from_hf(tensors, cfg)  # names and shapes checked before any allocation
    _check_finite(weights, src)
    model = build_model(family, cfg)
    kind = task_of({"family": family, "model": asdict(cfg), **({"task": task} if task else {})})
    pixels = _pixel_normalization(src, module, cfg)
    if pixels is not None:  # HF feeds (x - mean) / std; attnlab feeds [0, 1]: fold it into the weights
        weights = module.fold_pixel_normalization(weights, *pixels)
    model.load_state_dict(weights, strict=True)  # every tensor, every shape
    tok = _tokenizer(tokenizer_json, src, family, cfg, kind)
    config = {
        "family": family,
        "model": asdict(cfg),
        "train": asdict(TrainConfig()),
        "data": asdict(_data_config(kind, tok)),
    }
    if task is not None:
        config["task"] = task
    config["source"] = {**source, "architecture": arch}
    fresh_dir(out)  # only now: a failed conversion never costs an old run
    record(out, CONFIG, WEIGHTS, TOKENIZER, *[CHAT_TEMPLATE] * (template is not None))
    write_json(out / CONFIG, config)
    if template is not None:
        write_json(out / CHAT_TEMPLATE, template.to_dict())
    save_weights(model, out / WEIGHTS, {"step": "0"})
    if tokenizer_json is not None:
        write_text(out / TOKENIZER, tokenizer_json)
    return {"family": family, "architecture": arch, "parameters": _num_params(model), "run": str(out)}


def _pixel_normalization(src: Path, module, cfg) -> tuple[list[float], list[float]] | None:
    """The (mean, std) an image model's preprocessor_config.json normalizes with, if any."""
    if module.pixels_from_hf is None or not src.is_dir():
        return None
    processor = read_json_file(src, "preprocessor_config.json")  # bounded, inside the folder
    return None if processor is None else module.pixels_from_hf(processor, cfg.channels)


def export_hf(run_dir: str | Path, out_dir: str | Path, force: bool = False) -> dict[str, Any]:
    """Write run `run_dir` as a HuggingFace directory `out_dir` (config.json, model.safetensors,
    tokenizer.json) that transformers' from_pretrained loads. A non-empty `out_dir` is replaced
    only with force, and only if it is a HuggingFace model directory."""
    run, out = check_run_dir(run_dir), Path(out_dir)
    config = read_run_config(run)
    family = config["family"]
    if adapter_of(config) is not None:  # its weights file holds the adapters alone
        raise AttnlabError(
            f"{run} is a LoRA run: export its adapter with --to peft, or merge it into its base "
            f"first (attnlab merge {run} --out DIR) and export that"
        )
    if family not in EXPORTERS:
        raise AttnlabError(f"{run} is a {family} run: export to hf supports {' and '.join(EXPORTERS)} runs")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not force:
            raise AttnlabError(f"{out} already exists: choose another directory, or --force to replace it")
        if not is_hf_dir(out):  # another project's config.json is not ours to overwrite
            raise AttnlabError(
                f"{out} is not a HuggingFace model directory ({describe(out)}): refusing to "
                "replace it; choose another directory"
            )
    config_cls, model_cls = family_classes(family)
    cfg = from_dict(config_cls, config["model"], where="model config")
    module = exporter(family, cfg, run)
    hf_config = module.config_to_hf(cfg, config.get("task", {}).get("labels"))
    model = model_cls(cfg)
    load_weights(model, run / WEIGHTS)
    tok = load_tokenizer(run)
    tokenizer_json = hf_tokenizer_json(tok, run)  # a character tokenizer too: the folder converts back
    missing = f"not exported: HuggingFace has no {tok.kind} tokenizer format; the folder cannot be converted back"
    note = "tokenizer.json" if tokenizer_json is not None else missing
    if tokenizer_json is not None and "eos_token_id" in hf_config:  # a causal LM: end-of-text begins and ends texts
        hf_config["bos_token_id"] = hf_config["eos_token_id"] = tok.eot_id
    write_hf_dir(out, hf_config, module.weights_to_hf(model.state_dict(), cfg), tokenizer_json)
    return {
        "family": family,
        "architecture": hf_config["architectures"][0],
        "parameters": _num_params(model),
        "out": str(out),
        "tokenizer": note,
    }


def converted(src: Path) -> Path | None:
    """A HuggingFace folder as a run (runs.adapted's reader, so `--init` takes one): converted once
    into the cache, keyed by its path and its files' sizes and times, and reused after. The run is
    written into a temporary folder renamed into place when whole (io.build_folder): a conversion
    killed or refused midway leaves nothing a later one would take for a converted model."""
    if not is_hf_dir(src):
        return None
    stamp = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in src.iterdir() if f.is_file())
    # "whole": a new key, so an entry an older attnlab wrote in place (maybe half, if killed) is never read
    key = hashlib.sha256(json.dumps(["whole", str(src.resolve()), stamp]).encode()).hexdigest()[:16]
    out = cache_root() / "converted" / f"{src.resolve().name}-{key}"

    def convert(tmp: Path) -> None:
        print(f"converting {src} (HuggingFace) into {out}, once", file=sys.stderr)
        convert_from_hf(src, tmp, force=True)

    return build_folder(out, convert, has_weights)


READERS.append(converted)


def is_hf_dir(d: Path) -> bool:
    """A HuggingFace model folder: a config.json naming a model type, and weights beside it."""
    path = d / CONFIG
    try:
        # a regular file of at most 16 MB (a model's is a few KB): a FIFO or a device would never end
        if not path.is_file() or path.stat().st_size > 1 << 24:
            return False
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return False
    # pickles count as weights here, so that such a folder reaches read_hf_weights' refusal of them
    weights = any((d / name).is_file() for name in (WEIGHTS, SAFE_INDEX, BIN_INDEX)) or any(
        p.suffix in PICKLES and p.is_file() for p in d.iterdir()
    )
    return isinstance(hf, dict) and ("model_type" in hf or "architectures" in hf) and weights


def _tokenizer(text: str | None, src: Path, family: str, cfg: Any, task: Task) -> Tokenizer | None:
    """The checkpoint's tokenizer, checked to fit the model; image models read pixels and need none."""
    if not task.tokenized:
        return None
    if text is None:
        raise AttnlabError(
            f"{src}: tokenizer.json is missing; a {family} run needs it (save it beside the model with "
            "tokenizer.save_pretrained)"
        )
    try:
        tok = tokenizer_from_json(text)
        top = largest_id(text, tok.vocab_size)
    except Exception as e:  # any unreadable tokenizer is the same user error (RecursionError too)
        raise AttnlabError(f"cannot read {src / TOKENIZER}: {one_line(e)}") from None
    vocab = getattr(cfg, "vocab_size", None)
    if vocab is not None:
        _check_vocabulary(tok.vocab_size, top, vocab, src)
    return tok


def _check_vocabulary(size: int, top: int, vocab: int, src: Path) -> None:
    """The tokenizer must fit the model both ways. Every id it gives must have a row of the
    embedding. The model may have more rows than the tokenizer has tokens: checkpoints pad their
    embedding to a round size for speed (GPT-2's 50,257 tokens to 50,304 rows), and a model trained
    with its tokenizer never writes the padding ids. Beyond such padding (at most PADDING_ROWS rows,
    or 5% of the vocabulary) the tokenizer is not the model's: most of what it writes would decode
    to nothing, so the folder is refused."""
    if size > vocab:
        raise AttnlabError(f"{src}: tokenizer.json has {size} tokens, more than the model's {vocab}")
    if top >= vocab:
        raise AttnlabError(f"{src}: tokenizer.json gives ids up to {top}, beyond the model's vocabulary of {vocab}")
    padding = max(PADDING_ROWS, vocab // 20)
    if vocab - size > padding:
        raise AttnlabError(
            f"{src}: tokenizer.json has {size} tokens for a model of {vocab}: {vocab - size} of the "
            f"model's ids would decode to nothing, more than an embedding's padding (at most "
            f"{padding} here); give the model's own tokenizer.json"
        )


def _as_loaded(cfg: Any, src: Path) -> Any:
    """The model config as `attnlab.load` reads it back from config.json: a value it would refuse
    there (a NaN epsilon, a size below 1) is refused now, before anything is written."""
    try:
        return from_dict(type(cfg), json.loads(json.dumps(asdict(cfg))), where="model config")
    except (AttnlabError, ValueError, TypeError) as e:
        raise AttnlabError(f"{src / CONFIG} gives a model attnlab could not load back ({e})") from None


def _check_finite(weights: dict[str, torch.Tensor], src: Path) -> None:
    """A weight that is not a finite number would make the run refuse to load: refused now."""
    bad = first_not_finite(weights)
    if bad is not None:
        raise AttnlabError(f"{src}: the checkpoint's weights hold NaN or infinite values (first in attnlab's {bad})")


def _data_config(task: Task, tok: Tokenizer | None) -> Any:
    """The data settings a converted run starts with (what `attnlab eval` and fine-tuning read)."""
    data = task.default_data()
    if isinstance(data, DataConfig) and tok is not None:
        data = replace(data, tokenizer=tok.kind, vocab_size=tok.vocab_size)
    return data


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied weight once
