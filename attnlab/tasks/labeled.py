"""Sequence classification and token tagging, with the encoder or any baseline, through the shared loop.

train_labeled("runs/sent", "classify", "encoder", data=LabeledDataConfig(data="sentiment"))
  -> word tokenizer (or the --init run's), examples encoded as [CLS] + words (classify) or words (tag)
  -> training.start + training.loop, as for every task
  -> test-set scores in eval.json and a confusion matrix in confusion.png
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.engine import rundir as ck
from attnlab.engine import distributed
from attnlab.engine import loop as training
from attnlab.config import from_dict
from attnlab.data.batches import IGNORE, Examples
from attnlab.data.labeled import BUILTIN_TASKS, SPLIT_NAMES, LabeledDataConfig, load_splits
from attnlab.errors import AttnlabError
from attnlab.tasks.metrics import confusion, scores
from attnlab.models.baselines import BASELINES
from attnlab.models.encoder import PRESETS as ENCODER_PRESETS
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.tasks.common import build_config, preset_fields
from attnlab.data.tokenizers import WordPieceTokenizer, WordTokenizer, load_tokenizer
from attnlab.engine.loop import TrainConfig

# model name -> (config class, model class); the run's config.json names its family with these.
MODELS: dict[str, tuple[type, type[nn.Module]]] = {"encoder": (EncoderConfig, Encoder), **BASELINES}
# Settings that train each model well on the built-in tasks in a few minutes on a laptop CPU.
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "encoder": dict(max_steps=1500, batch_size=64, lr=1e-3, warmup_steps=100, weight_decay=0.01, eval_interval=250),
    "bow": dict(max_steps=1500, batch_size=64, lr=3e-3, warmup_steps=50, weight_decay=0.0, eval_interval=250),
}
for _name in BASELINES:
    TRAIN_DEFAULTS.setdefault(_name, dict(TRAIN_DEFAULTS["bow"]))


def model_config(name: str, task: str, vocab_size: int, n_labels: int, max_len: int, overrides: dict) -> Any:
    """The model's config: its defaults (the encoder: a preset), the user's overrides, and the sizes
    that come from the data."""
    if name not in MODELS:
        raise AttnlabError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    overrides = dict(overrides)
    context = overrides.pop("context", None) or max(max_len, 1)  # a pretrained encoder keeps its own
    if max_len > context:
        raise AttnlabError(f"--max-len {max_len} is beyond the pretrained encoder's context of {context}")
    sizes: dict[str, Any] = {"vocab_size": vocab_size, "n_labels": n_labels, "context": context}
    if name == "encoder":
        base = preset_fields(ENCODER_PRESETS, overrides.pop("preset", None), "encoder-tiny", "encoder")
        sizes["head"] = task
    else:
        base, sizes["task"] = {}, task
    return build_config(name, MODELS[name][0], base, overrides, sizes)


def encode(tok: WordTokenizer, examples: list, task: str, label_ids: dict[str, int], max_len: int, split: str):
    """Token ids and label ids of examples; texts longer than max_len are cut (one warning per split).
    A converted BERT's WordPiece tokenizer frames every input as [CLS] pieces [SEP], as BERT was
    trained, and a tagged word's label sits on its first piece (the others carry none)."""
    wraps = getattr(tok, "wraps", False)
    seqs, labels, cut = [], [], 0
    for text, label in examples:
        if task == "classify":
            ids = [tok.cls_id] + tok.encode(text) + [tok.sep_id] * wraps
            y = _label_id(label_ids, label, split)
        else:
            ids, y = _tagged(tok, text, [_label_id(label_ids, t, split) for t in label])
        cut += len(ids) > max_len
        seqs.append(np.array(ids[:max_len] or [tok.unk_id], dtype=np.int64))
        labels.append(y if task == "classify" else y[:max_len])
    if cut:
        warnings.warn(
            f"{cut} {split} examples longer than {max_len} tokens were truncated (raise --max-len)", stacklevel=2
        )
    return seqs, labels


