"""Every picture as PNG, SVG or JSON (viz/figures.py): the JSON holds the numbers that were drawn."""

from __future__ import annotations

import json

import torch

from attnlab.viz.curves import plot_loss
from attnlab.viz.heads import plot_head_tables


def test_a_curve_as_json_is_its_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 3.0 - 0.1 * s} for s in range(1, 11)] + [{"step": 10, "val_loss": 2.5}]
    metrics.write_text("\n".join(json.dumps(r) for r in rows))
    plot_loss(metrics, tmp_path / "loss.json")
    (panel,) = json.loads((tmp_path / "loss.json").read_text())["panels"]
    assert panel["xlabel"] == "step" and panel["lines"][0]["x"] == list(range(1, 11))
    assert panel["lines"][0]["y"] == [3.0 - 0.1 * s for s in range(1, 11)]
    assert {"label": "validation", "x": [10], "y": [2.5]} in panel["lines"]


def test_a_heatmap_as_json_svg_and_png(tmp_path):
    table = torch.tensor([[0.1, 0.9], [0.5, float("nan")]])
    for name in ("h.json", "h.svg", "h.png"):
        plot_head_tables({"induction": table}, tmp_path / name, "detectors")
    data = json.loads((tmp_path / "h.json").read_text())
    (panel,) = data["panels"]  # the colour bar is left out
    assert data["title"] == "detectors" and panel["title"] == "induction"
    (image,) = panel["images"]
    assert [[None if v is None else round(v, 6) for v in row] for row in image] == [
        [0.1, 0.9],
        [0.5, None],
    ]  # NaN: null
    assert panel["yticks"] == ["1", "2"] and panel["xticks"] == ["1", "2"]  # layers and heads from 1
    svg = (tmp_path / "h.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and ">induction<" in svg  # text kept as text
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
