"""--dtype auto: float32 against bf16 timed on the run's own kind of work (training, decoding), with a
spread check and bounds, and kept only when the answer can be trusted. Fake timers stand in for the
clock: no test here depends on how fast this machine is."""

from __future__ import annotations

import itertools
import json
import warnings

import pytest
import torch

import attnlab.runtime.device as dev
from attnlab.decoding import sampling
from attnlab.decoding.adapters import LMDecoder
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runtime import precision, timing
from attnlab.runtime.timing import ROUNDS, SPREAD_LIMIT, Timing, measure
from attnlab.runtime.workloads import WORKLOADS

CPU = torch.device("cpu")
F32, BF16 = torch.float32, torch.bfloat16


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))  # fake decisions stay out of later tests' cache
    monkeypatch.setattr(precision, "_DECIDED", {})  # as a new process: only the cache file remembers
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})  # a CPU with bf16 instructions
    precision.cache_path().unlink(missing_ok=True)


class Fake:
    """A timer: each dtype's seconds, in turn, from its own endless list; counts the calls."""

    def __init__(self, f32: list[float], bf16: list[float]):
        self.times = {F32: itertools.cycle(f32), BF16: itertools.cycle(bf16)}
        self.calls = 0

    def __call__(self, dtype: torch.dtype) -> float:
        self.calls += 1
        return next(self.times[dtype])


def timers(monkeypatch, **by_use: Fake) -> None:
    monkeypatch.setattr(precision, "timer_for", lambda device, use, width: by_use[use])


STEADY_F32 = [0.0100, 0.0102, 0.0099, 0.0101, 0.0100]
STEADY_BF16 = [0.0050, 0.0051, 0.0049, 0.0050, 0.0052]  # 2x faster
NOISY = [0.010, 0.050, 0.003, 0.020, 0.009, 0.090]  # a neighbour comes and goes


def test_the_spread_is_the_interquartile_range_over_the_median():
    assert Timing.of([1.0] * 7).spread == 0
    t = Timing.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert t.median == 3.0 and t.spread == pytest.approx((4.0 - 2.0) / 3.0) and t.samples == 5


def test_consistent_samples_are_kept_and_read_back_without_measuring(monkeypatch):
    fake = Fake(STEADY_F32, STEADY_BF16)
    timers(monkeypatch, train=fake)
    dtype, note = dev.dtype_choice("auto", CPU, 128)
    assert dtype == BF16 and note == "bf16 measured 2x float32 here"
    assert fake.calls == 2 + 2 * timing.REPEATS  # a warm-up of each, then the interleaved pairs: one round
    ((key, entry),) = json.loads(precision.cache_path().read_text()).items()
    assert key.endswith("|train|width 128") and precision.cpu_model() in key and torch.__version__ in key
    assert entry["float32"]["samples"] == timing.REPEATS and entry["float32"]["spread"] < SPREAD_LIMIT
    monkeypatch.setattr(precision, "_DECIDED", {})  # a later process reads the file
    assert dev.dtype_choice("auto", CPU, 128) == (BF16, "bf16 measured 2x float32 here")
    assert fake.calls == 2 + 2 * timing.REPEATS


def test_cpus_sold_under_one_name_keep_their_answers_apart(monkeypatch):
    zen3 = {"model name": "AMD EPYC", "cpu family": "25", "model": "1", "stepping": "1", "flags": "fpu avx2"}
    zen4 = {**zen3, "model": "17", "flags": "fpu avx2 avx512f"}
    keys = []
    for info in (zen3, zen4, {**zen3, "flags": "avx2 fpu"}):
        monkeypatch.setattr(precision, "cpu_info", lambda info=info: info)
        keys.append(precision.key(CPU, "decode", 384))
    assert keys[0] != keys[1] and keys[0] == keys[2]  # the same CPU, its flags in another order
    assert all("AMD EPYC (cpu family 25 model" in k for k in keys)


def test_noisy_samples_are_measured_again_then_not_kept(monkeypatch):
    fake = Fake(NOISY, NOISY[::-1])
    timers(monkeypatch, train=fake)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        dtype, note = dev.dtype_choice("auto", CPU, 128)
        assert dev.dtype_choice("auto", CPU, 128)[0] == F32  # the same process: not measured, not said, again
    assert dtype == F32 and note.startswith("the safe choice: timings too noisy to trust")
    assert fake.calls == ROUNDS * (2 + 2 * timing.REPEATS)  # every round measured, none steady
    assert not precision.cache_path().exists()
    assert len(said) == 1 and "using float32, the safe choice, and not keeping it" in str(said[0].message)


