"""The compiled decode step (decoding/compiled.py, exported.py): the tokens and logits of the ordinary
forward, on a Llama-block model with int8 weights and on the demo's preset, both ahead of time
(torch.export + AOTInductor) and through torch.compile; the ahead-of-time step reads the model's own
tensors (changed in place or replaced) and is compiled once per shape; bf16's one-row sum under
torch.compile against its formula; a model torch.export cannot take decodes through torch.compile; a
compilation that fails decodes as before after one warning; and the engine stepped by its readers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from conftest import perturb

from attnlab.decoding import compiled, compiled_rows, exported
from attnlab.decoding.adapters import LMDecoder
from attnlab.decoding.engine import engine_for
from attnlab.decoding.sampling import read_together, stream
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.quant import row_kernels
from attnlab.quant.packed import PackedLinear
from attnlab.runs.quantized import quantize_for_inference

pytestmark = pytest.mark.usefixtures("one_thread")


def llama_int8(kind: str = "int8") -> GPT:
    """A tiny Llama block (rotary positions, RMSNorm, SwiGLU, 2 key/value heads for 4) with `kind` weights."""
    torch.manual_seed(0)
    llama = dict(positions="rope", norm_kind="rmsnorm", feedforward="swiglu", bias=False, tie_weights=False)
    cfg = GPTConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=192, context=48, vocab_size=96, **llama)
    model = perturb(GPT(cfg), 0.05)
    report = quantize_for_inference(model, kind, every_layer=True)
    assert all(k == kind for k in report.layers.values())
    return model


def llama_int4() -> GPT:
    """The same with int4 weights (the int4 kernel's group size is a tensor of the layer's own, which
    the ahead-of-time step is handed like a weight)."""
    return llama_int8("int4")


def nano_fast() -> GPT:
    """The demo's preset, small (one block: each block holds every kind of tensor it hands the step, and
    llama_int8's two blocks check a step over several; one block compiles in 23 s cold where two took
    29, load 3.4), with its head tied to the token embedding (one tensor under two names, which the step
    is handed once): a bigram embedding (each position reads the token before it: a decode step must
    be given the row's previous one), a mixture of experts, qk-norm, relu^2, rotary positions and
    soft-capped logits; every weight perturbed (the bigram table starts at zero)."""
    torch.manual_seed(0)
    cfg = GPTConfig.from_preset(
        "gpt-nano-fast", n_layer=1, d_model=64, n_head=4, context=48, vocab_size=96, bigram_vocab=512, tie_weights=True
    )
    assert cfg.bigram_vocab and cfg.n_experts > 1
    model = perturb(GPT(cfg), 0.05)
    assert model.head.weight is model.tok.weight
    return model


def gpt2_tied() -> GPT:
    """GPT-2's blocks in float32 (learned positions, LayerNorm, GELU, biases), the head tied."""
    torch.manual_seed(0)
    model = perturb(GPT(GPTConfig(n_layer=2, n_head=4, d_model=64, context=48, vocab_size=96)), 0.05)
    assert model.head.weight is model.tok.weight
    return model


# Each compiles from an empty cache (as on CI) in 15-50 s on 2 cores: the default run keeps the two
# that between them hand the ahead-of-time step every kind of tensor (packed int8 weights and their
# scales, rotary tables, a tied head, a bigram table, experts); the others run under `make test-slow`.
SLOW = pytest.mark.slow
ROUTES = [
    (llama_int8, "exported"),
    (nano_fast, "exported"),
    pytest.param(gpt2_tied, "exported", marks=SLOW),
    pytest.param(llama_int4, "exported", marks=SLOW),
    pytest.param(nano_fast, "torch.compile", marks=SLOW),
]


def side_by_side(model, fast: LMDecoder, prompt: list[int], until: int):
    """The ordinary forward's greedy tokens fed to it and to `fast` (a compiled decoder of `model`) alike:
    (the forward's state, fast's state, steps), steps yielding (t, the forward's logits, fast's logits)
    after each one-token step t < until (the prompt is the ordinary forward in both)."""
    eager = LMDecoder(model, "float32")
    a, b = eager.start(None), fast.start(None)

    def steps():
        la, _ = eager.feed(a, prompt, 0)
        lb, _ = fast.feed(b, prompt, 0)
        for t in range(len(prompt), until):
            token = int(la.argmax())
            la, _ = eager.feed(a, [token], t)
            lb, _ = fast.feed(b, [token], t)
            yield t, la, lb

    return a, b, steps()


@pytest.mark.parametrize(("make", "route"), ROUTES)
def test_a_compiled_step_computes_what_the_forward_computes(make, route, monkeypatch):
    monkeypatch.setattr(compiled, "EXPORT", route == "exported")
    model = make()
    prompt = [5, 17, 2, 40]
    with torch.inference_mode():
        fast = LMDecoder(model, "float32", compiled=True)
        a, b, steps = side_by_side(model, fast, prompt, 40)
        # int4's row operator rounds its activations to int8: a step's 1e-6 differences from the forward
        # can flip a rounding, which moves this model's logits by up to ~0.03 (1e-6 noise at the
        # embedding did so eagerly too)
        tolerance = 0.1 if make is llama_int4 else 1e-4
        for t, la, lb in steps:
            assert fast.compiled.failed is None
            assert (fast.compiled.exported is not None) == (route == "exported"), fast.compiled.export_failed
            assert torch.allclose(la, lb, atol=tolerance, rtol=1e-4), (t, (la - lb).abs().max())
        assert b[0].length == a[0].length == 40
    # the engine's greedy tokens, through the compiled step, past where the cache needs a refill (48)
    want = list(stream(model, prompt, 60, temperature=0))
    assert list(stream(model, prompt, 60, temperature=0, compile=True)) == want


ROWS_ROUTES = [
    (nano_fast, "exported"),
    (nano_fast, "its own code"),  # torch.compile replaced by the step itself: RowsCache's writes and reads
    pytest.param(llama_int8, "exported", marks=SLOW),
]


@pytest.mark.parametrize(("make", "route"), ROWS_ROUTES)
def test_the_compiled_batched_step_computes_what_the_batched_forward_computes(make, route, monkeypatch):
    monkeypatch.setattr(compiled, "EXPORT", route == "exported")
    if route == "its own code":
        monkeypatch.setattr(compiled_rows.torch, "compile", lambda fn, **kw: fn)
    model = make()
    eager, fast = LMDecoder(model, "float32"), LMDecoder(model, "float32", compiled=True)
    prompts = [[5, 17, 2, 40], [9], [3, 1, 4, 1, 5, 9, 2, 6]]  # rows of different lengths
    with torch.inference_mode():
        tables = []
        for decoder in (eager, fast):
            slots = decoder.slots(4)
            for slot, prompt in enumerate(prompts):
                state = decoder.start(None)
                decoder.feed(state, prompt, 0)
                slots.put(slot, state)
            tables.append(slots)
        ids = torch.tensor([[7], [8], [9]])
        for _ in range(12):
            got = []
            for decoder, slots in zip((eager, fast), tables, strict=True):
                offsets = slots.table.begin(len(prompts))
                got.append(decoder.feed_slots(slots, ids, offsets))
                slots.table.end()
            assert fast.compiled_rows.failed is None
            assert (fast.compiled_rows.exported is not None) == (route == "exported"), fast.compiled_rows.export_failed
            assert torch.allclose(got[0], got[1], atol=1e-4, rtol=1e-4), (got[0] - got[1]).abs().max()
            ids = got[0].argmax(-1, keepdim=True)  # (B, 1) each row's greedy token, fed next
    # the engine's rows decoded together through it: each row's greedy tokens as decoded alone
    prompts = [[5, 17, 2, 40], [9, 3], [1, 2, 3]]
    alone = [list(stream(model, p, 20, temperature=0)) for p in prompts]
    together = read_together([map(str, stream(model, p, 20, temperature=0, compile=True)) for p in prompts])
    assert together == ["".join(map(str, t)) for t in alone]


def test_bf16_one_row_under_compile_is_its_sum(monkeypatch):
    """Where attnlab's one-row operators are not loaded (no compiler), a compiled bf16 row is the sum
    over the stored rows (packed.py's _one_row)."""
    monkeypatch.setattr(row_kernels, "ready", lambda: False)
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(torch.nn.Linear(64, 24), "bf16")
    x = torch.randn(1, 1, 64)
    with torch.inference_mode():
        y = torch.compile(layer, fullgraph=True)(x)
    want = (x[0].double() @ layer.weight.double().T + layer.bias.double()).float()
    assert y.shape == (1, 1, 24) and torch.allclose(y[0], want, atol=1e-5)


def test_the_exported_step_reads_the_models_tensors_changed_in_place_or_replaced():
    model = llama_int8()
    prompt = [5, 17, 2, 40]
    before = list(stream(model, prompt, 24, temperature=0, dtype="float32", compile=True))
    step = engine_for(model, "float32", compiled=True).decoder.compiled
    assert step.exported is not None, step.export_failed
    with torch.no_grad():
        model.tok.weight.mul_(-1)  # in place: the library reads the same tensor
    want = list(stream(model, prompt, 24, temperature=0, dtype="float32"))
    assert want != before and list(stream(model, prompt, 24, temperature=0, dtype="float32", compile=True)) == want
    model.norm.weight = torch.nn.Parameter(torch.rand_like(model.norm.weight))  # another tensor: handed over
    want = list(stream(model, prompt, 24, temperature=0, dtype="float32"))
    assert list(stream(model, prompt, 24, temperature=0, dtype="float32", compile=True)) == want
    assert step.exported.tensors["model.norm.weight"] is model.norm.weight


def test_a_shape_compiled_before_is_loaded_not_compiled_again(monkeypatch):
    list(stream(llama_int8(), [1, 2, 3], 6, temperature=0, dtype="float32", compile=True))  # compiled (or found) once
    import torch._inductor

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", None)  # a second compile fails
    monkeypatch.setattr(torch.export, "export", None)  # and so would a trace: the note names the library
    torch.manual_seed(1)
    other = llama_int8()
    perturb(other, 0.3)  # other weights, the same shapes
    want = list(stream(other, [1, 2, 3], 30, temperature=0, dtype="float32"))
    assert list(stream(other, [1, 2, 3], 30, temperature=0, dtype="float32", compile=True)) == want
    step = engine_for(other, "float32", compiled=True).decoder.compiled
    assert step.exported is not None and step.export_failed is None
    assert step.exported.path.parent.name == exported.FOLDER


def test_the_key_without_a_trace_changes_with_what_the_trace_reads_and_not_with_the_weights(monkeypatch):
    from attnlab.decoding import step_cache

    def key(model, rows=True):
        inputs = [torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, 1, 1)]
        return step_cache.fingerprint(exported._Step(model, compiled._step), inputs, rows)

    a = key(llama_int8())
    other = llama_int8()
    perturb(other, 0.3)
    assert key(other) == a  # other weights: the library is handed them
    assert key(llama_int8("int4")) != a and key(gpt2_tied()) != a and key(llama_int8(), rows=False) != a
    tied = gpt2_tied()
    untied = gpt2_tied()
    untied.head.weight = torch.nn.Parameter(untied.tok.weight.detach().clone())
    assert key(tied) != key(untied)  # one tensor under two names is another program than two tensors
    monkeypatch.setattr(step_cache.torch, "__version__", "0.0.0")
    assert key(llama_int8()) != a
    monkeypatch.undo()
    monkeypatch.setattr(step_cache, "source_digest", lambda: "edited")
    assert key(llama_int8()) != a


