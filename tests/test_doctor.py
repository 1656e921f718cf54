"""`attnlab doctor`: the machine, and what --dtype auto kept at each width with the timings behind it;
--measure, --clear, --json. Fake timers stand in for the clock."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.runtime import precision
from tests.conftest import run_cli
from tests.test_dtype_choice import STEADY_BF16, STEADY_F32, Fake, timers

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))  # fake decisions stay out of later tests' cache
    monkeypatch.setattr(precision, "_DECIDED", {})
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16"})
    precision.cache_path().unlink(missing_ok=True)
    # training: bf16 2x faster; decoding: 2x slower
    timers(monkeypatch, train=Fake(STEADY_F32, STEADY_BF16), decode=Fake(STEADY_BF16, STEADY_F32))


def kept_with_strangers() -> dict:
    """A width measured here for both uses, one of another thread count, one single ratio of before."""
    precision.decide(CPU, "train", 128), precision.decide(CPU, "decode", 128)
    known = json.loads(precision.cache_path().read_text())
    ours = precision.key(CPU, "train", 128)
    known[ours.replace(f"threads {torch.get_num_threads()}", "threads 99")] = known[ours]
    known[f"cpu|{precision.cpu_model()}|torch {torch.__version__}|width 384"] = 14.0  # the old format
    precision.cache_path().write_text(json.dumps(known))
    return known


def test_doctor_shows_the_machine_and_each_kept_choice(capsys):
    kept_with_strangers()
    code, out, err = run_cli(["doctor"], capsys)
    assert code == 0 and err == ""
    assert f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads" in out
    assert "device   cpu" in out and precision.cpu_model() in out and "bf16 instructions: yes" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("128")]
    assert [r[:4] for r in rows] == [["128", "decode", "float32", "0.50x"], ["128", "train", "bfloat16", "2.00x"]]
    assert "10 ms ±2% n=7" in out and "5 ms ±3% n=7" in out  # medians and spreads of the fake timings
    assert "1 for other CPUs, PyTorch versions or thread counts" in out and "1 single timing of an older" in out


def test_doctor_json(capsys):
    kept_with_strangers()
    code, out, _ = run_cli(["doctor", "--json"], capsys)
    info = json.loads(out)
    assert info["torch"] == torch.__version__ and info["threads"] == torch.get_num_threads()
    assert info["device"] == "cpu" and info["bf16_instructions"] is True and info["cleared"] is None
    here = {(r["use"], r["width"]): r for r in info["kept"] if r.get("here")}
    assert set(here) == {("train", 128), ("decode", 128)}
    assert here["train", 128]["dtype"] == "bfloat16" and here["train", 128]["ratio"] == pytest.approx(2, rel=0.05)
    assert here["decode", 128]["float32"]["median"] == pytest.approx(0.005, rel=0.05)
    assert sum(bool(r.get("old")) for r in info["kept"]) == 1 and len(info["kept"]) == 4


def test_doctor_clear_removes_the_measurements_and_nothing_else(capsys):
    known = kept_with_strangers()
    other = precision.cache_path().parent / "tokens-keep.txt"
    other.write_text("not a measurement")
    code, out, _ = run_cli(["doctor", "--clear"], capsys)
    assert code == 0 and "cleared  4 measurements removed:" in out
    assert all(k in out for k in known) and "nothing yet" in out
    assert not precision.cache_path().exists() and other.read_text() == "not a measurement"
    assert "removed (there were none)" in run_cli(["doctor", "--clear"], capsys)[1]
    assert precision.decide(CPU, "train", 128).kept  # this process forgot its answers too: measured again


def test_doctor_measure_now(capsys):
    code, out, _ = run_cli(["doctor", "--measure", "256", "--json"], capsys)
    now = {r["use"]: r for r in json.loads(out)["measured_now"]}
    assert now["train"]["dtype"] == "bfloat16" and now["decode"]["dtype"] == "float32"
    assert now["train"]["kept"] and now["train"]["float32"]["samples"] == 7
    code, _, err = run_cli(["doctor", "--measure", "0"], capsys)
    assert code == 2 and "--measure" in err


def test_doctor_says_why_a_measurement_was_not_kept(capsys, monkeypatch):
    noisy = [0.010, 0.050, 0.003, 0.020, 0.009, 0.090]
    timers(monkeypatch, train=Fake(noisy, noisy[::-1]), decode=Fake(STEADY_F32, STEADY_BF16))
    code, out, err = run_cli(["doctor", "--measure", "64"], capsys)
    assert code == 0 and err == ""  # the reason is in the table, not in a second warning
    assert "train: not kept, float32 (the safe choice: timings too noisy to trust" in out
    assert "decode: not kept" not in out


def test_doctor_without_cpuinfo(capsys, monkeypatch):
    monkeypatch.setattr(precision, "cpu_info", lambda: {})
    monkeypatch.setattr(precision, "cpu_flags", lambda: None)
    code, out, _ = run_cli(["doctor"], capsys)
    assert code == 0 and "bf16 instructions: unknown" in out and "nothing yet" in out


def test_doctor_is_listed_in_the_help(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    assert "doctor" in out


BUSY = "1 other attnlab/torch process is busy here (pid 42, attnlab train lm, 1.9 cores)"


@pytest.mark.parametrize("busy", [None, BUSY])
def test_doctor_says_whether_other_processes_share_the_cores(capsys, monkeypatch, busy):
    """runtime/threads.py's sharing_line, on doctor's `sharing` line and in --json."""
    from attnlab.cli import doctor

    monkeypatch.setattr(doctor, "sharing_line", lambda: busy)
    out = run_cli(["doctor"], capsys)[1]
    said = [line for line in out.splitlines() if line.startswith("sharing  ")]
    assert said == [f"sharing  {busy or 'no other attnlab or torch process is busy here'}"]
    assert json.loads(run_cli(["doctor", "--json"], capsys)[1])["sharing"] == busy
