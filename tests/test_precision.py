"""--dtype auto: chosen by measuring float32 against bf16 on this device, once, and kept."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab.runtime.device as dev
from attnlab.io import cache_root

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(dev, "_CHOICES", {})  # as a new process: only the cache file remembers
    (cache_root() / "dtype.json").unlink(missing_ok=True)


def counting(monkeypatch, ratio: float) -> list[int]:
    calls = []

    def measure(device, width=384):
        calls.append(width)
        return ratio

    monkeypatch.setattr(dev, "measure_bf16_speedup", measure)
    return calls


@pytest.mark.parametrize("ratio,chosen", [(2.5, torch.bfloat16), (0.5, torch.float32), (0.01, torch.float32)])
def test_auto_takes_the_faster_precision_as_measured(monkeypatch, ratio, chosen):
    counting(monkeypatch, ratio)
    dtype, note = dev.dtype_choice("auto", CPU, 128)
    assert dtype == chosen and f"bf16 measured {ratio:.2g}x float32 here" == note


def test_the_measurement_is_cached_per_cpu_torch_and_width(monkeypatch):
    calls = counting(monkeypatch, 2.0)
    assert dev.pick_dtype("auto", CPU, 128) == torch.bfloat16
    assert dev.pick_dtype("auto", CPU, 128) == torch.bfloat16
    monkeypatch.setattr(dev, "_CHOICES", {})  # a later process reads the file
    assert dev.pick_dtype("auto", CPU, 128) == torch.bfloat16
    assert calls == [128]
    (key,) = json.loads((cache_root() / "dtype.json").read_text())
    assert dev.cpu_model() in key and torch.__version__ in key and "width 128" in key
    dev.pick_dtype("auto", CPU, 256)  # another width is another shape: measured once more
    assert calls == [128, 256]


def test_a_cached_answer_is_honoured_without_measuring(monkeypatch):
    calls = counting(monkeypatch, 2.0)
    key = f"cpu|{dev.cpu_model()}|torch {torch.__version__}|width 64"
    cache_root().mkdir(parents=True, exist_ok=True)
    (cache_root() / "dtype.json").write_text(json.dumps({key: 0.4}))
    assert dev.dtype_choice("auto", CPU, 64) == (torch.float32, "bf16 measured 0.4x float32 here")
    assert calls == []


def test_explicit_precisions_are_not_measured(monkeypatch):
    calls = counting(monkeypatch, 2.0)
    assert dev.pick_dtype("float32", CPU) == torch.float32 and dev.pick_dtype("bfloat16", CPU) == torch.bfloat16
    assert calls == []


def test_the_real_measurement_gives_a_ratio():
    assert 0 < dev.measure_bf16_speedup(CPU, 64) < 1000
