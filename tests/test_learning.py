"""Learning quality, measured: the demo must reach the loss the foundation issue asks for, and
the ViT the digits accuracy the Vision Transformer issue asks for.

Slow (about 3 minutes and 1.5 minutes on 2 CPU cores), marked `slow`: the default run leaves them
out to stay within minutes; `make test-slow` (or `pytest -m slow`) runs them.
"""

from __future__ import annotations

import pytest

from attnlab.cli.demo import EVAL_TOKENS, run_demo
from attnlab.tasks.image import train_image


@pytest.mark.slow
def test_demo_reaches_1_70_nats_per_character(tmp_path, capsys):
    result = run_demo(tmp_path / "demo")
    out = capsys.readouterr().out
    assert "Samples" in out and "validation:" in out
    assert result["split"] == "val" and result["tokens"] == EVAL_TOKENS  # the held-out split's first 200,000
    assert result["loss"] <= 1.70, result


@pytest.mark.slow
def test_vit_reads_digits_at_97_percent_or_better(tmp_path):
    """The tuned defaults, as `attnlab train image --data digits` runs them (3,000 steps, ~1 min)."""
    result = train_image(tmp_path / "vit", "vit", progress=False)
    assert result["test"]["accuracy"] >= 0.97, result["test"]["accuracy"]


def test_the_demo_cannot_end_untrained_and_says_how_it_did(tmp_path, monkeypatch, capsys):
    """Under its time budget the demo has a floor of steps, and its last lines compare what it reached
    with what a quiet machine reaches (the issue's loaded machine: 64 steps, 1.83 nats/char)."""
    import attnlab.cli.demo as demo

    seen = {}

    def fake_train(out, model, cfg, data):
        seen["cfg"] = cfg
        raise SystemExit  # stop before any training: only the request is looked at

    monkeypatch.setattr(demo, "train", fake_train)
    with pytest.raises(SystemExit):
        demo.run_demo(tmp_path / "demo")
    assert seen["cfg"].time_budget == demo.BUDGET and seen["cfg"].min_steps == demo.FLOOR > 0
    slow, per_s = demo.verdict(64, 1.83, 120.0), demo.EXPECTED_STEPS / 120.0
    assert (
        "reached 64 steps and 1.83 nats/char in 2.0 minutes" in slow
        and f"at {64 / 120 / per_s:.0%} of that pace" in slow
    )
    late = demo.verdict(300, 1.27, 756.0)  # the floor reached, late: measured on a busy machine
    assert f"{300 / 756 / per_s:.0%} of that pace" in late
    assert "pace" not in demo.verdict(demo.EXPECTED_STEPS - 10, 1.15, 120.0)
