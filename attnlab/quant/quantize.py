"""Quantized frozen linear layers in plain PyTorch: int8 per output channel, and 4-bit NormalFloat.

Legend: O output features, I input features, N = O * I weights, K blocks of 64 (NF4).

A frozen base (QLoRA: Dettmers et al. 2023) keeps its weight as small integer codes plus float
scales and rebuilds the float weight inside the matrix product, so memory holds 1 byte (int8) or
half a byte (NF4) per weight instead of 4, and a LoRA adapter trains on top in float. No kernel:
the weight is dequantized on the fly (y = x @ W_deq^T + b), which runs anywhere PyTorch does.

    int8: scale_o = absmax(W[o, :]) / 127,  code = round(W / scale_o) in [-127, 127]   codes (O, I)
    nf4:  flatten W, blocks of 64, scale_k = absmax(block k),  code = nearest NF4 level to W / scale_k,
          two 4-bit codes per byte (first in the high nibble, as bitsandbytes packs them)  codes (K * 32,)

The scales stay float32: the paper's double quantization (8-bit scales, about 0.37 bit per weight
saved) is left out, so NF4 costs 4 + 32/64 = 4.5 bits per weight.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import AttnlabError
from attnlab.nn.stack import stacks_of

KINDS = ("int8", "nf4")
BLOCK = 64  # NF4 weights per scale, as in the QLoRA paper

# The 16 NF4 levels (QLoRA appendix E; bitsandbytes' table): normal quantiles scaled to [-1, 1], with
# 8 positive levels and 7 negative ones so that 0 is a level exactly (zeros and padding stay exact).
NF4_LEVELS = torch.tensor(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=torch.float32,
)


def _safe(scale: Tensor) -> Tensor:
    """A divisor for w / scale: an all-zero row or block (scale 0) divides by 1 and codes to 0."""
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """W (O, I) -> int8 codes (O, I) and float32 scales (O,), symmetric per output channel:
    |W - dequantize| <= scale / 2 in each row."""
    w = w.detach().float()
    scale = w.abs().amax(dim=1) / 127  # (O,)
    codes = torch.round(w / _safe(scale)[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes, scale


def dequantize_int8(codes: Tensor, scale: Tensor) -> Tensor:
    """int8 codes (O, I), scales (O,) -> float32 W (O, I)."""
    return codes.float() * scale[:, None]


def pack_nibbles(codes: Tensor) -> Tensor:
    """Codes 0..15, an even count (M,) -> uint8 (M / 2,), codes[2j] in the high nibble."""
    c = codes.to(torch.uint8).view(-1, 2)
    return (c[:, 0] << 4) | c[:, 1]


def unpack_nibbles(packed: Tensor) -> Tensor:
    """uint8 (M / 2,) -> codes (M,) as int64, ready to index the level table."""
    return torch.stack((packed >> 4, packed & 0x0F), dim=1).view(-1).long()


def quantize_nf4(w: Tensor, block: int = BLOCK) -> tuple[Tensor, Tensor]:
    """W (any shape, N weights) -> packed codes uint8 (K * block / 2,) and float32 block absmax (K,)."""
    flat = w.detach().float().reshape(-1)
    # N need not be a multiple of the block (e.g. 768 x 50 weights): pad the last block with zeros,
    # which code to the exact level 0 and do not change that block's absmax; dequantize drops them.
    pad = -flat.numel() % block
    blocks = F.pad(flat, (0, pad)).view(-1, block)  # (K, 64)
    scale = blocks.abs().amax(dim=1)  # (K,)
    x = blocks / _safe(scale)[:, None]  # in [-1, 1]
    # Nearest level = the bucket between the midpoints of neighbouring levels (no (N, 16) distances).
    mids = (NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2
    codes = torch.bucketize(x.reshape(-1), mids)
    return pack_nibbles(codes), scale


def nf4_byte_table(levels: Tensor = NF4_LEVELS) -> Tensor:
    """(256, 2): the two levels each packed byte stands for, so dequantizing is one gather per byte
    (measured faster than unpacking the nibbles first: docs/log.md, "Packed layers")."""
    return levels[unpack_nibbles(torch.arange(256, dtype=torch.uint8, device=levels.device))].view(256, 2)


def dequantize_nf4(packed: Tensor, scale: Tensor, shape: tuple[int, ...], table: Tensor | None = None) -> Tensor:
    """Packed codes (K * 32,) and block absmax (K,) -> float32 W of `shape` (the padding dropped).
    table: nf4_byte_table() on the codes' device (built here when not given)."""
    table = nf4_byte_table(NF4_LEVELS.to(packed.device)) if table is None else table
    w = table.index_select(0, packed.int()).view(scale.numel(), -1) * scale[:, None]  # (K, 64)
    return w.view(-1)[: math.prod(shape)].view(shape)


