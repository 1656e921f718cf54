"""`attnlab chat` as a conversation holds: the answer keeps the room the run's trained answers need (so a
built-in follow-up and three turns fit a context of 256 where the half-context reservation kept one),
Ctrl-C stops an answer and keeps the talk, a message spans lines (paste, \"\"\" block, backslash), the
phrasings the built-in instructions teach are listed from one table, and the real terminal path
(readline, bracketed paste, history, Ctrl-C at the prompt) through a pseudo-terminal."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

import attnlab
from attnlab import load
from attnlab.cli import chat as chat_cli
from attnlab.cli import phrasings
from attnlab.cli.options import ChatOptions
from attnlab.data import DataConfig
from attnlab.data.conversations import Message
from attnlab.data.finetune import TEST_SEED, ChatData
from attnlab.data.instructions import KINDS, PHRASINGS, instructions, preferences
from attnlab.decoding import dialogue as dialogue_module
from attnlab.decoding.dialogue import BLOCK, MORE, PROMPT, STOPPED, Dialogue, answer_tokens, next_message, talk
from attnlab.runs.adapted import run_template
from tests.conftest import run_cli, tiny_chat_base, tiny_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

# A "model" that answers the built-in questions right: the test is about what the context holds.
RIGHT = {"What comes after 9?": "10", "And after that?": "11", 'Reverse "abc".': "cba", "hi": "hello there"}


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """A tiny character-level sft run on the built-in instructions (context 256, built-in ChatML)."""
    root = tmp_path_factory.mktemp("sft")
    with pytest.MonkeyPatch.context() as mp:  # module scope runs before conftest's per-test cache
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        base = tiny_chat_base(root, dropout=0.0)
        attnlab.train(
            root / "sft",
            None,
            tiny_train(max_steps=1, eval_interval=1, warmup_steps=1),
            ChatData(examples=400, test_examples=2),
            init=base,
            task="sft",
            progress=False,
        )
    return load(root / "sft", "cpu")


@pytest.fixture
def perfect(monkeypatch):
    """The prompts the dialogue renders, with RIGHT's answer to each last message streamed back (a
    piece a character)."""
    seen = []

    def answer(model, tok, template, messages, **kw):
        seen.append((template.prompt(messages), kw["max_new_tokens"]))
        yield from RIGHT[messages[-1].content]

    monkeypatch.setattr(dialogue_module, "stream_answer", answer)
    return seen


def lines(*texts: str):
    """A reader like input(): the texts one by one, then EOFError; the prompts it was shown."""
    it, shown = iter(texts), []

    def read(prompt: str) -> str:
        shown.append(prompt)
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    read.shown = shown
    return read


def test_the_answer_s_room_is_the_longest_trained_answer_and_three_turns_fit(sft, perfect):
    template = run_template(sft.path)
    room, said = chat_cli.answer_room(sft, template, ChatOptions(run=str(sft.path)))
    trained = [c.messages[-1].content for c in instructions("train", 400, 0)]
    assert room == answer_tokens(sft.tokenizer, template, trained) <= len("seven seven seven<|im_end|>")
    assert f"{room} tokens kept" in said and "the longest answer in the built-in instructions" in said
    asked = ("What comes after 9?", "And after that?", 'Reverse "abc".')
    held = {}
    for reserve in (room, None):  # measured; the old default, min(max_new_tokens 256, half of 256)
        dialogue, out = Dialogue(sft.model, sft.tokenizer, template, reserve=reserve), io.StringIO()
        perfect.clear()
        talk(dialogue, lines(*asked), out, out)  # notes (stderr) shown in line
        held[reserve] = [prompt.count("<|im_start|>user") for prompt, _ in perfect]
        assert all(len(sft.tokenizer.encode(p)) + n <= 256 for p, n in perfect)  # an answer never passes the context
    assert held[room] == [1, 2, 3]  # the follow-up sees its question, the third message both turns before it
    assert held[None] == [1, 1, 1]  # half the context kept free: only the message itself
    assert out.getvalue().count("outgrew the model's context (256 tokens, 128 of them kept for the answer)") == 1


def test_reserve_flag_and_runs_without_training_data(sft, tmp_path, capsys):
    code, _, err = run_cli(["chat", sft.path, "--reserve", "256", "--device", "cpu"], capsys)
    assert code == 2 and "less than the model's context (256), got 256" in err and len(err.strip().splitlines()) == 1
    template = run_template(sft.path)
    assert chat_cli.answer_room(sft, template, ChatOptions(run="x", reserve=40))[0] == 40
    answers, where = chat_cli.trained_answers(
        {"task": {"kind": "dpo"}, "data": {"data": "preferences", "examples": 50}}
    )
    pairs = preferences("train", 50, 0)  # a DPO run's answers: both of each pair
    assert answers == [a for p in pairs for a in (p.chosen[-1].content, p.rejected[-1].content)]
    assert where == "the built-in preferences"
    sft.config = {**sft.config, "task": {"kind": "lm"}}  # a pretrained run: no answers to measure
    room, said = chat_cli.answer_room(sft, template, ChatOptions(run="x", max_new_tokens=300))
    assert room is None and "128 tokens kept" in said
    sft.config = {**sft.config, "task": {"kind": "sft"}, "data": {"data": str(tmp_path / "gone.jsonl")}}
    room, said = chat_cli.answer_room(sft, template, ChatOptions(run="x"))
    assert room is None and "not readable here" in said and "gone.jsonl" in said
    rows = tmp_path / "chats.jsonl"
    rows.write_text(
        '{"prompt": "hi", "completion": "a long answer of forty characters......"}\n'
        '{"chosen": "x", "rejected": "twelve chars"}\n{"neither": 1}\n'
    )
    sft.config["data"] = {"data": str(rows)}
    room, said = chat_cli.answer_room(sft, template, ChatOptions(run="x"))
    assert room == len("a long answer of forty characters......<|im_end|>") and "chats.jsonl" in said


def test_ctrl_c_during_an_answer_stops_it_and_the_talk_goes_on(sft, monkeypatch):
    template, out = run_template(sft.path), io.StringIO()
    seen = []

    def answer(model, tok, template, messages, **kw):
        seen.append(list(messages))
        for i, piece in enumerate(RIGHT[messages[-1].content]):
            if messages[-1].content == "hi" and i == 2:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C while the third piece is drawn
            yield piece

    monkeypatch.setattr(dialogue_module, "stream_answer", answer)
    handler = signal.getsignal(signal.SIGINT)
    dialogue = Dialogue(sft.model, sft.tokenizer, template, reserve=30)
    talk(dialogue, lines("What comes after 9?", "hi", "And after that?"), out, out)  # notes shown in line
    assert out.getvalue() == f"10\nhel\n[{STOPPED}]\n11\n\n"  # the piece drawn when it came is shown
    assert seen[2] == [
        Message("user", "What comes after 9?"),
        Message("assistant", "10"),
        Message("user", "And after that?"),
    ]  # the stopped turn is not in the history
    assert signal.getsignal(signal.SIGINT) is handler  # Ctrl-C is the user's again at the prompt

    def twice(model, tok, template, messages, **kw):
        yield "a"
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C before the answer could stop (a long step): leave
        yield "b"

    monkeypatch.setattr(dialogue_module, "stream_answer", twice)
    read, out = lines("hi", "never read"), io.StringIO()
    talk(Dialogue(sft.model, sft.tokenizer, template, reserve=30), read, out, out)
    assert out.getvalue() == "a\n" and read.shown == [PROMPT]


def test_a_message_of_several_lines_is_one_turn(sft, perfect):
    assert next_message(lines("one line")) == "one line"
    assert next_message(lines("\x1b[200~first", "second\x1b[201~")) == "first\nsecond"  # paste, read by lines
    assert next_message(lines('"""first', "second", 'third"""')) == "first\nsecond\nthird"
    assert next_message(lines('"""inline"""')) == "inline"
    read = lines("first \\", "second")
    assert next_message(read) == "first \nsecond" and read.shown == [PROMPT, MORE]
    RIGHT["hi\nthere"] = "ok"
    out = io.StringIO()
    dialogue = Dialogue(sft.model, sft.tokenizer, run_template(sft.path), reserve=30)
    talk(dialogue, lines("hi\nthere", '"""hi', 'there"""'), out)  # as readline hands over a paste; a block
    assert out.getvalue() == "ok\nok\n\n"
    assert [m.content for m in dialogue.history] == ["hi\nthere", "ok", "hi\nthere", "ok"]


# GNU readline's history as the chat uses it: entries numbered from 1, input() adding each line it reads
# while auto-history is on. Its __doc__ names GNU readline, as the real module's does.
class FakeReadline:
    __doc__ = "GNU readline (a stand-in)"

    def __init__(self):
        self.entries, self.auto = [], True

    def parse_and_bind(self, text):
        pass

    def set_auto_history(self, on):
        self.auto = on

    def add_history(self, entry):
        self.entries.append(entry)

    def get_current_history_length(self):
        return len(self.entries)

    def get_history_item(self, i):
        return self.entries[i - 1] if 1 <= i <= len(self.entries) else None

    def input(self, *texts: str):
        """A reader like input() over readline: each line it hands over is an entry while auto-history is on."""
        read = lines(*texts)

        def reader(prompt):
            line = read(prompt)
            if self.auto:
                self.add_history(line)
            return line

        return reader


def test_a_message_of_several_lines_is_one_history_entry_recalled_whole(sft, perfect, tmp_path, monkeypatch):
    """A \"\"\" block, backslash lines and a paste are one history entry each, newlines kept (one entry a line
    before: Up brought back the block's last line alone); the file keeps them so across chats, and reads
    a file readline wrote; a recalled entry sent again (input() hands it over whole) is the same message."""
    fake, history = FakeReadline(), tmp_path / "history"
    history.write_text('an older line\n"quoted" as typed\n')  # readline's own file, as attnlab wrote it before
    monkeypatch.setitem(sys.modules, "readline", fake)
    monkeypatch.setenv("ATTNLAB_HISTORY", str(history))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    RIGHT.update({"hi\nthere": "ok", "one \nmore": "ok", "a \\": "ok"})
    dialogue = Dialogue(sft.model, sft.tokenizer, run_template(sft.path), reserve=30)
    typed = ('"""hi', 'there"""', "one \\", "more", "hi\nthere", '"""a \\"""', "/reset")
    with chat_cli.terminal() as remember:
        assert not fake.auto  # input() adds nothing itself: talk() adds each message
        talk(dialogue, fake.input(*typed), io.StringIO(), remember=remember)
    assert fake.auto
    entries = ["an older line", '"quoted" as typed', "hi\nthere", "one \nmore", "hi\nthere", '"""a \\"""', "/reset"]
    assert fake.entries == entries
    written = ["an older line", '"\\"quoted\\" as typed"', '"hi\\nthere"', '"one \\nmore"', '"hi\\nthere"']
    assert history.read_text().splitlines() == [*written, json.dumps('"""a \\"""'), "/reset"]  # an entry a line
    again = FakeReadline()
    chat_cli.read_history(again, history)
    assert again.entries == entries  # the next chat's Up brings back each message whole
    sent = [next_message(lines(entry)) for entry in entries[2:6]]  # recalled and sent: input() hands each over whole
    assert sent == ["hi\nthere", "one \nmore", "hi\nthere", "a \\"]
    for text in ["hi", "hi\nthere", "ends in \\", '"""opens a block', 'a """ inside']:
        assert next_message(lines(chat_cli.history_entry(text))) == text


def test_phrasings_are_test_conversations_the_generator_makes(capsys):
    held_out = {tuple(m.content for m in c.messages) for c in instructions("test", 200, TEST_SEED)}
    for p in PHRASINGS:
        turns = tuple(x for pair in zip(p.asks, p.answers, strict=True) for x in pair)
        assert turns in held_out, p
    assert len(PHRASINGS) == len(KINDS)  # one a kind
    code, out, _ = run_cli(["chat", "--help"], capsys)
    assert code == 0
    for p in PHRASINGS:
        assert all(q in out and f"-> {a}" in out for q, a in zip(p.asks, p.answers, strict=True))
    assert phrasings.BLOCK == BLOCK and BLOCK in out and "--reserve" in out  # the help says what talk() reads


# ---- the real terminal: attnlab chat under a pseudo-terminal -------------------------------------------------


def read_until(fd: int, seen: bytearray, done, what: str, seconds: float = 60) -> str:
    """Read the terminal's output into `seen` until done(text so far); what it showed."""
    end = time.monotonic() + seconds
    while not done(seen.decode(errors="replace")):
        if time.monotonic() > end or not select.select([fd], [], [], max(0, end - time.monotonic()))[0]:
            raise AssertionError(f"no {what} in {seen.decode(errors='replace')!r}")
        try:
            seen += os.read(fd, 4096)
        except OSError:  # the other end closed
            raise AssertionError(f"the chat ended before {what}: {seen.decode(errors='replace')!r}") from None
    return seen.decode(errors="replace")


