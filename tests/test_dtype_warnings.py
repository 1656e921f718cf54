"""Under bf16, no PyTorch warning is written into generated text: QK-norm's RMSNorm gets bf16 queries
and keys while its gain is float32, and torch's rms_norm fell back to its unfused path with "Mismatch
dtype between input and weight ... Cannot dispatch to fused implementation", once per process, in
the middle of the sampled text. The norm now computes in its gain's dtype: the same numbers."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.cli.main import main
from attnlab.nn.norm import RMSNorm
from attnlab.runtime import precision
from tests.conftest import run_cli
from tests.test_dtype_choice import Fake

ROOT = Path(__file__).parent.parent

# A fresh process: torch warns once per process, so a warning another test raised first would hide it.
SCRIPT = r"""
import json, sys, warnings
import torch
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.decoding import sampling

torch.manual_seed(0)
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    for norm in ("rmsnorm", "layernorm"):
        model = GPT(GPTConfig(vocab_size=40, context=32, n_layer=2, n_head=2, d_model=32, norm_kind=norm, qk_norm=True))
        with torch.autocast("cpu", dtype=torch.bfloat16):  # a training step under bf16
            model(torch.randint(0, 40, (2, 16)), torch.randint(0, 40, (2, 16)))[1].backward()
        for use_cache in (True, False):  # the decoding engine, and the plain loop
            ids = list(sampling.stream(model, [1, 2, 3], 12, seed=0, use_cache=use_cache, dtype="bfloat16"))
            print(" ".join(map(str, ids)))
print(json.dumps([str(w.message) for w in said]))
"""


def test_sampling_under_bf16_writes_no_warning():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    *texts, said = done.stdout.splitlines()
    assert json.loads(said) == [] and done.stderr == ""
    assert len(texts) == 4 and all(len(t.split()) == 12 for t in texts)  # token ids, nothing else


def test_rmsnorm_under_autocast_computes_what_torch_fallback_computed():
    torch.manual_seed(0)
    norm = RMSNorm(16)
    with torch.no_grad():
        norm.weight.add_(torch.rand(16))
    x = (3 * torch.randn(2, 2, 8, 16)).bfloat16().requires_grad_()  # (B, H, T, Dh), as QK-norm gets it
    grad = torch.randn(2, 2, 8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = norm(x)
    ours.backward(grad)
    ours_grads = x.grad.clone(), norm.weight.grad.clone()
    x.grad, norm.weight.grad = None, None
    with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("ignore")
        theirs = F.rms_norm(x, (16,), norm.weight, norm.eps)  # the mismatched call: torch's fallback
    theirs.backward(grad)
    assert ours.dtype == theirs.dtype == torch.bfloat16 and torch.equal(ours, theirs)
    assert torch.equal(ours_grads[0], x.grad) and torch.equal(ours_grads[1], norm.weight.grad)


def test_sample_says_why_before_the_text_never_inside_it(tmp_path, corpus, capsys, monkeypatch):
    """`attnlab sample` with --dtype auto on a machine too noisy to trust: the warning is written
    before the prompt, not between the prompt and its continuation (stdout and stderr share a terminal)."""
    run = tmp_path / "run"
    tiny = (
        "--n-layer 1 --n-head 2 --d-model 16 --context 32 --batch-size 4 --max-steps 2 "
        "--eval-interval 2 --eval-batches 1 --device cpu --dtype float32"
    ).split()
    assert run_cli(["train", "lm", "--data", corpus, "--out", run, *tiny], capsys)[0] == 0
    monkeypatch.setattr(precision, "_DECIDED", {})
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))  # not a decision kept by an earlier test
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16"})
    noisy = Fake([0.010, 0.050, 0.003, 0.020, 0.009, 0.090], [0.090, 0.009, 0.020, 0.003, 0.050, 0.010])
    monkeypatch.setattr(precision, "timer_for", lambda device, use, width: noisy)
    terminal = io.StringIO()  # one screen for both streams, in the order they were written
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    with warnings.catch_warnings():  # as outside pytest: warnings written to sys.stderr as they come
        warnings.simplefilter("default")
        warnings.showwarning = lambda *w, **kw: sys.stderr.write(warnings.formatwarning(*w[:4]))
        assert main(["sample", str(run), "--prompt", "def ", "--max-new-tokens", "20", "--seed", "0"]) == 0
    first, text = terminal.getvalue().split("\n", 1)
    assert first.startswith("attnlab: warning: --dtype auto (decode, width 16): timings too noisy to trust"), (
        terminal.getvalue()[:600]
    )
    assert text.startswith("def ") and "warning" not in text
