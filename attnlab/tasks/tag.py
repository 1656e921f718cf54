"""tag: a label per token (part of speech, ...), with the encoder or any baseline but the bag of words.

attnlab train tag --data tagging --out runs/tags
attnlab predict runs/tags "the cat sat"
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnlab.data.batches import IGNORE
from attnlab.tasks.labeled import Labeled, label_id


class Tag(Labeled):
    name = "tag"
    noun = "a tagger"
    help = "a label per token: the encoder or a baseline, on a file or a generated task"
    description = "Train a model that predicts a label per token, then score it on the test split."
    pooled = False
    cls_first = False

    def labels_of(self, train: list) -> set[str]:
        return {tag for _, tags in train for tag in tags}

    def texts(self, train: list) -> list[str]:
        return [" ".join(words) for words, _ in train]

    def encode_one(self, tok, example: tuple, label_ids: dict[str, int], split: str) -> tuple[list[int], np.ndarray]:
        """One id per word (attnlab's word tokenizer); or a converted BERT's WordPiece: the words' pieces
        framed by [CLS] ... [SEP], each tag on its word's first piece (the others carry none)."""
        words, tags = example[0], [label_id(label_ids, t, split) for t in example[1]]
        if not tok.wraps:
            return tok.encode_words(words), np.array(tags, dtype=np.int64)
        ids, y = [tok.cls_id], [IGNORE]
        for word, tag in zip(words, tags):
            pieces = tok.encode_words(tok.split(word)) or [tok.unk_id]
            ids += pieces
            y += [tag] + [IGNORE] * (len(pieces) - 1)
        return ids + [tok.sep_id], np.array(y + [IGNORE], dtype=np.int64)

    def answer(self, words: list[str], probs: torch.Tensor, first: int, labels: list[str]) -> dict[str, Any]:
        p, best = probs[first : first + len(words)].max(-1)  # probs (T, L): the words' own positions
        return {
            "tokens": [{"token": w, "tag": labels[int(b)], "probability": float(q)} for w, b, q in zip(words, best, p)]
        }

    def show_prediction(self, result: dict[str, Any]) -> str:
        return "\n".join(f"{t['token']:<20} {t['tag']:<10} {t['probability']:.3f}" for t in result["tokens"])
