"""attnlab's inference on a CUDA GPU, each against a reference: the server's batched decoding against the
same requests sent one at a time, packed int8/int4/bf16 layers against dequantize-then-multiply, an
int8 model on the GPU against the same model on the CPU (and cached against uncached), and the compiled
decode step against the eager one. Training on the GPU is in tests/test_cuda.py, whose docstring says
how to run both: pytest -m cuda tests/test_cuda*.py on a GPU machine; with ATTNLAB_TEST_DEVICE=cpu, a
dry run on the CPU.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

import attnlab
from attnlab.data import DataConfig
from attnlab.decoding.engine import engine_for
from attnlab.decoding.exact import multinomial_is_a_race
from attnlab.decoding.sampling import stream, stream_rows
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.quant.packed import COMPUTE, KINDS, PackedLinear
from attnlab.runs.quantized import quantize_for_inference
from tests.conftest import TEXT, perturb
from tests.test_compiled_decode import side_by_side
from tests.test_cuda import tiny
from tests.test_quantized_inference import wide_gaps_model

DEVICE = torch.device(os.environ.get("ATTNLAB_TEST_DEVICE", "cuda"))
ON_GPU = DEVICE.type == "cuda"
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(), reason="needs a CUDA GPU")]


# ---- 7. the server's batched decoding ------------------------------------------------------------------


def post(url: str, body: dict) -> dict:
    """POST JSON, read JSON (urllib: no client library needed on the GPU machine)."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def test_the_servers_batched_decoding_gives_each_request_its_text_alone(tmp_path):
    """8 seeded /v1 completions (greedy, temperature, top-p, top-k; lengths past the context, so rows jump
    ahead at their own steps) sent at once to a server with the model on the device (float32, as
    `attnlab serve` decodes on a GPU: runtime/device.py): each text is the one the same request got
    sent alone, and the requests shared forward passes."""
    pytest.importorskip("fastapi", reason="attnlab serve needs fastapi")
    pytest.importorskip("uvicorn", reason="attnlab serve needs uvicorn")
    from attnlab.serve.app import create_app, running  # imports fastapi

    assert multinomial_is_a_race(DEVICE)  # else the engine decodes every row alone (engine.py)
    (tmp_path / "code.txt").write_text(TEXT * 40)
    attnlab.train(
        tmp_path / "lm",
        GPTConfig(n_layer=1, n_head=2, d_model=64, context=32),
        tiny(max_steps=20, eval_interval=20),
        DataConfig(data=str(tmp_path / "code.txt")),
        progress=False,
    )
    draws = [(1.0, 1.0, 0), (0.0, 1.0, 0), (0.7, 0.9, 0), (1.2, 1.0, 5)] * 2  # temperature, top_p, top_k
    bodies = [
        {
            "model": "lm",
            "prompt": "def ",
            "max_tokens": 40 + 3 * i,
            "temperature": t,
            "top_p": p,
            "top_k": k,
            "seed": i,
            "ignore_eos": True,
        }
        for i, (t, p, k) in enumerate(draws)
    ]
    app = create_app([tmp_path / "lm"], device=str(DEVICE))
    batcher = app.state.engines["lm"]
    with running(app) as url:
        ask = lambda body: post(f"{url}/v1/completions", body)["choices"][0]["text"]
        alone = [ask(body) for body in bodies]  # one at a time: each row decoded alone
        before = dict(batcher.stats)
        start = threading.Barrier(len(bodies))

        def at_once(body: dict) -> str:
            start.wait()
            return ask(body)

        with ThreadPoolExecutor(len(bodies)) as pool:
            together = list(pool.map(at_once, bodies))
    assert next(batcher.model.parameters()).device.type == DEVICE.type
    assert batcher.decoder.precision == torch.float32 or not ON_GPU  # --dtype auto decodes in float32 on a GPU
    assert len(set(alone)) > 4 and all(len(text) > 0 for text in alone)  # the seeds matter: a mix-up would show
    assert together == alone
    rows, steps = (batcher.stats[k] - before.get(k, 0) for k in ("batched rows", "steps"))
    assert rows > steps > 0, dict(batcher.stats)  # several requests per forward pass


# ---- 8. quantized weights ------------------------------------------------------------------------------


def reference(layer: PackedLinear, x: torch.Tensor) -> torch.Tensor:
    """x @ W^T + b in float64, W the dequantized weight (scales and zeros rounded to bf16, as stored). On
    CUDA the layer multiplies x by that weight in x's dtype; the CPU kernels round x to bf16 first."""
    x = x if ON_GPU else x.to(COMPUTE).float()
    y = x.double() @ layer.dequantize().double().T
    return (y if layer.bias is None else y + layer.bias.double()).float()


