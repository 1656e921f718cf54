"""Hostile fine-tuning data given to `attnlab train sft|dpo|reward --data FILE` (issue 55).

Every case asserts, through tests/hostile.py: one AttnlabError line naming the file and the row (through
the CLI: exit code 2 and one `attnlab: error:` line), no traceback, at most SECONDS seconds and MIB MiB
of peak memory growth, the file unchanged and no run written. Data that is usable but suspicious is one
warning line instead: pairs whose chosen answer is the rejected one are left out (all of them: an
error), conversations that open with the assistant are trained as given. A long line costs a small
multiple of its size to read (measured 3.0x; asserted under 5x), and a row too long for the model's
context is left out before it is tokenized. Hypothesis adds random rows and random bytes: each file
reads, or is refused in one line, within the same bounds.
"""

from __future__ import annotations

import json
import re
import time
import warnings

import pytest

from attnlab.data.conversations import read_conversations, read_preferences
from attnlab.data.finetune import ChatData, splits
from attnlab.data.tokenizers import load_tokenizer
from attnlab.errors import AttnlabError
from attnlab.runs.adapted import run_template
from attnlab.tasks import TASKS
from tests.conftest import REPEATABLE, tiny_chat_base
from tests.hostile import bounded, cli_refuses, one_line, refused, untouched

pytestmark = pytest.mark.usefixtures("one_thread")

SECONDS, MIB = 10.0, 100  # per case; refusals take a few ms and under a MiB
GOOD = {"prompt": "2 + 2?", "completion": "4"}
U, A = "user", "assistant"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny GPT run (context 256, character tokenizer) to fine-tune: the CLI cases' --init."""
    return tiny_chat_base(tmp_path_factory.mktemp("base"))


def jsonl(path, *rows) -> str:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows), encoding="utf-8"
    )
    return str(path)


def msgs(*turns) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


# ---- wrong types, missing fields, empty conversations: one line naming the row and the field ---------------

BAD_ROWS = [  # (the row, what the line says); the row is row 2, after a good one
    ({"messages": "hello"}, r"row 2: field 'messages' must be a non-empty list of messages, got str"),
    ({"messages": []}, r"row 2: field 'messages' must be a non-empty list of messages, got an empty list"),
    ({"messages": [{"role": "user", "content": 5}]}, r"message 1: needs .* a text content, got int"),
    ({"messages": [{"role": "user", "content": None}, {"role": "assistant"}]}, r"message 1: .*got null"),
    ({"messages": [{"role": 7, "content": "x"}]}, r"message 1: needs a role \(system, user, assistant\), got int"),
    ({"messages": [{"role": "tool\n", "content": "x"}]}, r"got 'tool\\n'"),  # the role escaped: one line
    ({"messages": [["user", "hi"]]}, r"message 1: must be an object with a role and a content, got list"),
    (msgs((U, "hi")), r"row 2: field 'messages' has no assistant turn"),
    ({"prompt": 1, "completion": "x"}, r"row 2: field 'prompt' must be a text, got int"),
    ({"text": None}, r"row 2: field 'text' must be a text, got null"),
    ({"text": ""}, r"row 2: field 'text' is empty: nothing to train"),
    ({"instruction": ["a"], "output": "x"}, r"field 'instruction' must be a text, got list"),
    ({"prompt": "a"}, r"row 2: fields \['prompt'\] fit no format"),
    ({"x" * 10_000: 1, "\n": 2}, r"fields \['\\n', 'xxxxx"),  # the file's keys: cut short, escaped
    ({}, r"row 2: fields \[\] fit no format"),
    (7, r"row 2: expected an object with fields, got int"),
    (None, r"row 2: expected an object with fields, got null"),
    ({"prompt": "q", "chosen": "a", "rejected": "b"}, r"row 2: a preference pair .* is DPO data"),
]


@pytest.mark.parametrize("row, says", BAD_ROWS, ids=[f"{i}" for i in range(len(BAD_ROWS))])
def test_a_row_of_the_wrong_shape_is_one_line(tmp_path, row, says):
    path = jsonl(tmp_path / "d.jsonl", GOOD, row)
    refused(lambda: read_conversations(path), says, SECONDS, MIB, keep=(tmp_path,))


