"""How much of a text a run's tokenizer cannot read, said in words when it is much.

A character tokenizer reads a character it never saw in training as `<unk>`; a word or WordPiece
tokenizer reads an unknown word as `[UNK]`. A model shown mostly unknown tokens still gives a
loss or a confident label, which says nothing about the text: eval --data, predict and
fine-tuning from a run (--init) report the share here, with the most frequent unknown pieces.
Each tokenizer counts its own unknowns (`unknown_in`); byte-level BPE has none.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

THRESHOLD = 0.05  # above this share of unknown tokens, a user is told
EXAMPLES = 5  # unknown pieces named in the warning, most frequent first


@dataclass
class UnknownShare:
    """Pieces read (characters, words or word pieces) and the unknown ones among them, counted."""

    pieces: int = 0
    unknown: Counter[str] = field(default_factory=Counter)

    @property
    def n_unknown(self) -> int:
        return sum(self.unknown.values())

    @property
    def rate(self) -> float:
        return self.n_unknown / self.pieces if self.pieces else 0.0

    def add(self, pieces: int, unknown: Counter[str]) -> None:
        self.pieces += pieces
        self.unknown.update(unknown)


def unknown_share(tok, texts: Iterable[str]) -> UnknownShare:
    """The unknown pieces of `texts` under `tok` (read one text at a time: a corpus streams through)."""
    share = UnknownShare()
    for text in texts:
        share.add(*tok.unknown_in(text))
    return share


def warn_unknown(tok, share: UnknownShare, what: str, consequence: str, stacklevel: int = 2) -> bool:
    """One warning line when more than THRESHOLD of `what` is unknown to `tok`; True if it was given."""
    if share.rate <= THRESHOLD:
        return False
    examples = ", ".join(repr(piece) for piece, _ in share.unknown.most_common(EXAMPLES))
    warnings.warn(
        f"{what}: {share.n_unknown:,} of {share.pieces:,} {tok.unit}s ({share.rate:.0%}) are not in the "
        f"run's vocabulary and are read as {tok.unk_name} (most often {examples}); {consequence}",
        stacklevel=stacklevel + 1,
    )
    return True
