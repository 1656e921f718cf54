"""The cache of converted models cannot lie: a HuggingFace or PEFT folder given to --init is converted
into a temporary folder renamed into place only when whole (io.build_folder), so a conversion refused,
failed or killed at any moment leaves nothing a later run takes for a converted model; `attnlab doctor`
shows the cache and --clear-cache empties it of converted models, and of nothing else."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.data.tokenizers import CharTokenizer
from attnlab.errors import AttnlabError
from attnlab.interop import adapter_runs, convert
from attnlab.interop.adapter_runs import export_peft, peft_run
from attnlab.interop.convert import converted, export_hf
from attnlab.io import BUILDING, build_folder, cache_root, remove_path
from attnlab.models.gpt import GPTConfig
from attnlab.nn.lora import LoRAConfig
from attnlab.runs.folder import has_weights
from tests.conftest import make_run, run_cli, write_lora_run

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py
IDS = torch.tensor([[2, 5, 9, 11, 3, 7]])  # (B, T): characters of the tiny tokenizer


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test's own cache folder (asserted here: a test must never write into the user's)."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    yield
    assert cache_root() == tmp_path / "cache"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A tiny GPT run (written by hand, untrained) and the HuggingFace folder exported from it."""
    root = tmp_path_factory.mktemp("models")
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,\n")
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=64, context=32, vocab_size=tok.vocab_size)
    export_hf(make_run(root / "run", cfg, tok, scale=0.0), root / "hf")
    return root


def logits(run: Path) -> torch.Tensor:
    with torch.no_grad():
        return attnlab.load(run, device="cpu").model(IDS)


def entries(folder: Path) -> tuple[list[str], list[str]]:
    """(final names, temporary folders) in a cache sub-folder."""
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    return [n for n in names if not BUILDING.match(n)], [n for n in names if BUILDING.match(n)]


def test_a_conversion_failing_midway_leaves_nothing(models, monkeypatch, capsys):
    def full_disk(*args, **kwargs):
        raise AttnlabError("disk full writing model.safetensors: free some space and run the command again")

    with monkeypatch.context() as patched, pytest.raises(AttnlabError, match="disk full"):
        patched.setattr(convert, "save_weights", full_disk)  # after config.json, before the weights
        converted(models / "hf")
    assert entries(cache_root() / "converted") == ([], [])
    out = converted(models / "hf")
    assert "converting" in capsys.readouterr().err and torch.equal(logits(out), logits(models / "run"))
    assert converted(models / "hf") == out and "converting" not in capsys.readouterr().err  # kept, not redone


def test_kill_9_at_ten_moments_then_the_same_init_again(models):
    """A child process converts and is killed at 10 moments spread over a conversion (measured first);
    after each, the cache holds a whole conversion or none, and the same call again gives a whole one
    with the logits of an uninterrupted conversion (and removes what the killed one left)."""
    src, folder = models / "hf", cache_root() / "converted"
    expected, found = logits(models / "run"), []
    took = min(remove_all(folder) or converting_child(src, kill_after=None) for _ in range(2))  # the first: cold
    for moment in (took * (0.02 + 0.96 * k / 9) for k in range(10)):
        remove_all(folder)
        converting_child(src, kill_after=moment)
        final, temporary = entries(folder)
        assert len(final) <= 1, final
        if final:  # the child finished before the kill: whole
            assert torch.equal(logits(folder / final[0]), expected)
        left = [sorted(p.name for p in (folder / t).iterdir()) for t in temporary]  # what the kill cut short
        found.append((round(moment, 3), "whole" if final else "nothing", left))
        out = converted(src)
        assert torch.equal(logits(out), expected) and entries(folder) == ([out.name], [])
    print(f"\nconversion {took:.3f} s; (kill after s, at the final name, files of a temporary folder left): {found}")


