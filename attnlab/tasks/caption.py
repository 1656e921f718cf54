"""Image captioning: images to words, through the shared loop.

attnlab train caption --data digits-strips --model transformer
  -> a word tokenizer trained on the training captions
  -> images (N, C, H, W) and caption ids (specials below the tokenizer's ids, data/batches.py)
  -> the shared engine (engine/train.py), as for every task
  -> the test split captioned greedily: exact match (of the word sequence), BLEU and chrF

The Transformer is a ViT encoder and the translation decoder (models/captioner.py); decoding is
the encoder-decoders' own (decoding/beam.py): greedy or beam search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.config import from_dict
from attnlab.data import strips
from attnlab.data.batches import BOS_ID, EOS_ID, N_SPECIAL, ImagePairs
from attnlab.data.captions import BUILTIN_CAPTIONS, CaptionDataConfig, load_captions
from attnlab.data.images import read_image
from attnlab.data.tokenizers import Tokenizer, load_tokenizer, train_tokenizer
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import engine_for
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.interpret.word_regions import digit_attention
from attnlab.models.captioner import PRESETS, CaptionerConfig
from attnlab.models.rnn_captioner import RNNCaptionerConfig
from attnlab.runs.folder import TOKENIZER
from attnlab.runs.run import Run
from attnlab.runtime.distributed import Dist
from attnlab.tasks.base import ModelChoice, Task
from attnlab.tasks.common import build_config, config_json, decoder_preset, init_builder
from attnlab.tasks.translate import (
    cross_attention,
    decode_all,
    pieces,
    scores,
    scores_line,
    show_scores,
    teacher_forced_loss,
    to_ids,
)
from attnlab.viz.captions import plot_caption_attention, write_caption_html

# Settings that caption digits-strips in under five minutes on a laptop CPU (benchmarks/captioning.py).
# The RNN gained from 6,000 steps over 3,000 (docs/log.md, "Captioning").
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "transformer": dict(
        max_steps=8000, batch_size=64, lr=2e-3, warmup_steps=100, weight_decay=0.1, eval_interval=1000, beta2=0.98
    ),
    "rnn-attention": dict(
        max_steps=6000, batch_size=64, lr=2e-3, warmup_steps=100, weight_decay=0.0, eval_interval=500
    ),
}
# Text lines (digits-strips: 8 px tall) are read best in full-height columns: patches of 8 x 4 over the
# stem's features gave 94.9% exact match where 4 x 4 gave 93.4% (6,000 steps), at half the tokens,
# and every digit word's attention on its digit. Used when no --patch-size or --patch-width is given.
LINE_PATCH = {"patch_size": strips.HEIGHT, "patch_width": 4}


def model_config(name: str, vocab: int, shape: tuple[int, ...], max_len: int, overrides: dict) -> Any:
    """The model's config: a preset, the user's overrides, and what the data decides (vocabulary,
    image size and channels, the caption length)."""
    choice = Captioning.models[name]
    overrides = dict(overrides)
    c, h, w = shape
    sizes: dict[str, Any] = {"tgt_vocab": vocab, "channels": c, "image_size": h, "image_width": w}
    line = h == strips.HEIGHT and w % LINE_PATCH["patch_width"] == 0
    base, context = decoder_preset(choice, overrides, max_len, "the RNN")
    if line and not {"patch_size", "patch_width"} & set(overrides):
        base.update(LINE_PATCH)
    return build_config(name, choice.config, base, overrides, {**sizes, **context})


def caption_tokens(tok: Tokenizer, caption: str) -> list[str]:
    """The caption as its tokens' texts: what exact match compares, so spacing never counts."""
    return [tok.decode([int(i)]) for i in tok.encode_array(caption)]


