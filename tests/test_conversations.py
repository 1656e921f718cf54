"""Instruction and preference data: the formats people have, told apart by their fields, and the
built-in generated instructions (disjoint splits, answers that are right, near misses that are not)."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from attnlab.data.conversations import Message, RowError, kind_of, read_conversations, read_preferences
from attnlab.data.instructions import in_test, instructions, preferences

U, A, S = "user", "assistant", "system"

ROWS = [  # (row, the messages it reads as)
    ({"text": "def f(): pass"}, [(A, "def f(): pass")]),
    ({"prompt": "2+2?", "completion": "4"}, [(U, "2+2?"), (A, "4")]),
    ({"instruction": "Add.", "input": "2 and 2", "output": "4"}, [(U, "Add.\n\n2 and 2"), (A, "4")]),
    ({"instruction": "Say hi.", "output": "hi"}, [(U, "Say hi."), (A, "hi")]),
    ({"instruction": "Say hi.", "input": "", "output": "hi"}, [(U, "Say hi."), (A, "hi")]),
    (
        {
            "messages": [
                {"role": S, "content": "Be brief."},
                {"role": U, "content": "1+1?"},
                {"role": A, "content": "2"},
                {"role": U, "content": "And 2+2?"},
                {"role": A, "content": "4"},
            ]
        },
        [(S, "Be brief."), (U, "1+1?"), (A, "2"), (U, "And 2+2?"), (A, "4")],
    ),
]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("row, expected", ROWS, ids=[kind_of(r) + str(i) for i, (r, _) in enumerate(ROWS)])
def test_each_format_reads_as_its_conversation(tmp_path, row, expected):
    (conv,) = read_conversations(write_jsonl(tmp_path / "d.jsonl", [row]))
    assert [(m.role, m.content) for m in conv.messages] == expected
    assert conv.plain == ("text" in row)


def test_a_json_list_reads_as_its_rows(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([r for r, _ in ROWS]))
    assert len(read_conversations(path)) == len(ROWS)


def test_preference_pairs_of_texts_or_messages(tmp_path):
    rows = [
        {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
        {
            "prompt": [{"role": S, "content": "Be brief."}, {"role": U, "content": "2+2?"}],
            "chosen": [{"role": A, "content": "4"}],
            "rejected": [{"role": A, "content": "22"}],
        },
    ]
    a, b = read_preferences(write_jsonl(tmp_path / "p.jsonl", rows))
    assert a.prompt == (Message(U, "2+2?"),) and a.chosen == (Message(A, "4"),) and a.rejected == (Message(A, "5"),)
    assert [m.role for m in b.prompt] == [S, U] and b.rejected == (Message(A, "22"),)


BAD = [  # (the file's lines, what the one line says)
    (['{"text": "ok"}', '{"question": "?"}'], "row 2: fields ['question'] fit no format"),
    (['{"text": "ok"}', "", '{"prompt": "a", "completion": 3}'], "row 3: field 'completion' must be a text, got int"),
    (['{"messages": [{"role": "bot", "content": "hi"}]}'], "row 1: field 'messages', message 1: needs a role"),
    (['{"messages": [{"role": "user", "content": "hi"}]}'], "row 1: field 'messages' has no assistant turn"),
    (['{"text": "ok"}', "{not json"], "row 2 is not valid JSON"),
    (['["a list"]'], "row 1: expected an object with fields, got str"),  # a file that is one JSON list of texts
    (['{"prompt": "a", "chosen": "b", "rejected": "c"}'], "row 1: a preference pair (chosen/rejected) is DPO data"),
    (["7"], "row 1: expected an object with fields, got int"),
]


@pytest.mark.parametrize("lines, says", BAD, ids=[s.split(":")[0][:30] for _, s in BAD])
def test_a_row_it_cannot_read_is_one_line_naming_the_row_and_field(tmp_path, lines, says):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(Exception) as e:
        read_conversations(path)
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_preferences_need_both_answers(tmp_path):
    with pytest.raises(RowError, match="row 1: needs the fields prompt, chosen and rejected"):
        read_preferences(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "completion": "b"}]))


DIGITS = "zero one two three four five six seven eight nine".split()
# The kinds of generated question, each with its answer worked out independently of the generator:
# (pattern of the last user turn, answer from its groups and the first user turn).
QUESTIONS = {
    "reverse": (r'Reverse "([a-z]+)"\.', lambda g, first: "".join(reversed(g[0]))),
    "capitals": (r'Write "([a-z]+)" in capitals\.', lambda g, first: "".join(chr(ord(c) - 32) for c in g[0])),
    "first": (r'First letter of "([a-z]+)"\?', lambda g, first: g[0][:1]),
    "last": (r'Last letter of "([a-z]+)"\?', lambda g, first: g[0][-1:]),
    "length": (r'How many letters in "([a-z]+)"\?', lambda g, first: str(len(g[0]))),
    "after": (r"What comes after (\d+)\?", lambda g, first: str(int(g[0]) + 1)),
    "larger": (r"Which is larger, (\d+) or (\d+)\?", lambda g, first: g[0] if int(g[0]) > int(g[1]) else g[1]),
    "digits": (r"Say (\d+) digit by digit\.", lambda g, first: " ".join(DIGITS[int(d)] for d in g[0])),
    "the last too": (r"And the last\?", lambda g, first: re.fullmatch(r'First letter of "([a-z]+)"\?', first)[1][-1]),
    "after that": (
        r"And after that\?",
        lambda g, first: str(int(re.fullmatch(r"What comes after (\d+)\?", first)[1]) + 2),
    ),
}


def kind_and_answer(turns: list[str]) -> tuple[str, str]:
    """The kind of a generated question (its user turns) and its right answer."""
    for kind, (pattern, answer) in QUESTIONS.items():
        if m := re.fullmatch(pattern, turns[-1]):
            return kind, answer(m.groups(), turns[0])
    raise AssertionError(f"not a generated question: {turns}")


def test_the_built_in_instructions_are_right_and_their_splits_disjoint():
    train, test = instructions("train", 3000), instructions("test", 300)
    key = lambda c: tuple(m.content for m in c.messages[:-1])  # noqa: E731
    assert len({key(c) for c in train}) == 3000 and not {key(c) for c in train} & {key(c) for c in test}
    assert all(in_test("\n".join(key(c))) for c in test) and not any(in_test("\n".join(key(c))) for c in train)
    for c in train + test:
        users = [m.content for m in c.messages if m.role == U]
        assert c.messages[-1] == Message(A, kind_and_answer(users)[1])
        if len(users) == 2:  # a follow-up: the first turn is answered rightly too
            assert c.messages[1] == Message(A, kind_and_answer(users[:1])[1])
    assert instructions("test", 50, seed=3) == instructions("test", 50, seed=3)
    assert instructions("test", 50, seed=3) != instructions("test", 50, seed=4)


def test_chained_conversations_ask_independent_instructions_each_answered_right():
    share, n = 0.3, 400
    chained, plain = instructions("train", n, chained=share), instructions("train", n)
    test = {tuple(m.content for m in c.messages[:-1]) for c in instructions("test", 300, seed=1)}
    chains, singles = 0, set()
    for c in chained:
        asked: list[list[str]] = []  # the instructions of the conversation, each its turns but the last answer
        for i in range(0, len(c.messages), 2):
            user, answer = c.messages[i : i + 2]
            assert user.role == U and answer.role == A
            if re.fullmatch(r"And (the last|after that)\?", user.content):
                asked[-1] += [c.messages[i - 1].content, user.content]  # a follow-up: of the instruction before
            else:
                asked.append([user.content])
            assert answer.content == kind_and_answer(asked[-1])[1], c.messages
        assert all(not in_test("\n".join(turns)) for turns in asked)  # held-out questions stay out
        assert not any(tuple(turns) in test for turns in asked)
        if len(asked) == 1:
            singles.add(c)
        else:
            chains += 1
            assert sum((len(turns) + 1) // 2 for turns in asked) <= 5, c.messages  # user turns: it fits a context
    assert len(chained) == n and chains == round(share * n)
    # the single ones are the plain set's first ones, so no share changes what a zero share makes
    assert singles <= set(plain)
    assert instructions("train", n, chained=0.0) == plain


def test_every_kind_has_a_fair_share_of_the_test_questions():
    counts = Counter(
        kind_and_answer([m.content for m in c.messages if m.role == U])[0] for c in instructions("test", 300, seed=1)
    )
    assert set(counts) == set(QUESTIONS) and min(counts.values()) >= 300 / len(QUESTIONS) / 2, counts


def test_preferences_choose_the_right_answer_over_a_near_miss():
    for p in preferences("test", 300) + preferences("train", 300, seed=2):
        users = [m.content for m in p.prompt if m.role == U]
        right = kind_and_answer(users)[1]
        assert p.chosen[0].content == right != p.rejected[0].content and p.rejected[0].content
