"""Sequence classification and token tagging, with the encoder or any baseline, through the shared engine.

setup:   word tokenizer (or the --init run's)
prepare: examples encoded as [CLS] + words (classify) or words (tag), the model sized to the data
finish:  test-set scores in eval.json and a confusion matrix in confusion.png
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.config import add_config_flags, from_dict
from attnlab.data.batches import IGNORE, Examples
from attnlab.data.labeled import BUILTIN_TASKS, SPLIT_NAMES, LabeledDataConfig, load_splits
from attnlab.data.tokenizers import WordPieceTokenizer, WordTokenizer, load_tokenizer
from attnlab.engine.config import TrainConfig
from attnlab.engine.loop import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.interpret.views import self_attention_view
from attnlab.models import build_model
from attnlab.models.attention_ladder import LADDER
from attnlab.models.baselines import BASELINES
from attnlab.models.encoder import PRESETS as ENCODER_PRESETS
from attnlab.models.encoder import EncoderConfig
from attnlab.models.protocols import WordEmbedded
from attnlab.runs.folder import TOKENIZER, check_run_dir, read_run_config
from attnlab.runtime.distributed import Dist
from attnlab.tasks.base import ModelChoice, Task, add_model_choice_flags, load_body
from attnlab.tasks.common import build_config, preset_fields
from attnlab.tasks.metrics import confusion, scores
from attnlab.tasks.text_predict import probabilities, words_and_ids
from attnlab.viz.confusion import plot_confusion
from attnlab.wordvec.embedding import load_word_vectors

# model name (= family in config.json) -> its config class
MODEL_CLASSES: dict[str, tuple[type, Any]] = {"encoder": (EncoderConfig, None), **BASELINES, **LADDER}
# Settings that train each model well on the built-in tasks in a few minutes on a laptop CPU.
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "encoder": dict(max_steps=1500, batch_size=64, lr=1e-3, warmup_steps=100, weight_decay=0.01, eval_interval=250),
    "bow": dict(max_steps=1500, batch_size=64, lr=3e-3, warmup_steps=50, weight_decay=0.0, eval_interval=250),
}
for _name in [*BASELINES, *LADDER]:
    TRAIN_DEFAULTS.setdefault(_name, dict(TRAIN_DEFAULTS["bow"]))


def model_config(name: str, task: str, vocab_size: int, n_labels: int, max_len: int, overrides: dict) -> Any:
    """The model's config: its defaults (the encoder: a preset), the user's overrides, and the sizes
    that come from the data."""
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
    return build_config(name, MODEL_CLASSES[name][0], base, overrides, sizes)


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
    if len(found) < 2:  # accuracy would be 1.0 and mean nothing
        only = f"only {next(iter(found))!r}" if found else "none"
        raise AttnlabError(f"the training data has one label ({only}): a {task} model needs at least two")
    return sorted(found)


class Labeled(Task):
    """classify (a label per text) and tag (a label per token): one class, two registry entries."""

    models = {name: ModelChoice(name, cls) for name, (cls, _) in MODEL_CLASSES.items()}
    default_model = "encoder"
    data_config = LabeledDataConfig
    set_by_data = frozenset({"vocab_size", "n_labels", "task", "head", "context"})
    tuned = TRAIN_DEFAULTS
    init_help = "start the encoder from a masked-LM run (or a converted BERT)"

    def __init__(self, name: str, what: str, noun: str):
        self.name, self.noun = name, noun
        self.help = f"{what}: the encoder or a baseline, on a file or a generated task"
        self.description = f"Train a model that predicts {what}, then score it on the test split."

    def setup(self, req: TrainRequest) -> dict[str, str]:
        splits = load_splits(req.data, self.name)
        label_set(splits["train"], self.name)  # before anything is written: one label is an error
        return {TOKENIZER: _tokenizer(req.init, splits["train"], self.name, req.data.vocab_size).to_json()}

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        splits = load_splits(req.data, self.name)
        labels = label_set(splits["train"], self.name)
        label_ids = {y: i for i, y in enumerate(labels)}
        tok = load_tokenizer(Path(req.out))
        overrides = req.model_config if req.resume else _init_overrides(req.init, req.model_config, self.name)
        cfg = model_config(req.model, self.name, tok.vocab_size, len(labels), req.data.max_len, overrides)
        encoded = {name: encode(tok, ex, self.name, label_ids, req.data.max_len, name) for name, ex in splits.items()}
        vectors, freeze = req.options.get("word_vectors"), req.options.get("freeze_vectors", False)
        if req.saved is not None:  # a frozen embedding stays out of the optimizer, as it was
            freeze = req.saved["task"].get("freeze_vectors", False)
        task_info = {"kind": self.name, "labels": labels, "init": str(req.init or ""), "freeze_vectors": freeze}
        config = {"family": req.model, "model": dataclasses.asdict(cfg), "train": dataclasses.asdict(req.train),
                  "data": dataclasses.asdict(req.data), "task": task_info}  # fmt: skip
        if req.init:
            config["init"] = str(req.init)  # the run it started from, as every task records it

        def build() -> nn.Module:
            net = build_model(req.model, cfg)
            if req.init and not req.resume:
                if req.model != "encoder":
                    raise AttnlabError("--init starts an encoder from a masked-LM run: use --model encoder")
                load_body(net, req.init, ("out.", "transform"))
            if vectors and not req.resume:
                _load_vectors(net, vectors, tok, freeze, d.main)
            elif freeze:
                net.word_embedding.weight.requires_grad_(False)
            return net

        batches = Examples({k: v[0] for k, v in encoded.items()}, {k: v[1] for k, v in encoded.items()})
        return Prepared(batches, build, config, state=labels)

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any]:
        return score(s.raw, prepared.batches, "test", prepared.state, s.device)

    def draw_test(self, s: Session, prepared: Prepared, req: TrainRequest, test: dict[str, Any]) -> None:
        _confusion_png(s.run, test, f"{req.model} on {req.data.data}: test")

    def test_line(self, t: dict[str, Any]) -> str:
        return f"test: accuracy {t['accuracy']:.4f}, macro-F1 {t['macro_f1']:.4f}"

    def next_step(self, out: str) -> str:
        return f'. Try: attnlab predict {out} "some text"'

    # ---- a trained run ------------------------------------------------------------------------
    def predict(self, run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        words, ids, first = words_and_ids(run, text, cls_first=self.name == "classify")
        probs = probabilities(run, ids)  # classify (L,), tag (T, L)
        labels = run.config["task"]["labels"]
        if self.name == "classify":
            best = int(probs.argmax())
            return {"kind": self.name, "label": labels[best], "probability": float(probs[best]),
                    "probabilities": dict(zip(labels, probs.tolist()))}  # fmt: skip
        p, best = probs[first : first + len(words)].max(-1)  # the words' own positions
        return {"kind": self.name, "tokens": [{"token": w, "tag": labels[int(b)], "probability": float(q)}
                                              for w, b, q in zip(words, best, p)]}  # fmt: skip

    def show_prediction(self, result: dict[str, Any]) -> str:
        if self.name == "classify":
            return f"{result['label']}  ({result['probability']:.3f})"
        return "\n".join(f"{t['token']:<20} {t['tag']:<10} {t['probability']:.3f}" for t in result["tokens"])

    def evaluate(self, run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        """Scores on a split of the run's data or of `data` (a built-in task or a file, read whole)."""
        split = split or "test"
        labels = run.config["task"]["labels"]
        cfg = from_dict(LabeledDataConfig, run.config["data"], where="data config")
        if data is not None:  # a file given here is the split to score, whole
            cfg = dataclasses.replace(cfg, data=data, val=data, test=data)
            split = split if data in BUILTIN_TASKS else "test"
        if split not in SPLIT_NAMES:
            raise AttnlabError(f"unknown split {split!r}: use {', '.join(SPLIT_NAMES)}")
        examples = load_splits(cfg, self.name)[split]
        max_len = min(cfg.max_len, run.model.cfg.context)  # a converted model may read less than the default
        ids, ys = encode(run.tokenizer, examples, self.name, {y: i for i, y in enumerate(labels)}, max_len, split)
        result = score(run.model, Examples({split: ids}, {split: ys}), split, labels, run.device)
        return {"data": cfg.data, "split": split, "examples": len(examples), **result}

    def show_evaluation(self, r: dict[str, Any]) -> str:
        return show_scores(r, "examples")

    def views(self, run, text: str) -> list:

        if run.config["family"] != "encoder":
            return super().views(run, text)
        _, ids, _ = words_and_ids(run, text, cls_first=self.name == "classify")
        return [self_attention_view(run, ids)]

    # ---- command line -------------------------------------------------------------------------
    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--model", default="encoder", choices=list(self.models), help="which model (default: encoder)"
        )
        parser.add_argument("--preset", default=None, help=f"encoder preset: {', '.join(ENCODER_PRESETS)}")
        parser.add_argument("--word-vectors", default=None, metavar="FILE", help="GloVe or word2vec text file")
        parser.add_argument("--freeze-vectors", action="store_true", help="keep the loaded word vectors fixed")
        add_config_flags(parser, "data", LabeledDataConfig, "data")
        preset = dataclasses.asdict(ENCODER_PRESETS["encoder-tiny"])
        add_model_choice_flags(parser, self, preset, "encoder")

    def request(self, args: argparse.Namespace, train: TrainConfig, saved: dict | None) -> TrainRequest:
        req = super().request(args, train, saved)
        req.options = {"word_vectors": args.word_vectors, "freeze_vectors": args.freeze_vectors}
        return req


