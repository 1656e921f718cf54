"""A run's clean and corrupted inputs for patching, and the metric read from its output.

Legend: B batch, T positions, V vocabulary (or labels).

What a run reads is asked of its model's protocols and its run kind, never of the family's name:
    a language model (CausalLM)       token ids; the metric at the last position (the next token)
    an encoder (OneSequence)          its framed word ids; a masked LM's metric at the first [MASK],
                                      a classifier's on its class logits
    an encoder-decoder (StepDecoding) clean and corrupted sources; the decoder reads the clean
                                      source's own greedy translation in both runs, the metric at its
                                      last position (the token after it)
    an image model                    clean and corrupted image files; the metric on the classes;
                                      position 0 is [CLS], position k patch k
The metric of one output row (the logits at the chosen position, or the class logits):
    logit-diff  logit(target) - logit(wrong)      prob  p(target)      loss  -log p(target)
The target defaults to the clean run's top answer, the wrong answer to the corrupted run's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.data.shifted import pieces
from attnlab.errors import AttnlabError
from attnlab.interpret.views import token_labels
from attnlab.models.common import PatchGrid
from attnlab.models.protocols import CausalLM, OneSequence, Positioned, StepDecoding
from attnlab.runs.run import Run

METRICS = ("logit-diff", "prob", "loss")


@dataclass(frozen=True)
class AnswerMetric:
    """The metric of the model's output (B, T, V) at `position`, or of (B, V) when position is None."""

    kind: str
    target: int
    wrong: int | None = None
    position: int | None = None

    def __post_init__(self):
        if self.kind not in METRICS:
            raise AttnlabError(f"--metric {self.kind!r}: one of {', '.join(METRICS)}")
        if self.kind == "logit-diff" and self.wrong is None:
            raise AttnlabError("the logit difference needs a wrong answer beside the target (--wrong)")

    def __call__(self, out: Tensor) -> Tensor:
        z = out if self.position is None else out[:, self.position]  # (B, V)
        z = z.to(torch.promote_types(z.dtype, torch.float32))  # bf16 logits read in float32, float64 kept
        if self.kind == "logit-diff":
            return z[:, self.target] - z[:, self.wrong]
        logp = F.log_softmax(z, dim=-1)[:, self.target]
        return logp.exp() if self.kind == "prob" else -logp


@dataclass
class Pair:
    """What patching needs of a run: both inputs (each (1, ...)), each stack's position labels, the
    names of the output's classes (tokens or labels) and where the metric reads."""

    clean: tuple
    corrupted: tuple
    labels: dict[str, list[str]]
    names: list[str]
    position: int | None

    def answer(self, text: str | None, default: int, flag: str) -> int:
        """The output class named `text` (a token or a label), or `default` when none is named."""
        if text is None:
            return default
        for candidate in (text, text.strip(), text.replace("·", " ")):
            if candidate in self.names:
                return self.names.index(candidate)
        raise AttnlabError(
            f"{flag} {text!r}: not a single token or label of this run's output "
            f"(e.g. {', '.join(repr(n) for n in self.names[:5])})"
        )


def _device(run: Run) -> torch.device:
    return next(run.model.parameters()).device


def _ids(run: Run, ids: list[int]) -> Tensor:
    return torch.tensor([ids], device=_device(run))  # (1, T)


def _language_model(run: Run, clean: str, corrupted: str) -> Pair:
    tok, context = run.tokenizer, run.model.cfg.context
    a, b = tok.encode(clean)[-context:], tok.encode(corrupted)[-context:]
    if not a:
        raise AttnlabError("the clean text has no tokens")
    names = [tok.decode([i]) for i in range(tok.vocab_size)]
    return Pair((_ids(run, a),), (_ids(run, b),), {"blocks": token_labels(tok, a)}, names, len(a) - 1)


def _framed(run: Run, text: str, cls_first: bool) -> list[int]:
    """An encoder's input: the text's word ids, [CLS] first where the model pools from it (or its
    tokenizer frames every input, as a converted BERT's does), [SEP] last where it frames."""
    tok = run.tokenizer
    pieces = tok.encode_words(tok.split(text, tok.lower))
    first = [tok.cls_id] if cls_first or tok.wraps else []
    return (first + pieces + [tok.sep_id] * tok.wraps)[: run.model.cfg.context]


