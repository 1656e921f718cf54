"""Masked-language pretraining of the encoder (BERT's objective) on any corpus the lm task reads.

setup:   word tokenizer with [PAD] [UNK] [CLS] [SEP] [MASK], token cache (shared with lm)
prepare: blocks of tokens, 15% chosen: 80% [MASK], 10% random, 10% kept; loss on the chosen only
a run:   attnlab predict RUN "import [MASK]" lists the candidates for each [MASK]
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from attnlab.config import checked
from attnlab.data import DataConfig
from attnlab.data.batches import MaskedWindows
from attnlab.data.tokenizers import WORD_SPECIALS, load_tokenizer
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.interpret.views import self_attention_view
from attnlab.models import family_classes
from attnlab.models.encoder import PRESETS, Encoder, EncoderConfig
from attnlab.runs.folder import TOKENIZER, check_run_dir, read_run_config
from attnlab.runs.kind import kind_of
from attnlab.runtime.distributed import Dist
from attnlab.tasks.base import ModelChoice, Task, load_body
from attnlab.tasks.common import config_json
from attnlab.tasks.lm import checked_block_size, corpus_tokenizer, corpus_tokens
from attnlab.tasks.text_predict import probabilities, words_and_ids

# An encoder-small on the standard library's words, in a few minutes on a laptop CPU.
MLM_TRAIN = dict(max_steps=4000, batch_size=32, block_size=64, lr=2e-3, warmup_steps=200, eval_interval=500)
MLM_DATA = dict(data="stdlib", tokenizer="word", vocab_size=8192)
DEFAULT_PRESET = "encoder-small"


class MaskedLM(Task):
    name = "mlm"
    help = "an encoder by masked-language modelling (BERT's pretraining)"
    description = "Pretrain an encoder: 15%% of word tokens hidden, each predicted from both sides."
    models = {
        "encoder": ModelChoice(
            "encoder", EncoderConfig, (("head", "mlm"),), presets=PRESETS, default_preset=DEFAULT_PRESET
        )
    }
    default_model = "encoder"
    data_config = DataConfig
    noun = "a masked-LM"
    init_help = "continue pretraining from this encoder run's weights and tokenizer (e.g. a converted BERT)"

    def train_defaults(self, model: str) -> dict[str, Any]:
        return dict(MLM_TRAIN)

    def default_data(self) -> DataConfig:
        return DataConfig(**MLM_DATA)

    def _model(self, req: TrainRequest) -> EncoderConfig:
        """A preset (encoder-small) with the given fields; the --init run's encoder to continue from."""
        fields = dict(req.model_config)
        if req.init is not None and not req.resume:
            fields = {**init_encoder(req.init), **{k: v for k, v in fields.items() if k == "dropout"}}
        preset = fields.pop("preset", None) or DEFAULT_PRESET
        if preset not in PRESETS:
            raise AttnlabError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        return checked(EncoderConfig, {**asdict(PRESETS[preset]), **fields, "head": "mlm"}, where="[model]")

    def setup(self, req: TrainRequest) -> dict[str, str]:
        if req.data.tokenizer != "word":
            raise AttnlabError("masked-LM training needs the word tokenizer (it has [MASK]): use --tokenizer word")
        checked_block_size(req.train, self._model(req).context)  # before any slow work

        tok = load_tokenizer(req.init) if req.init is not None else None
        return {TOKENIZER: corpus_tokenizer(req.data, req.progress, tok).to_json()}

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        tok, tokens = corpus_tokens(Path(req.out), req.data, d, req.progress)
        model = self._model(req)
        if req.init is None:
            model = replace(model, vocab_size=tok.vocab_size)
        block = checked_block_size(req.train, model.context)
        tokens.check(block)
        batches = MaskedWindows(tokens, block, tok.mask_id, n_special=len(WORD_SPECIALS))
        config = config_json(req, "encoder", model, {"kind": self.name})

        def build() -> Encoder:
            net = Encoder(model)
            if req.init is not None and not req.resume:  # the encoder's body; its head may be another task's
                load_body(net, req.init, ("out.", "transform", "pooler"))
            return net

        return Prepared(batches, build, config)

    def next_step(self, out: str) -> str:
        return f'. Try: attnlab predict {out} "def __init__([MASK], name):"'

    # ---- a trained run ------------------------------------------------------------------------
    def predict(self, run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        tok = run.tokenizer
        words, ids, _ = words_and_ids(run, text, cls_first=False)
        masks = [i for i, t in enumerate(ids) if t == tok.mask_id]
        if not masks:
            raise AttnlabError("a masked-LM run fills [MASK]: put [MASK] in the text")
        # (T, V'): the ids the tokenizer has; a converted model's embedding may have padding rows beyond them
        probs = probabilities(run, ids)[:, : len(tok.itos)]
        out = []
        for i in masks:
            p, top = probs[i].topk(options.get("top_k") or 5)
            out.append(
                {
                    "position": i,
                    "candidates": [{"token": tok.itos[int(t)], "probability": float(q)} for t, q in zip(top, p)],
                }
            )
        return {"kind": self.name, "tokens": words, "masks": out}

    def show_prediction(self, result: dict[str, Any]) -> str:
        lines = []
        for m in result["masks"]:
            shown = ("\\n" if c["token"] == "\n" else c["token"] for c in m["candidates"])  # a line break, visibly
            cands = "  ".join(f"{t} ({c['probability']:.2f})" for t, c in zip(shown, m["candidates"]))
            lines.append(f"[MASK] at token {m['position']}: {cands}")
        return "\n".join(lines)

    def evaluate(self, run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        raise AttnlabError(f'{run.path} is a masked-LM run: try attnlab predict {run.path} "... [MASK] ..."')

    def views(self, run, text: str) -> list:

        _, ids, _ = words_and_ids(run, text, cls_first=False)
        return [self_attention_view(run, ids)]


def init_encoder(init: str | Path) -> dict[str, Any]:
    """The model fields of an encoder run (attnlab's masked LM, or a converted BERT) to start from."""
    config = read_run_config(check_run_dir(init))
    if not issubclass(family_classes(config["family"])[1], Encoder):
        raise AttnlabError(f"--init {init} is a {kind_of(config).name} run, not an encoder run")
    return dict(config["model"])
