"""Hostile GGUF files given to `attnlab convert FILE.gguf --out RUN` (issue 55).

Every case asserts, through tests/hostile.py: one AttnlabError line (through the CLI: exit code 2 and one
`attnlab: error:` line), no traceback, at most SECONDS seconds and MIB MiB of peak memory growth, the file
unchanged and no run written. The files are three tiny valid ones (GPT-2 in F32, a Llama in Q8_0, a
Mixtral), taken apart with the gguf package's own reader and put together again by `Writer`, a GGUF
writer of this file's own: so a case can hold what no GGUF writer writes (an array of 2^62 elements,
invalid UTF-8, two tensors on the same bytes). Hypothesis adds random damage (bytes flipped, the file cut
short, any number of the header replaced, any key or array element given any value): each such file
converts or is refused in one line, within the same bounds.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gguf
import pytest
import torch

from attnlab.data.tokenizers import CharTokenizer
from attnlab.errors import AttnlabError
from attnlab.interop import gguf_header, gguf_in, gguf_layout, gguf_vocab
from attnlab.interop.gguf_in import convert_from_gguf
from attnlab.interop.gguf_out import write_gguf
from attnlab.interop.gguf_vocab import vocab_of_run
from attnlab.models.gpt import GPT, GPTConfig
from tests.conftest import REPEATABLE, TEXT
from tests.hostile import bounded, cli_refuses, one_line, refused, untouched

pytestmark = pytest.mark.usefixtures("one_thread")

SECONDS, MIB = 10.0, 300  # per case; refusals take 0.01-0.1 s and a few MiB, a conversion about 0.3 s
V, Q = gguf.GGUFValueType, gguf.GGMLQuantizationType
LLAMA = dict(positions="rope", norm_kind="rmsnorm", feedforward="swiglu", bias=False, n_kv_head=1)
MODELS = {
    "gpt2": (dict(activation="gelu_tanh"), "f32"),
    "llama": (LLAMA, "q8_0"),
    "mixtral": ({**LLAMA, "feedforward": "moe", "expert_ff": "swiglu", "n_experts": 4, "experts_per_token": 2}, "f32"),
}
NUMBER = {
    V.UINT8: "B",
    V.INT8: "b",
    V.UINT16: "H",
    V.INT16: "h",
    V.UINT32: "I",
    V.INT32: "i",
    V.FLOAT32: "f",
    V.BOOL: "?",
    V.UINT64: "Q",
    V.INT64: "q",
    V.FLOAT64: "d",
}


@dataclass
class Parts:
    """A GGUF file taken apart: key -> (type, value), an array's value (element type, items); each
    tensor [name, type, ne, offset from the data's start]; the data section's bytes."""

    meta: dict[str, tuple[int, Any]]
    tensors: list[list]
    data: bytes
    version: int = 3
    fields: list[tuple[int, str]] = field(default_factory=list)  # where `encode` wrote each number, its format


class Writer:
    """GGUF's layout written out plainly, recording where each count, length, type, dimension and offset went."""

    def __init__(self) -> None:
        self.out, self.fields = bytearray(), []

    def num(self, fmt: str, v: Any) -> None:
        self.fields.append((len(self.out), fmt))
        self.out += struct.pack("<" + fmt, v)

    def text(self, s: str | bytes) -> None:
        raw = s.encode() if isinstance(s, str) else s  # bytes: as they are, valid UTF-8 or not
        self.num("Q", len(raw))
        self.out += raw

    def value(self, kind: int, v: Any) -> None:
        if kind == V.STRING:
            self.text(v)
        elif kind == V.ARRAY:
            sub, items = v
            self.num("I", sub)
            raw = isinstance(items, bytes)  # the elements' bytes as they are (a long array, quickly)
            self.num("Q", len(items) // struct.calcsize(NUMBER[sub]) if raw else len(items))
            if raw:
                self.out += items
            for item in items if not raw else ():
                self.value(sub, item)
        else:
            self.num(NUMBER[kind], v)


def encode(p: Parts, align: int = 32) -> bytes:
    w = Writer()
    w.out += b"GGUF"
    for fmt, v in (("I", p.version), ("Q", len(p.tensors)), ("Q", len(p.meta))):
        w.num(fmt, v)
    for key, (kind, v) in p.meta.items():
        w.text(key)
        w.num("I", kind)
        w.value(kind, v)
    for name, kind, ne, offset in p.tensors:
        w.text(name)
        w.num("I", len(ne))
        for n in ne:
            w.num("Q", n)
        w.num("I", kind)
        w.num("Q", offset)
    p.fields = w.fields  # this instance's own (an edit's copy from `replace` gets its own list)
    return bytes(w.out) + bytes(-len(w.out) % align) + p.data


def parts_of(path: Path) -> Parts:
    """A file taken apart by gguf.GGUFReader (the reference reader)."""
    r = gguf.GGUFReader(path)
    meta = {
        key: (V.ARRAY, (f.types[-1], f.contents())) if f.types[0] == V.ARRAY else (f.types[0], f.contents())
        for key, f in r.fields.items()
        if not key.startswith("GGUF.")
    }
    tensors = [
        [t.name, int(t.tensor_type), [int(n) for n in t.shape], t.data_offset - r.data_offset] for t in r.tensors
    ]
    return Parts(meta, tensors, bytes(r.data[r.data_offset :]))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The valid files, as attnlab's export writes them."""
    root = tmp_path_factory.mktemp("bases")
    tok = CharTokenizer.train([TEXT + "Café 🙂 ≥"])  # multi-byte characters: the vocabulary has merges
    for name, (keys, qtype) in MODELS.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, context=32, vocab_size=tok.vocab_size, **keys))
        write_gguf(model, root / f"{name}.gguf", qtype, vocab=vocab_of_run(tok, tok.vocab_size, name))
    return {name: root / f"{name}.gguf" for name in MODELS}


