"""classify: a label per text, with the encoder (from [CLS] or the mean) or any baseline.

attnlab train classify --data sentiment --out runs/sentiment
attnlab predict runs/sentiment "a fine film"           -> pos  (0.97)
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.tasks.labeled import Labeled, label_id


class Classify(Labeled):
    name = "classify"
    noun = "a classifier"
    help = "a label per text: the encoder or a baseline, on a file or a generated task"
    description = "Train a model that predicts a label per text, then score it on the test split."

    def labels_of(self, train: list) -> set[str]:
        return {label for _, label in train}

    def texts(self, train: list) -> list[str]:
        return [text for text, _ in train]

    def encode_one(self, tok, example: tuple, label_ids: dict[str, int], split: str) -> tuple[list[int], int]:
        """[CLS] + the text's ids (+ [SEP] for a converted BERT's WordPiece, which frames every input so),
        and its label's id."""
        text, label = example
        return [tok.cls_id] + tok.encode(text) + [tok.sep_id] * tok.wraps, label_id(label_ids, label, split)

    def answer(self, words: list[str], probs: torch.Tensor, first: int, labels: list[str]) -> dict[str, Any]:
        best = int(probs.argmax())  # probs (L,)
        return {
            "label": labels[best],
            "probability": float(probs[best]),
            "probabilities": dict(zip(labels, probs.tolist())),
        }

    def show_prediction(self, result: dict[str, Any]) -> str:
        return f"{result['label']}  ({result['probability']:.3f})"