def _tagged(tok, words: list[str], tags: list[int]) -> tuple[list[int], np.ndarray]:
    """(ids, labels) of a tagged sentence: one id per word (attnlab's word tokenizer), or the
    words' pieces framed by [CLS] ... [SEP] with each tag on its word's first piece (WordPiece)."""
    if not getattr(tok, "wraps", False):
        return tok.encode_words(words), np.array(tags, dtype=np.int64)
    ids, y = [tok.cls_id], [IGNORE]
    for word, tag in zip(words, tags):
        pieces = tok.encode_words(tok.split(word)) or [tok.unk_id]
        ids += pieces
        y += [tag] + [IGNORE] * (len(pieces) - 1)
    return ids + [tok.sep_id], np.array(y + [IGNORE], dtype=np.int64)


def _label_id(label_ids: dict[str, int], label: str, split: str) -> int:
    if label not in label_ids:
        raise AttnlabError(f"unknown label {label!r} in the {split} split (training labels: {', '.join(label_ids)})")
    return label_ids[label]


def label_set(train: list, task: str) -> list[str]:
    found = {y for _, y in train} if task == "classify" else {t for _, tags in train for t in tags}
    return sorted(found)


def train_labeled(
    out: str | Path,
    task: str,
    model: str = "encoder",
    model_overrides: dict | None = None,
    train: TrainConfig | None = None,
    data: LabeledDataConfig | None = None,
    init: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    word_vectors: str | Path | None = None,
    freeze_vectors: bool = False,
) -> dict:
    """Train a classifier (task "classify") or tagger ("tag") into run directory `out`; returns
    the final losses and the test-set scores. init: a masked-LM run whose encoder (and
    tokenizer) to start from. word_vectors: a GloVe/word2vec text file for the word embedding."""
    data = data or LabeledDataConfig()
    train = train or TrainConfig(**TRAIN_DEFAULTS.get(model, {}))
    run = Path(out)
    d, device = distributed.init(train.device)
    training._check_dir(run, False, force)
    splits = load_splits(data, task)
    labels = label_set(splits["train"], task)
    label_ids = {y: i for i, y in enumerate(labels)}
    tok = _tokenizer(init, splits["train"], task, data.vocab_size, model)
    overrides = _init_overrides(init, model_overrides, task)
    cfg = model_config(model, task, tok.vocab_size, len(labels), data.max_len, overrides)
    encoded = {name: encode(tok, ex, task, label_ids, data.max_len, name) for name, ex in splits.items()}
    task_info = {"kind": task, "labels": labels, "init": str(init or "")}
    config = {"family": model, "model": dataclasses.asdict(cfg), "train": dataclasses.asdict(train),
              "data": dataclasses.asdict(data), "task": task_info}  # fmt: skip
    if d.main:
        training._fresh_dir(run)
        ck.write_text(run / ck.TOKENIZER, tok.to_json())
    distributed.barrier(d)

    def build() -> nn.Module:
        net = _build(model, cfg, init)
        if word_vectors:
            _load_vectors(net, word_vectors, tok, freeze_vectors, d.main)
        return net

    batches = Examples({k: v[0] for k, v in encoded.items()}, {k: v[1] for k, v in encoded.items()})
    s = training.start(run, build, batches, train, config, d, device, resume=False, command=task)
    t0 = time.perf_counter()
    try:
        result = training.loop(s, progress)
        result["train_seconds"] = time.perf_counter() - t0
        result["parameters"] = sum(p.numel() for p in s.raw.parameters())
        result["test"] = score(s.raw, batches, "test", labels, device)
        if d.main:
            ck.write_json(run / "eval.json", {"split": "test", **result["test"]})
            _confusion_png(run, result["test"], f"{model} on {data.data}: test")
    finally:
        distributed.shutdown(d)
    return result


def _tokenizer(init, train: list, task: str, vocab_size: int, model: str) -> WordTokenizer:
    if init:
        tok = load_tokenizer(ck.check_run_dir(init))
        if not isinstance(tok, (WordTokenizer, WordPieceTokenizer)):  # attnlab's MLM runs, converted BERTs
            raise AttnlabError(f"--init {init}: its tokenizer is not a word or WordPiece tokenizer")
        return tok
    texts = (t if task == "classify" else " ".join(t) for t, _ in train)
    return WordTokenizer.train(texts, vocab_size)


