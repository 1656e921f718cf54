"""attnlab's one-row operators (quant/row_kernels.py, csrc/row_products.cpp): built on this machine, they
equal the float64 product for every shape their loops split differently (rows per task, four
accumulators of 16 lanes, the tails), are what a packed layer's decode step takes, survive torch.compile
and torch.export as operators, refuse wrong inputs in one line, and leave PyTorch's kernels in charge
when they cannot be built."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.quant import row_kernels
from attnlab.quant.packed import ROW_OPS, PackedLinear

pytestmark = pytest.mark.usefixtures("one_thread")

needs_library = pytest.mark.skipif(not row_kernels.loaded(), reason=f"no row operators: {row_kernels.unavailable()}")
# (O, I): below one accumulator step (I < 64), a tail after the steps (I = 100, 771), one task's rows and
# many tasks' (O = 1, 63, 64, 130, 1000), a decode step's shapes (768 x 768, 2304 x 768)
SHAPES = [(1, 16), (63, 40), (64, 64), (130, 100), (1000, 771), (768, 768), (2304, 768)]


def exact(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
    w = w.double() if scales is None else w.double() * scales.double()[:, None]
    return x.double() @ w.T


@needs_library
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_int8_row_product_is_the_float64_product(shape, scale_dtype):
    torch.manual_seed(shape[0] + shape[1])
    x = torch.randn(1, shape[1])
    codes = torch.randint(-127, 128, shape, dtype=torch.int8)
    scales = (torch.rand(shape[0]) / 50).to(scale_dtype)
    y = row_kernels.int8_row(x, codes, scales)
    ref = exact(x, codes, scales.float())
    assert y.shape == (1, shape[0]) and y.dtype == torch.float32
    # float32 sums of up to 2,304 products: a few float32 steps of the largest output
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@needs_library
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bf16_and_f32_row_products_are_the_float64_product(shape, dtype):
    torch.manual_seed(shape[0])
    x, w = torch.randn(1, shape[1]), torch.randn(shape).to(dtype)
    y = row_kernels.bf16_row(x, w) if dtype == torch.bfloat16 else row_kernels.f32_row(x, w)
    ref = exact(x, w)
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@needs_library
def test_strided_input_and_weight_are_read_as_their_values():
    x = torch.randn(3, 200)[1:2, ::2]  # (1, 100), strided
    codes = torch.randint(-127, 128, (100, 70), dtype=torch.int8).T  # (70, 100), transposed
    scales = torch.rand(70)
    ref = exact(x, codes, scales)
    assert (row_kernels.int8_row(x, codes, scales).double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@needs_library
@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: row_kernels.int8_row(torch.randn(2, 8), torch.zeros(3, 8, dtype=torch.int8), torch.ones(3)),
            "one float32 row",
        ),
        (lambda: row_kernels.int8_row(torch.randn(1, 8), torch.zeros(3, 9, dtype=torch.int8), torch.ones(3)), "(O, I)"),
        (lambda: row_kernels.int8_row(torch.randn(1, 8), torch.zeros(3, 8, dtype=torch.int8), torch.ones(4)), "scales"),
        (lambda: row_kernels.bf16_row(torch.randn(1, 8), torch.zeros(3, 8)), "(O, I)"),
    ],
)
def test_wrong_inputs_are_refused_in_one_line(call, message):
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


@needs_library
@pytest.mark.parametrize("kind", ["int8", "bf16"])
def test_a_packed_layer_decodes_one_row_through_the_operator(kind, monkeypatch):
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(nn.Linear(96, 40), kind)
    x = torch.randn(1, 1, 96)
    seen = []
    original = ROW_OPS[kind]
    monkeypatch.setitem(ROW_OPS, kind, lambda *a: seen.append(1) or original(*a))
    with torch.inference_mode():
        y = layer(x)
        layer(torch.randn(2, 96))  # two rows: PyTorch's kernel
    assert len(seen) == 1
    ref = x[0].double() @ layer.dequantize().double().T + layer.bias.double()
    assert (y[0].double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@needs_library
def test_the_operators_compile_and_export():
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(nn.Linear(128, 64), "int8").eval()
    x = torch.randn(1, 128)
    with torch.no_grad():
        eager = layer(x)
        program = torch.export.export(layer, (x,), strict=False)
        assert "attnlab.int8_row_product" in str(program.graph)
        assert torch.equal(program.module()(x), eager)
        compiled = torch.compile(layer, backend="eager", fullgraph=True)(x)
    assert torch.equal(compiled, eager)


@needs_library
def test_float_rows_take_one_float32_row_through_the_operator_and_leave_the_rest():
    torch.manual_seed(0)
    layer = nn.Linear(100, 30)
    one, many = torch.randn(1, 1, 100), torch.randn(4, 100)
    with torch.no_grad():
        with row_kernels.FloatRows():
            traced_one = torch.export.export(layer, (one,), strict=False)
            traced_many = torch.export.export(layer, (many,), strict=False)
            traced_half = torch.export.export(layer.to(torch.bfloat16), (one.bfloat16(),), strict=False)
        assert "attnlab.f32_row_product" in str(traced_one.graph)
        assert "attnlab" not in str(traced_many.graph) + str(traced_half.graph)
        layer.float()
        assert torch.allclose(traced_one.module()(one), layer(one), rtol=1e-5, atol=1e-6)


@pytest.fixture
def unloaded(monkeypatch):
    """The module as a process that has not loaded the operators sees it: the load itself, uncached."""
    monkeypatch.setattr(row_kernels, "_LOADED", [])
    monkeypatch.setattr(row_kernels, "_WHY", [])
    return row_kernels._load.__wrapped__


def test_without_the_library_a_layer_takes_pytorchs_kernel(unloaded, monkeypatch):
    """ATTNLAB_ROW_KERNELS=0 (as a machine without a compiler): not loaded, doctor's line says so, and a
    one-row product is PyTorch's int8 kernel's (x rounded to bf16)."""
    monkeypatch.setenv("ATTNLAB_ROW_KERNELS", "0")
    assert unloaded() is False and row_kernels._WHY == ["ATTNLAB_ROW_KERNELS=0"]
    assert row_kernels.status() == "off (ATTNLAB_ROW_KERNELS=0)"  # attnlab doctor's line
    monkeypatch.setattr(row_kernels, "ready", lambda: False)  # what PackedLinear asks
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(nn.Linear(64, 32), "int8")
    x = torch.randn(1, 64)
    with torch.inference_mode():
        ref = torch._weight_int8pack_mm(x.to(torch.bfloat16), *layer.operands()).float() + layer.bias
        assert torch.equal(layer(x), ref)


def test_a_failing_compiler_is_one_reason_not_a_crash(unloaded, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "false")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert row_kernels.status().startswith("not built yet")  # doctor builds nothing
    assert unloaded() is False
    (why,) = row_kernels._WHY
    assert why.startswith("the compiler failed") and row_kernels.status() == f"not loaded: {why}"
    assert not list(tmp_path.rglob("*.so"))  # nothing half-built is left to load next time
