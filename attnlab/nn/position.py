"""Position information: the one seam every scheme plugs into.

Legend: B batch, T time, C model width.

A `Positions` module has three hooks, and every family's Stack calls all three:
- `forward(x, offset)` adds absolute positions to the token embeddings (B, T, C); the
  positions are offset, offset+1, ... (offset > 0 when decoding with a cache);
- `qk_transform` is None for absolute schemes; schemes that act on queries and keys inside
  attention (rotary) set it to a function (q, k, offset) -> (q, k) that every attention layer calls;
- `score_bias(tq, tk, offset)` is None for them too; schemes that add to the attention scores
  (ALiBi, relative-position biases) return a float (1|B, H|1, Tq, Tk) bias there.
Queries and keys given to `qk_transform` are the new positions' only (before the key/value
cache), so a cached key keeps the rotation of the position it was computed at.
So adding a scheme is one class taking (max_len, d_model) (or its own `build` from a PositionSpec)
and one `POSITIONS` entry.

`offset` is an int, or a (B,) tensor when the rows of a batch sit at different positions (a
server decoding many requests at once, decoding/engine.py): row b's positions are then
offset[b], offset[b]+1, ..., and its keys are positions 0, 1, ... of its own sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

Offset = int | Tensor  # where x[:, 0] sits: one position for every row, or one per row (B,)


def row_positions(offset: Tensor, t: int) -> Tensor:
    """(B, T) positions of each row's T tokens from per-row offsets (B,)."""
    return offset[:, None] + torch.arange(t, device=offset.device)


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Returns (n_positions, d_model), as in "Attention Is All You Need", section 3.5.
    """
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]  # (N, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # (ceil(C/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (N, ceil(C/2))
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table


@dataclass(frozen=True)
class PositionSpec:
    """What a scheme may be built from: the longest sequence and the model's width, the heads
    (ALiBi's slopes), the rotary base, and for image patches their (rows, cols) grid after `lead`
    tokens that are not on it (ViT's [CLS])."""

    max_len: int
    d_model: int
    n_heads: int = 1
    rope_theta: float = 10000.0
    grid: tuple[int, int] | None = None
    lead: int = 1


class Positions(nn.Module):
    """Base class: no position information at all (the model sees a bag of tokens)."""

    qk_transform = None
    on_grid = False  # on image patches, a table over the 2-D grid (then any number of patches fits)
    why_no_vectors = "'s positions act inside attention: no table to plot"

    def __init__(self, max_len: int, d_model: int | None = None):
        super().__init__()
        self.max_len = max_len

    @classmethod
    def build(cls, spec: PositionSpec) -> Positions:
        """The scheme for a model's shape (a new scheme overrides this if it needs more than these two)."""
        return cls(spec.max_len, spec.d_model)

    def vectors(self) -> tuple[Tensor, str] | None:
        """The position vectors added to the inputs, (N, C), and what they are; None for a scheme
        that adds none (why_no_vectors says why)."""
        return None

    def score_bias(self, tq: int, tk: int, offset: Offset = 0) -> Tensor | None:
        """An additive bias on the attention scores of Tq queries at positions offset..offset+Tq-1
        over Tk keys, the last Tk positions up to the newest query (offset+Tq-Tk..offset+Tq-1):
        with a cache the keys are every position so far, without one the queries' own."""
        return None

    def check(self, t: int, offset: Offset) -> None:
        if isinstance(offset, Tensor) and torch.compiler.is_compiling():
            return  # a compiled decode step (decoding/compiled.py): its caller keeps positions in the context
        first = offset if isinstance(offset, int) else int(offset.max())  # per-row offsets: the furthest row
        if first + t > self.max_len:
            raise ValueError(f"positions {first}..{first + t - 1} exceed the context of {self.max_len}")

    def forward(self, x: Tensor, offset: Offset = 0) -> Tensor:
        return x


class NoPositions(Positions):
    """Explicitly no positions: a block stack is then permutation-equivariant."""

    why_no_vectors = " was trained with positions 'none': it has no position vectors to plot"

    def check(self, t: int, offset: Offset) -> None:
        return None


class FixedPositions(Positions):
    """A fixed table of vectors (T, C) added to the embeddings; nothing to learn."""

    def __init__(self, table: Tensor):
        super().__init__(table.shape[0])
        # Not saved in checkpoints: it is a function of the shape alone.
        self.register_buffer("table", table, persistent=False)

    def vectors(self) -> tuple[Tensor, str]:
        return self.table, "fixed positions"

    def forward(self, x: Tensor, offset: Offset = 0) -> Tensor:
        t = x.shape[1]
        self.check(t, offset)
        if isinstance(offset, Tensor):
            return x + self.table[row_positions(offset, t)].to(x.dtype)  # (B, T, C) + (B, T, C)
        return x + self.table[offset : offset + t].to(x.dtype)  # (B, T, C) + (T, C)


class SinusoidalPositions(FixedPositions):
    """The paper's sin/cos encodings of the position in the sequence."""

    on_grid = True

    def __init__(self, max_len: int, d_model: int):
        super().__init__(sinusoidal_table(max_len, d_model))

    @classmethod
    def build(cls, spec: PositionSpec) -> Positions:
        """The 1-D table, or on image patches the 2-D one (the 1-D table would ignore the grid's rows)."""
        if spec.grid is not None:
            return GridPositions(*spec.grid, spec.d_model, lead=spec.lead)
        return cls(spec.max_len, spec.d_model)

    def vectors(self) -> tuple[Tensor, str]:
        return self.table, "sinusoidal positions"


class LearnedPositions(Positions):
    """A trained vector per position (GPT, BERT, ViT)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__(max_len)
        self.embedding = nn.Embedding(max_len, d_model)

    def vectors(self) -> tuple[Tensor, str]:
        return self.embedding.weight, "learned positions"

    def forward(self, x: Tensor, offset: Offset = 0) -> Tensor:
        t = x.shape[1]
        self.check(t, offset)
        if isinstance(offset, Tensor):
            return x + self.embedding.weight[row_positions(offset, t)]  # (B, T, C) + (B, T, C)
        # Rows offset..offset+T-1 of the table, as a view: the same values and gradients as
        # embedding(arange(offset, offset + T)) without making an index tensor at every step.
        return x + self.embedding.weight[offset : offset + t]  # (B, T, C) + (T, C)


def sinusoidal_2d_table(rows: int, cols: int, d_model: int) -> Tensor:
    """Positions on a grid (image patches), row-major: the first half of the width encodes the
    row with the 1-D sin/cos table, the second half the column. Returns (rows * cols, d_model)."""
    if d_model % 4:
        raise ValueError(f"2-D sinusoidal positions need a width divisible by 4, got {d_model}")
    half = d_model // 2
    by_row = sinusoidal_table(rows, half)[:, None, :].expand(rows, cols, half)  # (rows, cols, C/2)
    by_col = sinusoidal_table(cols, half)[None, :, :].expand(rows, cols, half)  # (rows, cols, C/2)
    return torch.cat([by_row, by_col], dim=-1).reshape(rows * cols, d_model)


class GridPositions(FixedPositions):
    """2-D sin/cos encodings for a grid of patches, after `lead` tokens that have no place on
    the grid (ViT's [CLS]) and get a zero vector."""

    def __init__(self, rows: int, cols: int, d_model: int, lead: int = 1):
        super().__init__(torch.cat([torch.zeros(lead, d_model), sinusoidal_2d_table(rows, cols, d_model)]))

    def vectors(self) -> tuple[Tensor, str]:
        return self.table, "2-D sinusoidal grid positions ([CLS] first, zero)"


def rotary_angles(n_positions: int, d_head: int, theta: float = 10000.0) -> Tensor:
    """(n_positions, d_head / 2) angles pos * theta^(-2i / d_head): pair i of a head's features
    turns by this much at position pos (RoFormer, Su et al. 2021, eq. 15)."""
    if d_head % 2:
        raise ValueError(f"rotary positions need an even head width, got {d_head}")
    inv_freq = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (Dh/2,)
    pos = torch.arange(n_positions, dtype=torch.float64)
    return torch.outer(pos, inv_freq).float()


def rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Turn each pair of features of x (..., T, Dh) by the angles whose cos/sin are (T, Dh/2).

    The pairs are (i, i + Dh/2) in the half-split layout (GPT-NeoX, Llama checkpoints) and
    (2i, 2i+1) when interleaved (the RoFormer paper, GPT-J).
    """
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]  # (..., T, Dh/2) each
        return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class RotaryPositions(Positions):
    """Rotary position embeddings: nothing is added to the tokens; inside every attention layer
    the queries and keys are rotated by angles proportional to their positions, so that
    q_m . k_n depends only on the content and on m - n: attention sees relative positions.

    The tables are built on first use for the heads' width (the Positions seam is given the
    model width), per device, and are not saved: they are a function of the shape alone.
    """

    def __init__(self, max_len: int, d_model: int | None = None, theta: float = 10000.0, interleaved: bool = False):
        super().__init__(max_len)
        self.theta, self.interleaved = theta, interleaved
        self._tables: dict[tuple[int, torch.device], tuple[Tensor, Tensor]] = {}

    @classmethod
    def build(cls, spec: PositionSpec) -> Positions:
        return cls(spec.max_len, spec.d_model, theta=spec.rope_theta)

    def _table(self, d_head: int, device: torch.device) -> tuple[Tensor, Tensor]:
        key = (d_head, device)
        if key not in self._tables:
            # Normal tensors even when first asked for under inference mode (the decoding engine's
            # thread): the same tables serve training afterwards.
            with torch.inference_mode(False), torch.no_grad():
                angles = rotary_angles(self.max_len, d_head, self.theta).to(device)  # (max_len, Dh/2)
                self._tables[key] = (angles.cos(), angles.sin())
        return self._tables[key]

    def forward(self, x: Tensor, offset: Offset = 0) -> Tensor:
        self.check(x.shape[1], offset)
        return x

    def qk_transform(self, q: Tensor, k: Tensor, offset: Offset) -> tuple[Tensor, Tensor]:
        """q, k (B, H, T, Dh) at positions offset..offset+T-1 -> rotated, same shapes and dtypes."""
        t = q.shape[-2]
        cos, sin = self._table(q.shape[-1], q.device)
        if isinstance(offset, Tensor):  # each row at its own positions
            rows = row_positions(offset, t)  # (B, T)
            cos, sin = cos[rows][:, None].to(q.dtype), sin[rows][:, None].to(q.dtype)  # (B, 1, T, Dh/2)
        else:
            cos, sin = cos[offset : offset + t].to(q.dtype), sin[offset : offset + t].to(q.dtype)  # (T, Dh/2)
        return rotate(q, cos, sin, self.interleaved), rotate(k, cos, sin, self.interleaved)

    def extra_repr(self) -> str:
        return f"theta={self.theta:g}, {'interleaved' if self.interleaved else 'half-split'}"


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's per-head slopes (Press et al. 2022, section 3): for n a power of 2, the geometric
    sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise the slopes of the power of 2 below n,
    then every other slope of the power of 2 above it until there are n."""

    def powers(n: int) -> list[float]:
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    below = 2 ** math.floor(math.log2(n_heads))
    slopes = powers(below) + powers(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes)  # (H,)


class ALiBiPositions(Positions):
    """Attention with linear biases: nothing is added to the tokens; head h's score of a query at
    position i for a key at j gets -slope_h * |i - j|, so each head prefers nearby keys with its own
    reach (steep slopes: the last few tokens; gentle ones: far back). The bias depends on i - j
    only, so a model trained on short sequences still works on longer ones (the paper's point).
    In a causal model only j <= i is seen, and -slope * |i - j| is the paper's -slope * (i - j)."""

    def __init__(self, max_len: int, d_model: int | None = None, n_heads: int = 1):
        super().__init__(max_len)
        # Not saved in checkpoints: a function of the head count alone.
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # (H,)

    @classmethod
    def build(cls, spec: PositionSpec) -> Positions:
        return cls(spec.max_len, spec.d_model, spec.n_heads)

    def forward(self, x: Tensor, offset: Offset = 0) -> Tensor:
        self.check(x.shape[1], offset)
        return x

    def score_bias(self, tq: int, tk: int, offset: Offset = 0) -> Tensor:
        """(1, H, Tq, Tk) = -slope_h * |i - j| for queries i = offset.. and keys j = offset+Tq-Tk..;
        with per-row offsets (B,), (B, H, Tq, Tk) for keys j = 0..Tk-1 of each row."""
        device = self.slopes.device
        if isinstance(offset, Tensor):
            i = row_positions(offset.to(device), tq)[:, None, :, None]  # (B, 1, Tq, 1)
            j = torch.arange(tk, device=device)  # (Tk,)
            return -self.slopes[None, :, None, None] * (i - j).abs()  # (B, H, Tq, Tk)
        i = torch.arange(offset, offset + tq, device=device)[:, None]  # (Tq, 1)
        j = torch.arange(offset + tq - tk, offset + tq, device=device)[None, :]  # (1, Tk)
        return -self.slopes[None, :, None, None] * (i - j).abs()  # (1, H, Tq, Tk)


# Position schemes by config name, in the order `--help` lists them.
POSITIONS: dict[str, type[Positions]] = {
    "learned": LearnedPositions,
    "sinusoidal": SinusoidalPositions,
    "rope": RotaryPositions,
    "alibi": ALiBiPositions,
    "none": NoPositions,
}


def build_positions(
    kind: str,
    max_len: int,
    d_model: int,
    grid: tuple[int, int] | None = None,
    n_heads: int = 1,
    rope_theta: float = 10000.0,
    lead: int = 1,
) -> Positions:
    """The position module named by a config value (a key of POSITIONS), built by its class from the
    model's shape (see PositionSpec)."""
    if kind not in POSITIONS:
        raise ValueError(f"unknown positions {kind!r}; choose from {sorted(POSITIONS)}")
    return POSITIONS[kind].build(PositionSpec(max_len, d_model, n_heads, rope_theta, grid, lead))
