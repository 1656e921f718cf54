"""Tokenizers: one interface for character-level, byte-level BPE and word vocabularies.

Both keep `<|endoftext|>` as a special token that separates documents in the token stream.
A tokenizer lives in `tokenizer.json` inside a run directory; `load_tokenizer` reads either kind.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from attnlab.data.pool import ordered_map
from attnlab.errors import AttnlabError

EOT = "<|endoftext|>"
UNK = "<unk>"
WORD_SPECIALS_UNK = "[UNK]"  # WORD_SPECIALS[1]: the word tokenizers' unknown token


class CharTokenizer:
    """One token per character seen in training; unseen characters map to `<unk>`."""

    wraps = False  # only a converted BERT's WordPiece frames its inputs in [CLS] ... [SEP]

    kind = "char"
    batch_pieces = 1  # encoding is one numpy lookup: batching pieces would only cost memory
    unit, unk_name = "character", UNK  # what unknown_in counts, and what an unknown one becomes

    def __init__(self, chars: str):
        self.specials = [UNK, EOT]
        self.chars = chars
        self.itos = self.specials + list(chars)
        self.unk_id, self.eot_id = 0, 1
        # A table from code point to id (unknown: <unk>), so encoding is one vectorized lookup.
        # At least 256 entries, so any byte of ASCII text indexes it without a bounds check.
        cps = np.array([ord(c) for c in chars], dtype=np.int64)
        dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32
        self._table = np.full(max(int(cps.max(initial=0)) + 2, 256), self.unk_id, dtype=dtype)
        self._table[cps] = np.arange(len(self.specials), len(self.specials) + len(chars), dtype=dtype)

    @classmethod
    def train(cls, texts: Iterable[str], workers: int = 1) -> CharTokenizer:
        """The characters of `texts`, found by `workers` processes (one per piece of text)."""
        seen = np.zeros(0, dtype=np.uint32)
        for cps in ordered_map(_code_points, texts, workers):
            seen = np.union1d(seen, cps)
        return cls("".join(map(chr, seen.tolist())))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode_array(self, text: str) -> np.ndarray:
        if text.isascii():  # (a flag CPython keeps: free) one byte per character, 4x less to move
            return self._table[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # one code point per character
        # Code points beyond the table all land on its last entry, which is <unk>.
        return self._table[np.minimum(cps, len(self._table) - 1)]

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def unknown_in(self, text: str) -> tuple[int, Counter[str]]:
        """(characters in `text`, the characters of it read as <unk> and their counts): one lookup."""
        unknown = self.encode_array(text) == self.unk_id
        if not unknown.any():  # the common case, at the speed of encoding
            return len(unknown), Counter()
        width = (np.uint8, "ascii") if text.isascii() else (np.uint32, "utf-32-le")  # as encode_array reads it
        cps, counts = np.unique(np.frombuffer(text.encode(width[1]), dtype=width[0])[unknown], return_counts=True)
        return len(unknown), Counter(dict(zip(map(chr, cps.tolist()), counts.tolist())))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode_array(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        n = len(self.itos)
        return "".join(self.itos[i] if 0 <= i < n else UNK for i in ids)

    def n_chars(self, ids: np.ndarray) -> int:
        """Characters the ids stand for (each token is one character or one boundary)."""
        return int(len(ids))

    def to_json(self) -> str:
        return json.dumps({"type": "char", "chars": self.chars}, ensure_ascii=False)


class BPETokenizer:
    """Byte-level BPE, trained on the user's corpus with HuggingFace `tokenizers`.

    Byte-level means any text, in any script, encodes without unknown tokens.
    """

    wraps = False  # only a converted BERT's WordPiece frames its inputs in [CLS] ... [SEP]

    kind = "bpe"
    batch_pieces = 8  # the Rust encoder spreads a batch over every core
    unit, unk_name = "token", "nothing"

    def unknown_in(self, text: str) -> tuple[int, Counter[str]]:
        """Byte-level: every text encodes, nothing is unknown (and nothing is counted)."""
        return 0, Counter()

    def __init__(self, tok):
        self.tok = tok
        self.eot_id = tok.token_to_id(EOT)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet) + 1:
            raise AttnlabError(f"--vocab-size must be at least {len(alphabet) + 1} for byte-level BPE")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[EOT], initial_alphabet=alphabet, show_progress=False
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text).ids, dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # The Rust encoder runs the batch on every core.
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(texts)]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def n_chars(self, ids: np.ndarray) -> int:
        ids = np.asarray(ids)
        n_eot = int((ids == self.eot_id).sum())
        text = self.tok.decode(ids[ids != self.eot_id].tolist())
        return len(text) + n_eot

    def to_json(self) -> str:
        return self.tok.to_str()


def _code_points(text: str) -> np.ndarray:
    """The distinct code points of a text, in numpy: many times faster than a Counter."""
    return np.unique(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32))


class WordTokenizer:
    """Whole words and punctuation marks, the N most frequent, with BERT's special tokens.

    The vocabulary is ordered: specials first ([PAD] is 0), then words by falling frequency,
    so "the N most frequent words" is the id range [len(SPECIALS), N). A line break is a token;
    other whitespace is not kept: decoding joins tokens with spaces.
    """

    wraps = False  # only a converted BERT's WordPiece frames its inputs in [CLS] ... [SEP]

    kind = "word"
    batch_pieces = 1
    unit, unk_name = "word", WORD_SPECIALS_UNK

    def __init__(self, words: list[str], lower: bool = False):
        self.itos = list(WORD_SPECIALS) + [w for w in words if w not in WORD_SPECIALS]
        self.lower = lower
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = range(len(WORD_SPECIALS))
        self.eot_id = self.sep_id  # documents in a token stream are separated by [SEP]

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 10000, lower: bool = False) -> WordTokenizer:
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(w for w in cls.split(text, lower) if w not in WORD_SPECIALS)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))  # ties in a fixed order
        return cls([w for w, _ in ranked[: max(0, vocab_size - len(WORD_SPECIALS))]], lower)

    @staticmethod
    def split(text: str, lower: bool = False) -> list[str]:
        """Words (letters, digits, underscores), single punctuation marks and line breaks ("\\n", blank
        lines folded in); [MASK]-style specials kept whole."""
        words = (NEWLINE if w[0] == NEWLINE else w for w in _WORD.findall(text))
        return [w if w in WORD_SPECIALS else (w.lower() if lower else w) for w in words]

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def specials(self) -> list[str]:
        return list(WORD_SPECIALS)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(w, self.unk_id) for w in self.split(text, self.lower)]

    def encode_words(self, words: list[str]) -> list[int]:
        return [self.stoi.get(w.lower() if self.lower and w not in WORD_SPECIALS else w, self.unk_id) for w in words]

    def unknown_in(self, text: str) -> tuple[int, Counter[str]]:
        """(words in `text`, the words of it read as [UNK] and their counts)."""
        words = self.split(text, self.lower)
        return len(words), Counter(w for w in words if w not in self.stoi)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode_array(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        n = len(self.itos)
        return " ".join(self.itos[i] if 0 <= i < n else WORD_SPECIALS[1] for i in ids)

    def n_chars(self, ids: np.ndarray) -> int:
        return len(self.decode(np.asarray(ids).tolist()))

    def to_json(self) -> str:
        return json.dumps({"type": "word", "words": self.itos[len(WORD_SPECIALS) :], "lower": self.lower})


class WordPieceTokenizer:
    """A HuggingFace WordPiece tokenizer.json (BERT's), used as it is: its normalizer and
    pre-tokenizer decide the pieces. A converted BERT read its inputs as [CLS] pieces [SEP], so
    `wraps` tells the readers (predict, attention) to frame them the same way."""

    kind = "wordpiece"
    batch_pieces = 8
    wraps = True
    unit, unk_name = "token", WORD_SPECIALS_UNK
    lower = False  # the tokenizer's own normalizer lowercases, if the model was uncased

    def __init__(self, tok):
        self.tok = tok
        self.itos = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
        ids = [tok.token_to_id(name) for name in WORD_SPECIALS]
        if None in ids:
            missing = WORD_SPECIALS[ids.index(None)]
            raise AttnlabError(f"this WordPiece tokenizer has no {missing} token, which BERT's inputs need")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids
        self.eot_id = self.sep_id

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def split(self, text: str, lower: bool = False) -> list[str]:
        """The text's word pieces ("playing" -> "play", "##ing"); [MASK] stays whole."""
        return self.tok.encode(text, add_special_tokens=False).tokens

    def encode_words(self, words: list[str]) -> list[int]:
        return [self.unk_id if (i := self.tok.token_to_id(w)) is None else i for w in words]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def unknown_in(self, text: str) -> tuple[int, Counter[str]]:
        """(word pieces of `text`, the words of it read as [UNK], by their place in the text, and their counts)."""
        enc = self.tok.encode(text, add_special_tokens=False)
        return len(enc.ids), Counter(text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets) if i == self.unk_id)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def n_chars(self, ids: np.ndarray) -> int:
        return len(self.decode(np.asarray(ids).tolist()))

    def to_json(self) -> str:
        return self.tok.to_str()