def screen_until(fd: int, text: str, seen: bytearray, count: int = 1) -> str:
    """Read the terminal's output until `text` appeared `count` times."""
    return read_until(fd, seen, lambda shown: shown.count(text) >= count, f"{text!r} x{count}")


# A session of its own whose controlling terminal is the pty: Ctrl-C typed there is a SIGINT.
OWN_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal and GNU readline")


@contextlib.contextmanager
def chat_in_a_terminal(run, tmp_path, *flags: str):
    """`attnlab chat RUN FLAGS` on a pseudo-terminal: (the terminal's fd, the process); history in
    tmp_path/history."""
    import pty

    env = {
        **os.environ,
        "ATTNLAB_HISTORY": str(tmp_path / "history"),
        "HOME": str(tmp_path),
        "TERM": "xterm",
        "ATTNLAB_THREADS": "1",
    }
    main, child = pty.openpty()
    args = [sys.executable, "-c", OWN_TERMINAL, "-m", "attnlab.cli.main", "chat", str(run), "--device", "cpu", *flags]
    # SIGINT as a shell gives it: a test runner's worker may ignore it, and a process started with SIGINT
    # ignored keeps ignoring it (Python installs its handler only over the default), so Ctrl-C at the
    # prompt would never arrive (seen in the whole suite under pytest-xdist, never alone).
    proc = subprocess.Popen(
        args,
        stdin=child,
        stdout=child,
        stderr=child,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(child)
    try:
        yield main, proc
    finally:
        proc.kill()
        proc.wait()
        os.close(main)


def ctrl_c_leaves(fd: int, proc: subprocess.Popen) -> bool:
    """Ctrl-C at the prompt, and the chat ended with status 0. Typed again after 5 s if it is still
    there: a SIGINT that lands after readline drew its prompt but before it waits for a key is only
    seen at the next event (CPython's readline loop), which a loaded machine makes likely."""
    for _ in range(12):
        os.write(fd, b"\x03")
        try:
            return proc.wait(timeout=5) == 0
        except subprocess.TimeoutExpired:
            continue
    return False


@linux
def test_the_terminal_takes_a_paste_whole_keeps_history_and_ctrl_c_at_the_prompt_leaves(sft, tmp_path):
    seen = bytearray()
    with chat_in_a_terminal(sft.path, tmp_path, "--temperature", "0", "--max-new-tokens", "3") as (main, proc):
        screen_until(main, PROMPT, seen)
        os.write(main, b'\x1b[200~First letter of\n"abc"?\x1b[201~')  # a paste of two lines, as a terminal sends it
        screen_until(main, '"abc"?', seen)
        os.write(main, b"\r")
        shown = screen_until(main, PROMPT, seen, count=2)
        assert ctrl_c_leaves(main, proc)
    after = shown[shown.index(PROMPT) :]
    assert after.count(PROMPT) == 2  # one message, one answer, then the prompt again (two lines: two prompts)
    assert "Traceback" not in shown and "chatting with sft" in shown and "tokens kept for each answer" in shown
    history = tmp_path / "history"
    assert "First letter of" in history.read_text() and oct(history.stat().st_mode & 0o777) == "0o600"


@linux
def test_the_terminal_s_ctrl_c_during_an_answer_stops_it_and_the_chat_goes_on(tmp_path):
    """A long answer (a model that never saw ChatML's markers does not end its turn) stopped by
    Ctrl-C typed in the terminal: the note, the prompt again, and Ctrl-D leaves."""
    # Trained until it no longer draws the end-of-text id (never in the corpus) nor ChatML's end of turn:
    # an untrained model draws the end-of-text id once in about as many tokens as the vocabulary has.
    (tmp_path / "corpus.txt").write_text("abcdefghij <|im_start|>user\n" * 200)
    attnlab.train(
        tmp_path / "long",
        tiny_model(n_layer=1, d_model=16, context=2048),
        tiny_train(max_steps=40, lr=1e-2),
        DataConfig(data=str(tmp_path / "corpus.txt"), tokenizer="char"),
        progress=False,
    )
    seen = bytearray()
    flags = ("--temperature", "1", "--seed", "1", "--max-new-tokens", "2000")
    with chat_in_a_terminal(tmp_path / "long", tmp_path, *flags) as (main, proc):
        screen_until(main, PROMPT, seen)
        os.write(main, b"abc\r")
        start = len(screen_until(main, "abc\r\n", seen))
        read_until(main, seen, lambda shown: len(shown) > start + 10, "an answer being written")
        os.write(main, b"\x03")
        shown = screen_until(main, PROMPT, seen, count=2)
        os.write(main, b"\x04")  # Ctrl-D at the prompt: leave
        assert proc.wait(timeout=60) == 0
    assert f"[{STOPPED}]" in shown and shown.index(f"[{STOPPED}]") < shown.rindex(PROMPT)
    assert "Traceback" not in shown


@linux
def test_the_terminal_s_up_arrow_brings_back_a_block_whole_and_sends_it_as_one_message(sft, tmp_path):
    """A \"\"\" block typed on two lines, then Up: GNU readline shows the whole message (its lines one under
    the other), not its last line; Enter sends it as one message (no continuation prompt), and the
    history file holds it as one entry."""
    seen = bytearray()
    with chat_in_a_terminal(sft.path, tmp_path, "--temperature", "0", "--max-new-tokens", "3") as (main, proc):
        screen_until(main, PROMPT, seen)
        os.write(main, b'"""first part\r')
        screen_until(main, MORE, seen)
        os.write(main, b'second part"""\r')
        start = len(screen_until(main, PROMPT, seen, count=2))
        os.write(main, b"\x1b[A")  # Up
        recalled = read_until(main, seen, lambda s: "second part" in s[start:], "the message recalled", 15)[start:]
        assert "first part" in recalled and '"""' not in recalled, recalled
        os.write(main, b"\r")
        after = screen_until(main, PROMPT, seen, count=3)[start:]
        assert ctrl_c_leaves(main, proc)
    assert MORE not in after  # sent whole: next_message asked for no more lines
    assert (tmp_path / "history").read_text().splitlines() == ['"first part\\nsecond part"'] * 2
