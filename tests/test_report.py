"""`attnlab report OUT`: the chain's report card reads back each stage's numbers, answers the held-out
instructions by kind, and writes markdown with its picture and a self-contained HTML page."""

import json
import shutil

import pytest

from attnlab.data.conversations import Conversation, Message
from attnlab.data.finetune import TEST_SEED
from attnlab.data.instructions import PHRASINGS, instructions
from attnlab.runs.report import kind_of
from tests.conftest import run_cli, tiny_chat_base

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_held_out_instruction_has_its_kind():
    for p in PHRASINGS:
        pairs = zip(p.asks, p.answers, strict=True)
        turns = [m for q, a in pairs for m in (Message("user", q), Message("assistant", a))]
        assert kind_of(Conversation(tuple(turns))) == p.kind
    kinds = [kind_of(c) for c in instructions("test", 200, TEST_SEED)]
    assert "other" not in kinds and set(kinds) == {p.kind for p in PHRASINGS}
    assert kind_of(Conversation((Message("user", "What is 2 + 2?"), Message("assistant", "4")))) == "other"


def test_the_report_card_of_a_chain(tmp_path, capsys):
    root = tmp_path / "chat"
    (tmp_path / "made").mkdir()
    base = tiny_chat_base(tmp_path / "made")
    shutil.copytree(base, root / "base")
    shutil.copytree(base, root / "sft")
    (root / "sft" / "eval.json").write_text(json.dumps({"split": "test", "exact": 0.425, "examples": 200}))
    numbers = {"exact_before": 0.0, "sampled_vs_best": [0.5, 0.625]}
    record = {"demo": "chat", "base": None, "numbers": numbers, "seconds": {"base": 60.0, "sft": 120.0}}
    (root / "chain.json").write_text(json.dumps(record))
    code, printed, _ = run_cli(["report", root], capsys)
    assert code == 0 and "42.5%" in printed and "report.html" in printed
    md = (root / "report.md").read_text()
    assert "| sft | lm | 42.5% |" in md and "| base |" in md and "3.0 minutes" in md and "62.5%" in md
    assert (root / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](report.png)" in md
    page = (root / "report.html").read_text()
    assert "data:image/png;base64," in page and "http" not in page.replace("https://", "").lower()
    assert "<td>42.5%</td>" in page


def test_a_folder_that_is_no_chain_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(["report", tmp_path], capsys)
    assert code != 0 and err.count("\n") == 1 and "no chain.json" in err