def show_scores(r: dict[str, Any], unit: str) -> str:
    """Accuracy, macro-F1 and each class's precision and recall, as eval prints them."""
    lines = [f"{r['data']} ({r['split']}): {r['examples']:,} {unit}",
             f"  accuracy  {r['accuracy']:.4f}\n  macro-F1  {r['macro_f1']:.4f}"]  # fmt: skip
    for name, c in r["per_class"].items():
        lines.append(f"  {name:<12} precision {c['precision']:.3f}  recall {c['recall']:.3f}  support {c['support']}")
    return "\n".join(lines)


def _tokenizer(init, train: list, task: str, vocab_size: int) -> WordTokenizer:
    if init:
        tok = load_tokenizer(check_run_dir(init))
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
    base = read_run_config(check_run_dir(init))
    if base.get("family") != "encoder":
        raise AttnlabError(f"--init {init} is not an encoder run (family {base.get('family')!r})")
    keep = {k: v for k, v in base["model"].items() if k not in ("head", "n_labels", "vocab_size")}
    if task != "classify":
        keep["pooler"] = False
    return {**keep, **{k: v for k, v in overrides.items() if k in ("dropout", "pooling")}}


def _load_vectors(model: nn.Module, path, tok: WordTokenizer, freeze: bool, report: bool) -> None:

    if not isinstance(model, WordEmbedded) or model.word_embedding is None:
        raise AttnlabError("--word-vectors: this model has no word embedding (bow reads word counts)")
    found, missing = load_word_vectors(model.word_embedding, path, tok.itos, freeze)
    if report:
        words = tok.vocab_size - len(tok.specials)
        print(f"word vectors: {found:,} of {words:,} vocabulary words found in {path}, {len(missing):,} missing"
              + (f" (e.g. {', '.join(missing[:5])})" if missing else ""))  # fmt: skip


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


def _confusion_png(run: Path, result: dict, title: str) -> None:

    plot_confusion(np.array(result["confusion"]), result["labels"], run / "confusion.png", title)
