"""Language modelling: a GPT learns to predict each next token of a corpus.

setup:   the tokenizer trained on the corpus (or the --init run's), the token cache
prepare: random windows of block_size tokens, y = x shifted by one; GPTConfig sized to the tokenizer
a run:   attnlab sample continues text; eval gives nats/token, perplexity and bits per character
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from attnlab.config import checked, parse_value
from attnlab.data import DataConfig, TokenData, build_token_cache, read_texts, resolve_sources, workers_for
from attnlab.data.batches import Windows
from attnlab.data.tokenizers import Tokenizer, load_tokenizer, train_tokenizer
from attnlab.data.unknown import unknown_share, warn_unknown
from attnlab.engine.config import TrainConfig
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest, open_session
from attnlab.errors import AttnlabError
from attnlab.interpret.views import self_attention_view
from attnlab.models.gpt import GPT, PRESET_TRAINING, PRESETS, GPTConfig
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS, check_run_dir, read_run_config
from attnlab.runs.kind import kind_of
from attnlab.runs.run import Run
from attnlab.runs.weights import load_weights
from attnlab.runtime import distributed
from attnlab.runtime.distributed import Dist
from attnlab.tasks.base import ModelChoice, Task, TrainOptions
from attnlab.tasks.common import config_json
from attnlab.tasks.lm_eval import SPLITS, evaluate
from attnlab.tasks.request import python_request

FIXED_ON_RESUME = ("tokenizer", "vocab_size", "val_fraction")  # a resumed run keeps its tokens and split
FROM_INIT = ("tokenizer", "vocab_size")  # the data settings an --init run's tokenizer decides


def checked_block_size(cfg: TrainConfig, context: int) -> int:
    """Tokens per training sequence: --block-size, or the model's whole context (never beyond it)."""
    block_size = cfg.block_size or context
    if block_size > context:
        raise AttnlabError(f"block size {block_size} is beyond the model's context of {context}")
    return block_size


def corpus_tokenizer(data: DataConfig, progress: bool, tok: Tokenizer | None = None) -> Tokenizer:
    """Setup of a corpus task (lm, mlm): the tokenizer trained on the corpus unless given, and the
    token cache of the corpus under it (both may fail, so they come before --force replaces a run)."""
    files = resolve_sources(data.data, data.glob)
    if tok is None:
        texts = read_texts(files, "reading the corpus" if progress else None)
        tok = train_tokenizer(data.tokenizer, texts, data.vocab_size, workers_for(files))
    else:  # the --init run's tokenizer: what of this corpus it cannot read is trained on as unknown
        share = unknown_share(tok, read_texts(files, "counting unknown tokens" if progress else None))
        warn_unknown(tok, share, f"--data {data.data}", f"fine-tuning learns {tok.unk_name} in their place")
    build_token_cache(files, tok, data.val_fraction, progress)
    return tok


def corpus_tokens(run: Path, data: DataConfig, d: Dist, progress: bool) -> tuple[Tokenizer, TokenData]:
    """The run's tokenizer and the token cache of its corpus (built by rank 0 if missing; for a run
    that setup just started, found at once)."""
    tok = load_tokenizer(run)
    files = resolve_sources(data.data, data.glob)
    with distributed.main_first(d):
        return tok, TokenData(build_token_cache(files, tok, data.val_fraction, progress and d.main))


def init_model(init: str | Path, model_cfg: GPTConfig | None = None) -> GPTConfig:
    """The model config of the GPT run `init`, with model_cfg's dropout; any other difference
    (but vocab_size, which the tokenizer sets) is an error: the weights have their shape."""
    config = read_run_config(check_run_dir(init))
    if not kind_of(config).generates:
        raise AttnlabError(
            f"--init {init} is a {kind_of(config).name} run: fine-tuning a language model needs a gpt run"
        )
    base = checked(GPTConfig, config["model"], where=f"{Path(init) / CONFIG} model")
    if model_cfg is None:
        return base
    changed = [k for k, v in asdict(model_cfg).items() if k not in ("dropout", "vocab_size") and v != getattr(base, k)]
    if changed:
        raise AttnlabError(f"the model of --init {init} is fixed (only dropout can change), not {', '.join(changed)}")
    return replace(base, dropout=model_cfg.dropout)


