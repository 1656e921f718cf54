"""Translation: the encoder-decoder Transformer or an RNN encoder-decoder, through the shared loop.

attnlab.train("runs/numbers", Seq2SeqConfig(), data=ParallelDataConfig(data="numbers"), task="translate")
  -> a tokenizer per side (or one shared), trained on the training pairs
  -> pairs encoded with BOS/EOS/PAD ids below the tokenizers' ids (data/batches.py Pairs)
  -> the shared engine (engine/train.py), as for every task
  -> the test split decoded greedily: exact match, BLEU and chrF (sacrebleu) in eval.json
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import sacrebleu
import torch
from torch import nn

from attnlab.config import from_dict
from attnlab.data.batches import BOS_ID, EOS_ID, IGNORE, N_SPECIAL, PAD_ID, Pairs, pad
from attnlab.data.parallel import ParallelDataConfig, load_pairs, tokenizer_kind
from attnlab.data.shifted import pieces, to_ids, to_text
from attnlab.data.tokenizers import Tokenizer, load_tokenizer, train_tokenizer
from attnlab.decoding.beam import beam_search, greedy
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.interpret.views import TRANSLATION_VIEWS, numpy_weights
from attnlab.models.rnn import RNNSeq2SeqConfig
from attnlab.models.seq2seq import PRESETS, Seq2SeqConfig
from attnlab.progress import tqdm
from attnlab.runs.folder import TOKENIZER
from attnlab.runs.run import Run
from attnlab.runtime.distributed import Dist
from attnlab.tasks.base import ModelChoice, Task
from attnlab.tasks.common import build_config, config_json, decoder_preset, init_builder
from attnlab.viz.alignment import plot_alignment
from attnlab.viz.html import AttentionView

TARGET_TOKENIZER = "tokenizer_target.json"  # absent when both sides share tokenizer.json
# Settings that learn the built-in tasks in a few minutes on a laptop CPU.
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "transformer": dict(
        max_steps=3000, batch_size=64, lr=1e-3, warmup_steps=200, weight_decay=0.01, eval_interval=500, beta2=0.98
    ),
    "rnn-attention": dict(
        max_steps=3000, batch_size=64, lr=2e-3, warmup_steps=100, weight_decay=0.0, eval_interval=500
    ),
}
TRAIN_DEFAULTS["rnn"] = dict(TRAIN_DEFAULTS["rnn-attention"])


def model_config(name: str, src_vocab: int, tgt_vocab: int, max_len: int, overrides: dict) -> Any:
    """The model's config: its defaults (the Transformer: a preset), the user's overrides, the data's sizes."""
    choice = Translation.models[name]
    cls, fixed = choice.config, dict(choice.fixed)
    overrides = dict(overrides)
    base, context = decoder_preset(choice, overrides, max_len, "the RNNs")
    if choice.presets:  # the Transformer: one embedding for both sides where their vocabularies are one
        base["share_embeddings"] = overrides.get("share_embeddings", False) and src_vocab == tgt_vocab
    sizes = {"src_vocab": src_vocab, "tgt_vocab": tgt_vocab, **fixed, **context}
    return build_config(name, cls, base, overrides, sizes)


def train_tokenizers(pairs: list[tuple[str, str]], kind: str, vocab_size: int, shared: bool):
    """(source tokenizer, target tokenizer) trained on the training pairs; one object when shared."""
    if shared:
        tok = train_tokenizer(kind, [s for pair in pairs for s in pair], vocab_size)
        return tok, tok
    return (
        train_tokenizer(kind, [s for s, _ in pairs], vocab_size),
        train_tokenizer(kind, [t for _, t in pairs], vocab_size),
    )


def encode_pairs(src_tok, tgt_tok, pairs: list[tuple[str, str]], max_len: int, split: str):
    """Source and target id arrays; sides longer than max_len tokens are cut (one warning per split)."""
    src, tgt, cut = [], [], 0
    for s, t in pairs:
        a, b = to_ids(src_tok, s), to_ids(tgt_tok, t)
        cut += len(a) > max_len or len(b) > max_len
        src.append(a[:max_len])
        tgt.append(b[:max_len])
    if cut:
        warnings.warn(
            f"{cut} {split} pairs longer than {max_len} tokens were truncated (raise --max-len)", stacklevel=2
        )
    return src, tgt


