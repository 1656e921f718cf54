"""stream_text's `stop`: nothing of the stop text is ever streamed, even when it arrives over several tokens."""

from __future__ import annotations

import pytest

import attnlab.decoding.sampling as generate
from attnlab.data.tokenizers import CharTokenizer


@pytest.fixture
def scripted(monkeypatch):
    """A 'model' whose tokens are the characters of a given text, in order."""
    tok = CharTokenizer("abcdefgh?!")

    def use(text: str):
        ids = tok.encode(text)
        monkeypatch.setattr(generate, "stream", lambda model, prompt, n, **kw: iter(ids[:n]))
        return tok

    return use


@pytest.mark.parametrize(
    "text, stop, expected",
    [
        ("abcde?fgh", "e?", "abcd"),  # the stop's first character arrives a token before the rest
        ("abceabe?h", "e?", "abceab"),  # a false start ("e" then "a") is streamed once it is ruled out
        ("abcdefgh", "h?", "abcdefgh"),  # ends while "h" might start the stop: it comes out at the end
        ("abcdefgh", None, "abcdefgh"),
        ("abcdefgh", "c", "ab"),
    ],
)
def test_stop_text_is_never_streamed(scripted, text, stop, expected):
    tok = scripted(text)
    pieces = list(generate.stream_text(None, tok, "a", max_new_tokens=len(text), stop=stop))
    assert "".join(pieces) == expected


def test_stop_token_ends_the_text_without_itself(monkeypatch):
    """A chat answer ends at the tokenizer's end of text (stream_answer passes it as stop_token)."""
    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.decoding import sampling

    tok = train_tokenizer("char", ["abc"], 16)
    drawn = [tok.encode("a")[0], tok.encode("b")[0], tok.eot_id, tok.encode("c")[0]]
    monkeypatch.setattr(sampling, "stream", lambda *a, **k: iter(drawn))
    assert "".join(sampling.stream_text(None, tok, "x", stop_token=tok.eot_id)) == "ab"
    assert "".join(sampling.stream_text(None, tok, "x")) == "ab" + tok.decode([tok.eot_id]) + "c"
