"""Classification metrics from a confusion matrix: accuracy, per-class precision/recall/F1, macro-F1."""

from __future__ import annotations

import numpy as np


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
    present = actual > 0  # classes absent from the gold data do not drag the macro average down
    per_class = {
        name: {"precision": float(precision[i]), "recall": float(recall[i]), "f1": float(f1[i]),
               "support": int(actual[i])}
        for i, name in enumerate(labels)
    }  # fmt: skip
    return {
        "accuracy": float(tp.sum() / max(m.sum(), 1)),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "per_class": per_class,
        "confusion": m.tolist(),
        "labels": labels,
    }
