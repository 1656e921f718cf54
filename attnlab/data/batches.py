"""Batches for the training loop: one interface, whatever the task.

Every source answers `batch(split, n, rng, part)` with a tuple of tensors that the model takes
as `model(*batch)` and that ends with the labels, so the training loop (engine/loop.py) needs no knowledge of the
task. part=(rank, world): all processes draw the same global batch from the same RNG and each
keeps its own slice, so the global batch is the same whatever the number of processes.

Legend: B batch, T time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from attnlab.data.jitter import jitter, jitter_offsets
from attnlab.data.tokens import TokenData

IGNORE = -100  # a label that carries no loss (cross_entropy's ignore_index)
PAD_ID = 0
# Sequence-to-sequence ids: a tokenizer's id t becomes t + N_SPECIAL, below it these three.
BOS_ID, EOS_ID, N_SPECIAL = 1, 2, 3


class Batches(Protocol):
    per_example: tuple[int, str]  # (units in one example, unit name) for throughput: (256, "tokens")

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, ...]: ...

    def has(self, split: str) -> bool: ...

    def describe(self) -> str: ...


def rank_slice(rows: np.ndarray, part: tuple[int, int]) -> np.ndarray:
    """This process's share of the global batch's rows: part = (rank, world)."""
    rank, world = part
    per = len(rows) // world
    return rows[rank * per : (rank + 1) * per]


class LengthGroups:
    """Rows of like length drawn together, so a batch padded to its longest wastes little.

    The rows are split by length into equal-count groups; a batch draws one group with probability
    proportional to its size, then its rows from that group, so every row is as likely to be drawn
    as with uniform draws. On the chat demo's data the padded batch came out less than half as long
    (docs/fine-tuning.md). A group keeps at least `spread` batches' worth of rows, so a
    small data set stays one group and is drawn uniformly."""

    def __init__(self, lengths: list[int], batch: int, groups: int = 8, spread: int = 4):
        order = np.argsort(np.asarray(lengths), kind="stable")
        k = max(1, min(groups, len(order) // max(1, spread * batch)))
        self.groups = np.array_split(order, k)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        group = self.groups[int(rng.choice(len(self.groups), p=self.weights()))]
        return group[rng.integers(0, len(group), size=n)]

    def weights(self) -> np.ndarray:
        sizes = np.array([len(g) for g in self.groups], dtype=np.float64)
        return sizes / sizes.sum()


def draw_rows(count: int, n: int, rng: np.random.Generator, groups: LengthGroups | None = None) -> np.ndarray:
    """n row indices of `count`: uniform, or through length groups when given."""
    return groups.draw(n, rng) if groups is not None else rng.integers(0, count, size=n)


class Windows:
    """Language modelling: random contiguous token blocks x (B, T) and y = x shifted by one."""

    def __init__(self, tokens: TokenData, block_size: int):
        self.tokens, self.block_size = tokens, block_size
        self.per_example = (block_size, "tokens")

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, Tensor]:
        return self.tokens.batch(split, n, self.block_size, rng, part)

    def has(self, split: str) -> bool:
        return len(self.tokens.splits[split]) > self.block_size

    def describe(self) -> str:
        return f"{len(self.tokens) / 1e6:.1f}M training tokens"


class Examples:
    """Labelled sequences (classification or tagging), padded per batch to the longest.

    seqs[split]: token id arrays; labels[split]: one int per sequence (classification) or an
    int array as long as its sequence (tagging, IGNORE where a token carries no label).
    """

    def __init__(self, seqs: dict[str, list[np.ndarray]], labels: dict[str, list]):
        self.seqs, self.labels = seqs, labels
        lengths = [len(s) for s in seqs.get("train", [])]
        self.per_example = (round(float(np.mean(lengths))) if lengths else 0, "tokens")

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, Tensor]:
        rows = rank_slice(rng.integers(0, len(self.seqs[split]), size=n), part)
        return self.collate(split, rows)

    def collate(self, split: str, rows) -> tuple[Tensor, Tensor]:
        """ids (B, T) padded with PAD_ID, labels (B,) or (B, T) padded with IGNORE."""
        seqs = [self.seqs[split][i] for i in rows]
        ids = pad([torch.as_tensor(s) for s in seqs], PAD_ID)
        labels = [self.labels[split][i] for i in rows]
        if np.ndim(labels[0]) == 0:
            return ids, torch.as_tensor(labels, dtype=torch.long)
        return ids, pad([torch.as_tensor(y) for y in labels], IGNORE)

    def has(self, split: str) -> bool:
        return len(self.seqs.get(split, [])) > 0

    def describe(self) -> str:
        return f"{len(self.seqs.get('train', [])):,} training examples"


class Pairs:
    """Translation: source and target id arrays (specials already shifted in, no BOS/EOS).

    A batch is (src (B, S), tgt_in (B, T), labels (B, T)), padded per batch to the longest:
    tgt_in = BOS + target (teacher forcing), labels = target + EOS, IGNORE on padding.
    """

    def __init__(self, src: dict[str, list[np.ndarray]], tgt: dict[str, list[np.ndarray]]):
        self.src, self.tgt = src, tgt
        lengths = [len(t) + 1 for t in tgt.get("train", [])]
        self.per_example = (round(float(np.mean(lengths))) if lengths else 0, "tokens")  # target side

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, ...]:
        return self.collate(split, rank_slice(rng.integers(0, len(self.src[split]), size=n), part))

    def collate(self, split: str, rows) -> tuple[Tensor, Tensor, Tensor]:
        src = self.source(split, rows)
        tgt = [torch.as_tensor(self.tgt[split][i]) for i in rows]
        bos, eos = torch.tensor([BOS_ID]), torch.tensor([EOS_ID])
        tgt_in = pad([torch.cat([bos, t]) for t in tgt], PAD_ID)  # (B, T)
        labels = pad([torch.cat([t, eos]) for t in tgt], IGNORE)  # (B, T)
        return src, tgt_in, labels

    def source(self, split: str, rows) -> Tensor:
        return pad([torch.as_tensor(self.src[split][i]) for i in rows], PAD_ID)  # (B, S)

    def has(self, split: str) -> bool:
        return len(self.src.get(split, [])) > 0

    def describe(self) -> str:
        return f"{len(self.src.get('train', [])):,} training pairs"


class ImagePairs(Pairs):
    """Captioning: src[split] is an image array (N, C, H, W) float32 in [0, 1]; a batch is
    (images (B, C, H, W), tgt_in (B, T), labels (B, T)), the targets as in Pairs.

    With shift > 0, a `share` of each training batch's images is moved by up to `shift` pixels
    each way, fractions resampled (data/jitter.py); validation and test images never move."""

    def __init__(self, src: dict, tgt: dict, shift: float = 0.0, share: float = 0.5):
        super().__init__(src, tgt)
        self.shift, self.share = shift, share

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, ...]:
        images, tgt_in, labels = super().batch(split, n, rng, part)
        if split == "train" and self.shift > 0:
            offsets = rank_slice(jitter_offsets(n, self.shift, self.share, rng), part)  # (B, 2)
            images = jitter(images, offsets)
        return images, tgt_in, labels

    def source(self, split: str, rows) -> Tensor:
        return torch.from_numpy(self.src[split][np.asarray(rows)])  # (B, C, H, W)

    def describe(self) -> str:
        return f"{len(self.src.get('train', [])):,} training images with captions"


def pad(rows: list[Tensor], value: int) -> Tensor:
    """(B, T_longest) int64 from rows of different lengths."""
    out = torch.full((len(rows), max(len(r) for r in rows)), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


class MaskedWindows:
    """Masked-language modelling on token blocks (BERT's recipe): of each block, `rate` of the
    tokens are chosen; a chosen token becomes [MASK] 80% of the time, a random token 10%, and
    stays 10%; the loss is on chosen positions only (labels IGNORE elsewhere). Special tokens
    (ids below `n_special`) are never chosen."""

    def __init__(self, tokens: TokenData, block_size: int, mask_id: int, n_special: int, rate: float = 0.15):
        self.windows = Windows(tokens, block_size)
        self.mask_id, self.n_special, self.rate = mask_id, n_special, rate
        self.vocab_size = tokens.meta["vocab_size"]
        self.per_example = self.windows.per_example

    def batch(self, split: str, n: int, rng: np.random.Generator, part: tuple[int, int]) -> tuple[Tensor, Tensor]:
        x, _ = self.windows.batch(split, n, rng, part)
        # The mask draws come from a generator seeded by the batch RNG, so runs are reproducible.
        g = torch.Generator().manual_seed(int(rng.integers(2**62)))
        return mask_tokens(x, self.mask_id, self.n_special, self.vocab_size, self.rate, g)

    def has(self, split: str) -> bool:
        return self.windows.has(split)

    def describe(self) -> str:
        return self.windows.describe()


def mask_tokens(
    ids: Tensor, mask_id: int, n_special: int, vocab_size: int, rate: float, g: torch.Generator
) -> tuple[Tensor, Tensor]:
    """(inputs, labels) for masked-LM from token ids (B, T); see MaskedWindows."""
    chosen = (torch.rand(ids.shape, generator=g) < rate) & (ids >= n_special)  # (B, T)
    labels = torch.where(chosen, ids, IGNORE)
    roll = torch.rand(ids.shape, generator=g)
    inputs = ids.clone()
    inputs[chosen & (roll < 0.8)] = mask_id
    random_ = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[random_] = torch.randint(n_special, vocab_size, ids.shape, generator=g)[random_]
    return inputs, labels


def windows(arr: np.ndarray, block: int, batch_size: int) -> Iterator[np.ndarray]:
    """Consecutive (B, block + 1) windows overlapping by one token, so that every token after
    the first is a target exactly once; the last, shorter window comes alone."""
    n_full = (len(arr) - 1) // block
    for i in range(0, n_full, batch_size):
        starts = np.arange(i, min(i + batch_size, n_full)) * block
        yield arr[starts[:, None] + np.arange(block + 1)].astype(np.int64)
    if (len(arr) - 1) % block:
        yield arr[None, n_full * block :].astype(np.int64)
