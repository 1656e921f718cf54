"""ONNX export of GPT runs, checked with onnxruntime before it is kept.

Legend: B batch, T time (sequence), V vocabulary.

    run = attnlab.load("runs/demo")
    report = export_onnx(run, "runs/demo/model.onnx")   # input_ids (B, T) int64 -> logits (B, T, V) float32

The graph comes from torch's `torch.export`-based exporter (`dynamo=True`), which traces
sizes as symbols: B and T stay free axes (1 <= T <= context) instead of the numbers of the
example input. The older TorchScript exporter records Python's view of each shape (the
`T == 1` branch in attention, the context check) as constants and is deprecated since
torch 2.9. Needs `pip install onnx onnxruntime onnxscript`.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError, one_line
from attnlab.io import atomic_write
from attnlab.runs.run import Run, load

PIP = "pip install onnx onnxruntime onnxscript"
EXTRA = ("onnx", "onnxruntime", "onnxscript")  # the onnx extra; torch's exporter translates through onnxscript
PROTOBUF_LIMIT = 2**31  # one .onnx file is a protobuf message, which cannot reach 2 GiB


def check_target(path: Path, force: bool) -> None:
    if not path.exists():
        return
    if not path.is_file() or path.suffix.lower() != ".onnx":
        raise AttnlabError(f"{path} exists and is not an .onnx file: refusing to replace it; choose another name")
    if not force:
        raise AttnlabError(f"{path} already exists: choose another name, or --force to replace it")


class LogitsOnly(nn.Module):
    """The graph ONNX sees: input_ids (B, T) -> logits (B, T, V), and nothing else.

    GPT.forward also takes targets, caches and a position offset; pinning them here keeps the
    export to one input (the TorchScript exporter even turned `offset` into a second one).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.model(input_ids)  # (B, T, V)


def export_onnx(
    run: Run | str | Path, path: str | Path, opset: int | None = None, force: bool = True
) -> dict[str, Any]:
    """Write the run's GPT as ONNX and check it with onnxruntime against PyTorch.

    Input "input_ids" int64 (batch, sequence), both axes dynamic (sequence up to the model's
    context); output "logits" float32 (batch, sequence, vocab). The file replaces `path` only
    after onnxruntime has matched PyTorch's logits on two shapes that differ in batch and length.
    An existing `path` is replaced only with force, and only if it is an .onnx file.
    Returns {"path", "bytes", "opset", "checks": [{"shape": [b, t], "max_abs_diff": float}, ...]}.
    """
    check_target(Path(path), force)
    if not isinstance(run, Run):
        run = load(run, device="cpu")
    if not run.task.generates:
        raise AttnlabError(f"ONNX export supports gpt runs; {run.path} is a {run.config['family']} run")
    missing = [name for name in EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise AttnlabError(f"ONNX export needs {', '.join(missing)}: {PIP}")

    # A float32 copy on the CPU in eval mode (no dropout); the run's own model is left as it is.
    model = copy.deepcopy(run.model).to("cpu", torch.float32).eval()
    if sum(p.numel() * 4 for p in model.parameters()) >= PROTOBUF_LIMIT:
        raise AttnlabError("this model's float32 weights exceed 2 GiB, the limit of a single ONNX file")
    context, vocab = model.cfg.context, model.cfg.vocab_size
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    found: dict[str, Any] = {}  # what write() learns from the temporary file

    def write(tmp: Path) -> None:
        import onnx  # the onnx extra

        _export(LogitsOnly(model).eval(), tmp, context, vocab, opset)
        onnx.checker.check_model(str(tmp))
        written = {o.domain: o.version for o in onnx.load(str(tmp)).opset_import}.get("", 0)
        if opset is not None and written != opset:  # the exporter falls back instead of failing
            raise AttnlabError(
                f"could not export to opset {opset} (the exporter wrote opset {written}); use 17 or later"
            )
        found["opset"] = written
        import onnxruntime  # the onnx extra

        session = onnxruntime.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        # Neither shape is the export example's, so a baked-in batch or length would show here.
        short = min(7, max(context - 1, 1))
        found["shapes"] = [_check(session, model, (b, t), vocab) for b, t in [(1, short), (3, context)]]

    atomic_write(path, write)
    return {"path": str(path), "bytes": path.stat().st_size, "opset": found["opset"], "checks": found["shapes"]}


def _export(module: nn.Module, path: Path, context: int, vocab: int, opset: int | None) -> None:
    """torch.export-based ONNX export with symbolic batch and sequence axes."""
    example = torch.randint(0, vocab, (2, max(1, min(5, context))))  # (B, T)
    batch = torch.export.Dim("batch", min=1)
    sequence = torch.export.Dim("sequence", min=1, max=context)
    kwargs = {} if opset is None else {"opset_version": opset}
    try:
        with _quiet():
            torch.onnx.export(
                module,
                (example,),
                str(path),
                dynamo=True,
                input_names=["input_ids"],
                output_names=["logits"],
                dynamic_shapes={"input_ids": {0: batch, 1: sequence}},
                external_data=False,  # the weights inside the one file, so one rename publishes it
                verbose=False,
                **kwargs,
            )
    except Exception as e:  # the exporter's errors are pages long; the first line names the problem
        raise AttnlabError(f"ONNX export failed: {one_line(e)}") from e


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporter's own chatter (optional torchvision ops it skips, deprecations
    inside torch) for the duration of an export; real errors still raise."""
    log = logging.getLogger("torch.onnx")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|copyreg)(\.|$)")
            yield
    finally:
        log.setLevel(level)


def _check(session: Any, model: nn.Module, shape: tuple[int, int], vocab: int) -> dict[str, Any]:
    """Run onnxruntime and PyTorch on the same random tokens; fail unless their logits agree."""
    gen = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
    idx = torch.randint(0, vocab, shape, generator=gen)  # (B, T)
    with torch.no_grad():
        ref = model(idx).numpy()  # (B, T, V)
    (out,) = session.run(["logits"], {"input_ids": idx.numpy()})
    if out.shape != ref.shape:
        raise AttnlabError(f"ONNX check failed: shape {list(shape)} gave logits {out.shape}, expected {ref.shape}")
    diff = float(np.abs(out - ref).max())
    limit = 1e-3 * max(1.0, float(np.abs(ref).max()))  # float32 kernels differ in summation order only
    if not diff <= limit:  # also catches NaN
        raise AttnlabError(f"ONNX check failed: shape {list(shape)} max abs diff {diff:.3g} > {limit:.3g}")
    return {"shape": list(shape), "max_abs_diff": diff}
