"""A run's tokenizer inside a GGUF file, as llama.cpp reads it, and a GGUF's vocabulary as a tokenizer.json.

Out (tokenizer.ggml.* keys):
  bpe   attnlab's byte-level BPE (HuggingFace `tokenizers`, GPT-2's pre-tokenizer): model "gpt2", pre
        "gpt-2", its tokens by id, its merges, <|endoftext|> a control token and both bos and eos.
  char  a CharTokenizer (<unk>, <|endoftext|>, then one token per character) as the same kind of
        byte-level vocabulary: each character is its UTF-8 bytes in GPT-2's byte alphabet, and merges
        join the bytes of a multi-byte character, so llama.cpp reads a text of the run's characters
        as the run does, id for id. A character the run never saw is <unk> to attnlab; llama.cpp has
        no such fallback in a byte-level vocabulary and drops it (its bytes are no tokens).
  Rows of the embedding beyond the tokenizer's tokens (a converted checkpoint's padding) are
  [PAD{i}] tokens of type UNUSED, as llama.cpp's converter writes them.
In (the converted run's tokenizer.json):
  gpt2   byte-level BPE with the pre-tokenizer "pre" names (gpt-2, llama-bpe); a vocabulary this module
         wrote for a character run becomes a character tokenizer again.
  llama  SentencePiece's vocabulary with scores, as HuggingFace converts a Llama's: a BPE whose merges
         are every pair of pieces that makes a piece, ranked by the score of what they make, with byte
         fallback (<0x00>..<0xFF>), "▁" for spaces and one before the text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from attnlab.data.chat import ChatTemplate
from attnlab.data.tokenizers import EOT, UNK, CharTokenizer, Tokenizer
from attnlab.errors import AttnlabError
from attnlab.interop.gguf_checks import merge_pair, vocab_keys

T = gguf.TokenType
K = gguf.Keys.Tokenizer

# llama.cpp's name of a pre-tokenizer -> the regex its words are split by (GPT-2's is ByteLevel's own).
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PRE_SPLITS = {"gpt-2": GPT2_SPLIT, "llama-bpe": LLAMA3_SPLIT}


@dataclass
class Vocab:
    """What a GGUF file says of its tokenizer (the tokenizer.ggml.* keys)."""

    model: str
    pre: str | None
    tokens: list[str]
    types: list[int]
    merges: list[str] = field(default_factory=list)
    scores: list[float] | None = None
    bos: int | None = None
    eos: int | None = None
    unk: int | None = None
    add_bos: bool = False
    template: str | None = None
    note: str = ""  # what export's summary says of it

    def to_metadata(self) -> dict[str, Any]:
        """The keys a GGUFWriter writes (None and empty lists left out)."""
        meta = {
            K.MODEL: self.model,
            K.PRE: self.pre,
            K.LIST: self.tokens,
            K.TOKEN_TYPE: self.types,
            K.MERGES: self.merges,
            K.SCORES: self.scores,
            K.BOS_ID: self.bos,
            K.EOS_ID: self.eos,
            K.UNK_ID: self.unk,
            K.ADD_BOS: self.add_bos,
            K.CHAT_TEMPLATE: self.template,
        }
        return {k: v for k, v in meta.items() if v is not None and v != []}


def byte_alphabet() -> list[str]:
    """GPT-2's stand-in character for each byte 0..255: printable Latin-1 bytes stand for themselves,
    the others (controls, space, ...) for the characters from U+0100 on, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


BYTES = byte_alphabet()
FROM_BYTES = {c: b for b, c in enumerate(BYTES)}
# A merge that never applies (no word of a text is ever split into these two symbols), for a
# vocabulary with no merges of its own: llama.cpp refuses a gpt2 vocabulary without merges, and gguf
# writes no empty list.
NO_MERGE = f"{UNK} {EOT}"


def as_byte_symbols(text: str) -> str:
    return "".join(BYTES[b] for b in text.encode("utf-8"))


# ---- out


def vocab_of_run(tok: Tokenizer, rows: int, run: str) -> Vocab:
    """The run's tokenizer as GGUF's vocabulary of `rows` tokens (the model's vocabulary size)."""
    if isinstance(tok, CharTokenizer):
        vocab = _char_vocab(tok)
    elif tok.kind == "bpe":
        vocab = _bpe_vocab(json.loads(tok.to_json()), run)
    else:
        raise AttnlabError(
            f"{run} has a {tok.kind} tokenizer: GGUF holds byte-level BPE and character "
            "tokenizers (llama.cpp has no word-level vocabulary)"
        )
    if len(vocab.tokens) > rows:
        raise AttnlabError(f"{run}: its tokenizer has {len(vocab.tokens)} tokens, more than the model's {rows}")
    pad = rows - len(vocab.tokens)  # embedding rows no token uses
    vocab.tokens += [f"[PAD{i}]" for i in range(pad)]
    vocab.types += [T.UNUSED] * pad
    vocab.bos = vocab.eos = tok.eot_id  # attnlab separates (and ends) documents with <|endoftext|>
    return vocab


