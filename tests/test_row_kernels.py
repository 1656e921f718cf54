"""attnlab's row operators (quant/row_kernels.py, csrc/): built on this machine, they equal the float64
product for every shape their loops split differently (rows per task, four accumulators of 16 lanes,
tiles of two weight rows by four rows of x, the tails), on one row and on a batch's (whose rows equal
the one-row product's), int4 with its activations rounded to int8 as the kernel does; they are what a
packed layer's decode step takes, batched or not, survive torch.compile and torch.export as operators,
refuse wrong inputs in one line, and leave PyTorch's kernels in charge when they cannot be built."""

from __future__ import annotations

import pytest
import torch
from conftest import int4_rows_exact
from torch import nn

from attnlab.quant import row_kernels
from attnlab.quant.packed import ROW_LIMIT, ROW_OPS, PackedLinear, int4_blocks, quantize_int4, unpack_int4

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
        (lambda: row_kernels.f32_row(torch.randn(2, 8).double(), torch.zeros(3, 8)), "float32 rows"),
        (lambda: row_kernels.int4_row(torch.randn(2, 40), torch.zeros(3, 20, dtype=torch.uint8)), "multiple of 32"),
        (lambda: row_kernels.int4_row(torch.randn(2, 64), torch.zeros(3, 20, dtype=torch.uint8)), "int4 blocks"),
        (lambda: row_kernels.int8_row(torch.randn(1, 8), torch.zeros(3, 9, dtype=torch.int8), torch.ones(3)), "(O, I)"),
        (lambda: row_kernels.int8_row(torch.randn(1, 8), torch.zeros(3, 8, dtype=torch.int8), torch.ones(4)), "scales"),
        (lambda: row_kernels.bf16_row(torch.randn(1, 8), torch.zeros(3, 8)), "(O, I)"),
    ],
)
def test_wrong_inputs_are_refused_in_one_line(call, message):
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


# Rows of x: one, tiles of four and the rest (1, 2, 3), several tiles, a batch's most (ROW_LIMIT: 32)
ROWS = [1, 2, 3, 5, 8, 16, 17, 32]