def test_a_noisy_round_then_a_steady_one_is_kept(monkeypatch):
    pairs = 2 + 2 * timing.REPEATS
    noisy_then_steady = iter([0.01, 0.05, 0.003, 0.02] * (pairs // 4 + 1))
    first = [next(noisy_then_steady) for _ in range(pairs // 2)]
    fake = Fake(first + STEADY_F32 * 4, first + STEADY_BF16 * 4)  # round 1 noisy, round 2 steady
    m = measure(fake)
    assert m.rounds == 2 and m.spread <= SPREAD_LIMIT and m.ratio == pytest.approx(2, rel=0.05)


@pytest.mark.parametrize("bf16", [[0.001] * 5, [0.2] * 5])  # 10x faster; 20x slower, both steady
def test_an_implausible_ratio_is_not_kept(monkeypatch, bf16):
    timers(monkeypatch, train=Fake([0.01] * 5, bf16))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        dtype, note = dev.dtype_choice("auto", CPU, 384)
    assert dtype == F32 and "bf16 measured" in note and ("more than a CPU can gain" in note or "slower than" in note)
    assert not precision.cache_path().exists() and len(said) == 1


def test_amx_allows_a_larger_gain(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16", "amx_bf16"})
    timers(monkeypatch, train=Fake([0.01] * 5, [0.0016] * 5))  # 6.25x: believable with AMX only
    assert dev.dtype_choice("auto", CPU, 384)[0] == BF16 and precision.cache_path().exists()


def test_without_bf16_instructions_float32_is_chosen_without_measuring(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "fma"})
    fake = Fake([0.01], [0.01])
    timers(monkeypatch, train=fake)
    dtype, note = dev.dtype_choice("auto", CPU, 384)
    assert dtype == F32 and "no bf16 instructions" in note and fake.calls == 0


def test_emulated_bf16_on_an_unknown_cpu_stops_after_one_pair_and_is_kept(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: None)  # flags unreadable (not Linux)
    fake = Fake([0.01], [1.0])  # 100x slower: emulated
    timers(monkeypatch, train=fake)
    assert dev.dtype_choice("auto", CPU, 384) == (F32, "bf16 measured 0.01x float32 here")
    assert fake.calls == 4 and precision.cache_path().exists()  # warm-up and one pair: seconds each


def test_training_and_decoding_are_decided_separately(monkeypatch):
    train, decode = Fake(STEADY_F32, STEADY_BF16), Fake(STEADY_BF16, STEADY_F32)  # decoding: bf16 2x slower
    timers(monkeypatch, train=train, decode=decode)
    assert dev.pick_dtype("auto", CPU, 32) == BF16
    assert dev.pick_dtype("auto", CPU, 32, use="decode") == F32
    assert sorted(k.rsplit("|", 2)[1] for k in json.loads(precision.cache_path().read_text())) == ["decode", "train"]


def test_decoding_asks_for_the_decoding_decision(monkeypatch):
    asked = []
    real = dev.decide
    monkeypatch.setattr(dev, "decide", lambda device, use, width: asked.append(use) or real(device, use, width))
    timers(monkeypatch, train=Fake(STEADY_F32, STEADY_BF16), decode=Fake(STEADY_BF16, STEADY_F32))
    model = GPT(GPTConfig(vocab_size=20, context=16, n_layer=1, n_head=2, d_model=32))
    assert LMDecoder(model, "auto").precision == F32  # the engine behind sample, serve and /v1
    list(sampling.stream_rows(model, [1, 2], max_new_tokens=2, use_cache=False))
    assert asked == ["decode", "decode"]


def test_explicit_precisions_are_not_measured(monkeypatch):
    fake = Fake([0.01], [0.01])
    timers(monkeypatch, train=fake, decode=fake)
    assert dev.pick_dtype("float32", CPU) == F32 and dev.pick_dtype("bfloat16", CPU, use="decode") == BF16
    assert fake.calls == 0


@pytest.mark.parametrize("use", list(WORKLOADS))
@pytest.mark.parametrize("width", [32, 96])  # 96: no whole number of 64-wide heads
def test_the_real_workloads_run_in_both_dtypes(use, width):
    seconds = precision.timer_for(CPU, use, width)
    assert seconds(F32) > 0 and seconds(BF16) > 0
    with torch.no_grad():  # `attnlab eval` decides its dtype inside no_grad: the training workload still runs
        assert seconds(F32) > 0


def test_a_kept_answer_no_cpu_can_give_is_measured_again(monkeypatch):
    fake = Fake(STEADY_F32, STEADY_BF16)
    timers(monkeypatch, train=fake)
    k = precision.key(CPU, "train", 64)
    precision.cache_path().parent.mkdir(parents=True, exist_ok=True)
    steady = {"spread": 0.01, "samples": 7}
    kept = {"float32": {"median": 0.014, **steady}, "bfloat16": {"median": 0.001, **steady}}  # bf16 14x: no CPU
    precision.cache_path().write_text(json.dumps({k: kept}))
    assert dev.dtype_choice("auto", CPU, 64) == (BF16, "bf16 measured 2x float32 here")  # not the 14x on file
    assert fake.calls > 0 and json.loads(precision.cache_path().read_text())[k]["ratio"] == pytest.approx(2, rel=0.05)


@pytest.mark.parametrize("bf16", [True, False])
def test_a_gpu_trains_in_bf16_where_it_has_it_and_decodes_in_float32(monkeypatch, bf16):
    """On a CUDA GPU nothing is timed: bf16 to train where the GPU has it; float32 to decode, since bf16
    autocast casts every weight at every step (0.48-0.65x float32's tokens/s on an H100). A device
    object needs no GPU, and the GPU's answer is faked."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(dev, "decide", lambda *a: pytest.fail("a GPU's precision was timed"))
    gpu = torch.device("cuda")
    assert dev.dtype_choice("auto", gpu, 384)[0] == (BF16 if bf16 else F32)
    decode = dev.dtype_choice("auto", gpu, 384, use="decode")
    assert decode == (F32, "auto: float32 to decode on a GPU (bf16 autocast is slower there)")
    assert dev.dtype_choice("bfloat16", gpu, 384, use="decode") == (BF16, "as asked")
