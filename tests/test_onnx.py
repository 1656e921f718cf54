"""ONNX export: one exported graph serves every batch size and length up to the context, and
onnxruntime's logits match PyTorch's."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import attnlab
from attnlab.cli.main import main
from attnlab.errors import AttnlabError
from tests.conftest import code_file, extra

ort = extra("onnxruntime", "onnxruntime is not installed (pip install onnx onnxruntime onnxscript)")
extra("onnx", "onnx is not installed (pip install onnx onnxruntime onnxscript)")
extra("onnxscript", "onnxscript is not installed (pip install onnx onnxruntime onnxscript)")

from attnlab.interop.onnx import export_onnx  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = 32
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A 2-layer GPT with a character vocabulary, trained for 3 steps."""
    root = tmp_path_factory.mktemp("onnx")
    text = code_file(root)
    out = root / "run"
    args = ["train", "lm", "--data", str(text), "--out", str(out), "--preset", "gpt-nano", "--n-layer", "2"]
    args += ["--d-model", "32", "--n-head", "2", "--context", str(CONTEXT), "--max-steps", "3", "--batch-size", "4"]
    args += ["--eval-interval", "3", "--eval-batches", "1", "--device", "cpu", "--tokenizer", "char"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        assert main(args) in (0, None)
    return attnlab.load(out, device="cpu")


@pytest.fixture(scope="module")
def exported(gpt_run, tmp_path_factory):
    """(report, onnxruntime session) of the run exported once for the whole module."""
    path = tmp_path_factory.mktemp("onnx_out") / "model.onnx"
    report = export_onnx(gpt_run, path)
    return report, ort.InferenceSession(report["path"], providers=["CPUExecutionProvider"])


def test_report_describes_the_file_and_its_checks(exported):
    report, _ = exported
    print(report)
    path = report["path"]
    assert report["bytes"] == os.path.getsize(path) > 0
    assert isinstance(report["opset"], int) and report["opset"] >= 17
    shapes = [c["shape"] for c in report["checks"]]
    assert len(shapes) == 2 and shapes[0][0] != shapes[1][0] and shapes[0][1] != shapes[1][1], shapes
    assert [3, CONTEXT] in shapes
    for c in report["checks"]:
        assert c["max_abs_diff"] <= TOLERANCE, f"shape {c['shape']}: max abs diff {c['max_abs_diff']:.3g}"


def test_graph_has_symbolic_batch_and_sequence(exported):
    _, session = exported
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, out.name, out.type) == ("input_ids", "tensor(int64)", "logits", "tensor(float)")
    assert all(isinstance(d, str) for d in inp.shape), inp.shape  # named axes, not the example's numbers
    assert out.shape[:2] == inp.shape, (inp.shape, out.shape)


@pytest.mark.parametrize("shape", [(2, 5), (1, CONTEXT), (4, 1), (3, 17)])
def test_onnxruntime_matches_pytorch(gpt_run, exported, shape):
    _, session = exported
    vocab = gpt_run.model.cfg.vocab_size
    idx = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(sum(shape)))
    with torch.no_grad():
        ref = gpt_run.model(idx).numpy()  # (B, T, V)
    (out,) = session.run(["logits"], {"input_ids": idx.numpy()})
    assert out.shape == ref.shape == (*shape, vocab)
    diff = float(np.abs(out - ref).max())
    print(f"shape {shape}: max abs diff {diff:.3g}")
    assert diff <= TOLERANCE, f"shape {shape}: max abs diff {diff:.3g} > {TOLERANCE}"


def test_non_gpt_run_is_refused(tmp_path):
    out = tmp_path / "bow"
    args = ["train", "classify", "--model", "bow", "--out", str(out), "--max-steps", "3", "--device", "cpu"]
    assert main(args) in (0, None)
    with pytest.raises(AttnlabError, match="ONNX export supports gpt runs"):
        export_onnx(attnlab.load(out, device="cpu"), tmp_path / "bow.onnx")
    assert not (tmp_path / "bow.onnx").exists()


def test_missing_package_says_what_to_install(gpt_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # makes `import onnxscript` fail
    with pytest.raises(AttnlabError, match="pip install onnx onnxruntime onnxscript"):
        export_onnx(gpt_run, tmp_path / "m.onnx")


def test_failed_check_keeps_the_previous_file(gpt_run, tmp_path, monkeypatch):
    import attnlab.interop.onnx as mod

    def fail(*args, **kwargs):
        raise AttnlabError("ONNX check failed: simulated")

    path = tmp_path / "model.onnx"
    path.write_bytes(b"previous")
    monkeypatch.setattr(mod, "_check", fail)
    with pytest.raises(AttnlabError, match="simulated"):
        export_onnx(gpt_run, path)
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]  # no temporary file left behind


def test_unreachable_opset_is_an_error_not_a_silent_fallback(gpt_run, tmp_path):
    # The exporter converts to older opsets where it can and otherwise keeps its own; opset 9
    # has no LayerNormalization, so asking for it must fail rather than report success.
    with pytest.raises(AttnlabError, match="could not export to opset 9"):
        export_onnx(gpt_run, tmp_path / "old.onnx", opset=9)
    assert list(tmp_path.iterdir()) == []