def ids_only(rows: int) -> Vocab:
    """Placeholder tokens for a model without a tokenizer: ids 0..255 are the bytes (a byte-level
    vocabulary with no merges), ids beyond are [PAD] tokens. For callers that feed token ids."""
    tokens = BYTES[:rows] + [f"[PAD{i}]" for i in range(rows - len(BYTES))]
    types = [T.NORMAL] * min(rows, 256) + [T.UNUSED] * (rows - min(rows, 256))
    return Vocab("gpt2", "gpt-2", tokens, types, [NO_MERGE], note="placeholders (ids 0-255 as bytes)")


def _char_vocab(tok: CharTokenizer) -> Vocab:
    tokens = [UNK, EOT] + [as_byte_symbols(c) for c in tok.chars]
    note = (
        f"gpt2: the run's {len(tok.chars)} characters as byte-level tokens (a character outside them is "
        "<unk> to attnlab, dropped by llama.cpp)"
    )
    return Vocab(
        "gpt2",
        "gpt-2",
        tokens,
        [T.UNKNOWN, T.CONTROL] + [T.NORMAL] * len(tok.chars),
        char_merges(tok.chars),
        unk=tok.unk_id,
        note=note,
    )


def char_merges(chars: str) -> list[str]:
    """The merges that build each multi-byte character from its bytes, left to right. Each joins a
    character's prefix with its next byte, a continuation byte that begins no character, so they can
    join nothing but the bytes of one character."""
    merges: dict[str, None] = {}
    for c in chars:
        symbols = as_byte_symbols(c)
        for i in range(1, len(symbols)):
            merges[f"{symbols[:i]} {symbols[i]}"] = None
    return list(merges) or [NO_MERGE]