def test_a_note_without_its_library_is_a_cold_build(tmp_path):
    from attnlab.decoding import step_cache

    step_cache.remember(tmp_path, "k", tmp_path / "gone.pt2", {"t": torch.ones(2)})
    assert step_cache.remembered(tmp_path, "k") is None and step_cache.remembered(tmp_path, "other") is None
    (tmp_path / "gone.pt2").write_bytes(b"x")
    path, lifted = step_cache.remembered(tmp_path, "k")
    assert path == tmp_path / "gone.pt2" and torch.equal(lifted["t"], torch.ones(2))
    (tmp_path / step_cache.NOTES / "k.safetensors").write_bytes(b"cut short")
    assert step_cache.remembered(tmp_path, "k") is None


def test_the_librarys_name_is_its_graph_not_where_its_source_lies():
    """Another checkout (a fresh clone, a worktree) traces the same graph with other file names in its
    comments: the same library, loaded instead of compiled again; another shape is another library."""
    text = (
        "class GraphModule(torch.nn.Module):\n"
        "    def forward(self, x: 'f32[2, 4]'):\n"
        "        # File: /work/a/attnlab/nn/norm.py:12 in forward, code: return x * 2\n"
        "        mul: 'f32[2, 4]' = torch.ops.aten.mul.Tensor(x, 2)\n"
    )
    moved = text.replace("/work/a/attnlab/nn/norm.py:12", "/home/b/attnlab/nn/norm.py:40")
    assert exported.library_key(moved) == exported.library_key(text)
    assert exported.library_key(text.replace("f32[2, 4]", "f32[3, 4]")) != exported.library_key(text)
    assert exported.library_key(text.replace("(x, 2)", "(x, 3)")) != exported.library_key(text)