BAD_PAIRS = [
    ({"prompt": "q", "chosen": 5, "rejected": "b"}, r"field 'chosen' must be a text or a non-empty list of messages"),
    ({"prompt": None, "chosen": "a", "rejected": "b"}, r"field 'prompt' must be a text or .* got null"),
    (
        {"prompt": "q", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"},
        r"field 'chosen' must end with the assistant's turn \(the answer\), not the user's",
    ),
    (GOOD, r"row 2: needs the fields prompt, chosen and rejected"),
]


@pytest.mark.parametrize("row, says", BAD_PAIRS, ids=[f"{i}" for i in range(len(BAD_PAIRS))])
def test_a_pair_of_the_wrong_shape_is_one_line(tmp_path, row, says):
    path = jsonl(tmp_path / "p.jsonl", {"prompt": "q", "chosen": "a", "rejected": "b"}, row)
    refused(lambda: read_preferences(path), says, SECONDS, MIB, keep=(tmp_path,))


def test_chosen_equal_to_rejected_is_left_out_and_said_once_all_of_them_refused(tmp_path):
    """Such a pair's DPO and reward losses are ln 2 whatever the model: left out, counted, in one warning."""
    rows = [{"prompt": f"q{i}", "chosen": "a", "rejected": "a" if i < 3 else "b"} for i in range(10)]
    path = jsonl(tmp_path / "p.jsonl", *rows)
    with untouched(tmp_path), bounded(SECONDS, MIB), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        pairs = read_preferences(path)
    assert len(pairs) == 7 and all(p.chosen != p.rejected for p in pairs) and len(said) == 1
    one_line(
        str(said[0].message),
        r"left out 3 of 10 pairs whose chosen answer is the rejected one \(first: row 1\): "
        r"they teach nothing",
    )
    same = jsonl(tmp_path / "same.jsonl", *[{**r, "rejected": "a"} for r in rows])
    refused(
        lambda: read_preferences(same),
        r"in every pair the chosen answer is the rejected one",
        SECONDS,
        MIB,
        keep=(tmp_path,),
    )


def test_a_conversation_that_opens_with_the_assistant_is_trained_with_a_warning(tmp_path):
    rows = [GOOD, msgs(("system", "Be brief."), (A, "Hello!"), (U, "Hi"), (A, "What now?")), msgs((A, "Hi"))]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        convs = read_conversations(jsonl(tmp_path / "d.jsonl", *rows))
    assert len(convs) == 3 and len(said) == 1
    one_line(str(said[0].message), r"2 of 3 conversations open with the assistant's turn \(first: row 2\)")


# ---- bytes: UTF-8 strictly, a byte-order mark, lines that end at "\n" only, nesting ------------------------


def test_invalid_utf8_is_one_line_naming_the_row_and_the_byte(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"text": "caf\xe9"}\n')  # Latin-1, not UTF-8
    refused(
        lambda: read_conversations(path),
        r"row 2 is not UTF-8 \(byte 0xe9 at byte 14 of the line\): save the "
        r"file as UTF-8",
        SECONDS,
        MIB,
        keep=(tmp_path,),
    )
    whole = tmp_path / "d.json"
    whole.write_bytes(b'[\n{"text": "a"},\n{"text": "\xff"}\n]')
    refused(lambda: read_conversations(whole), r"line 3 is not UTF-8 \(byte 0xff\)", SECONDS, MIB, keep=(tmp_path,))


@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_a_byte_order_mark_at_the_start_is_read_past_and_elsewhere_is_one_line(tmp_path, suffix):
    text = json.dumps([GOOD, GOOD]) if suffix == "json" else f"{json.dumps(GOOD)}\n{json.dumps(GOOD)}\n"
    path = tmp_path / f"d.{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert len(read_conversations(path)) == 2
    later = tmp_path / "later.jsonl"
    later.write_bytes(f"{json.dumps(GOOD)}\n\ufeff{json.dumps(GOOD)}\n".encode())
    refused(
        lambda: read_conversations(later), r"row 2 is not valid JSON \(it starts with a byte-order mark", SECONDS, MIB
    )


def test_unicode_line_separators_inside_a_row_are_text(tmp_path):
    """U+2028, U+2029, U+0085, \\x1c-\\x1e, \\v, \\f: str.splitlines() breaks at each; JSONL only at \\n."""
    odd = "a\u2028b\u2029c\x85d\x1ce\x1df\x1eg\x0bh\x0ci\rj"
    convs = read_conversations(jsonl(tmp_path / "d.jsonl", {"prompt": odd, "completion": odd}, GOOD))
    assert len(convs) == 2 and convs[0].messages[0].content == odd


@pytest.mark.parametrize(
    "text, where",
    [("[" * 100_000 + "]" * 100_000, "the file"), ('{"text": ' + "[" * 50_000 + "]" * 50_000 + "}", "row 2")],
)
def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path, text, where):
    path = tmp_path / "d.jsonl"
    path.write_text(text if where == "the file" else f"{json.dumps(GOOD)}\n{text}\n")
    refused(lambda: read_conversations(path), rf"{where} nests JSON too deeply", SECONDS, MIB, keep=(tmp_path,))