@pytest.fixture(scope="module")
def bases(files) -> dict[str, Parts]:
    return {name: parts_of(path) for name, path in files.items()}


# ---- edits: each takes a copy of a base's parts and gives a file's bytes


def keyed(p: Parts, key: str, kind: int | None, value: Any = None) -> bytes:
    """The key set to (kind, value); kind None: the key left out."""
    meta = {k: v for k, v in p.meta.items() if k != key} | ({key: (kind, value)} if kind is not None else {})
    return encode(replace(p, meta=meta))


def items(p: Parts, key: str, change) -> bytes:
    """An array key's items replaced by change(items)."""
    kind, (sub, old) = p.meta[key]
    return keyed(p, key, kind, (sub, change(list(old))))


def tensor(p: Parts, name: str, index: int, value: Any) -> bytes:
    """One field of a tensor's info (1 type, 2 ne, 3 offset) replaced."""
    tensors = [[*t[:index], value, *t[index + 1 :]] if t[0] == name else t for t in p.tensors]
    return encode(replace(p, tensors=tensors))


def at(p: Parts, offset: int, raw: bytes) -> bytes:
    data = bytearray(encode(p))
    data[offset : offset + len(raw)] = raw
    return bytes(data)


def value_at(p: Parts, key: str) -> int:
    """Where the value type of `key` is in the encoded file."""
    data = encode(p)
    name = struct.pack("<Q", len(key)) + key.encode()
    return data.index(name) + len(name)


def with_offsets(p: Parts, offsets: dict[str, int]) -> bytes:
    return encode(replace(p, tensors=[[*t[:3], offsets.get(t[0], t[3])] for t in p.tensors]))