def test_the_minute_long_message_is_said_only_when_a_library_is_compiled(tmp_path, monkeypatch, capsys):
    built = []

    def package(program, package_path, inductor_configs):
        built.append(1)
        Path(package_path).write_bytes(b"library")

    monkeypatch.setattr(exported.torch._inductor, "aoti_compile_and_package", package)
    program = type("Program", (), {"__str__": lambda self: "graph"})()
    first = exported._library(program, tmp_path, "cold: compiling")
    assert "cold: compiling" in capsys.readouterr().err and built == [1]
    assert exported._library(program, tmp_path, "cold: compiling") == first  # found by its graph's key
    assert capsys.readouterr().err == "" and built == [1]


def test_a_model_torch_export_cannot_take_decodes_through_torch_compile(monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("data-dependent shape")

    monkeypatch.setattr(compiled, "ExportedStep", refuse)
    monkeypatch.setattr(compiled.torch, "compile", lambda fn, **kw: fn)
    model = llama_int8()
    want = list(stream(model, [1, 2, 3], 20, temperature=0, dtype="float32"))
    assert list(stream(model, [1, 2, 3], 20, temperature=0, dtype="float32", compile=True)) == want
    step = engine_for(model, "float32", compiled=True).decoder.compiled
    assert step.exported is None and step.export_failed == "RuntimeError: data-dependent shape"
    assert step.failed is None and step.warm


def test_a_device_outside_the_ahead_of_time_ones_decodes_through_torch_compile(monkeypatch):
    """On a GPU the ahead-of-time package crashed the process as it loaded (an H100, torch 2.11): a model
    on a device outside EXPORT_DEVICES never makes one, and takes torch.compile's step (here the CPU
    stands in for that device, and torch.compile for an identity: the route is what is checked)."""

    def never(*a, **k):
        raise AssertionError("the ahead-of-time step was made")

    monkeypatch.setattr(compiled, "EXPORT_DEVICES", ("cuda",))
    monkeypatch.setattr(compiled, "ExportedStep", never)
    seen = []
    monkeypatch.setattr(compiled.torch, "compile", lambda fn, **kw: seen.append(kw["options"]) or fn)
    model = llama_int8()
    want = list(stream(model, [1, 2, 3], 20, temperature=0, dtype="float32"))
    assert list(stream(model, [1, 2, 3], 20, temperature=0, dtype="float32", compile=True)) == want
    step = engine_for(model, "float32", compiled=True).decoder.compiled
    assert step.exported is None and step.failed is None and step.warm
    assert step.export_failed == "the ahead-of-time step runs on cuda only, not cpu"
    assert seen == [{"cpp_wrapper": True}]  # the CPU's C++ wrapper
    assert compiled.compile_options(torch.device("cuda")) == {}  # a GPU: inductor's Python wrapper, Triton


def test_a_compilation_that_fails_decodes_as_before(monkeypatch):
    def broken(fn, **kw):
        def step(*a, **k):
            raise RuntimeError("no C++ compiler here")

        return step

    monkeypatch.setattr(compiled.torch, "compile", broken)
    monkeypatch.setattr(compiled, "EXPORT", False)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("gpt-nano")).eval()
    want = list(stream(model, [1, 2, 3], 20, temperature=0))
    with pytest.warns(UserWarning, match="compiled decode step is off for this model .*no C\\+\\+ compiler"):
        got = list(stream(model, [1, 2, 3], 20, temperature=0, compile=True))
    assert got == want


def test_readers_step_the_engine_together_in_one_thread_and_across_threads():
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("gpt-nano")).eval()
    alone = [list(stream(model, [1, 2, 3], 30, temperature=1.0, seed=s)) for s in (7, 8)]
    # two generators read in turn by one thread (sample --num-samples): each steps the engine when it waits
    texts = read_together([map(str, stream(model, [1, 2, 3], 30, temperature=1.0, seed=s)) for s in (7, 8)])
    assert texts == ["".join(map(str, t)) for t in alone]
    # and readers in several threads at once
    got: dict[int, list[int]] = {}
    threads = [
        threading.Thread(
            target=lambda s=s: got.__setitem__(s, list(stream(model, [1, 2, 3], 30, temperature=1.0, seed=s)))
        )
        for s in (7, 8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [got[7], got[8]] == alone