def _encoder(run: Run, clean: str, corrupted: str) -> Pair:
    tok, head = run.tokenizer, run.model.task_head
    if not hasattr(tok, "encode_words"):
        raise AttnlabError(f"{run.path}: an encoder run without a word tokenizer cannot be patched")
    a, b = _framed(run, clean, head.pooled), _framed(run, corrupted, head.pooled)
    labels = {"blocks": token_labels(tok, a)}
    if head.over_vocabulary:  # a masked LM: the answer at the first [MASK]
        if tok.mask_id not in a:
            raise AttnlabError("a masked-LM run is patched at its [MASK]: put [MASK] in the clean text")
        names = [tok.decode([i]) for i in range(tok.vocab_size)]
        return Pair((_ids(run, a),), (_ids(run, b),), labels, names, a.index(tok.mask_id))
    if not head.pooled:
        raise AttnlabError(
            f"{run.path}: a tagger answers at every token; patching reads one answer (a masked "
            "LM's [MASK], a classifier's class)"
        )
    return Pair((_ids(run, a),), (_ids(run, b),), labels, list(run.config["task"]["labels"]), None)


def _translation(run: Run, clean: str, corrupted: str) -> Pair:
    tgt_in, src, decode = run.task.lens_input(run, clean)
    _, bad_src, _ = run.task.lens_input(run, corrupted)
    names = [decode(i) for i in range(run.model.out.out_features)]
    labels = {"encoder": pieces(run.tokenizer, src[0].tolist()), "decoder": [decode(int(i)) for i in tgt_in[0]]}
    return Pair((src, tgt_in), (bad_src, tgt_in), labels, names, tgt_in.shape[1] - 1)


def _image(run: Run, clean: str, corrupted: str) -> Pair:
    a, b = (torch.from_numpy(run.task.image(run, p))[None].to(_device(run)) for p in (clean, corrupted))
    n = run.model.cfg.grid[0] * run.model.cfg.grid[1]
    labels = {"blocks": ["[CLS]", *(f"patch {k + 1}" for k in range(n))]}
    return Pair((a,), (b,), labels, list(run.config["task"]["labels"]), None)


def pair(run: Run, clean: str, corrupted: str) -> Pair:
    """Both inputs of `run` (see the module's docstring for what each kind of run reads)."""
    model = run.model
    if isinstance(model, CausalLM):
        return _language_model(run, clean, corrupted)
    if isinstance(model, StepDecoding) and run.task.tokenized:
        return _translation(run, clean, corrupted)
    if isinstance(model, OneSequence) and isinstance(model, Positioned):  # an encoder (a baseline has no positions)
        return _encoder(run, clean, corrupted)
    if run.task.reads_images and not isinstance(model, StepDecoding) and isinstance(model.cfg, PatchGrid):
        return _image(run, clean, corrupted)
    raise AttnlabError(
        f"{run.path} is {run.task.noun} run: patching reads a language model, an encoder "
        "(masked LM or classifier), a translation or an image classifier"
    )


@torch.no_grad()
def metric_of(run: Run, p: Pair, kind: str, target: str | None = None, wrong: str | None = None) -> AnswerMetric:
    """The metric, its target and wrong answer named or else read from the two runs' top answers."""
    run.model.eval()
    top = [int(_row(run.model(*x), p.position).argmax()) for x in (p.clean, p.corrupted)]
    t = p.answer(target, top[0], "--target")
    w = p.answer(wrong, top[1], "--wrong") if kind == "logit-diff" else None
    if w is not None and w == t:
        raise AttnlabError(
            f"the target and the wrong answer are both {p.names[t]!r} (the corrupted run's top answer "
            "too?): name another with --wrong"
        )
    return AnswerMetric(kind, t, w, p.position)


def _row(out: Tensor, position: int | None) -> Tensor:
    return (out if position is None else out[:, position])[0]  # (V,)