def quantized_bytes(out_features: int, in_features: int, kind: str) -> int:
    """Bytes of the codes and scales of one (O, I) weight, without its bias."""
    if kind == "int8":
        return out_features * in_features + 4 * out_features  # 1 byte a weight + a float32 per row
    blocks = -(-out_features * in_features // BLOCK)
    return blocks * BLOCK // 2 + 4 * blocks  # half a byte a weight (padded) + a float32 per block


class _DequantizedMatmul(torch.autograd.Function):
    """y = x @ W_deq^T + b that saves nothing of the weight for backward and dequantizes it again
    there (dL/dx = dL/dy @ W_deq): F.linear would keep each layer's float W_deq alive until backward,
    as much memory as the float base the quantization was to save."""

    @staticmethod
    def forward(ctx, x: Tensor, layer: QuantizedLinear) -> Tensor:
        ctx.layer, ctx.x_dtype = layer, x.dtype
        dtype = x.dtype if x.is_floating_point() else torch.float32
        bias = None if layer.bias is None else layer.bias.to(dtype)
        return F.linear(x, layer.dequantize().to(dtype), bias)  # autocast, when on, casts it further

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        w = ctx.layer.dequantize().to(grad.dtype)  # (O, I)
        return (grad @ w).to(ctx.x_dtype), None  # (..., O) @ (O, I) -> (..., I)


class QuantizedLinear(nn.Module):
    """A frozen nn.Linear whose weight is stored as int8 or NF4 codes: (..., I) -> (..., O).

    Codes, scales and the bias are buffers, not Parameters: nothing here trains (an adapter on top
    does), an optimizer never sees them, and they save as plain tensors (`codes`, `scales`, `bias`)."""

    def __init__(self, in_features: int, out_features: int, kind: str = "nf4", bias: bool = True):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"quantization kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.in_features, self.out_features, self.kind = in_features, out_features, kind
        if kind == "int8":
            codes = torch.zeros(out_features, in_features, dtype=torch.int8)
            scales = torch.zeros(out_features)
        else:
            blocks = -(-out_features * in_features // BLOCK)
            codes = torch.zeros(blocks * BLOCK // 2, dtype=torch.uint8)
            scales = torch.zeros(blocks)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        # The levels per byte follow the module's device but are a constant, not saved state.
        self.register_buffer("table", nf4_byte_table(), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, kind: str = "nf4") -> QuantizedLinear:
        """The quantized copy of `linear` on its device (the float weight is not kept)."""
        q = cls(linear.in_features, linear.out_features, kind, bias=linear.bias is not None)
        w = linear.weight.detach()
        codes, scales = quantize_int8(w) if kind == "int8" else quantize_nf4(w)
        q.codes, q.scales = codes, scales
        if linear.bias is not None:
            q.bias = linear.bias.detach().float().clone()
        return q.to(w.device)

    def dequantize(self) -> Tensor:
        """The float32 weight (O, I) the codes stand for."""
        if self.kind == "int8":
            return dequantize_int8(self.codes, self.scales)
        return dequantize_nf4(self.codes, self.scales, (self.out_features, self.in_features), self.table)

    def logical_parameters(self) -> int:
        """The weights the codes stand for, O x I, and the bias."""
        return self.out_features * self.in_features + (0 if self.bias is None else self.out_features)

    def stored_bytes(self) -> int:
        """Bytes of what is saved: codes, scales and the bias."""
        return sum(b.numel() * b.element_size() for b in self.state_dict().values())

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) / .half() casts every float buffer: the scales (and the level table)
        # would lose their precision on top of the quantization's. They move devices but stay float32.
        kept = {name: self._buffers[name] for name in ("scales", "table")}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            moved = self._buffers[name]
            if moved.dtype != before.dtype:
                self._buffers[name] = before.to(moved.device)
        return self

    @property
    def weight(self) -> Tensor:
        """The dequantized weight, a fresh float32 tensor, for code that reads a linear's weight (the
        attention's row slices for cross-attention); writing to it changes nothing."""
        return self.dequantize()

    def forward(self, x: Tensor) -> Tensor:
        """(..., I) -> (..., O) in the input's dtype (a bfloat16 model computes in bfloat16)."""
        return _DequantizedMatmul.apply(x, self)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}, "
            f"bias={self.bias is not None}"
        )


