"""What every encoder-side task does with a raw text: frame its word ids as the model was trained to
read them, and run the model once. Each task (labeled.py, mlm.py) reads its own answer from the output.
"""

from __future__ import annotations

import warnings

import torch

from attnlab.data.tokenizers import WordPieceTokenizer, WordTokenizer
from attnlab.data.unknown import unknown_share, warn_unknown
from attnlab.errors import AttnlabError


def frame(tok, pieces: list[int], cls_first: bool, context: int) -> tuple[list[int], int]:
    """The ids an encoder reads for these word ids, and where the first word sits: attnlab's own
    runs put [CLS] before a classifier's input (cls_first); a converted BERT reads [CLS] ... [SEP]
    for every head, as it was trained. Texts longer than the context are cut (with a warning)."""
    wraps = tok.wraps
    first = 1 if wraps or cls_first else 0
    room = context - first - wraps
    if len(pieces) > room:
        warnings.warn(f"the text has {len(pieces)} tokens; only the first {room} are read", stacklevel=3)
    ids = [tok.cls_id] * first + pieces[:room] + [tok.sep_id] * wraps
    return ids, first


def words_and_ids(run, text: str, cls_first: bool) -> tuple[list[str], list[int], int]:
    """(the words read, the framed ids, where the first word sits) of `text` for an encoder run."""
    tok = run.tokenizer
    if not isinstance(tok, (WordTokenizer, WordPieceTokenizer)):
        raise AttnlabError(f"{run.path} is a {run.config.get('family')} language model: use attnlab sample")
    words = tok.split(text, tok.lower)
    warn_unknown(tok, unknown_share(tok, [text]), "the text", "the model reads little of it", stacklevel=3)
    ids, first = frame(tok, tok.encode_words(words), cls_first, run.model.cfg.context)
    words = words[: len(ids) - first - tok.wraps]
    if not words:
        raise AttnlabError("the text has no words")
    return words, ids, first


@torch.no_grad()
def probabilities(run, ids: list[int]) -> torch.Tensor:
    """The model's output probabilities on one framed input: classify (L,), tag (T, L), mlm (T, V)."""
    run.model.eval()
    return run.model(torch.tensor([ids], device=run.device)).float().softmax(-1)[0]


def predict(run, text: str, top_k: int = 5) -> dict:
    """What the run's task predicts for `text` (a classifier's label, a tagger's tags, [MASK] fills)."""
    return run.task.predict(run, text, {"top_k": top_k})