@pytest.mark.parametrize("kind", KINDS)
def test_a_packed_layer_on_the_device_is_dequantize_then_multiply(kind):
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(nn.Linear(96, 40), kind).to(DEVICE)  # packed on the CPU, then moved
    kept = [b for b in (layer.bias, getattr(layer, "scales", None)) if b is not None]
    assert all(b.dtype == torch.float32 and b.device.type == DEVICE.type for b in kept)
    # CUDA: a float32 product of 96 terms against float64; the CPU: the kernels round their output to bf16
    tol = dict(atol=1e-5, rtol=1e-5) if ON_GPU else dict(atol=1e-3, rtol=2**-7)
    for lead in [(1,), (5, 3)]:  # one row (a decode step), and a batch
        x = torch.randn(*lead, 96, device=DEVICE)
        with torch.inference_mode():
            y = layer(x)
        assert y.shape == (*lead, 40) and y.dtype == torch.float32 and y.device.type == DEVICE.type
        torch.testing.assert_close(y, reference(layer, x.reshape(-1, 96)).view(*lead, 40), **tol)


def test_int8_on_the_device_decodes_what_it_decodes_on_the_cpu():
    """Quantized on the device: greedy tokens equal those of the same packed weights on the CPU (its
    int8 kernel), cached equal uncached, and a batch of 3 rows each the lone sequence."""
    model = wide_gaps_model(DEVICE)
    quantize_for_inference(model, "int8", every_layer=True)
    assert isinstance(model.head, PackedLinear) and model.head.codes.device.type == DEVICE.type
    on_cpu = copy.deepcopy(model).to("cpu")
    prompt = [ord(c) % 64 for c in "def add("]
    want = list(stream(on_cpu, prompt, 40, temperature=0, dtype="float32"))
    got = list(stream(model, prompt, 40, temperature=0, dtype="float32"))
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
    if first is not None:
        with torch.no_grad():
            top = on_cpu(torch.tensor([prompt + want[:first]]))[0, -1].topk(2).values
        pytest.fail(
            f"int8 on {DEVICE} differs from the CPU's at token {first} (the CPU's top-2 gap "
            f"{float(top[0] - top[1]):.4f})"
        )
    assert got == list(stream(model, prompt, 40, temperature=0, use_cache=False, dtype="float32"))
    rows = [list(map(int, step)) for step in stream_rows(model, prompt, 3, 40, temperature=0, dtype="float32")]
    assert rows == [[t] * 3 for t in got]


# ---- 9. the compiled decode step -----------------------------------------------------------------------


def test_the_compiled_decode_step_gives_the_eager_logits_and_tokens():
    """One-token steps through the compiled step (ahead of time, else torch.compile) against the ordinary
    forward: logits within 1e-4 (float32), and the engine's greedy tokens equal, past a refill of the
    cache (60 tokens, context 48). Prints which way the step was compiled."""
    torch.manual_seed(0)
    model = perturb(GPT(GPTConfig(n_layer=2, n_head=4, d_model=64, context=48, vocab_size=96)), 0.05).to(DEVICE)
    prompt = [5, 17, 2, 40]
    fast = engine_for(model, "float32", compiled=True).decoder  # the engine's own: stream(compile=True) below
    with torch.inference_mode():
        _, b, steps = side_by_side(model, fast, prompt, 24)
        for _, la, lb in steps:
            assert fast.compiled.failed is None, fast.compiled.failed
            torch.testing.assert_close(lb, la, atol=1e-4, rtol=1e-4)
    assert fast.compiled.warm and b[0].length == 24  # the compiled step wrote the cache
    want = list(stream(model, prompt, 60, temperature=0, dtype="float32"))
    assert list(stream(model, prompt, 60, temperature=0, dtype="float32", compile=True)) == want
    step = engine_for(model, "float32", compiled=True).decoder.compiled
    assert step is fast.compiled and step.failed is None and step.warm, step.failed
    if DEVICE.type == "cuda":  # the ahead-of-time package crashed loading on the H100 (compiled.EXPORT_DEVICES)
        assert step.exported is None and "cpu only" in step.export_failed
    way = "ahead of time (torch.export + AOTInductor)" if step.exported is not None else "torch.compile"
    why = f" (export: {step.export_failed})" if step.export_failed else ""
    print(f"compiled decode step on {DEVICE}: {way}{why}")