def _bpe_vocab(data: dict[str, Any], run: str) -> Vocab:
    """A tokenizer.json of GPT-2's byte-level BPE (attnlab's own, or a converted GPT-2's)."""
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    byte_level = pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")
    plain = not any(model.get(k) for k in ("continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"))
    if model.get("type") != "BPE" or not byte_level or not plain or data.get("normalizer"):
        raise AttnlabError(
            f"{run}: its tokenizer.json is not GPT-2's byte-level BPE (pre-tokenizer "
            f"{pre.get('type')}), the one BPE vocabulary GGUF export writes"
        )
    by_id = {i: t for t, i in model["vocab"].items()}
    added = {t["id"]: t for t in data.get("added_tokens") or []}
    by_id |= {i: t["content"] for i, t in added.items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise AttnlabError(f"{run}: its tokenizer's ids are not 0..n-1, as a GGUF token list needs")
    types = [
        T.NORMAL if i not in added else T.CONTROL if added[i]["special"] else T.USER_DEFINED for i in range(len(by_id))
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return Vocab(
        "gpt2",
        "gpt-2",
        [by_id[i] for i in range(len(by_id))],
        types,
        merges or [NO_MERGE],
        note=f"gpt2: byte-level BPE, {len(by_id)} tokens, {len(merges)} merges",
    )


# ---- in


def vocab_from_metadata(meta: dict[str, Any], where: str, rows: int | None = None) -> Vocab:
    """The tokenizer.ggml.* keys of a GGUF file's metadata, checked (gguf_checks.vocab_keys)."""
    v = vocab_keys(meta, where, rows)
    return Vocab(
        v[K.MODEL] or "?",
        v[K.PRE],
        v[K.LIST],
        v[K.TOKEN_TYPE],
        v[K.MERGES],
        v[K.SCORES],
        v[K.BOS_ID],
        v[K.EOS_ID],
        v[K.UNK_ID],
        v[K.ADD_BOS],
        v[K.CHAT_TEMPLATE],
    )


def tokenizer_json(vocab: Vocab, where: str) -> str:
    """A GGUF vocabulary as the tokenizer.json text the converted run reads."""
    if vocab.model == "llama":
        return _sentencepiece(vocab, where).to_str()
    if vocab.model != "gpt2":
        raise AttnlabError(
            f"{where}: its tokenizer is tokenizer.ggml.model {vocab.model!r}; attnlab reads gpt2 "
            "(byte-level BPE) and llama (SentencePiece) vocabularies"
        )
    chars = _chars_of(vocab)
    if chars is not None:
        return CharTokenizer(chars).to_json()
    return _byte_level(vocab, where).to_str()


def _used(vocab: Vocab) -> list[str]:
    """The tokens without the UNUSED ones after the last used one (an embedding's padding); a special
    token (begin, end, unknown) counts as used."""
    n, special = len(vocab.tokens), max((i for i in (vocab.bos, vocab.eos, vocab.unk) if i is not None), default=-1)
    while n > special + 1 and vocab.types[n - 1] == T.UNUSED:
        n -= 1
    return vocab.tokens[:n]


def _chars_of(vocab: Vocab) -> str | None:
    """The characters of a vocabulary `_char_vocab` wrote, else None."""
    tokens = _used(vocab)
    if tokens[:2] != [UNK, EOT] or vocab.types[:2] != [T.UNKNOWN, T.CONTROL]:
        return None
    try:
        chars = [bytes(FROM_BYTES[s] for s in t).decode("utf-8") for t in tokens[2:]]
    except (KeyError, UnicodeDecodeError):
        return None
    if any(len(c) != 1 for c in chars) or vocab.merges != char_merges("".join(chars)):
        return None
    return "".join(chars)


def _byte_level(vocab: Vocab, where: str) -> HFTokenizer:
    if vocab.pre not in PRE_SPLITS and vocab.pre is not None:
        raise AttnlabError(
            f"{where}: its tokenizer splits words as {vocab.pre!r}; attnlab reads the "
            f"pre-tokenizers {', '.join(PRE_SPLITS)}"
        )
    tokens = _used(vocab)
    ids = {t: i for i, t in enumerate(tokens)}
    pairs = [merge_pair(m) for m in vocab.merges]
    merges = [(a, b) for a, b in pairs if a in ids and b in ids and a + b in ids]  # what a tokenizers BPE holds
    hf = HFTokenizer(models.BPE(ids, merges, ignore_merges=vocab.pre == "llama-bpe"))  # as Llama 3's file says
    if vocab.pre == "llama-bpe":
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's split, then bytes
    hf.decoder = decoders.ByteLevel()
    return _with_specials(hf, vocab, tokens)


def _sentencepiece(vocab: Vocab, where: str) -> HFTokenizer:
    """SentencePiece's BPE as a `tokenizers` BPE: merge ranks from the pieces' scores."""
    if vocab.scores is None:
        raise AttnlabError(f"{where}: its llama (SentencePiece) vocabulary has no scores (tokenizer.ggml.scores)")
    tokens = _used(vocab)
    ids = {t: i for i, t in enumerate(tokens)}
    normal = [i for i, t in enumerate(vocab.types[: len(tokens)]) if t in (T.NORMAL, T.USER_DEFINED)]
    merges = _piece_merges(tokens, normal, vocab.scores, ids, where)
    unk = tokens[vocab.unk] if vocab.unk is not None else UNK
    hf = HFTokenizer(models.BPE(ids, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    hf.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return _with_specials(hf, vocab, tokens)


# Bounds on the work of finding a SentencePiece vocabulary's merges, which is quadratic in a piece's
# length: Llama 2's 32,000 pieces are at most 16 characters, 200,000 in all, and make 61,000 merges.
MAX_PIECE, MAX_PIECE_CHARS, MAX_MERGES = 256, 1 << 22, 1 << 19


def _piece_merges(
    tokens: list[str], normal: list[int], scores: list[float], ids: dict[str, int], where: str
) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces, the best-scored piece's first."""
    longest = max(normal, key=lambda i: len(tokens[i]), default=None)
    if longest is not None and len(tokens[longest]) > MAX_PIECE:
        raise AttnlabError(
            f"{where}: piece {longest} of its SentencePiece vocabulary is {len(tokens[longest]):,} "
            f"characters long; attnlab reads pieces of up to {MAX_PIECE}"
        )
    if sum(len(tokens[i]) for i in normal) > MAX_PIECE_CHARS:
        raise AttnlabError(
            f"{where}: its SentencePiece pieces hold more than {MAX_PIECE_CHARS:,} characters, more than attnlab reads"
        )
    pairs = []  # (the score of the piece made, its id, left, right)
    for i in normal:
        piece = tokens[i]
        pairs += [
            (-scores[i], i, piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in ids and piece[k:] in ids
        ]
        if len(pairs) > MAX_MERGES:
            raise AttnlabError(
                f"{where}: its SentencePiece pieces split into more than {MAX_MERGES:,} pairs of "
                "pieces, more than attnlab reads"
            )
    return [(left, right) for _, _, left, right in sorted(pairs)]


def _with_specials(hf: HFTokenizer, vocab: Vocab, tokens: list[str]) -> HFTokenizer:
    """Control and unknown tokens as special added tokens, user-defined ones as added tokens (both
    matched whole in a text, as llama.cpp does), and the begin-of-text token when the file adds one."""
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, vocab.types)
        if kind in (T.CONTROL, T.UNKNOWN)
    ]
    user = [AddedToken(t, normalized=False) for t, kind in zip(tokens, vocab.types) if kind == T.USER_DEFINED]
    hf.add_special_tokens(special)
    hf.add_tokens(user)
    if vocab.add_bos and vocab.bos is not None:
        bos = tokens[vocab.bos]
        hf.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab.bos)]
        )
    return hf


def chat_template(vocab: Vocab, where: str | None = None) -> ChatTemplate | None:
    """The file's chat template (tokenizer.chat_template), with its begin and end tokens' texts; `where`:
    the file, named by the template's errors (a template read from a file is tried as it is read)."""
    if not vocab.template:
        return None
    text = lambda i: vocab.tokens[i] if i is not None and 0 <= i < len(vocab.tokens) else ""  # noqa: E731
    return ChatTemplate(vocab.template, text(vocab.bos), text(vocab.eos), where)