def _differs(name: str, value: Any, own: dict[str, Any]) -> bool:
    """Whether a GPT field given differs from the init run's (both read as the field's type)."""
    return parse_value(GPTConfig, name, value) != parse_value(GPTConfig, name, own[name])


def _build(model_cfg: GPTConfig, weights: Path | None) -> GPT:
    """A GPT initialized from the seed, or (fine-tuning) loaded from `weights`."""
    model = GPT(model_cfg)
    if weights is not None:
        load_weights(model, weights)
    return model


class LanguageModel(Task):
    name = "lm"
    help = "a GPT language model on text (next-token prediction)"
    description = "Train a GPT on a text file, a folder, or a built-in corpus ('stdlib', 'repeats')."
    models = {"gpt": ModelChoice("gpt", GPTConfig, presets=PRESETS, default_preset="gpt-nano")}
    preset_help = (
        f"model preset: {', '.join(PRESETS)} (default: gpt-nano); "
        f"{', '.join(PRESET_TRAINING)} also bring their tuned training settings, under the flags"
    )
    data_fixed_on_resume = FIXED_ON_RESUME
    kept_on_resume = "the run's tokens and split stay as they were"
    default_model = "gpt"
    data_config = DataConfig
    set_by_data = frozenset({"vocab_size"})  # the tokenizer's
    generates = True
    noun = "a language-model"
    endpoint = "/api/generate"
    init_help = (
        "start from this GPT run's weights and tokenizer (e.g. one converted from HuggingFace); fine-tunes on --data"
    )

    def _model(self, req: TrainRequest) -> GPTConfig:
        """The GPT's config: the run's own (resume), the --init run's, or a preset / the defaults with
        the given fields (vocab_size follows the tokenizer in prepare)."""
        fields = dict(req.model_config)
        preset = fields.pop("preset", None)
        if preset is not None and preset not in PRESETS:
            raise AttnlabError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        base = asdict(PRESETS[preset]) if preset else {}
        cfg = checked(GPTConfig, {**base, **fields}, where="[model]")
        if req.init is not None and not req.resume:
            return init_model(req.init, cfg if fields or preset else None)
        return cfg

    def _data(self, req: TrainRequest) -> tuple[DataConfig, Tokenizer | None]:
        """The data config, and the --init run's tokenizer when fine-tuning (whose kind and size it takes)."""
        if req.init is None or req.resume:
            return req.data, None
        tok = load_tokenizer(req.init)
        return replace(req.data, tokenizer=tok.kind, vocab_size=tok.vocab_size), tok

    def setup(self, req: TrainRequest) -> dict[str, str]:
        model_cfg = self._model(req)
        checked_block_size(req.train, model_cfg.context)  # before any slow work
        data, tok = self._data(req)
        if tok is not None and tok.vocab_size > model_cfg.vocab_size:
            raise AttnlabError(
                f"--init {req.init}: its tokenizer has {tok.vocab_size} tokens, its model {model_cfg.vocab_size}"
            )
        return {TOKENIZER: corpus_tokenizer(data, req.progress, tok).to_json()}

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        data, _ = self._data(req)
        model_cfg = self._model(req)
        tok, tokens = corpus_tokens(Path(req.out), data, d, req.progress)
        if req.init is None and not req.resume:  # a fine-tuned model keeps its vocab_size (may exceed its tokenizer's)
            model_cfg = replace(model_cfg, vocab_size=tok.vocab_size)
        block_size = checked_block_size(req.train, model_cfg.context)
        tokens.check(block_size)
        weights = Path(req.init) / WEIGHTS if req.init is not None and not req.resume else None
        config = config_json(req, "gpt", model_cfg, data=data)  # data: with --init, its tokenizer's
        return Prepared(Windows(tokens, block_size), partial(_build, model_cfg, weights), config)

    def next_step(self, out: str) -> str:
        return f". Try: attnlab sample {out}"

    # ---- a trained run ------------------------------------------------------------------------
    def predict(self, run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        raise AttnlabError(f"{run.path} is a {run.config['family']} language model: use attnlab sample")

    def evaluate(self, run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        if split == "test":
            raise AttnlabError("a language model's data has a train and a val split: use --split val, train or all")
        glob = options.get("glob") or (run.config["data"].get("glob", "*") if not data else "*")
        return evaluate(
            run,
            data or run.config["data"]["data"],
            glob,
            split or "val",
            options.get("max_tokens"),
            progress=options.get("progress", True),
        )

    def show_evaluation(self, r: dict[str, Any]) -> str:
        return (
            f"{r['data']} ({r['split']}): {r['tokens']:,} tokens, {r['characters']:,} characters\n"
            f"  loss            {r['loss']:.4f} nats/token\n  perplexity      {r['perplexity']:.3f}\n"
            f"  bits per char   {r['bits_per_char']:.4f}"
        )

    def lens_input(self, run: Run, text: str) -> tuple[torch.Tensor, None, Callable[[int], str]]:
        ids = torch.tensor([run.tokenizer.encode(text)], device=run.device)[:, : run.model.cfg.context]  # (1, T)
        if ids.shape[1] < 2:
            raise AttnlabError("give an input of at least two tokens")
        return ids, None, lambda i: run.tokenizer.decode([i])

    def views(self, run, text: str) -> list:

        ids = run.tokenizer.encode(text)[-run.model.cfg.context :]  # the last window, as generation reads it
        return [self_attention_view(run, ids)]

    # ---- the request (tasks/request.py) -----------------------------------------------------------
    def preset_training(self, preset: str | None) -> dict[str, Any]:
        return dict(PRESET_TRAINING.get(preset, {}))  # a new run of a preset: its training settings

    def check_given(self, opts: TrainOptions, flags: dict[str, dict[str, Any]], preset: str | None) -> None:
        """A new run from --init takes the init run's model and tokenizer: only --dropout may change.
        A model field equal to the init run's passes (Python's model=GPTConfig(...) gives them all),
        and so do the data's tokenizer settings at their defaults (a DataConfig gives them all)."""
        if opts.init is None or opts.resume:
            return
        own, data = asdict(init_model(opts.init)), DataConfig()
        given = flags.get("model", {}).items()
        clash = [k for k, v in given if k in own and k not in ("dropout", "vocab_size") and _differs(k, v, own)]
        clash += [k for k, v in flags.get("data", {}).items() if k in FROM_INIT and v != getattr(data, k)]
        clash += ["preset"] if preset else []
        if clash:
            names = ", ".join("--" + k.replace("_", "-") for k in clash)
            raise AttnlabError(
                f"--init takes the model and tokenizer of {opts.init}: drop {names} (only --dropout may change)"
            )

    def from_init(self, init: str, fields: dict[str, Any], preset: str | None) -> dict[str, Any]:
        """The init run's model fields, of which only dropout may change."""
        return {**asdict(init_model(init)), **fields}


def prepare(
    out: str | Path,
    model: GPTConfig | None = None,
    train: TrainConfig | None = None,
    data: DataConfig | None = None,
    **request: Any,
) -> Session:
    """A GPT run ready for `engine.loop.loop` (run directory, tokenizer, token cache, model,
    optimizer); `request`: the other TrainRequest fields (resume, force, init, progress)."""
    task = LanguageModel()
    fields = asdict(model) if model is not None else None
    return open_session(task, python_request(task, out, "gpt", fields, train, data, **request))[0]


__all__ = [
    "SPLITS",
    "LanguageModel",
    "checked_block_size",
    "corpus_tokenizer",
    "corpus_tokens",
    "init_model",
    "prepare",
]