class Captioning(Task):
    name = "caption"
    help = "image -> words: a ViT encoder with a Transformer decoder, or Show, Attend and Tell's RNN"
    description = (
        "Train a captioner on images with captions (the built-in digits-strips, or a folder with "
        "captions.jsonl), then caption its test split: exact match, BLEU, chrF."
    )
    models = {
        "transformer": ModelChoice("captioner", CaptionerConfig, presets=PRESETS, default_preset="captioner-tiny"),
        "rnn-attention": ModelChoice("rnn-captioner", RNNCaptionerConfig),
    }
    default_model = "transformer"
    data_config = CaptionDataConfig
    noun = "a captioner"
    endpoint = "/api/caption"
    reads_images = True
    tokenized = True
    set_by_data = frozenset({"tgt_vocab", "channels", "image_size", "image_width", "src_vocab"})
    tuned = TRAIN_DEFAULTS

    def setup(self, req: TrainRequest) -> dict[str, str]:
        if req.init is not None:  # fine-tuning keeps the init run's vocabulary
            return {TOKENIZER: (Path(req.init) / TOKENIZER).read_text(encoding="utf-8")}
        _, captions = load_captions(req.data)["train"]
        return {TOKENIZER: train_tokenizer("word", captions, req.data.vocab_size).to_json()}

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        out, data = Path(req.out), req.data
        splits = load_captions(data)
        tok = load_tokenizer(out)
        cfg = model_config(
            req.model, tok.vocab_size + N_SPECIAL, splits["train"][0].shape[1:], data.max_len, self.model_fields(req)
        )
        targets = {name: [to_ids(tok, c)[: data.max_len] for c in caps] for name, (_, caps) in splits.items()}
        max_out = min(data.max_len, 2 * max(len(t) for t in targets["train"]) + 2)
        family = self.models[req.model].family
        config = config_json(req, family, cfg, {"kind": self.name, "model": req.model, "max_out": max_out})

        batches = ImagePairs({k: v[0] for k, v in splits.items()}, targets, data.shift, data.shift_share)
        return Prepared(batches, init_builder(family, cfg, req), config, state=(splits["test"], tok, max_out, data))

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any]:
        (images, captions), tok, max_out, data = prepared.state
        hyps = caption_ids(s.raw, images, max_out, device=s.device, progress=req.progress and s.dist.main)
        return {"decoding": "greedy", **caption_scores(tok, hyps, captions), **word_regions(s.raw, tok, hyps, data)}

    def test_line(self, t: dict[str, Any]) -> str:
        where = f", attention on the word's digit {t['attention_on_digit']:.1%}" if "attention_on_digit" in t else ""
        return scores_line(t) + where

    def next_step(self, out: str) -> str:
        return f". Try: attnlab predict {out} IMAGE.png --attention words.png"

    # ---- a trained run ------------------------------------------------------------------------
    def predict(self, run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        """text: an image file; options: beam, attention (a picture of where each word looked)."""
        beam, picture = options.get("beam") or 1, options.get("attention")
        pixels = read_image(text, run.model.cfg.size, run.model.cfg.channels)  # (C, H, W)
        words, weights = caption_attention(run, pixels, beam)
        caption = " ".join(words[:-1])
        if picture:
            title = f"{run.config['task']['model']}: {Path(text).name} -> {caption!r}"
            draw = write_caption_html if Path(picture).suffix.lower() in (".html", ".htm") else plot_caption_attention
            draw(pixels, words, weights, run.model.cfg.grid, picture, title)
        return {
            "kind": self.name,
            "image": str(text),
            "caption": caption,
            **({"attention": str(picture)} if picture else {}),
        }

    def show_prediction(self, result: dict[str, Any]) -> str:
        return result["caption"] + (f"\nattention: {result['attention']}" if result.get("attention") else "")

    def evaluate(self, run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        return evaluate_captions(
            run, data, split or "test", options.get("beam") or 1, progress=options.get("progress", True)
        )

    def show_evaluation(self, r: dict[str, Any]) -> str:
        return show_scores(r, "images") + _where(r)

    def image(self, run: Run, path: str | Path) -> np.ndarray:
        return read_image(path, run.model.cfg.size, run.model.cfg.channels)  # (C, H, W)

    def stream_image(self, run: Run, pixels: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
        return stream_caption(run, pixels)


def caption_ids(
    model: nn.Module,
    images: np.ndarray,
    max_len: int,
    beam: int = 1,
    batch_size: int = 256,
    device=None,
    progress: bool = False,
) -> list[list[int]]:
    """Decoded caption ids for each image of (N, C, H, W) (greedy when beam is 1; progress: a bar on stderr)."""
    return decode_all(model, images, torch.from_numpy, max_len, beam, batch_size, device, progress)


def caption_attention(run, pixels: np.ndarray, beam: int = 1) -> tuple[list[str], np.ndarray]:
    """Caption one image (C, H, W) and say where each word looked: the words (the last one </s>) and
    the cross-attention (L, H, T, N) of teacher-forced decoding on that caption (the RNN: L = H = 1)."""
    images = torch.from_numpy(pixels)[None].to(run.device)  # (1, C, H, W)
    (hyp,) = caption_ids(run.model, pixels[None], run.config["task"]["max_out"], beam)
    tgt_in = torch.tensor([[BOS_ID, *hyp]], device=run.device)
    return pieces(run.tokenizer, [*hyp, EOS_ID]), cross_attention(run, images, tgt_in)


def stream_caption(run: Run, pixels: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """Caption one image (C, H, W) greedily, a word at a time as each is chosen: (word, where it looked
    (L, H, N)), the last word </s>. Decoded by the model's engine, with its cache (the words are
    greedy decoding's, caption_attention's); a caption that reaches max_out still ends, with </s>."""
    images = torch.from_numpy(pixels)[None]  # (1, C, H, W)
    most = run.config["task"]["max_out"]
    steps = engine_for(run.model).generate([BOS_ID], Draw(temperature=0.0), most + 1, attention=True, source=images)
    for n, step in enumerate(steps):
        token = step.token if n < most else EOS_ID
        yield pieces(run.tokenizer, [token])[0], step.attention
        if token == EOS_ID:
            return


def caption_scores(tok: Tokenizer, hyps: list[list[int]], captions: list[str]) -> dict[str, Any]:
    """Exact match of the word sequences, BLEU and chrF of the captions as words joined by spaces."""
    hyp = [" ".join(pieces(tok, h)) for h in hyps]
    ref = [" ".join(caption_tokens(tok, c)) for c in captions]
    return scores(hyp, ref)


def evaluate_captions(
    run, data: str | None = None, split: str = "test", beam: int = 1, progress: bool = False
) -> dict[str, Any]:
    """Exact match, BLEU, chrF and loss of a trained run on a split of its data, or on other data."""
    cfg = from_dict(CaptionDataConfig, run.config["data"], where="data config")
    if data is not None:
        cfg = dataclasses.replace(cfg, data=data)
    model_cfg = run.model.cfg
    images, captions = load_captions(cfg, model_cfg.size, model_cfg.channels)[split]
    hyps = caption_ids(run.model, images, run.config["task"]["max_out"], beam, progress=progress)
    targets = [to_ids(run.tokenizer, c)[: cfg.max_len] for c in captions]
    loss = teacher_forced_loss(run.model, ImagePairs({split: images}, {split: targets}), split)
    where = (
        word_regions(run.model, run.tokenizer, hyps, cfg, split)
        if model_cfg.size == (strips.HEIGHT, strips.WIDTH)
        else {}
    )
    return {
        "data": cfg.data,
        "split": split,
        "beam": beam,
        **caption_scores(run.tokenizer, hyps, captions),
        "loss": loss,
        **where,
    }


def _where(r: dict[str, Any]) -> str:
    if "attention_on_digit" not in r:
        return ""
    return (
        f"\n  attention on the word's digit {r['attention_on_digit']:.2%} of {r['attention_words']:,} digit words, "
        f"{r['attention_other_words']:.2%} of {r['attention_others']:,} others ({r['attention_strips']:,} strips "
        "captioned right)"
    )


def word_regions(
    model: nn.Module, tok: Tokenizer, hyps: list[list[int]], data: CaptionDataConfig, split: str = "test"
) -> dict[str, Any]:
    """On digits-strips, whether each word looked at its digit (interpret/word_regions.py); {} on other data."""
    if data.data not in BUILTIN_CAPTIONS:  # only generated strips know where each digit is
        return {}
    count = {"train": data.n_train, "test": data.n_test}.get(split)
    return digit_attention(model, tok, strips.strips(split, count, data.data_seed), hyps)