def converting_child(src: Path, kill_after: float | None) -> float:
    """Fork a process that calls converted(src); kill -9 it after `kill_after` seconds (None: let it
    finish). Returns the seconds from the fork to its end."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: convert, then leave without pytest's cleanup
        code = 1
        try:
            torch.set_num_threads(1)
            converted(src)
            code = 0
        finally:
            os._exit(code)
    if kill_after is not None:
        time.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert kill_after is not None or status == 0
    return time.perf_counter() - start


def remove_all(folder: Path) -> None:
    for p in folder.iterdir() if folder.is_dir() else ():
        remove_path(p)


def test_temporary_folders_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    final = tmp_path / "cache" / "model-1"
    final.parent.mkdir(parents=True)
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # a process id no process has now
    gone, old = final.with_name(f".model-1.tmp-{dead}-00ff"), final.with_name(f".model-2.tmp-{os.getpid()}-0a0a")
    live = final.with_name(f".model-3.tmp-{os.getpid()}-0b0b")
    for d in (gone, old, live):
        d.mkdir()
        (d / "config.json").write_text("{}")  # half a run
    os.utime(old, (time.time() - 2 * 86400,) * 2)  # two days untouched: a leftover whatever its PID
    build_folder(final, lambda tmp: tmp.mkdir() or (tmp / "done").write_text("yes"), lambda d: (d / "done").is_file())
    assert sorted(p.name for p in final.parent.iterdir()) == [live.name, final.name]


def test_two_builders_at_once_both_get_the_first_whole_folder(tmp_path):
    final, calls = tmp_path / "model", []

    def build(tmp: Path, tag: str) -> None:
        calls.append(tag)
        tmp.mkdir()
        (tmp / "done").write_text(tag)
        if tag == "slow":  # another process finishes first, while this one is still writing
            build_folder(final, lambda t: build(t, "fast"), lambda d: (d / "done").is_file())

    assert build_folder(final, lambda t: build(t, "slow"), lambda d: (d / "done").is_file()) == final
    assert calls == ["slow", "fast"] and (final / "done").read_text() == "fast"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # the loser's folder removed


@pytest.mark.parametrize("what", ["file", "half", "link"])
def test_what_is_not_whole_at_the_final_name_is_replaced(tmp_path, what):
    """A file, a half-written folder (an older attnlab killed midway) or a link at the final name is
    replaced; a link's target stays."""
    final, outside = tmp_path / "cache" / "model", tmp_path / "outside"
    final.parent.mkdir()
    outside.mkdir()
    (outside / "keep").write_text("mine")
    if what == "file":
        final.write_text("junk")
    elif what == "half":
        final.mkdir()
        (final / "config.json").write_text("{}")
    else:
        final.symlink_to(outside)
    build_folder(final, lambda tmp: tmp.mkdir() or (tmp / "done").write_text("yes"), lambda d: (d / "done").is_file())
    assert (final / "done").read_text() == "yes" and not final.is_symlink()
    assert (outside / "keep").read_text() == "mine" and sorted(p.name for p in final.parent.iterdir()) == ["model"]


def test_a_peft_adapter_failing_midway_leaves_nothing(models, tmp_path, monkeypatch):
    lora = write_lora_run(models / "run", tmp_path / "lora", LoRAConfig(rank=2, targets=("q", "v")))
    export_peft(lora, tmp_path / "adapter")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the weights are written

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(adapter_runs, "write_weights", interrupted)
        peft_run(tmp_path / "adapter")
    assert entries(cache_root() / "peft") == ([], [])
    out = peft_run(tmp_path / "adapter")
    assert has_weights(out) and torch.allclose(logits(out), logits(lora), atol=1e-6)


def test_doctor_shows_the_cache_and_clear_cache_removes_converted_models_only(models, tmp_path, capsys):
    root = cache_root()
    converted(models / "hf")
    lora = write_lora_run(models / "run", tmp_path / "lora", LoRAConfig(rank=2))
    export_peft(lora, tmp_path / "adapter")
    peft_run(tmp_path / "adapter")
    (root / "dtype.json").write_text("{}")  # a measurement (--clear's)
    (root / "tokens").mkdir(exist_ok=True)
    (root / "tokens" / "x.bin").write_bytes(b"0" * 1000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    (root / "converted" / "linked").symlink_to(outside)  # counted as an entry, removed as a link
    live = root / "converted" / f".under-way.tmp-{os.getpid()}-0c0c"  # a conversion of a live process
    live.mkdir()
    capsys.readouterr()
    code, out, _ = run_cli(["doctor"], capsys)
    line = next(x for x in out.splitlines() if x.startswith("cache "))
    assert code == 0 and f"cache    {root}, " in line
    assert "3 converted models" in line and "(HuggingFace: 2, PEFT: 1; --clear-cache removes them)" in line
    info = json.loads(run_cli(["doctor", "--json"], capsys)[1])["cache_folder"]
    assert info["path"] == str(root) and info["models"] == {"converted": 2, "peft": 1}
    assert info["bytes"] > info["models_bytes"] > 1000 and info["bytes"] > 0
    code, out, _ = run_cli(["doctor", "--clear-cache"], capsys)
    assert code == 0 and "cleared  3 converted models removed from the cache" in out and "peft/adapter-" in out
    assert "no converted models" in out and live.is_dir() and (outside / "keep").read_text() == "mine"
    assert (root / "dtype.json").is_file() and (root / "tokens" / "x.bin").is_file()
    assert "removed from the cache (there were none)" in run_cli(["doctor", "--clear-cache"], capsys)[1]