def _init_overrides(init, overrides: dict | None, task: str = "classify") -> dict:
    """With --init, the architecture is the pretrained run's; only dropout and pooling may change.
    BERT's pooler (a converted classifier's) serves classification only: a tagger leaves it out."""
    overrides = dict(overrides or {})
    if not init:
        return overrides
    base = ck.read_run_config(ck.check_run_dir(init))
    if base.get("family") != "encoder":
        raise AttnlabError(f"--init {init} is not an encoder run (family {base.get('family')!r})")
    keep = {k: v for k, v in base["model"].items() if k not in ("head", "n_labels", "vocab_size")}
    if task != "classify":
        keep["pooler"] = False
    return {**keep, **{k: v for k, v in overrides.items() if k in ("dropout", "pooling")}}


def _load_vectors(model: nn.Module, path, tok: WordTokenizer, freeze: bool, report: bool) -> None:
    from attnlab.data.vectors import load_word_vectors

    if getattr(model, "word_embedding", None) is None:
        raise AttnlabError("--word-vectors: this model has no word embedding (bow reads word counts)")
    found, missing = load_word_vectors(model.word_embedding, path, tok.itos, freeze)
    if report:
        words = tok.vocab_size - len(tok.specials)
        print(f"word vectors: {found:,} of {words:,} vocabulary words found in {path}, {len(missing):,} missing"
              + (f" (e.g. {', '.join(missing[:5])})" if missing else ""))  # fmt: skip


def _build(name: str, cfg: Any, init) -> nn.Module:
    model = MODELS[name][1](cfg)
    if init:
        if name != "encoder":
            raise AttnlabError("--init starts an encoder from a masked-LM run: use --model encoder")
        tensors, _ = ck.read_safetensors(Path(init) / ck.WEIGHTS)
        body = {k: v for k, v in tensors.items() if not k.startswith(("out.", "transform"))}
        missing, _ = model.load_state_dict(body, strict=False)
        if any(not k.startswith("out.") for k in missing):
            raise AttnlabError(f"--init {init}: weights do not fit this encoder (missing {missing[0]})")
    return model


@torch.no_grad()
def predict_batches(model: nn.Module, batches: Examples, split: str, device, batch_size: int = 256):
    """(gold, predicted) label ids over a whole split, padding excluded for tagging."""
    model.eval()
    gold, pred = [], []
    n = len(batches.seqs[split])
    for start in range(0, n, batch_size):
        ids, y = batches.collate(split, range(start, min(n, start + batch_size)))
        p = model(ids.to(device)).argmax(-1).cpu()
        keep = y != IGNORE
        gold.append(y[keep])
        pred.append(p[keep])
    return torch.cat(gold).numpy(), torch.cat(pred).numpy()


def score(model: nn.Module, batches: Examples, split: str, labels: list[str], device) -> dict:
    gold, pred = predict_batches(model, batches, split, device)
    return scores(confusion(gold, pred, len(labels)), labels)


def evaluate_labeled(run, data: str | None = None, split: str = "test") -> dict:
    """Scores of a trained classifier or tagger `run` (attnlab.load) on a split of its data or of `data`
    (a built-in task or a file, read whole when given)."""
    kind, labels = run.config["task"]["kind"], run.config["task"]["labels"]
    cfg = from_dict(LabeledDataConfig, run.config["data"], where="data config")
    if data is not None:  # a file given here is the split to score, whole
        cfg = dataclasses.replace(cfg, data=data, val=data, test=data)
        split = split if data in BUILTIN_TASKS else "test"
    if split not in SPLIT_NAMES:
        raise AttnlabError(f"unknown split {split!r}: use {', '.join(SPLIT_NAMES)}")
    examples = load_splits(cfg, kind)[split]
    max_len = min(cfg.max_len, run.model.cfg.context)  # a converted model may read less than the default
    ids, ys = encode(run.tokenizer, examples, kind, {y: i for i, y in enumerate(labels)}, max_len, split)
    result = score(run.model, Examples({split: ids}, {split: ys}), split, labels, run.device)
    return {"data": cfg.data, "split": split, "examples": len(examples), **result}


def _confusion_png(run: Path, result: dict, title: str) -> None:
    from attnlab.viz.confusion import plot_confusion

    plot_confusion(np.array(result["confusion"]), result["labels"], run / "confusion.png", title)
