"""Instruction and preference data: the formats people have, told apart by their fields, and the
built-in generated instructions (disjoint splits, answers that are right, near misses that are not)."""

from __future__ import annotations

import json
import re

import pytest

from attnlab.data.conversations import Message, RowError, kind_of, read_conversations, read_preferences
from attnlab.data.instructions import in_test, instructions, preferences
from attnlab.data.numbers import english

U, A, S = "user", "assistant", "system"

ROWS = [  # (row, the messages it reads as)
    ({"text": "def f(): pass"}, [(A, "def f(): pass")]),
    ({"prompt": "2+2?", "completion": "4"}, [(U, "2+2?"), (A, "4")]),
    ({"instruction": "Add.", "input": "2 and 2", "output": "4"}, [(U, "Add.\n\n2 and 2"), (A, "4")]),
    ({"instruction": "Say hi.", "output": "hi"}, [(U, "Say hi."), (A, "hi")]),
    ({"instruction": "Say hi.", "input": "", "output": "hi"}, [(U, "Say hi."), (A, "hi")]),
    ({"messages": [{"role": S, "content": "Be brief."}, {"role": U, "content": "1+1?"}, {"role": A, "content": "2"},
                   {"role": U, "content": "And 2+2?"}, {"role": A, "content": "4"}]},
     [(S, "Be brief."), (U, "1+1?"), (A, "2"), (U, "And 2+2?"), (A, "4")]),
]  # fmt: skip


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
    rows = [{"prompt": "2+2?", "chosen": "4", "rejected": "5"},
            {"prompt": [{"role": S, "content": "Be brief."}, {"role": U, "content": "2+2?"}],
             "chosen": [{"role": A, "content": "4"}], "rejected": [{"role": A, "content": "22"}]}]  # fmt: skip
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


def right_answer(turns: list[str]) -> str:
    """The answer to the generated questions, worked out independently of the generator."""
    q = turns[-1]
    if m := re.fullmatch(r"And times (\d+)\?", q):
        a, b = map(int, re.fullmatch(r"What is (\d+) \+ (\d+)\?", turns[0]).groups())
        return str((a + b) * int(m.group(1)))
    if m := re.fullmatch(r"What is (\d+) \+ (\d+)\?", q):
        return str(int(m.group(1)) + int(m.group(2)))
    if m := re.fullmatch(r"Write (\d+) in words\.", q):
        return english(int(m.group(1)))
    if m := re.fullmatch(r'Spell "(\w+)" backwards\.', q):
        return "".join(reversed(m.group(1)))
    if m := re.fullmatch(r'How many letters are in "(\w+)"\?', q):
        return str(len(m.group(1)))
    a, b = map(int, re.fullmatch(r"Which is larger, (\d+) or (\d+)\?", q).groups())
    return str(max(a, b))


def test_the_built_in_instructions_are_right_and_their_splits_disjoint():
    train, test = instructions("train", 3000), instructions("test", 300)
    key = lambda c: tuple(m.content for m in c.messages[:-1])  # noqa: E731
    assert len({key(c) for c in train}) == 3000 and not {key(c) for c in train} & {key(c) for c in test}
    assert all(in_test("\n".join(key(c))) for c in test) and not any(in_test("\n".join(key(c))) for c in train)
    for c in train + test:
        users = [m.content for m in c.messages if m.role == U]
        assert c.messages[-1] == Message(A, right_answer(users))
    assert instructions("test", 50, seed=3) == instructions("test", 50, seed=3)
    assert any(len(c.messages) == 4 for c in test)  # follow-ups are there


def test_preferences_choose_the_right_answer_over_a_near_miss():
    for p in preferences("test", 200):
        users = [m.content for m in p.prompt if m.role == U]
        assert p.chosen[0].content == right_answer(users) != p.rejected[0].content
