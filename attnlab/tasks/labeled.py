"""What classification and tagging share: a label per text (tasks/classify.py) or per token
(tasks/tag.py), with the encoder or any baseline, through the shared engine.

setup:   word tokenizer (or the --init run's)
prepare: examples encoded by the task (its `encode_one`), the model sized to the data
finish:  test-set scores in eval.json and a confusion matrix in confusion.png
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.config import from_dict, option
from attnlab.data.batches import IGNORE, Examples
from attnlab.data.labeled import BUILTIN_TASKS, FORMATS, SPLIT_NAMES, LabeledDataConfig, load_splits
from attnlab.data.tokenizers import WordPieceTokenizer, WordTokenizer, load_tokenizer
from attnlab.data.unknown import unknown_share, warn_unknown
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.errors import AttnlabError
from attnlab.interpret.views import self_attention_view
from attnlab.models import build_model, family_classes
from attnlab.models.attention_ladder import LADDER
from attnlab.models.baselines import BASELINES
from attnlab.models.encoder import PRESETS as ENCODER_PRESETS
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.protocols import WordEmbedded
from attnlab.runs.folder import TOKENIZER, check_run_dir, read_run_config
from attnlab.runs.marker import record
from attnlab.runs.run import Run
from attnlab.runtime.distributed import Dist
from attnlab.tasks.base import ModelChoice, Task, load_body
from attnlab.tasks.common import build_config, config_json, preset_fields
from attnlab.tasks.metrics import confusion, scores, warn_small_split
from attnlab.tasks.text_predict import probabilities, words_and_ids
from attnlab.viz.confusion import plot_confusion
from attnlab.wordvec.embedding import load_word_vectors

# Settings that train each model well on the built-in tasks in a few minutes on a laptop CPU.
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "encoder": dict(max_steps=1500, batch_size=64, lr=1e-3, warmup_steps=100, weight_decay=0.01, eval_interval=250),
    "bow": dict(max_steps=1500, batch_size=64, lr=3e-3, warmup_steps=50, weight_decay=0.0, eval_interval=250),
}
for _name in [*BASELINES, *LADDER]:
    TRAIN_DEFAULTS.setdefault(_name, dict(TRAIN_DEFAULTS["bow"]))


@dataclass
class LabeledOptions:
    word_vectors: str | None = option(None, "GloVe or word2vec text file", metavar="FILE")
    freeze_vectors: bool = option(False, "keep the loaded word vectors fixed")


def label_id(label_ids: dict[str, int], label: str, split: str) -> int:
    if label not in label_ids:
        raise AttnlabError(f"unknown label {label!r} in the {split} split (training labels: {', '.join(label_ids)})")
    return label_ids[label]


class Labeled(Task):
    """A label per text or per token: the encoder or a baseline, its head fixed by the task."""

    default_model = "encoder"
    data_config = LabeledDataConfig
    options = LabeledOptions
    fixed_options = {"freeze_vectors": "a frozen embedding stays out of the optimizer"}
    preset_help = f"encoder preset: {', '.join(ENCODER_PRESETS)}"
    set_by_data = frozenset({"vocab_size", "n_labels", "task", "head", "context"})
    tuned = TRAIN_DEFAULTS
    init_help = "start the encoder from a masked-LM run (or a converted BERT)"
    pooled = True  # one label per text, from the sequence pooled (classify); False: per token (tag)
    cls_first = True  # attnlab's own encoders read [CLS] before the text

    def __init__(self) -> None:
        # The encoder's head and a baseline's task are this task: the models it trains predict what it labels.
        encoder = ModelChoice("encoder", EncoderConfig, (("head", self.name),), ENCODER_PRESETS, "encoder-tiny")
        self.models = {
            "encoder": encoder,
            **{
                name: ModelChoice(name, cls, (("task", self.name),))
                for name, (cls, _) in {**BASELINES, **LADDER}.items()
            },
        }

    def default_data(self) -> LabeledDataConfig:
        """The task's own generated data when --data is not given: classify sentiment, tag tagging."""
        return LabeledDataConfig(data=FORMATS[self.name].builtin)

    # ---- what a task of labels says -------------------------------------------------------------
    def labels_of(self, train: list) -> set[str]:
        raise NotImplementedError

    def texts(self, train: list) -> list[str]:
        """What the word tokenizer is trained on."""
        raise NotImplementedError

    def encode_one(self, tok, example: tuple, label_ids: dict[str, int], split: str) -> tuple[list[int], Any]:
        """(token ids, label ids) of one example."""
        raise NotImplementedError

    def answer(self, words: list[str], probs: torch.Tensor, first: int, labels: list[str]) -> dict[str, Any]:
        raise NotImplementedError

    def setup(self, req: TrainRequest) -> dict[str, str]:
        splits = load_splits(req.data, self.name)
        self.label_set(splits["train"])  # before anything is written: one label is an error
        if not req.init:
            return {TOKENIZER: WordTokenizer.train(self.texts(splits["train"]), req.data.vocab_size).to_json()}
        tok = init_tokenizer(req.init)  # the pretrained run's vocabulary, which may not cover this data
        warn_unknown(
            tok,
            unknown_share(tok, self.texts(splits["train"])),
            f"--data {req.data.data}",
            f"fine-tuning from {req.init} learns from {tok.unk_name} in their place",
        )
        return {TOKENIZER: tok.to_json()}

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        splits = load_splits(req.data, self.name)
        labels = self.label_set(splits["train"])
        label_ids = {y: i for i, y in enumerate(labels)}
        tok = load_tokenizer(Path(req.out))
        overrides = req.model_config if req.resume else init_overrides(req.init, req.model_config, self.pooled)
        cfg = self.model_config(req.model, tok.vocab_size, len(labels), req.data.max_len, overrides)
        encoded = {name: self.encode(tok, ex, label_ids, req.data.max_len, name) for name, ex in splits.items()}
        vectors, freeze = req.options.word_vectors, req.options.freeze_vectors  # a resumed run's own
        task_info = {"kind": self.name, "labels": labels, "init": str(req.init or ""), "freeze_vectors": freeze}
        config = config_json(req, req.model, cfg, task_info)

        def build() -> nn.Module:
            net = build_model(req.model, cfg)
            if req.init and not req.resume:
                if not isinstance(net, Encoder):
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
        confusion_png(s.run, test, f"{req.model} on {req.data.data}: test")

    def test_line(self, t: dict[str, Any]) -> str:
        return f"test: accuracy {t['accuracy']:.4f}, macro-F1 {t['macro_f1']:.4f}"

    def next_step(self, out: str) -> str:
        return f'. Try: attnlab predict {out} "some text"'

    # ---- a trained run ------------------------------------------------------------------------
    def predict(self, run: Run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        words, ids, first = words_and_ids(run, text, cls_first=self.cls_first)
        probs = probabilities(run, ids)  # classify (L,), tag (T, L)
        return {"kind": self.name, **self.answer(words, probs, first, run.config["task"]["labels"])}

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
        if data is not None:
            warn_unknown(
                run.tokenizer,
                unknown_share(run.tokenizer, self.texts(examples)),
                data,
                "the scores are the model's on what it can read",
            )
        max_len = min(cfg.max_len, run.model.cfg.context)  # a converted model may read less than the default
        ids, ys = self.encode(run.tokenizer, examples, {y: i for i, y in enumerate(labels)}, max_len, split)
        result = score(run.model, Examples({split: ids}, {split: ys}), split, labels, run.device)
        return {"data": cfg.data, "split": split, "examples": len(examples), **result}

    def show_evaluation(self, r: dict[str, Any]) -> str:
        return show_scores(r, "examples")

    def views(self, run: Run, text: str) -> list:
        if not isinstance(run.model, Encoder):  # the baselines have no attention to show
            return super().views(run, text)
        _, ids, _ = words_and_ids(run, text, cls_first=self.cls_first)
        return [self_attention_view(run, ids)]

    # ---- data and model -------------------------------------------------------------------------
    def label_set(self, train: list) -> list[str]:
        found = self.labels_of(train)
        if len(found) < 2:  # accuracy would be 1.0 and mean nothing
            only = f"only {next(iter(found))!r}" if found else "none"
            raise AttnlabError(f"the training data has one label ({only}): a {self.name} model needs at least two")
        return sorted(found)

    def model_config(self, name: str, vocab_size: int, n_labels: int, max_len: int, overrides: dict) -> Any:
        """The model's config: its defaults (the encoder: a preset), the user's overrides, and the sizes
        that come from the data."""
        if name not in self.models:
            raise AttnlabError(f"unknown model {name!r}; choose from {', '.join(self.models)}")
        choice, overrides = self.models[name], dict(overrides)
        context = overrides.pop("context", None) or max(max_len, 1)  # a pretrained encoder keeps its own
        if max_len > context:
            raise AttnlabError(f"--max-len {max_len} is beyond the pretrained encoder's context of {context}")
        sizes = {"vocab_size": vocab_size, "n_labels": n_labels, "context": context, **dict(choice.fixed)}
        base = (
            preset_fields(choice.presets, overrides.pop("preset", None), choice.default_preset, name)
            if choice.presets
            else {}
        )
        return build_config(name, choice.config, base, overrides, sizes)

    def encode(self, tok, examples: list, label_ids: dict[str, int], max_len: int, split: str):
        """Token ids and label ids of examples; texts longer than max_len are cut (one warning per split)."""
        seqs, labels, cut = [], [], 0
        for example in examples:
            ids, y = self.encode_one(tok, example, label_ids, split)
            cut += len(ids) > max_len
            seqs.append(np.array(ids[:max_len] or [tok.unk_id], dtype=np.int64))
            labels.append(y if self.pooled else y[:max_len])
        if cut:
            warnings.warn(
                f"{cut} {split} examples longer than {max_len} tokens were truncated (raise --max-len)", stacklevel=2
            )
        return seqs, labels


def show_scores(r: dict[str, Any], unit: str) -> str:
    """Accuracy, macro-F1 and each class's precision and recall, as eval prints them."""
    lines = [
        f"{r['data']} ({r['split']}): {r['examples']:,} {unit}",
        f"  accuracy  {r['accuracy']:.4f}\n  macro-F1  {r['macro_f1']:.4f}",
    ]
    for name, c in r["per_class"].items():
        lines.append(f"  {name:<12} precision {c['precision']:.3f}  recall {c['recall']:.3f}  support {c['support']}")
    return "\n".join(lines)


def init_tokenizer(init: str | Path) -> WordTokenizer | WordPieceTokenizer:
    """The tokenizer of the --init run (attnlab's MLM runs, converted BERTs)."""
    tok = load_tokenizer(check_run_dir(init))
    if not isinstance(tok, (WordTokenizer, WordPieceTokenizer)):
        raise AttnlabError(f"--init {init}: its tokenizer is not a word or WordPiece tokenizer")
    return tok


def init_overrides(init, overrides: dict | None, pooled: bool) -> dict:
    """With --init, the architecture is the pretrained run's; only dropout and pooling may change.
    BERT's pooler (a converted classifier's) serves a pooled head only: a tagger leaves it out."""
    overrides = dict(overrides or {})
    if not init:
        return overrides
    base = read_run_config(check_run_dir(init))
    if not issubclass(family_classes(base["family"])[1], Encoder):
        raise AttnlabError(f"--init {init} is not an encoder run (family {base.get('family')!r})")
    keep = {k: v for k, v in base["model"].items() if k not in ("head", "n_labels", "vocab_size")}
    if not pooled:
        keep["pooler"] = False
    return {**keep, **{k: v for k, v in overrides.items() if k in ("dropout", "pooling")}}


def _load_vectors(model: nn.Module, path, tok: WordTokenizer, freeze: bool, report: bool) -> None:

    if not isinstance(model, WordEmbedded) or model.word_embedding is None:
        raise AttnlabError("--word-vectors: this model has no word embedding (bow reads word counts)")
    found, missing = load_word_vectors(model.word_embedding, path, tok.itos, freeze)
    if report:
        words = tok.vocab_size - len(tok.specials)
        print(
            f"word vectors: {found:,} of {words:,} vocabulary words found in {path}, {len(missing):,} missing"
            + (f" (e.g. {', '.join(missing[:5])})" if missing else "")
        )


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
    m = confusion(gold, pred, len(labels))
    warn_small_split(split, len(batches.seqs[split]), m, labels)
    return scores(m, labels)


def confusion_png(run: Path, result: dict, title: str) -> None:
    record(run, "confusion.png")
    plot_confusion(np.array(result["confusion"]), result["labels"], run / "confusion.png", title)
