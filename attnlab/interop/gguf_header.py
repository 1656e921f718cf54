"""A GGUF file's header, read and checked before anything of it is trusted.

The layout (llama.cpp's docs/gguf.md; little-endian):
    "GGUF" | version u32 (2 or 3) | tensor count u64 | key-value count u64
    each key-value: key (string) | value type u32 | value
        string: length u64 + UTF-8 bytes;  array: element type u32 + count u64 + the elements
    each tensor: name (string) | n_dims u32 | ne: n_dims x u64, fastest first | type u32 | offset u64
    padding to general.alignment (32 unless set) | the tensors' data, each at its offset from here
Every count and length is checked against the bytes left and a bound below before it is used, so a
header declaring 2^62 elements or a 2^50-byte string is refused in one line having read only what the
file holds. The header's time and memory follow its real size, capped by the bounds (a million
tokens parse in about a second within 100 MB: docs/log.md, "GGUF").

The gguf package's GGUFReader is not used to parse: it makes numpy arrays for every element of every
array (measured per token: docs/log.md, "GGUF"), and it loops on a declared count it never checks.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from attnlab.errors import AttnlabError

V = gguf.GGUFValueType
MAX_HEADER_BYTES = 64 << 20  # keys, values and tensor infos: a 256k-token vocabulary with merges takes ~10 MB
MAX_ELEMENTS = 1 << 21  # array elements in all keys together (Llama 3's tokens, types and merges: 537k)
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 14  # Llama 3.1 405B has 1,138, a Mixtral 8x22B (experts stacked) about 500
MAX_NAME = 64  # ggml's GGML_MAX_NAME: llama.cpp refuses a longer tensor name
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays, as GGUF allows
# value type -> numpy's little-endian dtype of one element (BOOL: a byte, 0 or not)
NUMBERS = {
    V.UINT8: "<u1",
    V.INT8: "<i1",
    V.UINT16: "<u2",
    V.INT16: "<i2",
    V.UINT32: "<u4",
    V.INT32: "<i4",
    V.FLOAT32: "<f4",
    V.BOOL: "<u1",
    V.UINT64: "<u8",
    V.INT64: "<i8",
    V.FLOAT64: "<f8",
}
SMALLEST = {V.STRING: 8, V.ARRAY: 12}  # bytes the shortest value of each other kind takes


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header places it: its bytes are file[start : start + n_bytes]."""

    name: str
    type: gguf.GGMLQuantizationType
    ne: tuple[int, ...]  # GGUF's dimensions, fastest first
    start: int
    n_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy's order: (out, in) for a matrix whose ne is [in, out]."""
        return tuple(reversed(self.ne))


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Any]  # every key's value as Python holds it (a list for an array)
    tensors: dict[str, TensorInfo]  # in the file's order