WORD_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# A line break (and any blank lines after it) is one token: in code it ends a statement.
_WORD = re.compile(r"\[(?:PAD|UNK|CLS|SEP|MASK)\]|\w+|[^\w\s]|\n(?:[^\S\n]*\n)*")
NEWLINE = "\n"

Tokenizer = CharTokenizer | BPETokenizer | WordTokenizer | WordPieceTokenizer


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int = 4096, workers: int = 1) -> Tokenizer:
    """A tokenizer of `kind` trained on `texts`; `workers` processes for the character pass
    (BPE training is multithreaded inside `tokenizers` already)."""
    if kind == "char":
        return CharTokenizer.train(texts, workers)
    if kind == "bpe":
        return BPETokenizer.train(texts, vocab_size)
    if kind == "word":
        return WordTokenizer.train(texts, vocab_size)
    raise AttnlabError(f"unknown tokenizer {kind!r}: use char, bpe or word")


def tokenizer_from_json(text: str) -> Tokenizer:
    data = json.loads(text)
    if data.get("type") == "char":
        return CharTokenizer(data["chars"])
    if data.get("type") == "word":
        return WordTokenizer(data["words"], data.get("lower", False))
    if (data.get("model") or {}).get("type") == "WordPiece":  # a converted BERT's own tokenizer
        return WordPieceTokenizer(HFTokenizer.from_str(text))
    return BPETokenizer(HFTokenizer.from_str(text))


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read `tokenizer.json` (either kind) from a file or a run directory."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    try:
        return tokenizer_from_json(p.read_text(encoding="utf-8"))
    except Exception as e:  # any unreadable file is the same user error
        raise AttnlabError(f"cannot read tokenizer {p}: {e}") from None
