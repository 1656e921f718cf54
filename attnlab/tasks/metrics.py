"""Classification metrics from a confusion matrix: accuracy, per-class precision/recall/F1, macro-F1;
and a word when a scored split is too small to trust."""

from __future__ import annotations

import warnings

import numpy as np

TINY_SPLIT = 20  # examples: below this a split's accuracy moves in steps of 5 points or more


def confusion(gold: np.ndarray, pred: np.ndarray, n: int) -> np.ndarray:
    """(n, n) counts: row = true class, column = predicted class."""
    m = np.zeros((n, n), dtype=np.int64)
    np.add.at(m, (np.asarray(gold), np.asarray(pred)), 1)
    return m


def scores(m: np.ndarray, labels: list[str]) -> dict:
    """accuracy, macro_f1, and per-class precision / recall / F1 / support from a confusion matrix."""
    tp = np.diag(m).astype(float)
    predicted, actual = m.sum(0), m.sum(1)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros_like(tp), where=actual > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros_like(tp), where=precision + recall > 0)
    # Over the classes in the gold labels or the predictions, as sklearn's f1_score(average="macro"):
    # a class no example has but the model predicts scores F1 0 and counts; one in neither is left out.
    present = (actual > 0) | (predicted > 0)
    per_class = {
        name: {
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(actual[i]),
        }
        for i, name in enumerate(labels)
    }
    return {
        "accuracy": float(tp.sum() / max(m.sum(), 1)),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "per_class": per_class,
        "confusion": m.tolist(),
        "labels": labels,
    }


def warn_small_split(split: str, examples: int, m: np.ndarray, labels: list[str]) -> bool:
    """One warning line when a scored split has under TINY_SPLIT examples or lacks a class; True if given."""
    missing = [name for name, n in zip(labels, m.sum(1)) if n == 0]
    if examples >= TINY_SPLIT and not missing:
        return False
    few = f"only {examples} example{'s' * (examples != 1)}" if examples < TINY_SPLIT else f"{examples} examples"
    lacks = f" and no example of {', '.join(map(repr, missing[:5]))}{' ...' * (len(missing) > 5)}" if missing else ""
    warnings.warn(
        f"the {split} split has {few}{lacks}: its accuracy and macro-F1 are noisy (macro-F1 averages the "
        f"classes in its labels or predictions); give more data or a {split} file",
        stacklevel=3,
    )
    return True