@dataclass
class QuantizeReport:
    """What quantize_model replaced (qualified module names) and the bytes of their weights and biases."""

    replaced: list[str] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0


def block_linears(model: nn.Module, kind: type | tuple[type, ...]) -> list[tuple[str, nn.Module, str, nn.Module]]:
    """(qualified name, parent, attribute, module) of every `kind` module inside the model's blocks:
    the attention and feed-forward (and experts') matrices, never embeddings or the head."""
    blocks = {id(b) for stack in stacks_of(model) for b in stack}
    names = {id(m): n for n, m in model.named_modules()}
    found = []
    for block in (m for m in model.modules() if id(m) in blocks):
        for parent in block.modules():
            for attr, child in parent.named_children():
                if isinstance(child, kind):
                    found.append((f"{names[id(parent)]}.{attr}", parent, attr, child))
    return found


def _skipped(name: str, skip: Collection[str]) -> bool:
    """skip names a module by its attribute (`router`) or by a dotted tail of its name (`attn.out_proj`)."""
    return any(name == s or name.endswith("." + s) for s in skip)


def quantize_model(model: nn.Module, kind: str = "nf4", skip: Collection[str] = ()) -> QuantizeReport:
    """Replace, in place, every nn.Linear inside the model's transformer blocks by its QuantizedLinear
    (embeddings, the head and anything outside a Stack stay float); names in `skip` stay float too."""
    if kind not in KINDS:
        raise ValueError(f"quantization kind must be one of {', '.join(KINDS)}, got {kind!r}")
    report = QuantizeReport()
    for name, parent, attr, linear in block_linears(model, nn.Linear):
        if _skipped(name, skip):
            continue
        q = QuantizedLinear.from_linear(linear, kind)
        report.bytes_before += sum(p.numel() * p.element_size() for p in linear.parameters())
        report.bytes_after += sum(b.numel() * b.element_size() for b in q.buffers(recurse=False) if b is not q.table)
        setattr(parent, attr, q)
        report.replaced.append(name)
    return report


def rebuild_quantized(model: nn.Module, tensors: Mapping[str, Tensor]) -> list[str]:
    """Put back in `model` (built in float, e.g. from its config) the QuantizedLinear layers that a saved
    quantized state dict holds (a `NAME.codes` tensor), empty, ready for load_state_dict. The kind is
    read from the codes' dtype: int8 codes are int8, NF4 codes packed uint8. Returns the names rebuilt."""
    rebuilt = []
    for name, parent, attr, linear in block_linears(model, nn.Linear):
        codes = tensors.get(f"{name}.codes")
        if codes is None:
            continue
        kind = "int8" if codes.dtype == torch.int8 else "nf4"
        q = QuantizedLinear(linear.in_features, linear.out_features, kind, bias=linear.bias is not None)
        setattr(parent, attr, q.to(linear.weight.device))
        rebuilt.append(name)
    return rebuilt


def load_quantized(model: nn.Module, tensors: Mapping[str, Tensor]) -> list[str]:
    """rebuild_quantized, then load every tensor; a tied weight saved once (the LM head) may be absent.
    A mismatch is one line. Returns the names rebuilt."""
    rebuilt = rebuild_quantized(model, tensors)
    try:
        result = model.load_state_dict(dict(tensors), strict=False)
    except RuntimeError as e:  # shapes of another model: one line, not torch's page
        raise AttnlabError(f"quantized weights do not fit the model ({str(e).splitlines()[-1].strip()})") from None
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise AttnlabError(
            f"quantized weights do not fit the model (missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})"
        )
    return rebuilt
