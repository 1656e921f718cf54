"""A tokenizer's vocabulary as the bytes each token stands for, the form a grammar engine reads.

Legend: V the tokenizer's vocabulary size.

A constraint is checked on bytes, not on token ids: token t is allowed when the bytes it adds keep
the text a prefix of some valid value. So every attnlab tokenizer that spells text byte for byte
gives its tokens' bytes here: a character tokenizer (each character's UTF-8), a byte-level BPE
(GPT-2's alphabet of 256 printable stand-ins mapped back to bytes) and a Metaspace BPE with byte
fallback (Llama's `▁` for a space, `<0x0A>` for a byte). Special tokens get a leading 0xFF byte,
which no UTF-8 text contains, so no constraint ever allows one except end-of-sequence.
"""

from __future__ import annotations

import functools
import json
import re
import weakref

import llguidance

from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, Tokenizer
from attnlab.errors import AttnlabError

SPECIAL = b"\xff"  # the prefix of a special token's bytes: never valid UTF-8, so never in a value
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character standing for each byte -> the byte.

    Bytes that print as themselves keep their code point; the other 68 are moved past 255 in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in printable]
    chars = printable + [256 + i for i in range(len(moved))]
    return {chr(c): b for c, b in zip(chars, printable + moved)}


def char_token_bytes(tok: CharTokenizer) -> list[bytes]:
    """One entry per id: a special's name behind 0xFF, a character's UTF-8."""
    return [SPECIAL + name.encode() for name in tok.specials] + [c.encode() for c in tok.chars]


def bpe_token_bytes(tok: BPETokenizer) -> list[bytes]:
    """One entry per id of a byte-level or Metaspace/byte-fallback BPE; added (special) tokens behind 0xFF."""
    spec = json.loads(tok.tok.to_str())
    decoders = json.dumps(spec.get("decoder") or {})
    added = {t["id"] for t in spec.get("added_tokens") or [] if t.get("special", True)}
    if '"ByteLevel"' in decoders:
        spell = _byte_level_bytes
    elif '"ByteFallback"' in decoders or '"Metaspace"' in decoders or "▁" in decoders:
        spell = _metaspace_bytes
    else:
        raise AttnlabError("structured outputs need a byte-level or byte-fallback BPE; this tokenizer is neither")
    out = [b""] * tok.vocab_size
    for text, i in tok.tok.get_vocab(with_added_tokens=True).items():
        if i < len(out):
            out[i] = SPECIAL + text.encode() if i in added else spell(text)
    return out


def _byte_level_bytes(text: str) -> bytes:
    alphabet = byte_level_alphabet()
    return bytes(alphabet[c] for c in text)


def _metaspace_bytes(text: str) -> bytes:
    """Llama-style pieces: `<0xNN>` is byte NN, `▁` is a space."""
    if m := _BYTE_FALLBACK.fullmatch(text):
        return bytes([int(m.group(1), 16)])
    return text.replace("▁", " ").encode()


def token_bytes(tok: Tokenizer) -> list[bytes]:
    """The bytes of every token of `tok`, by id; word-level tokenizers are refused (they drop spaces)."""
    if isinstance(tok, CharTokenizer):
        return char_token_bytes(tok)
    if isinstance(tok, BPETokenizer):
        return bpe_token_bytes(tok)
    raise AttnlabError(f"structured outputs need a char or BPE tokenizer, not a {tok.kind} one")


class ByteTokenizer:
    """What llguidance's TokenizerWrapper reads from a tokenizer: the tokens' bytes, end-of-sequence,
    and a way to encode bytes (it re-tokenizes forced text, e.g. the rest of a fixed key)."""

    bos_token_id = None

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.tokens = token_bytes(tok)
        self.eos_token_id = tok.eot_id
        self.special_token_ids = [i for i, b in enumerate(self.tokens) if b.startswith(SPECIAL)]

        self.by_bytes = {b: i for i, b in reversed(list(enumerate(self.tokens))) if b and not b.startswith(SPECIAL)}
        self.longest = max(map(len, self.by_bytes), default=1)

    def __call__(self, text: bytes) -> list[int]:
        ids = self.tok.encode(text.decode("utf-8", errors="replace"))
        if b"".join(self.tokens[i] for i in ids) == text:
            return ids
        # Not spelled byte for byte: a Metaspace tokenizer put a space in front, or the bytes end
        # inside a character. llguidance needs the bytes exactly, so take the longest token each time.
        return self.greedy(text)

    def greedy(self, text: bytes) -> list[int]:
        out, at = [], 0
        while at < len(text):
            n = next(
                (n for n in range(min(self.longest, len(text) - at), 0, -1) if text[at : at + n] in self.by_bytes), 0
            )
            if n == 0:  # a byte no token spells (a character vocabulary without it)
                break
            out.append(self.by_bytes[text[at : at + n]])
            at += n
        return out


# One engine-side vocabulary per tokenizer object, dropped with it (a server holds one per run).
_VOCABS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary(tok: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of `tok` (its trie of the tokens' bytes), built once per tokenizer."""
    if tok not in _VOCABS:
        _VOCABS[tok] = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer(tok)), slices=None)
    return _VOCABS[tok]