class Translation(Task):
    name = "translate"
    help = "source -> target: the Transformer or an RNN encoder-decoder"
    description = (
        "Train an encoder-decoder on sentence pairs (a built-in task or a TSV/two files), then "
        "decode its test split: exact match, BLEU, chrF."
    )
    models = {
        "transformer": ModelChoice("seq2seq", Seq2SeqConfig, presets=PRESETS, default_preset="transformer-tiny"),
        "rnn-attention": ModelChoice("rnn-seq2seq", RNNSeq2SeqConfig, (("attention", True),)),
        "rnn": ModelChoice("rnn-seq2seq", RNNSeq2SeqConfig, (("attention", False),)),
    }
    default_model = "transformer"
    data_config = ParallelDataConfig
    noun = "a translation"
    set_by_data = frozenset({"src_vocab", "tgt_vocab", "attention"})
    tuned = TRAIN_DEFAULTS

    def model_of(self, config: dict[str, Any]) -> str:
        return config["task"]["model"]

    def setup(self, req: TrainRequest) -> dict[str, str]:
        if req.init is not None:  # fine-tuning keeps the init run's vocabularies
            src = Path(req.init) / TOKENIZER
            files = {TOKENIZER: src.read_text(encoding="utf-8")}
            if (Path(req.init) / TARGET_TOKENIZER).is_file():
                files[TARGET_TOKENIZER] = (Path(req.init) / TARGET_TOKENIZER).read_text(encoding="utf-8")
            return files
        splits = load_pairs(req.data)
        src_tok, tgt_tok = train_tokenizers(
            splits["train"], tokenizer_kind(req.data), req.data.vocab_size, req.data.shared_vocab
        )
        files = {TOKENIZER: src_tok.to_json()}
        if tgt_tok is not src_tok:
            files[TARGET_TOKENIZER] = tgt_tok.to_json()
        return files

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        out, data = Path(req.out), req.data
        splits = load_pairs(data)
        src_tok = load_tokenizer(out)
        tgt_tok = load_tokenizer(out / TARGET_TOKENIZER) if (out / TARGET_TOKENIZER).is_file() else src_tok
        cfg = model_config(
            req.model,
            src_tok.vocab_size + N_SPECIAL,
            tgt_tok.vocab_size + N_SPECIAL,
            data.max_len,
            self.model_fields(req),
        )
        encoded = {name: encode_pairs(src_tok, tgt_tok, p, data.max_len, name) for name, p in splits.items()}
        # Decoding stops at EOS or after this many tokens: twice the longest training target, which an
        # untrained model (that never says EOS) reaches quickly instead of running to max_len.
        max_out = min(data.max_len, 2 * max(len(t) for t in encoded["train"][1]) + 10)
        task = {"kind": self.name, "model": req.model, "max_out": max_out}
        family = self.models[req.model].family
        config = config_json(req, family, cfg, task)

        batches = Pairs({k: v[0] for k, v in encoded.items()}, {k: v[1] for k, v in encoded.items()})
        return Prepared(
            batches,
            init_builder(family, cfg, req),
            config,
            state=(encoded["test"][0], splits["test"], tgt_tok, max_out),
        )

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any]:
        sources, pairs, tgt_tok, max_out = prepared.state
        hyps = translate_ids(s.raw, sources, max_out, device=s.device, progress=req.progress and s.dist.main)
        return {"decoding": "greedy", **scores([to_text(tgt_tok, h) for h in hyps], [t for _, t in pairs])}

    def test_line(self, t: dict[str, Any]) -> str:
        return scores_line(t)

    def next_step(self, out: str) -> str:
        return f'. Try: attnlab translate {out} "some text" --beam 4'

    # ---- a trained run ------------------------------------------------------------------------
    def predict(self, run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        if not text.strip():
            raise AttnlabError("the text is empty")
        beam, picture = options.get("beam") or 1, options.get("attention")
        if picture:
            return {
                "kind": self.name,
                "translation": alignment_picture(run, text, picture, beam),
                "attention": str(picture),
            }
        return {"kind": self.name, "translation": translate(run, [text], beam)[0]}

    def show_prediction(self, result: dict[str, Any]) -> str:
        picture = result.get("attention")
        return result["translation"] + (f"\nalignment: {picture}" if picture else "")

    def evaluate(self, run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        return evaluate_translation(
            run, data, split or "test", options.get("beam") or 1, progress=options.get("progress", True)
        )

    def show_evaluation(self, r: dict[str, Any]) -> str:
        return show_scores(r, "pairs")

    def lens_input(self, run: Run, text: str) -> tuple[torch.Tensor, torch.Tensor, Callable[[int], str]]:
        """The decoder's inputs on the run's own greedy translation of `text`, and its source: row l,
        column t of the lens is what the decoder would write after reading the source and its first
        t outputs, stopped after layer l."""
        src, tgt_in, _ = decode_one(run, text)
        tok = target_tokenizer(run)
        return tgt_in, src, lambda i: pieces(tok, [i])[0]

    def views(self, run, text: str) -> list:
        return translation_views(run, text)


MODELS = Translation.models  # model name -> ModelChoice


@torch.no_grad()
def decode_all(
    model: nn.Module,
    sources,
    collate,
    max_len: int,
    beam: int = 1,
    batch_size: int = 256,
    device=None,
    progress: bool = False,
) -> list[list[int]]:
    """Decoded target ids for each source, batch_size at a time as collate(sources[a:b]) makes them
    (greedy when beam is 1): token id arrays for translation, an image array for captioning.
    progress: a bar on stderr, source by source (a test set takes long enough on a CPU to want one)."""
    model.eval()
    device = device or next(model.parameters()).device
    out: list[list[int]] = []
    how = "greedy" if beam == 1 else f"beam {beam}"
    with tqdm(total=len(sources), desc=f"decoding ({how})", unit=" examples", disable=not progress, leave=False) as bar:
        for start in range(0, len(sources), batch_size):
            src = collate(sources[start : start + batch_size]).to(device)
            out += greedy(model, src, max_len) if beam == 1 else beam_search(model, src, beam, max_len)
            bar.update(len(src))
    return out


def translate_ids(model: nn.Module, sources: list[np.ndarray], max_len: int, *how, **named) -> list[list[int]]:
    """Decoded target ids for each source id array; the rest as decode_all takes them (beam, batch_size,
    device, progress: greedy when beam is 1)."""
    collate = lambda part: pad([torch.as_tensor(s) for s in part], PAD_ID)  # (B, S)
    return decode_all(model, sources, collate, max_len, *how, **named)


def scores_line(t: dict[str, Any]) -> str:
    """The greedy test scores of a sequence-output task in one line."""
    return f"test (greedy): exact match {t['exact_match']:.2%}, BLEU {t['bleu']:.1f}, chrF {t['chrf']:.1f}"


def show_scores(r: dict[str, Any], unit: str) -> str:
    """`attnlab eval`'s lines for a sequence-output task; unit: what one example is ("pairs", "images")."""
    decoding = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
    return (
        f"{r['data']} ({r['split']}): {r['examples']:,} {unit}, {decoding}\n"
        f"  exact match  {r['exact_match']:.2%}\n  BLEU         {r['bleu']:.2f}\n"
        f"  chrF         {r['chrf']:.2f}\n  loss         {r['loss']:.4f} nats/token"
    )


def scores(hypotheses: list[str], references: list[str]) -> dict:
    """Exact match, and corpus BLEU and chrF from sacrebleu (the field's reference implementation)."""

    exact = float(np.mean([h.strip() == r.strip() for h, r in zip(hypotheses, references)]))
    return {
        "examples": len(references),
        "exact_match": exact,
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
    }


def target_tokenizer(run) -> Tokenizer:
    path = run.path / TARGET_TOKENIZER
    return load_tokenizer(path) if path.is_file() else run.tokenizer


def translate(run, texts: list[str], beam: int = 1) -> list[str]:
    """Translations of raw texts by a trained run (attnlab.load)."""
    limit = run.config["data"]["max_len"]
    ids = [to_ids(run.tokenizer, t) for t in texts]
    if any(len(i) > limit for i in ids):
        warnings.warn(f"a text longer than {limit} tokens was truncated", stacklevel=2)
    hyps = translate_ids(run.model, [i[:limit] for i in ids], run.config["task"]["max_out"], beam)
    return [to_text(target_tokenizer(run), h) for h in hyps]


def evaluate_translation(
    run, data: str | None = None, split: str = "test", beam: int = 1, progress: bool = False
) -> dict:
    """Exact match, BLEU, chrF and loss of a trained run on a split of its data, or on a file `data`
    (progress: a bar on stderr while it decodes)."""
    cfg = from_dict(ParallelDataConfig, run.config["data"], where="data config")
    if data is not None:
        cfg = dataclasses.replace(cfg, data=data, target=None, val=data, test=data)
    pairs = load_pairs(cfg)[split]
    tgt_tok = target_tokenizer(run)
    src, tgt = encode_pairs(run.tokenizer, tgt_tok, pairs, cfg.max_len, split)
    hyps = translate_ids(run.model, src, run.config["task"]["max_out"], beam, progress=progress)
    result = scores([to_text(tgt_tok, h) for h in hyps], [t for _, t in pairs])
    loss = teacher_forced_loss(run.model, Pairs({split: src}, {split: tgt}), split)
    return {"data": cfg.data, "split": split, "beam": beam, **result, "loss": loss}


@torch.no_grad()
def teacher_forced_loss(model: nn.Module, batches: Pairs, split: str, batch_size: int = 256) -> float:
    """Mean cross-entropy per target token (EOS included), teacher forced, without smoothing (any
    Pairs: token sources, or images for captioning)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    n = len(batches.src[split])
    for start in range(0, n, batch_size):
        src, tgt_in, labels = (t.to(device) for t in batches.collate(split, range(start, min(n, start + batch_size))))
        _, loss = model(src, tgt_in, labels)
        k = int((labels != IGNORE).sum())
        total, count = total + float(loss) * k, count + k
    return total / max(count, 1)


def decode_one(run, text: str, beam: int = 1) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Translate one text for a look at its attention: (source ids (1, S), the decoder's inputs
    (1, T) = BOS + translation, the translation's ids)."""
    src = to_ids(run.tokenizer, text)[: run.config["data"]["max_len"]]
    if len(src) == 0:
        raise AttnlabError("the text has no tokens")
    (hyp,) = translate_ids(run.model, [src], run.config["task"]["max_out"], beam)
    src_t = torch.as_tensor(src, device=run.device)[None]  # (1, S)
    return src_t, torch.tensor([[BOS_ID, *hyp]], device=run.device), hyp  # (1, T): what each step read


def cross_attention(run, src: torch.Tensor, tgt_in: torch.Tensor) -> np.ndarray:
    """Where each output step looked in the source: (L, H, T, S) (the RNN's: L = H = 1)."""
    try:
        return run.model.alignment(src, tgt_in)[0].float().cpu().numpy()
    except ValueError as e:  # the plain RNN has no attention to draw
        raise AttnlabError(f"{run.path}: {e}") from None


def alignment_picture(run, text: str, path: str | Path, beam: int = 1) -> str:
    """Translate `text` and draw where each produced token looked in the source; returns the translation."""

    src, tgt_in, hyp = decode_one(run, text, beam)
    w = cross_attention(run, src, tgt_in)
    tgt_tok = target_tokenizer(run)
    translation = to_text(tgt_tok, hyp)
    title = f"{run.config['task'].get('model', run.config['family'])}: {text!r} -> {translation!r}"
    plot_alignment(w, pieces(run.tokenizer, src[0].tolist()), pieces(tgt_tok, [*hyp, EOS_ID]), Path(path), title)
    return translation


def translation_views(run, text: str) -> list:
    """Encoder, decoder and cross-attention on the run's own greedy translation of `text` (the RNN:
    its Bahdanau alignment alone, the one attention it has)."""
    src, tgt_in, hyp = decode_one(run, text)
    source = pieces(run.tokenizer, src[0].tolist())
    target = pieces(target_tokenizer(run), [*hyp, EOS_ID])  # what each step produced
    inputs = pieces(target_tokenizer(run), [BOS_ID, *hyp])  # decoder self-attention reads its inputs
    labels = {"encoder": (source, source), "decoder": (target, inputs), "cross": (target, source)}
    try:
        maps = run.model.attention(src, tgt_in)
    except ValueError as e:  # the plain RNN has no attention to draw
        raise AttnlabError(f"{run.path}: {e}") from None
    return [AttentionView(TRANSLATION_VIEWS[name], *labels[name], numpy_weights(w)) for name, w in maps.items()]
