"""Text sources: a file, a folder of files, or a built-in corpus.

Built in: `stdlib`, the source of the running Python's standard library (its tests and
site-packages excluded), read from the interpreter's installation: no download, on every
machine that has Python; `repeats`, random letter strings each written twice (data/repeats.py),
where a small model learns an induction head.
"""

from __future__ import annotations

import ctypes
import sysconfig
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnlab.config import check_fraction, check_types, option
from attnlab.data.repeats import repeats_file
from attnlab.errors import AttnlabError
from attnlab.io import cache_root
from attnlab.progress import tqdm

BUILTIN = ("stdlib", "repeats")
_STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


@dataclass
class DataConfig:
    data: str = option("stdlib", "a text file, a folder, or a built-in corpus: stdlib, repeats")
    glob: str = option("*", "which files of a folder to read, searched recursively (e.g. '*.py')")
    tokenizer: str = option("char", "character-level, byte-level BPE or word tokens", ("char", "bpe", "word"))
    vocab_size: int = option(4096, "vocabulary size when training a BPE tokenizer")
    val_fraction: float = option(0.05, "share of the corpus held out for validation")

    def __post_init__(self):
        check_types(self)  # DataConfig(data=5), built by hand, is named here rather than deep in the reader
        check_fraction(self, "val_fraction")
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size must be at least 1, got {self.vocab_size}")


def stdlib_files() -> list[Path]:
    """The .py files of this interpreter's standard library, tests excluded, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p for p in root.rglob("*.py") if not _STDLIB_SKIP.intersection(p.relative_to(root).parts[:-1]) and p.is_file()
    ]
    return sorted(files)


def _wanted(rel: Path) -> bool:
    """Skip hidden files and folders (.git, .venv, ...) and caches inside a data folder."""
    return not any(part.startswith(".") or part in _STDLIB_SKIP - {"test", "tests"} for part in rel.parts)


def _is_text(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\0" not in f.read(8192)


def resolve_sources(data: str, glob: str = "*") -> list[Path]:
    """The files a data spec names, sorted (so every run sees the same order)."""
    if data == "stdlib":
        files = stdlib_files()
        if not files:
            raise AttnlabError("no standard library sources found in this Python installation")
        return files
    if data == "repeats":
        return [repeats_file(cache_root() / "corpora")]
    p = Path(data).expanduser()
    if p.is_file():
        if not _is_text(p):  # a folder skips such files; one named on its own is a mistake
            raise AttnlabError(f"{p} is not a text file (it holds NUL bytes): give a text file or a folder")
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.rglob(glob) if _wanted(f.relative_to(p)) and f.is_file() and _is_text(f))
        if not files:
            raise AttnlabError(f"no text files matching {glob!r} in folder {p}")
    else:
        raise AttnlabError(f"data not found: {data!r} is not a file, a folder, or one of: {', '.join(BUILTIN)}")
    if sum(f.stat().st_size for f in files) == 0:
        raise AttnlabError(f"data is empty: {data}")
    return files


PIECE_BYTES = 4 << 20  # read large files 4 MB at a time, so memory stays small whatever their size
# No text holds this many NUL bytes in a row; a file padded with zeros, a disk image or a binary does.
NUL_RUN = b"\0" * 16


def refuse_nul_run(path: Path, block: bytes, offset: int, before: bytes = b"") -> None:
    """An error if `block` (at byte `offset` of `path`, after the bytes `before`) holds a run of NULs."""
    carry = before[-(len(NUL_RUN) - 1) :] if before else b""  # a run across the two blocks
    where = (carry + block).find(NUL_RUN) if carry else block.find(NUL_RUN)
    if where >= 0:
        at = offset - len(carry) + where
        raise AttnlabError(
            f"{path} is not text: it holds a run of NUL bytes from byte {at:,} (a file padded "
            f"with zeros, a disk image or a binary?): give a text file"
        )


def _trim_heap() -> None:
    """Hand memory freed by earlier pieces back to the OS. glibc keeps large freed blocks in its heap,
    and resident memory would otherwise creep up with the corpus size (measured: docs/log.md,
    "Data"). A no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def decode(data: bytes | memoryview, bad: list[int]) -> str:
    """UTF-8 text; bytes that are not UTF-8 become U+FFFD and are counted in bad[0]."""
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError:
        text = str(data, "utf-8", errors="replace")
        bad[0] += len(data) - len(str(data, "utf-8", errors="ignore").encode("utf-8"))
        return text


def warn_undecodable(path: Path, bad: int, sample: bytes) -> None:
    """One line: how many bytes of `path` were not UTF-8, and the encoding they look like."""
    if not bad:
        return
    try:
        sample.decode("cp1252")
        guess = "Latin-1 / Windows-1252"
    except UnicodeDecodeError:
        guess = "an unknown encoding"
    warnings.warn(
        f"{path}: {bad:,} bytes are not UTF-8 and were read as U+FFFD; the file looks like {guess}: "
        f"convert it, e.g. iconv -f cp1252 -t utf-8",
        stacklevel=3,
    )


def read_text(path: Path) -> str:
    """A whole (small) text file as UTF-8, with the warning of read_pieces for bytes that are not."""
    data, bad = Path(path).read_bytes(), [0]
    refuse_nul_run(path, data, 0)
    text = decode(data, bad)
    warn_undecodable(path, bad[0], data[:65536])
    return text


def read_pieces(files: list[Path], piece_bytes: int = PIECE_BYTES) -> Iterator[tuple[str, int, bool]]:
    """The files' text in pieces of about piece_bytes: (text, its size in bytes, last piece of
    its file). Pieces end at a line break where there is one, so no character or line is cut
    in two; undecodable bytes become U+FFFD rather than an error, with one warning per file; a run
    of NUL bytes anywhere is an error (resolve_sources looks only at a file's first 8 KB)."""
    for f in files:
        bad = [0]
        with open(f, "rb") as fh:
            pending, previous, offset = b"", b"", 0
            head = fh.read(65536)  # what the encoding is guessed from
            fh.seek(0)
            while block := fh.read(piece_bytes):
                refuse_nul_run(f, block, offset, previous)  # before a NUL is trained on or cached
                previous, offset = block, offset + len(block)
                if len(block) == piece_bytes:  # a large file: give back what the last piece used
                    _trim_heap()
                cut = block.rfind(b"\n") + 1
                if cut == 0 and len(pending) < 3 * piece_bytes:
                    pending += block
                    continue  # no line break yet: read on rather than cut a line
                cut = cut or len(block)
                piece = b"".join((pending, memoryview(block)[:cut]))  # one copy, not three
                yield decode(piece, bad), len(piece), False
                pending = block[cut:]
            last = decode(pending, bad)
            warn_undecodable(f, bad[0], head)
            yield last, len(pending), True


def read_texts(files: list[Path], progress: str | None = None) -> Iterator[str]:
    """The text of the files, piece by piece (see read_pieces); `progress`: a bar with that label, in MB/s."""
    total = sum(f.stat().st_size for f in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc=progress, disable=progress is None, leave=False) as bar:
        for text, size, _ in read_pieces(files):
            yield text
            bar.update(size)
