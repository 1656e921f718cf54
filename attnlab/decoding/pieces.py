"""The text of tokens that arrive one at a time, cut into pieces safe to show as they come."""

from __future__ import annotations

from collections.abc import Sequence

from attnlab.data.tokenizers import Tokenizer


class TextPieces:
    """The text of tokens that come one by one, cut into pieces safe to show as they come.

    A token that leaves a multi-byte character incomplete gives no piece (None) until the
    character is whole; the text ends before the first of the `stops` texts, and a tail that may
    be the start of one is held back (an empty piece) until the next tokens tell. The whole text
    is decoded again at each token, so a tokenizer's merges across tokens are honoured.
    """

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.text = ""  # the text so far, up to its last complete character
        self.emitted = 0  # characters of it given out as pieces
        self.stopped = False

    def add(self, token: int) -> str | None:
        """The piece `token` completes: new text, '' while a tail may start a stop text, None while
        a character is incomplete. After a stop text, `stopped` is set and the piece ends before it."""
        self.ids.append(token)
        decoded = self.tokenizer.decode(self.ids)
        if decoded.endswith("\ufffd"):
            return None
        self.text = decoded
        cut = first_stop(decoded, self.stops)
        end = len(decoded) - max((_held_back(decoded, s) for s in self.stops), default=0) if cut is None else cut
        piece, self.emitted = decoded[self.emitted : end], end
        self.stopped = cut is not None
        return piece

    def flush(self) -> str:
        """The text held back at the end, when no more tokens come."""
        tail, self.emitted = self.text[self.emitted :], len(self.text)
        return tail


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first of the stop texts that occur in `text` begins (None: none occurs)."""
    found = [text.index(s) for s in stops if s in text]
    return min(found) if found else None


def _held_back(text: str, stop: str | None) -> int:
    """Length of the longest end of `text` that is a proper start of `stop` (0 if none)."""
    for k in range(min(len(stop or "") - 1, len(text)), 0, -1):
        if stop.startswith(text[-k:]):
            return k
    return 0
