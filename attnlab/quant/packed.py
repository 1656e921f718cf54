"""Linear layers for inference whose weights are stored small: int8, int4 or bfloat16.

Legend: M rows of input, O output features, I input features, G = I / GROUP groups per row.

A decode step at batch 1 reads every weight once, so on a CPU its speed is memory bandwidth over the
bytes of the weights: fewer bytes per weight, more tokens per second. Weight-only: the activations
stay floating point, only the stored weights shrink.

    int8: per output channel, symmetric:   w = code * scale_o        codes int8 (O, I), scales (O,)
          (absmax / 127, quant/quantize.py's quantize_int8, the frozen QLoRA base's format)
    int4: per group of GROUP weights of a row, asymmetric (min to max in 16 steps):
          w = (code - 8) * scale_og + zero_og      codes uint8 (O, I/2), two per byte (the even
          column in the low nibble); scales, zeros (O, G)
    bf16: the weight rounded to bfloat16, (O, I)

GROUP = 32, as GGUF's q4_0 and q8_0 blocks: a scale and a zero per 32 weights (5 bits a weight in all,
with bf16 scale and zero) where 128, torchao's default, would save half a bit but let one large weight
coarsen the steps of 127 others. int8 needs no groups: 256 levels over a whole row moved the demo
model's held-out loss by +0.004% (int4 by +0.32%; benchmarks/quantize_quality.py, docs/cpu.md).

A decode step's rows on the CPU (1 to ROW_LIMIT, 32: one row, or a batch's) are attnlab's operators
where they could be built (quant/row_kernels.py, ROW_OPS): int8 and bf16 weights widened in registers
with float32 activations; int4 (groups of 32) repacked once into blocks (int4_blocks) and multiplied by
the activations rounded to int8 per block of 32, as integers. Otherwise, and for more rows (a prompt),
the kernels are PyTorch's own weight-only products, measured fastest on the CPU (quant/pack_choice.py,
benchmarks/generate_speed.py): torch._weight_int8pack_mm and torch._weight_int4pack_mm_for_cpu (called
as quantized.int4mm_packed_weight_cpu, the same kernel given its group size as a tensor), both with
bfloat16 activations (float32 or float16 ones take their far slower paths: docs/cpu.md), and for bf16
weights torch.mv on one row, F.linear on several, in bfloat16 (under torch.compile, one row: the sums
of _one_row). The int4 kernel wants its weight repacked (_convert_weight_to_int4pack_for_cpu, O a
multiple of 16): the saved codes stay in the portable layout above and are packed when the layer
reaches its device. Another device (CUDA, MPS) computes x @ dequantize(W)^T: correct, not fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.nn.attention import stored
from attnlab.quant import row_kernels
from attnlab.quant.quantize import _safe, dequantize_int8, quantize_int8

KINDS = ("int8", "int4", "bf16")
GROUP = 32  # int4 weights per scale and zero
COMPUTE = torch.bfloat16  # the activations' dtype inside the kernels (see the module's docstring)
INT4_ROWS = 16  # the CPU int4 kernel takes O a multiple of this: the packed weight is padded with zero rows
INNER_TILES = 2  # the int4 packing's inner K tiles (the CPU kernel's layout; 2 is what it is tuned for)


def quantize_int4(w: Tensor, group: int = GROUP) -> tuple[Tensor, Tensor, Tensor]:
    """W (O, I), I a multiple of `group` -> codes uint8 (O, I/2), scales (O, G), zeros (O, G) with
    |W - dequantize_int4| <= scale / 2: each group's min to max in 15 steps."""
    o, i = w.shape
    g = w.detach().float().view(o, i // group, group)  # (O, G, group)
    lo, hi = g.amin(dim=2), g.amax(dim=2)  # (O, G)
    scale = (hi - lo) / 15
    codes = torch.round((g - lo[..., None]) / _safe(scale)[..., None]).clamp_(0, 15).to(torch.uint8)
    zero = lo + 8 * scale  # w = (code - 8) * scale + zero = code * scale + lo
    codes = codes.view(o, i)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, zero


def unpack_int4(codes: Tensor) -> Tensor:
    """uint8 (O, I/2) -> codes 0..15 (O, I) as int32, the even column from the low nibble."""
    low, high = codes & 0x0F, codes >> 4
    return torch.stack((low, high), dim=2).view(codes.shape[0], -1).to(torch.int32)


def dequantize_int4(codes: Tensor, scales: Tensor, zeros: Tensor) -> Tensor:
    """Codes (O, I/2), scales and zeros (O, G) -> float32 W (O, I)."""
    q = unpack_int4(codes).float()  # (O, I)
    group = q.shape[1] // scales.shape[1]
    return (q - 8) * scales.repeat_interleave(group, dim=1) + zeros.repeat_interleave(group, dim=1)


def packable(linear: nn.Linear, kind: str, group: int = GROUP) -> bool:
    """Whether this layer's shape takes `kind`: int4 needs whole groups in a row, and the CPU int8
    kernel whole blocks of 32 inputs (it crashed the process on 344 inputs and 20 rows: torch 2.13)."""
    return kind == "bf16" or linear.in_features % group == 0


class PackedLinear(nn.Module):
    """A frozen nn.Linear for inference with its weight stored as `kind`: (..., I) -> (..., O) in the
    input's dtype. What is saved (state_dict): int8 `codes`, `scales`; int4 `codes`, `scales`, `zeros`;
    bf16 `weight`; and `bias` (float32) if the layer has one. Nothing here trains."""

    def __init__(self, in_features: int, out_features: int, kind: str, bias: bool = True, group: int = GROUP):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"quantization kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.in_features, self.out_features, self.kind, self.group = in_features, out_features, kind, group
        o, i = out_features, in_features
        if kind == "int8":
            self.register_buffer("codes", torch.zeros(o, i, dtype=torch.int8))
            self.register_buffer("scales", torch.zeros(o))
        elif kind == "int4":
            self.register_buffer("codes", torch.zeros(o, i // 2, dtype=torch.uint8))
            self.register_buffer("scales", torch.zeros(o, i // group))
            self.register_buffer("zeros", torch.zeros(o, i // group))
        else:
            self.register_buffer("weight", torch.zeros(o, i, dtype=torch.bfloat16))
        self.register_buffer("bias", torch.zeros(o) if bias else None)
        self._packed: dict[str, tuple[str, ...]] = {}  # the kernels' operands' names (see operands), per device
        self.tied = False  # a packed copy of a weight the model keeps in float too (a tied LM head)

    @classmethod
    def from_linear(cls, linear: nn.Linear, kind: str, group: int = GROUP) -> PackedLinear:
        """The packed copy of `linear`, on its device (the float weight is not kept)."""
        layer = cls(linear.in_features, linear.out_features, kind, linear.bias is not None, group)
        w = linear.weight.detach()
        if kind == "int8":
            layer.codes, layer.scales = quantize_int8(w)
        elif kind == "int4":
            layer.codes, layer.scales, layer.zeros = quantize_int4(w, group)
        else:
            layer.weight = w.to(torch.bfloat16)
        if linear.bias is not None:
            layer.bias = linear.bias.detach().float().clone()
        return layer.to(w.device)

    def dequantize(self) -> Tensor:
        """The float32 weight (O, I) the layer multiplies by: the kernels take the scales and zeros
        rounded to bfloat16, and so does this."""
        rounded = lambda t: t.to(COMPUTE).float()
        if self.kind == "int8":
            return dequantize_int8(self.codes, rounded(self.scales))
        if self.kind == "int4":
            return dequantize_int4(self.codes, rounded(self.scales), rounded(self.zeros))
        return self.weight.float()

    def stored_bytes(self) -> int:
        """Bytes of what is saved: codes, scales, zeros (or the bf16 weight) and the bias."""
        return sum(b.numel() * b.element_size() for b in self.state_dict().values())

    def logical_parameters(self) -> int:
        """The weights this layer stands for, O x I (not again for a tied head's copy) and the bias."""
        weights = 0 if self.tied else self.out_features * self.in_features
        return weights + (0 if self.bias is None else self.out_features)

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) would round the float32 scales, zeros and bias too: they keep their
        # dtype and move devices only. Any move drops the packed operands: they are made again there.
        for name in self._non_persistent_buffers_set:
            del self._buffers[name]
        self._non_persistent_buffers_set.clear()
        kept = {n: b for n, b in self._buffers.items() if b is not None and b.dtype == torch.float32}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            if self._buffers[name].dtype != before.dtype:
                self._buffers[name] = before.to(self._buffers[name].device)
        self._packed = {}
        return self

    def operands(self, kernel: str = "packed") -> tuple[Tensor, ...]:
        """What the CPU kernel takes besides x ("packed": KERNELS'; "rows": ROW_OPS'), made once (the
        weight never changes). A tensor made here is a buffer that is not saved (packed0, rows0, ...)
        and is read back as the layer's attribute: torch.export then names it by its path in the model,
        so a compiled step can be handed the model's own tensors instead of keeping copies
        (decoding/exported.py)."""
        if kernel not in self._packed:
            names: list[str] = []
            for i, value in enumerate((PACKERS if kernel == "packed" else ROW_PACKERS)[self.kind](self)):
                name = next((n for n, b in self._buffers.items() if b is value), None)
                if name is None:
                    name = f"{kernel}{i}"
                    self.register_buffer(name, value, persistent=False)
                names.append(name)
            self._packed[kernel] = tuple(names)
        return tuple(getattr(self, n) for n in self._packed[kernel])

    def forward(self, x: Tensor) -> Tensor:
        """(..., I) -> (..., O) in x's dtype."""
        if self._takes_row_op(x) and row_kernels.ready():
            return self._row_op(x)
        if x.numel() == self.in_features and torch.compiler.is_compiling() and self._sums_one_row():
            return self._one_row(x)
        if x.device.type != "cpu":  # no kernel of ours there: the dequantized weight, in x's dtype
            return F.linear(x, self.dequantize().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        y = KERNELS[self.kind](x.reshape(-1, self.in_features).to(COMPUTE), *self.operands())  # (M, O')
        if y.shape[1] != self.out_features:  # int4's padding rows
            y = y[:, : self.out_features]
        y = y.view(*x.shape[:-1], self.out_features)
        if self.bias is not None and self.bias.dtype == x.dtype:
            return torch.add(self.bias, y)  # one operation: the sum is made in x's dtype (decode is per-op cost)
        y = y.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def _takes_row_op(self, x: Tensor) -> bool:
        """Whether x is 1..ROW_LIMIT rows on the CPU for a kind with a row operator (int4: groups of 32)."""
        rows = x.numel() // self.in_features
        return (
            self.kind in ROW_OPS
            and 1 <= rows <= ROW_LIMIT
            and x.device.type == "cpu"
            and (self.kind != "int4" or self.group == GROUP)
        )

    def _row_op(self, rows: Tensor) -> Tensor:
        """A decode step's rows (one, or a batch's few) through attnlab's own row operator (quant/
        row_kernels.py): float32 activations (int4: rounded to int8 per block of 32), the stored weights
        widened in registers, the sum in float32."""
        shape, dtype, x = rows.shape, rows.dtype, rows.reshape(-1, self.in_features).float()
        y = ROW_OPS[self.kind](x, self)  # (M, O)
        y = y if self.bias is None else y + self.bias
        return y.view(*shape[:-1], self.out_features).to(dtype)

    def _sums_one_row(self) -> bool:
        """Whether a one-row product is the sum below (see ONE_ROW) rather than the kernel."""
        return self.kind in ONE_ROW and self.out_features * self.in_features >= ONE_ROW[self.kind]

    def _one_row(self, row: Tensor) -> Tensor:
        """One row (a decode step) inside torch.compile: y_o = sum_i x_i w_oi with w dequantized from what
        is stored, which inductor fuses into one loop over each row of codes: the float weight is never
        made, and the bytes read are the stored ones. Measured faster than the kernels for bf16
        (docs/log.md, "Packed layers")."""
        shape, dtype, x = row.shape, row.dtype, stored(row.reshape(1, -1).float())
        if self.kind == "int8":  # the row's scale after its sum: one multiply per output, not per weight
            y = (x * self.codes.float()).sum(-1) * self.scales.to(COMPUTE).float()  # (O,)
        else:
            y = (x * self.dequantize()).sum(-1)  # (O,)
        y = y if self.bias is None else y + self.bias
        return y.view(*shape[:-1], self.out_features).to(dtype)

    def extra_repr(self) -> str:
        group = f", group={self.group}" if self.kind == "int4" else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}{group}, "
            f"bias={self.bias is not None}"
        )


def _int8_operands(layer: PackedLinear) -> tuple[Tensor, ...]:
    return layer.codes, layer.scales.to(COMPUTE)


def _int4_operands(layer: PackedLinear) -> tuple[Tensor, ...]:
    q = unpack_int4(layer.codes)  # (O, I) int32, 0..15
    pad = -q.shape[0] % INT4_ROWS  # rows of zeros; their outputs are cut off in forward
    q = F.pad(q, (0, 0, 0, pad))
    scales_zeros = torch.stack((layer.scales, layer.zeros), dim=2)  # (O, G, 2)
    scales_zeros = F.pad(scales_zeros, (0, 0, 0, 0, 0, pad)).transpose(0, 1).contiguous()  # (G, O', 2)
    # The group size as a tensor of one element, the layer's own: the kernel's form that takes it so is
    # what an exported step can be compiled with (inductor reads its value; a plain int, or a 0-d tensor,
    # became a constant of inductor's own that the step's library would need handed in: exported.py).
    group = torch.tensor([layer.group], dtype=torch.int64, device=q.device)
    return torch._convert_weight_to_int4pack_for_cpu(q, INNER_TILES), group, scales_zeros.to(COMPUTE)


def _bf16_operands(layer: PackedLinear) -> tuple[Tensor, ...]:
    return (layer.weight,)


# The kinds whose one-row product is written as a sum under torch.compile (see _one_row), from this many
# weights a matrix. bf16: always (no PyTorch kernel came close). int8: from 2^20 weights, where the sum
# beat PyTorch's int8 kernel in compiled chains and whole models (per shape: docs/log.md, "Packed
# layers"). int4: never (its nibbles' unpacking does not vectorize: a whole GPT decoded far slower).
ONE_ROW = {"bf16": 0, "int8": 1 << 20}


# By kind: the row products of quant/row_kernels.py (where that library is loaded), x (M, I) float32 and
# the layer -> (M, O), on the operands the layer made (ROW_PACKERS): int8 codes and the scales rounded to
# bf16, the bf16 weight, int4 blocks (int4_blocks). Taken for 1..ROW_LIMIT rows: a decode step,
# batched or not. Above that a prefill's matrix is compute's, not memory's, and PyTorch's kernels are
# tuned for it. Every kind keeps float32 activations through ROW_LIMIT rows: PyTorch's bf16 product
# measured faster from a few rows on a CPU with bf16 instructions, but it rounds the activations to
# bf16, so a batched row's logits moved far from its lone ones and the engine replayed its batched
# draws alone (docs/log.md, "Serving").
ROW_LIMIT = 32  # the most rows a row operator takes (csrc: a batch's rows in tiles of 4)
ROW_OPS = {
    "int8": lambda x, layer: row_kernels.int8_row(x, *layer.operands("rows")),
    "bf16": lambda x, layer: row_kernels.bf16_row(x, *layer.operands("rows")),
    "int4": lambda x, layer: row_kernels.int4_row(x, *layer.operands("rows")),
}


def int4_blocks(codes: Tensor, scales: Tensor, zeros: Tensor) -> Tensor:
    """The portable int4 codes (O, I/2), scales and zeros (O, G), groups of 32 -> the int4 row operator's
    blocks (O, G * 20) uint8 (csrc/q4_products.cpp): per group 16 bytes of codes, byte j holding weight j
    in its low nibble and weight j + 16 in its high one, then the scale and the zero as bfloat16."""
    o = codes.shape[0]
    q = unpack_int4(codes).to(torch.uint8).view(o, -1, 2, 16)  # (O, G, half, 16)
    nibbles = q[:, :, 0] | (q[:, :, 1] << 4)  # (O, G, 16)
    scale_zero = torch.stack((scales, zeros), dim=2).to(torch.bfloat16).view(torch.uint8)  # (O, G, 4)
    return torch.cat((nibbles, scale_zero), dim=2).view(o, -1)  # (O, G * 20)


def _bf16_product(x: Tensor, w: Tensor) -> Tensor:
    """x (M, I) @ w^T in bfloat16. One row through torch.mv: PyTorch's matrix-vector kernel for bf16,
    measured faster than F.linear's (mkldnn) on one row, and slower than float32 on matrices
    that stay in the cache (docs/log.md, "Packed layers"; quant/pack_choice.py decides per shape)."""
    if x.shape[0] == 1:
        return torch.mv(w, x[0]).unsqueeze(0)  # (1, O)
    return F.linear(x, w)


# By kind: the operands made once from the stored tensors, and the product x (M, I) in COMPUTE -> (M, O').
PACKERS = {"int8": _int8_operands, "int4": _int4_operands, "bf16": _bf16_operands}
ROW_PACKERS = {
    "int8": lambda layer: layer.operands(),  # the same tensors as PyTorch's kernel's
    "bf16": lambda layer: layer.operands(),
    "int4": lambda layer: (int4_blocks(layer.codes, layer.scales, layer.zeros),),
}
KERNELS = {
    "int8": torch._weight_int8pack_mm,
    "int4": torch.ops.quantized.int4mm_packed_weight_cpu,  # _weight_int4pack_mm_for_cpu, the group size a tensor
    "bf16": _bf16_product,
}