def test_a_row_of_a_million_lists_is_refused_before_it_is_parsed(tmp_path):
    """1.2 million empty lists are 2.4 MB of text and would be ~70 MB of Python lists."""
    path = jsonl(tmp_path / "d.jsonl", '{"text": [' + ",".join(["[]"] * 1_200_000) + "]}")
    refused(
        lambda: read_conversations(path), r"row 1 holds over 1,000,000 objects and lists", SECONDS, 30, keep=(tmp_path,)
    )


@pytest.mark.parametrize("content, says", [("", r"no rows"), ("\n \n\t\n", r"no rows"), (None, r"not a file")])
def test_an_empty_file_or_a_folder_is_one_line(tmp_path, content, says):
    path = tmp_path / "d.jsonl"
    path.mkdir() if content is None else path.write_text(content)
    refused(lambda: read_conversations(path), says, SECONDS, MIB, keep=(tmp_path,))


# ---- size: a long line, many rows -------------------------------------------------------------------------


def test_a_long_line_costs_a_small_multiple_of_its_size_and_is_left_out_untokenized(tmp_path, base):
    """A 20 MB answer (the issue's 100 MB measured 3.0x its size to read, 0.6 s): read under 5x its size;
    too long for the model's 256 tokens, left out before its 20 million tokens are made."""
    mb = 20
    path = jsonl(tmp_path / "d.jsonl", {"prompt": "q", "completion": "a" * (mb * 2**20)}, GOOD)
    with untouched(tmp_path), bounded(SECONDS, 5 * mb):
        convs = read_conversations(path)
    assert len(convs[0].messages[1].content) == mb * 2**20
    task, data = TASKS["sft"], ChatData(data=path, val_fraction=0.0)
    with untouched(tmp_path), bounded(SECONDS, 5 * mb), pytest.warns(UserWarning, match=r"left out 1 of 2"):
        parts = task.examples(load_tokenizer(base), run_template(base), data, room=256)
    assert len(parts["train"]) == 1


def test_many_tiny_rows_read_in_linear_time(tmp_path):
    """250,000 rows (the issue's million: 3.3 s of CPU, 214 MiB on a 2-core EPYC): in the bounds, and the
    time per row of 250,000 within 3x that of 25,000 (a quadratic reader: 10x)."""
    per_row = []
    for n in (25_000, 250_000):
        path = tmp_path / f"{n}.jsonl"
        path.write_text('{"text": "hi"}\n' * n)
        with bounded(SECONDS, 150):
            start = time.process_time()
            assert len(splits(ChatData(data=str(path)), "instructions")["train"]) == n - round(n * 0.05)
            per_row.append((time.process_time() - start) / n)
    assert per_row[1] < 3 * per_row[0], f"{per_row[1] / per_row[0]:.1f}x the time per row at 10x the rows"


# ---- through the command line: one error line, no run written --------------------------------------------

CLI_CASES = {  # name: (task, the file's bytes, what the line says)
    "messages a text": ("sft", b'{"messages": "hello"}\n', r"row 1: field 'messages' must be a non-empty list"),
    "not UTF-8": ("sft", b'{"text": "\xff"}\n', r"row 1 is not UTF-8"),
    "nested": ("reward", b"[" * 10_000 + b"]" * 10_000, r"nests JSON too deeply"),
    "chosen == rejected": ("dpo", b'{"prompt": "q", "chosen": "a", "rejected": "a"}\n', r"in every pair the chosen"),
    "a row too long": (
        "sft",
        json.dumps({"text": "a" * 2_000_000}).encode(),
        r"every conversation is longer than "
        r"the model's context of 256 tokens",
    ),
}