@needs_library
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("kind", ["int8", "bf16", "f32"])
def test_batched_products_are_the_float64_product_and_the_one_row_products(kind, rows):
    """(O, I) = (63, 100): an odd weight row after the pairs, and a tail after the vector steps."""
    torch.manual_seed(rows)
    x, w, scales = torch.randn(rows, 100), torch.randn(63, 100), None
    if kind == "int8":
        w, scales = torch.randint(-127, 128, (63, 100), dtype=torch.int8), torch.rand(63) / 50
    product = {
        "int8": lambda x: row_kernels.int8_row(x, w, scales),
        "bf16": lambda x: row_kernels.bf16_row(x, w.bfloat16()),
        "f32": lambda x: row_kernels.f32_row(x, w),
    }[kind]
    y = product(x)
    ref = exact(x, w.bfloat16() if kind == "bf16" else w, scales)
    assert y.shape == (rows, 63) and (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    alone = torch.cat([product(x[r : r + 1]) for r in range(rows)])  # (rows, 63), each row by itself
    assert (y - alone).abs().max() <= 1e-6 * alone.abs().max()


@needs_library
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", [(40, 96), (65, 32), (130, 800)])
def test_int4_rows_are_the_float64_product_of_their_int8_activations(shape, rows):
    torch.manual_seed(rows + shape[0])
    x = torch.randn(rows, shape[1]) * torch.rand(1, shape[1]) * 3
    x[0, :32] = 0  # a block of zeros: its d is 0, not a division by it
    codes, scales, zeros = quantize_int4(torch.randn(shape) * torch.rand(shape[0], 1))
    y = row_kernels.int4_row(x, int4_blocks(codes, scales, zeros))
    ref = int4_rows_exact(x, codes, scales, zeros)
    assert y.shape == (rows, shape[0]) and (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    alone = torch.cat([row_kernels.int4_row(x[r : r + 1], int4_blocks(codes, scales, zeros)) for r in range(rows)])
    assert (y - alone).abs().max() <= 1e-6 * alone.abs().max()


@needs_library
def test_rows_split_among_threads_and_strided_inputs_are_read_as_their_values():
    """Two threads split 130 weight rows into tasks of 65: each ends in an odd row. x is strided."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        x = torch.randn(10, 300)[1::2, ::3]  # (5, 100), strided both ways
        w = torch.randn(100, 130).T  # (130, 100), transposed
        ref, half = exact(x, w), w.bfloat16()
        assert (row_kernels.f32_row(x, w).double() - ref).abs().max() <= 1e-5 * ref.abs().max()
        assert (row_kernels.bf16_row(x, half).double() - exact(x, half)).abs().max() <= 1e-5 * ref.abs().max()
        codes, scales, zeros = quantize_int4(torch.randn(130, 128))
        x4 = torch.randn(7, 256)[:, ::2]  # (7, 128), strided
        y4 = row_kernels.int4_row(x4, int4_blocks(codes, scales, zeros))
        ref4 = int4_rows_exact(x4, codes, scales, zeros)
        assert (y4.double() - ref4).abs().max() <= 1e-5 * ref4.abs().max()
    finally:
        torch.set_num_threads(threads)


def test_int4_blocks_hold_the_portable_codes_scales_and_zeros():
    """The operator's blocks (repacked at load from the saved, portable codes) give the codes back, and
    the scale and zero as bfloat16."""
    torch.manual_seed(0)
    codes, scales, zeros = quantize_int4(torch.randn(5, 96))
    blocks = int4_blocks(codes, scales, zeros).view(5, 3, 20)  # (O, G, 20)
    nibbles = blocks[..., :16]
    q = torch.cat((nibbles & 15, nibbles >> 4), dim=2).view(5, 96)  # weight j low, weight j + 16 high
    assert torch.equal(q.int(), unpack_int4(codes))
    back = blocks[..., 16:].contiguous().view(torch.bfloat16)  # (O, G, 2): scale, zero
    assert torch.equal(back[..., 0], scales.bfloat16()) and torch.equal(back[..., 1], zeros.bfloat16())


@needs_library
@pytest.mark.parametrize("kind", ["int8", "bf16", "int4"])
def test_a_packed_layer_decodes_up_to_a_batch_of_rows_through_the_operator(kind, monkeypatch):
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(nn.Linear(96, 40), kind)
    x = torch.randn(ROW_LIMIT, 1, 96)  # a batched decode step
    seen = []
    original = ROW_OPS[kind]
    monkeypatch.setitem(ROW_OPS, kind, lambda *a: seen.append(1) or original(*a))
    with torch.inference_mode():
        y, one = layer(x), layer(x[3])
        layer(torch.randn(ROW_LIMIT + 1, 96))  # more rows (a prompt): PyTorch's kernel
    assert len(seen) == 2
    assert (y[3] - one).abs().max() <= 1e-6 * one.abs().max()  # the batch's row is the row's alone
    if kind != "int4":  # int4's activations are rounded to int8 (the tests above)
        ref = x[:, 0].double() @ layer.dequantize().double().T + layer.bias.double()
        assert (y[:, 0].double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@needs_library
@pytest.mark.parametrize("kind, rows", [("int8", 1), ("int4", 3)])
def test_the_operators_compile_and_export(kind, rows):
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(nn.Linear(128, 64), kind).eval()
    x = torch.randn(rows, 128)
    with torch.no_grad():
        eager = layer(x)
        program = torch.export.export(layer, (x,), strict=False)
        assert f"attnlab.{kind}_row_product" in str(program.graph)
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


@needs_library
def test_float_rows_of_a_batched_step_take_every_float32_product_through_the_operator():
    """rows > 1 (a batched step's trace, B symbolic): the products of any number of rows are the
    operator's, and give the layer's numbers."""
    torch.manual_seed(0)
    layer = nn.Linear(100, 30)
    many = torch.randn(5, 1, 100)
    b = torch.export.Dim("B", min=2, max=16)
    with torch.no_grad():
        with row_kernels.FloatRows(16):
            traced = torch.export.export(layer, (many,), dynamic_shapes=({0: b},), strict=False)
        assert "attnlab.f32_row_product" in str(traced.graph)
        for rows in (2, 5, 16):
            x = torch.randn(rows, 1, 100)
            assert torch.allclose(traced.module()(x), layer(x), rtol=1e-5, atol=1e-6)


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


@pytest.mark.parametrize("kind", ["bf16", "int8", "int4"])
def test_a_batchs_rows_keep_float32_activations_so_they_stay_near_their_lone_products(kind):
    """Through ROW_LIMIT rows every kind is attnlab's operator on float32 activations: a batched row
    differs from the same row alone by float32's rounding only (PyTorch's bf16 product, which rounds the
    activations to bf16, once took a batch's bf16 rows, and the engine replayed their draws alone)."""
    from attnlab.quant.packed import PackedLinear

    if not row_kernels.loaded():
        pytest.skip("attnlab's row operators are not built here")
    torch.manual_seed(0)
    layer = PackedLinear.from_linear(torch.nn.Linear(256, 96), kind)
    x = torch.randn(16, 256)
    with torch.inference_mode():
        together, alone = layer(x), torch.cat([layer(x[i : i + 1]) for i in range(16)])
    assert ROW_LIMIT == 32 and layer._takes_row_op(x)  # the whole batch through the operator
    assert (together - alone).abs().max() <= 1e-5 * (1 + alone.abs().max())


def test_the_kernels_are_built_for_the_instructions_pytorch_is_told_to_use(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 makes PyTorch and inductor run an AVX2-only CPU's code on an AVX-512 one;
    the row operators follow it, in a library of their own (its name holds the command)."""
    from pathlib import Path

    from attnlab.quant import row_kernels

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    native = row_kernels._command([Path("s.cpp")], Path("t.so"))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    avx2 = row_kernels._command([Path("s.cpp")], Path("t.so"))
    assert "-march=native" in native and "-march=haswell" in avx2 and "-march=native" not in avx2
    assert row_kernels._target([b"source"]) != (
        monkeypatch.delenv("ATEN_CPU_CAPABILITY") or row_kernels._target([b"source"])
    )