TOKENS, TYPES, MERGES = gguf.Keys.Tokenizer.LIST, gguf.Keys.Tokenizer.TOKEN_TYPE, gguf.Keys.Tokenizer.MERGES
U32, I32, F32, STR = V.UINT32, V.INT32, V.FLOAT32, V.STRING
CASES = [
    # the header's own bytes
    ("empty", "gpt2", lambda p: b"", r"has 0 bytes, fewer than GGUF's 24-byte start"),
    ("truncated header", "gpt2", lambda p: encode(p)[:300], r"(declares|ends inside) .* the file"),
    ("wrong magic", "gpt2", lambda p: at(p, 0, b"GGML"), r"does not begin with the bytes 'GGUF'"),
    ("version 7", "gpt2", lambda p: at(p, 4, struct.pack("<I", 7)), r"is GGUF version 7; attnlab reads versions 2"),
    ("big-endian", "gpt2", lambda p: at(p, 4, struct.pack(">I", 3)), r"is a big-endian GGUF file"),
    (
        "tensor count 2^40",
        "gpt2",
        lambda p: at(p, 8, struct.pack("<Q", 2**40)),
        r"declares 1,099,511,627,776 tensors, but the file has only [\d,]+ bytes left",
    ),
    ("key count 2^40", "gpt2", lambda p: at(p, 16, struct.pack("<Q", 2**40)), r"declares 1,099,511,627,776 keys"),
    (
        "key length 2^50",
        "gpt2",
        lambda p: at(p, 24, struct.pack("<Q", 2**50)),
        r"declares key number 1 of 1,125,899,906,842,624 bytes at byte 32, but the file has only",
    ),
    (
        "array of 2^62",
        "gpt2",
        lambda p: at(p, value_at(p, TYPES) + 8, struct.pack("<Q", 2**62)),
        r"declares an array of 4,611,686,018,427,387,904 elements in key tokenizer.ggml.token_type, but the file has "
        r"only [\d,]+ bytes left",
    ),
    (
        "value type 13",
        "gpt2",
        lambda p: at(p, value_at(p, "general.name"), struct.pack("<I", 13)),
        r"gives general.name the value type 13, which GGUF does not have",
    ),
    (
        "element type 99",
        "gpt2",
        lambda p: at(p, value_at(p, TYPES) + 4, struct.pack("<I", 99)),
        r"gives the array tokenizer.ggml.token_type the element type 99",
    ),
    (
        "arrays 5 deep",
        "gpt2",
        lambda p: keyed(p, "general.x", V.ARRAY, (V.ARRAY, [(V.ARRAY, [(V.ARRAY, [(V.ARRAY, [(U32, [1])])])])])),
        r"nests arrays 4 deep in key general.x\[0\]\[0\]\[0\]",
    ),
    (
        "key twice",
        "gpt2",
        lambda p: encode(p).replace(b"tokenizer.ggml.eos_", b"tokenizer.ggml.bos_"),
        r"has the key tokenizer.ggml.bos_token_id twice",
    ),
    (
        "key not UTF-8",
        "gpt2",
        lambda p: encode(p).replace(b"general.name", b"general.\xffame", 1),
        r"holds key number \d+, which is not UTF-8 text",
    ),
    (
        "string of 2^50",
        "gpt2",
        lambda p: at(p, value_at(p, "general.name") + 4, struct.pack("<Q", 2**50)),
        r"declares the value of general.name of 1,125,899,906,842,624 bytes",
    ),
    ("alignment 0", "gpt2", lambda p: keyed(p, "general.alignment", U32, 0), r"general.alignment to 0; it must be"),
    ("alignment as text", "gpt2", lambda p: keyed(p, "general.alignment", STR, "32"), r"general.alignment to '32'"),
    # tensor infos and data
    ("n_dims 0", "gpt2", lambda p: tensor(p, "output_norm.weight", 2, []), r"gives tensor output_norm.weight 0 dim"),
    (
        "n_dims 10^6",
        "gpt2",
        lambda p: at(p, encode(p).index(b"output_norm.weight") + 18, struct.pack("<I", 10**6)),
        r"gives tensor output_norm.weight 1,000,000 dimensions; GGUF tensors have 1 to 4",
    ),
    ("a dimension 0", "gpt2", lambda p: tensor(p, "output_norm.weight", 2, [0]), r"\[0\]: one is 0"),
    (
        "a dimension 2^63",
        "gpt2",
        lambda p: tensor(p, "output_norm.weight", 2, [2**63]),
        r"declares tensor output_norm.weight of 9,223,372,036,854,775,808 elements .*, more than the file's",
    ),
    (
        "dimensions overflow int64",
        "gpt2",
        lambda p: tensor(p, "token_embd.weight", 2, [2**32, 2**32]),
        r"declares tensor token_embd.weight of 18,446,744,073,709,551,616 elements",
    ),
    ("type 99", "gpt2", lambda p: tensor(p, "output_norm.weight", 1, 99), r"the type 99, which is no GGML type"),
    (
        "rows not whole blocks",
        "gpt2",
        lambda p: tensor(p, "output_norm.weight", 1, int(Q.Q4_K)),
        r"rows of 32 values, not whole 256-value blocks of its type Q4_K",
    ),
    (
        "a type attnlab does not read",
        "gpt2",
        lambda p: tensor(p, "output_norm.weight", 1, int(Q.I32)),
        r"tensor output_norm.weight is I32; attnlab reads the weight types F32",
    ),
    (
        "misaligned offset",
        "gpt2",
        lambda p: tensor(p, "output_norm.weight", 3, p.tensors[-1][3] + 4),
        r"at offset [\d,]+, not a multiple of its alignment 32",
    ),
    (
        "offset past the end",
        "gpt2",
        lambda p: tensor(p, "output_norm.weight", 3, 2**40),
        r"places tensor output_norm.weight \(128 bytes\) at byte [\d,]+, past the end of the file",
    ),
    ("data cut short", "gpt2", lambda p: encode(p)[:-64], r"past the end of the file"),
    (
        "overlapping tensors",
        "gpt2",
        lambda p: with_offsets(p, {"output_norm.bias": 0}),
        r"places tensors output_norm.bias and \S+ on the same bytes"
        r"|places tensors \S+ and output_norm.bias on the same",
    ),
    (
        "tensor twice",
        "gpt2",
        lambda p: encode(p).replace(b"blk.1.attn_norm.weight", b"blk.0.attn_norm.weight"),
        r"has the tensor blk.0.attn_norm.weight twice",
    ),
    (
        "tensor name of 70 bytes",
        "gpt2",
        lambda p: tensor(p, "output_norm.weight", 0, "x" * 70),
        r"longer than ggml's 63 bytes",
    ),
    (
        "no token embedding",
        "gpt2",
        lambda p: encode(p).replace(b"token_embd.weight", b"token_embd.wxxxxx"),
        r"has no token_embd.weight",
    ),
    # settings against the tensors, before anything is built
    (
        "block_count 10^9",
        "gpt2",
        lambda p: keyed(p, "gpt2.block_count", U32, 10**9),
        r"sets gpt2.block_count 1,000,000,000, but holds tensors of 2 blocks \(blk.0 to blk.1\)",
    ),
    ("block_count 3", "gpt2", lambda p: keyed(p, "gpt2.block_count", U32, 3), r"block_count 3, but holds tensors of 2"),
    (
        "block_count -1",
        "gpt2",
        lambda p: keyed(p, "gpt2.block_count", I32, -1),
        r"block_count is -1; attnlab reads a whole",
    ),
    (
        "block_count 2.0",
        "gpt2",
        lambda p: keyed(p, "gpt2.block_count", F32, 2.0),
        r"block_count is 2.0; attnlab reads a",
    ),
    (
        "block_count per layer",
        "gpt2",
        lambda p: keyed(p, "gpt2.block_count", V.ARRAY, (U32, [2, 2])),
        r"block_count is \[2, 2\] \(list\); attnlab reads one number there",
    ),
    ("no block_count", "gpt2", lambda p: keyed(p, "gpt2.block_count", None), r"has no gpt2.block_count, which a gpt2"),
    (
        "expert_count 10^6",
        "mixtral",
        lambda p: keyed(p, "llama.expert_count", U32, 10**6),
        r"sets llama.expert_count 1,000,000, but its router \(blk.0.ffn_gate_inp.weight\) chooses among 4 experts",
    ),
    (
        "no expert_count",
        "mixtral",
        lambda p: keyed(p, "llama.expert_count", None),
        r"holds a router \(blk.0.ffn_gate_inp.weight\) but sets no llama.expert_count",
    ),
    (
        "expert_used_count 0",
        "mixtral",
        lambda p: keyed(p, "llama.expert_used_count", U32, 0),
        r"sets llama.expert_count 4 but not llama.expert_used_count",
    ),
    (
        "expert_used_count 5",
        "mixtral",
        lambda p: keyed(p, "llama.expert_used_count", U32, 5),
        r"expert_used_count 5, more than its 4 experts",
    ),
    (
        "embedding_length 10^6",
        "gpt2",
        lambda p: keyed(p, "gpt2.embedding_length", U32, 10**6),
        r"sets gpt2.embedding_length 1,000,000, but its token embedding \(token_embd.weight\) is 32 wide",
    ),
    (
        "head_count 3",
        "gpt2",
        lambda p: keyed(p, "gpt2.attention.head_count", U32, 3),
        r"head_count 3, which does not divide",
    ),
    (
        "no head_count_kv",
        "llama",
        lambda p: keyed(p, "llama.attention.head_count_kv", None),
        r"tensor blk.0.attn_k.weight has shape \(16, 32\); the file's settings imply \(32, 32\)",
    ),
    (
        "head_count_kv 3",
        "llama",
        lambda p: keyed(p, "llama.attention.head_count_kv", U32, 3),
        r"head_count_kv 3, which does not divide its 2 query heads",
    ),
    (
        "feed_forward_length 2^31-1",
        "llama",
        lambda p: keyed(p, "llama.feed_forward_length", U32, 2**31 - 1),
        r"sets llama.feed_forward_length 2,147,483,647, larger than any dimension of its tensors",
    ),
    (
        "context_length 10^12",
        "gpt2",
        lambda p: keyed(p, "gpt2.context_length", V.UINT64, 10**12),
        r"context_length is 1000000000000; attnlab reads a whole number from 1 to 2,147,483,647",
    ),
    (
        "context beyond the positions",
        "gpt2",
        lambda p: keyed(p, "gpt2.context_length", U32, 64),
        r"sets gpt2.context_length 64, but its position embedding \(position_embd.weight\) serves 32 positions",
    ),
    (
        "vocab_size 10^6",
        "gpt2",
        lambda p: keyed(p, "gpt2.vocab_size", U32, 10**6),
        r"vocab_size 1,000,000, but its token embedding \(token_embd.weight\) has \d+ rows",
    ),
    (
        "eps 0",
        "gpt2",
        lambda p: keyed(p, "gpt2.attention.layer_norm_epsilon", F32, 0.0),
        r"is 0.0; it must be a finite",
    ),
    (
        "eps -1e-5",
        "llama",
        lambda p: keyed(p, "llama.attention.layer_norm_rms_epsilon", F32, -1e-5),
        r"must be a finite",
    ),
    ("eps NaN", "llama", lambda p: keyed(p, "llama.attention.layer_norm_rms_epsilon", F32, float("nan")), r"is nan"),
    ("rope base inf", "llama", lambda p: keyed(p, "llama.rope.freq_base", F32, float("inf")), r"freq_base is inf"),
    (
        "rope scaling type",
        "llama",
        lambda p: keyed(p, "llama.rope.scaling.type", STR, "yarn"),
        r"scales its rotary angles \(llama.rope.scaling.type is 'yarn' \(str\)\)",
    ),
    (
        "rope scaling factor alone",
        "llama",
        lambda p: keyed(p, "llama.rope.scaling.factor", F32, 8.0),
        r"scales its rotary angles \(llama.rope.scaling.factor is 8.0",
    ),
    (
        "a sliding window",
        "llama",
        lambda p: keyed(p, "llama.attention.sliding_window", U32, 8),
        r"sets llama.attention.sliding_window \(8 \(int\)\), which attnlab's llama does not read",
    ),
    (
        "architecture a list",
        "gpt2",
        lambda p: keyed(p, "general.architecture", V.ARRAY, (STR, ["gpt2"])),
        r"holds a \['gpt2'\] model: attnlab converts GGUF's gpt2, llama and qwen3",
    ),
    # the vocabulary
    (
        "token not UTF-8",
        "gpt2",
        lambda p: items(p, TOKENS, lambda t: t[:2] + [b"\xff\xfe"] + t[3:]),
        r"holds element 2 of tokenizer.ggml.tokens, which is not UTF-8 text",
    ),
    (
        "merge not UTF-8",
        "gpt2",
        lambda p: items(p, MERGES, lambda m: [b"a \xc3"] + m[1:]),
        r"holds element 0 of tokenizer.ggml.merges, which is not UTF-8",
    ),
    ("token_type short", "gpt2", lambda p: items(p, TYPES, lambda t: t[:-3]), r"token_type has \d+ entries for \d+"),
    ("token_type long", "gpt2", lambda p: items(p, TYPES, lambda t: t + [1]), r"token_type has \d+ entries for \d+"),
    ("token_type 99", "gpt2", lambda p: items(p, TYPES, lambda t: [99] + t[1:]), r"token 0 has the type 99"),
    (
        "token_type as text",
        "gpt2",
        lambda p: keyed(p, TYPES, V.ARRAY, (STR, ["1"])),
        r"token_type is not a list of int",
    ),
    (
        "merge without a space",
        "gpt2",
        lambda p: items(p, MERGES, lambda m: ["ab"] + m[1:]),
        r"merge 0 of tokenizer.ggml.merges is 'ab', not two tokens with a space",
    ),
    ("merge of one token", "gpt2", lambda p: items(p, MERGES, lambda m: [" a"] + m[1:]), r"merge 0 .* is ' a'"),
    (
        "bos id 10^6",
        "gpt2",
        lambda p: keyed(p, gguf.Keys.Tokenizer.BOS_ID, U32, 10**6),
        r"tokenizer.ggml.bos_token_id is 1000000 \(int\), not the id of one of its \d+ tokens",
    ),
    (
        "unk id -1",
        "gpt2",
        lambda p: keyed(p, gguf.Keys.Tokenizer.UNK_ID, I32, -1),
        r"unknown_token_id is -1 \(int\), not the",
    ),
    ("padding id 10^6", "gpt2", lambda p: keyed(p, gguf.Keys.Tokenizer.PAD_ID, U32, 10**6), r"padding_token_id is"),
    (
        "sep id as text",
        "gpt2",
        lambda p: keyed(p, gguf.Keys.Tokenizer.SEP_ID, STR, "0"),
        r"seperator_token_id is '0' \(str\)",
    ),
    (
        "empty vocabulary",
        "gpt2",
        lambda p: items(p, TOKENS, lambda t: []),
        r"its vocabulary \(tokenizer.ggml.tokens\) is",
    ),
    (
        "token twice",
        "gpt2",
        lambda p: items(p, TOKENS, lambda t: t[:3] + t[2:3] + t[4:]),
        r"is in tokenizer.ggml.tokens twice \(ids 2 and 3\)",
    ),
    (
        "more tokens than rows",
        "gpt2",
        lambda p: items(p, TOKENS, lambda t: t + ["x1", "x2"]),
        r"has \d+ tokens but its embedding \(token_embd.weight\) has only \d+ rows",
    ),
    ("scores short", "gpt2", lambda p: keyed(p, gguf.Keys.Tokenizer.SCORES, V.ARRAY, (F32, [0.0])), r"scores has 1"),
    ("template as a number", "gpt2", lambda p: keyed(p, gguf.Keys.Tokenizer.CHAT_TEMPLATE, U32, 7), r"template is not"),
    ("add_bos as a number", "gpt2", lambda p: keyed(p, gguf.Keys.Tokenizer.ADD_BOS, U32, 1), r"add_bos_token is not"),
]