@pytest.mark.parametrize("case", CLI_CASES)
def test_the_command_line_refuses_in_one_line_and_writes_nothing(base, tmp_path, capsys, case):
    task, raw, says = CLI_CASES[case]
    (tmp_path / "in").mkdir()
    path, out = tmp_path / "in" / "d.jsonl", tmp_path / "out"
    path.write_bytes(raw)
    line = cli_refuses(
        ["train", task, "--init", base, "--out", out, "--data", path, "--device", "cpu"],
        capsys,
        says,
        SECONDS,
        MIB,
        keep=(path.parent, base),
    )
    assert not out.exists() and (str(path) in line or "context" in line)


# ---- random rows and random bytes: read, or one line ---------------------------------------------------------


def hypothesis():
    """hypothesis is a dev extra: without it the property-based tests skip, the rest run."""
    return pytest.importorskip("hypothesis", reason="hypothesis is a dev extra: pip install -e .[dev]")


def rows_strategy(st):
    """Rows near the formats: their fields (and others) holding any JSON value, messages of any shape."""
    scalar = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    value = st.recursive(
        scalar,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=8,
    )
    role = st.sampled_from(["system", "user", "assistant", "tool", "", "USER"]) | value
    message = st.fixed_dictionaries({}, optional={"role": role, "content": st.text(max_size=8) | value})
    field = st.sampled_from(
        ["text", "prompt", "completion", "messages", "instruction", "input", "output", "chosen", "rejected", "other"]
    )
    return st.lists(
        st.dictionaries(field, value | st.text(max_size=8) | st.lists(message, max_size=3), max_size=4) | value,
        min_size=0,
        max_size=4,
    )


def read_or_refused(path, read) -> None:
    """read(path) returns, or refuses in one line naming the file; warnings (one line each) aside."""
    with untouched(path), bounded(SECONDS, MIB), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            read(path)
        except AttnlabError as e:
            one_line(str(e), re.escape(str(path)))


def test_random_rows_read_or_are_refused_in_one_line(tmp_path):
    h = hypothesis()
    st = h.strategies

    @h.settings(max_examples=80, **REPEATABLE)
    @h.given(rows_strategy(st), st.booleans(), st.booleans())
    def check(rows, as_list, pairs):
        path = tmp_path / ("d.json" if as_list else "d.jsonl")
        text = json.dumps(rows) if as_list else "".join(json.dumps(r) + "\n" for r in rows)
        path.write_text(text)
        read_or_refused(path, read_preferences if pairs else read_conversations)

    check()


def test_random_bytes_read_or_are_refused_in_one_line(tmp_path):
    h = hypothesis()
    st = h.strategies
    good = (json.dumps(GOOD) + "\n" + json.dumps(msgs((U, "é\u2028"), (A, "b"))) + "\n").encode()

    @h.settings(max_examples=100, **REPEATABLE)
    @h.given(st.lists(st.tuples(st.integers(0, len(good) - 1), st.binary(min_size=0, max_size=3)), max_size=4))
    def check(edits):
        raw = bytearray(good)
        for at, new in edits:
            raw[at : at + 1] = new
        path = tmp_path / "d.jsonl"
        path.write_bytes(bytes(raw))
        read_or_refused(path, read_conversations)

    check()


def test_many_rows_are_encoded_under_a_progress_bar(monkeypatch, capsys):
    """A million rows take about 20 s to encode: a bar says so (a few rows encode without one)."""
    from attnlab.tasks import adapt

    rows = ["a", "bb", "ccc"]
    assert adapt.encoded_rows(rows, len, None, "conversations") == [1, 2, 3]
    assert "encoding conversations" not in capsys.readouterr().err
    monkeypatch.setattr(adapt, "SHOWN_FROM", 3)
    assert adapt.encoded_rows(rows, len, None, "conversations") == [1, 2, 3]
    assert "encoding conversations" in capsys.readouterr().err
