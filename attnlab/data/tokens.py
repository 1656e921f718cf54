"""Token caches: a corpus tokenized once into flat binary files, read through numpy memmaps.

A cache is a folder `<cache>/tokens/<key>/` holding `train.bin`, `val.bin` (uint16 or uint32
token ids) and `meta.json`. The key is a hash of the tokenizer and of the files' names,
sizes and modification times, so any change gives a new cache. A cache is built in a
temporary folder and renamed into place when complete: an interrupted build never leaves
a folder that looks finished.

Validation split: the token stream is cut into chunks and every k-th chunk (k = 1 / val
fraction) is held out, so validation text is spread over the whole corpus and the split
is the same on every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from attnlab.data.pool import cpu_count
from attnlab.data.text import read_pieces
from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.progress import tqdm

CACHE_VERSION = 2  # bump when the split or file format changes
MIN_CHUNK, MAX_CHUNK = 64, 8192  # tokens
PARALLEL_BYTES = 32 << 20  # below this, starting worker processes costs more than it saves


def cache_root() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _fingerprint(files: list[Path], tok: Tokenizer, val_fraction: float) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION} {val_fraction}\n".encode())
    h.update(tok.to_json().encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def workers_for(files: list[Path]) -> int:
    """Processes worth starting for a pass over `files`: one per core for a large corpus, else one."""
    return cpu_count() if sum(f.stat().st_size for f in files) > PARALLEL_BYTES else 1


class _Splitter:
    """Routes a stream of tokens to train or validation by chunk position."""

    def __init__(self, total_bytes: int, val_fraction: float):
        self.period = round(1 / val_fraction) if val_fraction > 0 else 0
        # Small corpora get smaller chunks (so they still have a validation part), but never
        # so small that both splits become strings of fragments.
        self.chunk = int(np.clip(total_bytes // max(self.period * 4, 1), MIN_CHUNK, MAX_CHUNK))
        self.pos = 0

    def split(self, ids: np.ndarray) -> Iterator[tuple[bool, np.ndarray]]:
        """(is_val, run) for the runs of `ids` that fall in training or validation chunks, in
        order. Runs are views of `ids`: neighbouring chunks of one kind make one run, and
        nothing is copied before it is written."""
        start = 0
        while start < len(ids):
            chunk = (self.pos + start) // self.chunk
            is_val = self.period > 0 and chunk % self.period == self.period - 1
            # a validation chunk ends at the chunk's end; a training run at the next validation chunk
            run_end = chunk + 1 if is_val or not self.period else chunk + self.period - 1 - chunk % self.period
            end = min(len(ids), run_end * self.chunk - self.pos)
            yield is_val, ids[start:end]
            start = end
        self.pos += len(ids)


def build_token_cache(files: list[Path], tok: Tokenizer, val_fraction: float = 0.05, progress: bool = True) -> Path:
    """Tokenize `files` into a cache folder (once; later calls return the same folder)."""
    key = _fingerprint(files, tok, val_fraction)
    final = cache_root() / "tokens" / key
    if (final / "meta.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{key}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    dtype = token_dtype(tok.vocab_size)
    total = sum(f.stat().st_size for f in files)
    splitter = _Splitter(total, val_fraction)
    counts = {"train": 0, "val": 0}
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", disable=not progress, leave=False)
    try:
        with open(tmp / "train.bin", "wb") as ftrain, open(tmp / "val.bin", "wb") as fval:
            for size, last, ids in _encoded(files, tok, dtype):
                if last:
                    ids = np.append(ids, np.array([tok.eot_id], dtype))  # documents end with <|endoftext|>
                for is_val, run in splitter.split(ids):
                    (fval if is_val else ftrain).write(run.data)
                    counts["val" if is_val else "train"] += len(run)
                bar.update(size)
        meta = {"dtype": dtype.name, "vocab_size": tok.vocab_size, "files": len(files), "bytes": total, **counts}
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same cache first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()
    return final


def _encoded(files: list[Path], tok: Tokenizer, dtype: np.dtype) -> Iterator[tuple[int, bool, np.ndarray]]:
    """(size, last, ids) for each piece of the files, ids in the cache's dtype (2 bytes a token, not 8).

    BPE encodes batches of pieces on every core inside its Rust library. The character
    tokenizer's lookup stays in this process: sending its token arrays back from worker
    processes was measured to cost more than the lookup (docs/log.md, "Data").
    """
    if tok.kind == "bpe":
        for group in _groups(read_pieces(files), tok.batch_pieces):
            for (_, size, last), ids in zip(group, tok.encode_batch([text for text, _, _ in group])):
                yield size, last, ids.astype(dtype)
    else:
        for text, size, last in read_pieces(files):
            yield size, last, tok.encode_array(text).astype(dtype, copy=False)


def _groups(items: Iterable, n: int) -> Iterator[list]:
    group = []
    for item in items:
        group.append(item)
        if len(group) == n:
            yield group
            group = []
    if group:
        yield group


class TokenData:
    """The train and validation token streams of a cache, and random batches from them."""

    def __init__(self, folder: Path):
        self.meta = json.loads((folder / "meta.json").read_text())
        dtype = np.dtype(self.meta["dtype"])
        self.splits = {
            name: np.memmap(folder / f"{name}.bin", dtype=dtype, mode="r") if self.meta[name] else np.zeros(0, dtype)
            for name in ("train", "val")
        }

    def __len__(self) -> int:
        return len(self.splits["train"])

    def check(self, block_size: int, split: str = "train") -> None:
        n = len(self.splits[split])
        if n < block_size + 1:
            raise AttnlabError(
                f"the {split} split has {n} tokens, fewer than block size {block_size} + 1: "
                "use more data or a smaller --block-size"
            )

    def batch(
        self, split: str, batch_size: int, block_size: int, rng: np.random.Generator, part: tuple[int, int] = (0, 1)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (B, T) int64: random contiguous blocks and the same shifted by one.

        part=(rank, world): every process draws the same global batch from the same RNG and
        keeps its own 1/world slice, so the processes see different sequences and the global
        batch is the same whatever the number of processes.
        """
        data = self.splits[split]
        starts = rng.integers(0, len(data) - block_size, size=batch_size)
        rank, world = part
        per = batch_size // world
        starts = starts[rank * per : (rank + 1) * per]
        idx = starts[:, None] + np.arange(block_size + 1)  # (B / world, T+1)
        block = torch.from_numpy(data[idx].astype(np.int64))
        return block[:, :-1], block[:, 1:]