@pytest.fixture
def scratch(tmp_path) -> tuple[Path, Path]:
    return tmp_path / "m.gguf", tmp_path / "run"


@pytest.mark.parametrize(("base", "edit", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_files_are_refused_in_one_line(bases, scratch, base, edit, says):
    path, out = scratch
    path.write_bytes(edit(bases[base]))
    refused(lambda: convert_from_gguf(path, out), says, SECONDS, MIB, keep=(path.parent,))
    assert not out.exists()


def test_the_parts_here_are_the_files_and_attnlab_reads_them_as_gguf_does(files, bases):
    """The reference: attnlab's header reader gives the gguf package's values and tensor places, and
    this file's writer writes the bytes the gguf package wrote (so the cases differ only by their edit)."""
    for name, path in files.items():
        assert encode(bases[name]) == path.read_bytes()
        mine, theirs = gguf_header.read_header(path), gguf.GGUFReader(path)
        assert mine.metadata == {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
        assert [(t.name, t.type, list(t.ne), t.start, t.n_bytes) for t in mine.tensors.values()] == [
            (t.name, t.tensor_type, t.shape.tolist(), t.data_offset, t.n_bytes) for t in theirs.tensors
        ]


def test_settings_that_change_nothing_still_convert(bases, tmp_path):
    p = bases["llama"]
    harmless = {
        "llama.rope.scaling.type": (STR, "none"),
        "llama.rope.scaling.factor": (F32, 1.0),
        "llama.tensor_data_layout": (STR, "reference"),
        "llama.expert_count": (U32, 0),
        "general.nested": (V.ARRAY, (V.ARRAY, [(U32, [1, 2]), (U32, [])])),
    }
    (tmp_path / "m.gguf").write_bytes(encode(replace(p, meta=p.meta | harmless)))
    assert convert_from_gguf(tmp_path / "m.gguf", tmp_path / "run")["architecture"] == "LlamaForCausalLM"


def test_the_bounds_on_a_header(bases, tmp_path, monkeypatch):
    """Counts beyond the bounds, though the file holds them: one line each, nothing read past them."""
    path, out, p = tmp_path / "m.gguf", tmp_path / "run", bases["gpt2"]
    blob = bytes(gguf_header.MAX_ELEMENTS + 1)
    path.write_bytes(encode(replace(p, meta=p.meta | {"general.blob": (V.ARRAY, (V.UINT8, blob))})))
    refused(
        lambda: convert_from_gguf(path, out),
        r"holds more than 2,097,152 array elements in all \(key "
        r"general.blob has 2,097,153\)",
        SECONDS,
        MIB,
        keep=(path,),
    )
    path.write_bytes(encode(p))
    for bound, says in [
        ("MAX_KEYS", r"declares \d+ keys; attnlab reads at most 5"),
        ("MAX_TENSORS", r"declares \d+ tensors; attnlab reads at most 5"),
        ("MAX_HEADER_BYTES", r"has a header longer than 5 bytes"),
    ]:
        with monkeypatch.context() as m:
            m.setattr(gguf_header, bound, 5)
            refused(lambda: convert_from_gguf(path, out), says, SECONDS, MIB, keep=(path,))
    assert not out.exists()


def deep(p: Parts, n: int) -> bytes:
    """p with blocks up to blk.{n-1}, each beyond the file's own holding one small tensor."""
    end, row = len(p.data), struct.pack("<32f", *[1.0] * 32)
    extra = [[f"blk.{i}.attn_norm.weight", int(Q.F32), [32], end + 128 * (i - 2)] for i in range(2, n)]
    meta = p.meta | {"gpt2.block_count": (U32, n)}
    return encode(replace(p, meta=meta, tensors=p.tensors + extra, data=p.data + row * (n - 2)))


def test_a_file_of_many_blocks_costs_what_its_tensors_cost(bases, scratch):
    """5,000 blocks of one tensor each: refused for the tensors it lacks without building 5,000 blocks
    (expected() builds two and names the rest after the second)."""
    path, out = scratch
    path.write_bytes(deep(bases["gpt2"], 5000))
    refused(
        lambda: convert_from_gguf(path, out),
        r"has no tensor blk.2.attn_norm.bias, which its gpt2 settings",
        SECONDS,
        MIB,
        keep=(path.parent,),
    )


@pytest.mark.parametrize("name", ["gpt2", "llama", "mixtral"])
def test_the_shapes_of_many_blocks_are_those_of_a_model_of_them(files, name):
    """expected() (two blocks built, the rest named after the second) against a model of every block."""
    header, layout = gguf_header.read_header(files[name]), gguf_layout.LAYOUTS["gpt2" if name == "gpt2" else "llama"]
    hf = gguf_in.hf_config(header.metadata, header, layout, files[name])
    for n in (1, 3, 5):
        hf[next(key.hf for key in layout.keys if key.gguf == "block_count")] = n
        assert gguf_layout.expected(hf, layout) == gguf_layout._expected_built(hf, layout)


def spm(p: Parts, tokens: list[str]) -> bytes:
    """p's vocabulary replaced by a SentencePiece one (tokenizer.ggml.model llama) of these pieces."""
    n, tok = len(tokens), gguf.Keys.Tokenizer
    vocab = {
        tok.MODEL: (STR, "llama"),
        TOKENS: (V.ARRAY, (STR, tokens)),
        TYPES: (V.ARRAY, (I32, [1] * n)),
        tok.SCORES: (V.ARRAY, (F32, [0.0] * n)),
    }
    return encode(replace(p, meta={k: v for k, v in p.meta.items() if k != MERGES} | vocab))


def test_sentencepiece_merges_are_bounded(bases, scratch, monkeypatch):
    """A SentencePiece vocabulary's merges are found by splitting every piece (quadratic in its length):
    a piece longer than 256 characters, or pieces that split more ways than the bound, are refused."""
    path, out = scratch
    path.write_bytes(spm(bases["gpt2"], ["<unk>", "a" * 300]))
    refused(
        lambda: convert_from_gguf(path, out),
        r"piece 1 of its SentencePiece vocabulary is 300 characters long; "
        r"attnlab reads pieces of up to 256",
        SECONDS,
        MIB,
        keep=(path.parent,),
    )
    path.write_bytes(spm(bases["gpt2"], ["a" * k for k in range(1, 9)]))
    for bound, says in [("MAX_MERGES", "split into more than 10 pairs"), ("MAX_PIECE_CHARS", "hold more than 10 char")]:
        with monkeypatch.context() as m:
            m.setattr(gguf_vocab, bound, 10)
            refused(lambda: convert_from_gguf(path, out), says, SECONDS, MIB, keep=(path.parent,))


@pytest.mark.parametrize("case", ["block_count 10^9", "array of 2^62", "overlapping tensors", "token not UTF-8"])
def test_the_command_line_refuses_in_one_line(bases, scratch, capsys, case):
    path, out = scratch
    _, base, edit, says = next(c for c in CASES if c[0] == case)
    path.write_bytes(edit(bases[base]))
    cli_refuses(["convert", path, "--out", out], capsys, says, SECONDS, MIB, keep=(path.parent,))
    assert not out.exists()


# ---- random damage: each file converts, or is refused in one line, within the same bounds


def hypothesis():
    """hypothesis is a dev extra: without it the property-based test skips, the rest run."""
    return pytest.importorskip("hypothesis", reason="hypothesis is a dev extra: pip install -e .[dev]")


EDGES = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def any_value(st, kind: int | None = None):
    """A GGUF value: (type, value), of `kind` if given (a number of any value its width holds)."""
    text = st.text(max_size=6) | st.sampled_from(["", " ", "a b", "none", "yarn", "<unk>", "\u0120"])
    ints = st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, 1, 2, 3, 4, 32, 33, 64])
    floats = st.floats(width=32) | st.sampled_from([0.0, 1.0, 1e-5, -1.0])
    if kind == V.STRING:
        return text.map(lambda v: (kind, v))
    if kind in (V.FLOAT32, V.FLOAT64):
        return floats.map(lambda v: (kind, v))
    if kind is not None:
        bits, signed = 8 * struct.calcsize(NUMBER[kind]), NUMBER[kind].islower()
        low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
        return st.integers(low, high).map(lambda v: (kind, v))
    return st.one_of(
        ints.map(lambda v: (V.INT32, v)),
        floats.map(lambda v: (V.FLOAT32, v)),
        text.map(lambda v: (V.STRING, v)),
        st.booleans().map(lambda v: (V.BOOL, v)),
        st.lists(ints, max_size=3).map(lambda v: (V.ARRAY, (V.INT32, v))),
        st.lists(text, max_size=3).map(lambda v: (V.ARRAY, (V.STRING, v))),
    )


def damaged(draw, st, p: Parts) -> bytes:
    """p's file with bytes of its header flipped, cut short, a number of its header (a count, a
    length, a type, a dimension, an offset, a value) replaced by any of its width, or a key (its own,
    or one of the settings llama.cpp knows) given any value, or an element of an array any other."""
    data = encode(p)
    how = draw(st.sampled_from(["flip", "cut", "number", "key", "element"]))
    if how == "key":
        arch = p.meta["general.architecture"][1]
        known = [
            k.replace("{arch}", arch)
            for group in (gguf.Keys.LLM, gguf.Keys.Rope, gguf.Keys.Attention, gguf.Keys.Tokenizer)
            for k in vars(group).values()
            if isinstance(k, str) and "." in k
        ]
        return keyed(p, draw(st.sampled_from(sorted(p.meta)) | st.sampled_from(known)), *draw(any_value(st)))
    if how == "element":
        key = draw(st.sampled_from(sorted(k for k, (kind, _) in p.meta.items() if kind == V.ARRAY)))
        sub, old = p.meta[key][1]
        i, new = draw(st.integers(0, len(old) - 1)), draw(any_value(st, sub))[1]
        return items(p, key, lambda v: v[:i] + [new] + v[i + 1 :])
    if how == "cut":
        return data[: draw(st.integers(0, len(data) - 1))]
    out = bytearray(data)
    if how == "flip":
        for at_, byte in draw(
            st.lists(
                st.tuples(st.integers(0, len(data) - len(p.data) - 1), st.integers(0, 255)), min_size=1, max_size=3
            )
        ):
            out[at_] = byte
        return bytes(out)
    at_, fmt = draw(st.sampled_from(p.fields))
    size = struct.calcsize("<" + fmt)
    out[at_ : at_ + size] = (draw(st.integers(0, 2**64 - 1) | st.sampled_from(EDGES)) % 2 ** (8 * size)).to_bytes(
        size, "little"
    )
    return bytes(out)


def test_random_damage_converts_or_is_refused_in_one_line(bases, tmp_path):
    h = hypothesis()
    st, n = h.strategies, itertools.count()
    for p in bases.values():
        encode(p)  # records where each number is

    @h.settings(
        max_examples=150, suppress_health_check=[h.HealthCheck.too_slow, h.HealthCheck.data_too_large], **REPEATABLE
    )
    @h.given(st.data())
    def check(data):
        raw = damaged(data.draw, st, bases[data.draw(st.sampled_from(sorted(bases)))])
        path, out = tmp_path / f"{next(n)}.gguf", tmp_path / f"run{next(n)}"
        path.write_bytes(raw)
        with untouched(path), bounded(SECONDS, MIB):
            try:
                convert_from_gguf(path, out)
            except AttnlabError as e:
                one_line(str(e))
                assert not out.exists()

    check()