def read_header(path: Path) -> Header:
    """The checked header of the GGUF file at `path`; one AttnlabError line for anything wrong."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:  # magic, version and the two counts
                raise AttnlabError(
                    f"{path} is not a readable GGUF file: it has {size} bytes, fewer than GGUF's 24-byte start"
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _Walk(buf, path).header()
    except OSError as e:
        raise AttnlabError(f"cannot read {path}: {e.strerror or e}") from None


class _Walk:
    """A cursor over the file's bytes that never reads past them (nor past MAX_HEADER_BYTES)."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos, self.elements = buf, path, 0, 0

    def fail(self, what: str) -> AttnlabError:
        return AttnlabError(f"{self.path} {what}")

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str, declared: bool = True) -> bytes:
        """The next n bytes, of `what` (declared: n is the file's word, not GGUF's fixed size)."""
        if n > self.left() and not declared:
            raise self.fail(f"ends inside {what} (byte {self.pos:,}): the file is cut short")
        if n > self.left():
            raise self.fail(
                f"declares {what} of {n:,} bytes at byte {self.pos:,}, but the file has only {self.left():,} bytes left"
            )
        if self.pos + n > MAX_HEADER_BYTES:
            raise self.fail(
                f"has a header longer than {MAX_HEADER_BYTES:,} bytes (at {what}); attnlab reads "
                "headers up to that size (a 256k-token vocabulary takes about 10 MB)"
            )
        self.pos += n
        return self.buf[self.pos - n : self.pos]  # a copy: no view of the map outlives it

    def number(self, fmt: str, what: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what, declared=False))[0]

    def text(self, what: str) -> str:
        raw = self.take(self.number("Q", f"the length of {what}"), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"holds {what}, which is not UTF-8 text (its byte {e.start})") from None

    def header(self) -> Header:
        if self.buf[:4] != b"GGUF":
            raise self.fail("is not a readable GGUF file: it does not begin with the bytes 'GGUF'")
        self.pos = 4
        version = self.number("I", "the version")
        if version & 0xFFFF == 0:  # a file written on a big-endian machine reads as n * 65536 here
            raise self.fail("is a big-endian GGUF file; attnlab reads little-endian ones (as llama.cpp writes)")
        if version not in (2, 3):
            raise self.fail(f"is GGUF version {version}; attnlab reads versions 2 and 3")
        n_tensors, n_keys = self.number("Q", "the tensor count"), self.number("Q", "the key count")
        self._count(n_keys, MAX_KEYS, 13, "keys")  # the shortest pair: an empty key and one byte
        meta = {}
        for _ in range(n_keys):
            key = self.text(f"key number {len(meta) + 1}")
            if key in meta:
                raise self.fail(f"has the key {key} twice")
            meta[key] = self.value(self.number("I", f"the type of {key}"), key, 0)
        self._count(n_tensors, MAX_TENSORS, 32, "tensors")  # the shortest info: an empty name, one dimension
        infos = [self.tensor_info() for _ in range(n_tensors)]
        return Header(version, meta, self.place(infos, self._alignment(meta)))

    def _count(self, n: int, bound: int, smallest: int, what: str) -> None:
        if n * smallest > self.left():
            raise self.fail(
                f"declares {n:,} {what}, but the file has only {self.left():,} bytes left (each takes "
                f"at least {smallest})"
            )
        if n > bound:
            raise self.fail(f"declares {n:,} {what}; attnlab reads at most {bound:,}")

    def value(self, kind: int, key: str, depth: int) -> Any:
        if kind == V.STRING:
            return self.text(f"the value of {key}")
        if kind in NUMBERS:
            dtype = np.dtype(NUMBERS[kind])
            number = np.frombuffer(self.take(dtype.itemsize, f"the value of {key}", declared=False), dtype)[0]
            return bool(number) if kind == V.BOOL else number.item()
        if kind == V.ARRAY:
            return self.array(key, depth)
        raise self.fail(f"gives {key} the value type {kind}, which GGUF does not have (0 to 12)")

    def array(self, key: str, depth: int) -> list:
        kind, n = self.number("I", f"the element type of {key}"), self.number("Q", f"the length of {key}")
        if kind not in NUMBERS and kind not in SMALLEST:
            raise self.fail(f"gives the array {key} the element type {kind}, which GGUF does not have (0 to 12)")
        size = np.dtype(NUMBERS[kind]).itemsize if kind in NUMBERS else SMALLEST[kind]
        if n * size > self.left():
            raise self.fail(
                f"declares an array of {n:,} elements in key {key}, but the file has only {self.left():,} bytes left"
            )
        self.elements += n
        if self.elements > MAX_ELEMENTS:
            raise self.fail(
                f"holds more than {MAX_ELEMENTS:,} array elements in all (key {key} has {n:,}); "
                f"attnlab reads at most that many (Llama 3's vocabulary takes 537,000)"
            )
        if kind in NUMBERS:  # at once: no Python work per element until tolist
            data = np.frombuffer(self.take(n * size, f"the elements of {key}"), NUMBERS[kind])
            return (data != 0 if kind == V.BOOL else data).tolist()
        if kind == V.STRING:
            return self.strings(key, n)
        if depth + 1 >= MAX_NESTING:
            raise self.fail(f"nests arrays {MAX_NESTING} deep in key {key}; attnlab reads at most {MAX_NESTING - 1}")
        return [self.array(f"{key}[{i}]", depth + 1) for i in range(n)]

    def strings(self, key: str, n: int) -> list[str]:
        """n strings (a vocabulary's tokens): the loop `text` makes, without its per-call cost."""
        buf, pos, out = self.buf, self.pos, []
        end = min(len(buf), MAX_HEADER_BYTES)
        for i in range(n):
            try:
                length = struct.unpack_from("<Q", buf, pos)[0] if pos + 8 <= end else end
                if length > end - pos - 8:
                    raise ValueError(key)
                out.append(buf[pos + 8 : pos + 8 + length].decode("utf-8"))  # UnicodeDecodeError: a ValueError
            except ValueError:
                self.pos = pos
                self.text(f"element {i} of {key}")  # read again the careful way: refused, saying why
                raise  # not reached: `text` refuses whatever this loop could not read
            pos += 8 + length
        self.pos = pos
        return out

    def tensor_info(self) -> tuple[str, int, tuple[int, ...], int]:
        name = self.text("a tensor name")
        if len(name.encode()) >= MAX_NAME:
            raise self.fail(f"names a tensor {name[:80]!r}..., longer than ggml's {MAX_NAME - 1} bytes")
        n_dims = self.number("I", f"the dimension count of tensor {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"gives tensor {name} {n_dims:,} dimensions; GGUF tensors have 1 to {MAX_DIMS}")
        ne = struct.unpack(f"<{n_dims}Q", self.take(8 * n_dims, f"the dimensions of tensor {name}", declared=False))
        kind = self.number("I", f"the type of tensor {name}")
        return name, kind, ne, self.number("Q", f"the offset of tensor {name}")

    def _alignment(self, meta: dict[str, Any]) -> int:
        align = meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or isinstance(align, bool) or align < 1 or align & (align - 1):
            raise self.fail(f"sets general.alignment to {align!r}; it must be a power of two")
        return align

    def place(self, infos: list[tuple[str, int, tuple[int, ...], int]], align: int) -> dict[str, TensorInfo]:
        """Each tensor's bytes: a known type, whole blocks, aligned, inside the file, shared with no other."""
        data_start = -(-self.pos // align) * align  # the header's end, rounded up to the alignment
        tensors: dict[str, TensorInfo] = {}
        for name, kind, ne, offset in infos:
            if name in tensors:
                raise self.fail(f"has the tensor {name} twice")
            n_bytes = self._bytes(name, kind, ne)
            if offset % align:
                raise self.fail(f"places tensor {name} at offset {offset:,}, not a multiple of its alignment {align}")
            if data_start + offset + n_bytes > len(self.buf):
                raise self.fail(
                    f"places tensor {name} ({n_bytes:,} bytes) at byte {data_start + offset:,}, past "
                    f"the end of the file ({len(self.buf):,} bytes): it is cut short or wrong"
                )
            tensors[name] = TensorInfo(name, gguf.GGMLQuantizationType(kind), ne, data_start + offset, n_bytes)
        ordered = sorted(tensors.values(), key=lambda t: t.start)
        for a, b in zip(ordered, ordered[1:]):
            if b.start < a.start + a.n_bytes:
                raise self.fail(
                    f"places tensors {a.name} and {b.name} on the same bytes ({a.name} ends at byte "
                    f"{a.start + a.n_bytes:,}, {b.name} starts at {b.start:,})"
                )
        return tensors

    def _bytes(self, name: str, kind: int, ne: tuple[int, ...]) -> int:
        """The bytes a tensor of GGML type `kind` and dimensions `ne` takes."""
        try:
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise self.fail(f"gives tensor {name} the type {kind}, which is no GGML type") from None
        if 0 in ne:
            raise self.fail(f"gives tensor {name} the dimensions {list(ne)}: one is 0")
        elements = math.prod(ne)  # Python's integers: no overflow
        if elements * block_bytes // block > len(self.buf):
            raise self.fail(
                f"declares tensor {name} of {elements:,} elements ({list(ne)}), more than the file's "
                f"{len(self.buf):,} bytes hold"
            )
        if ne[0] % block:
            raise self.fail(
                f"gives tensor {name} rows of {ne[0]:,} values, not whole {block}-value blocks of its "
                f"type {gguf.GGMLQuantizationType(kind).name}"
            )
        return elements // block * block_bytes
