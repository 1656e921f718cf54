"""A conversation with a language model, turn by turn: what `attnlab chat RUN` runs in the terminal.

Legend: a turn = a user message and the answer to it; the history = the turns so far (the system
text, when there is one, stands before them and is never dropped); the room = the tokens a prompt
leaves the answer in the context.

Each answer streams as the model writes it (decoding/chat.py's stream_answer: the run's template,
cut at its end of turn) and joins the history, so the next prompt renders every earlier turn with
the template. A prompt must leave the answer `reserve` tokens of room (what the run's answers need:
cli/chat.py measures it from the run's training data; min(max_new_tokens, half the context) when
nothing says): when it does not, the oldest turns go first, and the user is told once. An answer
may then use all the room there is, up to max_new_tokens, never more: past the context the model
would lose the start of its prompt.

In the terminal, Ctrl-C while an answer is drawn stops that answer (its turn is left out of the
history: a cut answer would show the model answers that stop short, and a template that wants user
and assistant turns in turn refuses a user turn with none); Ctrl-C at the prompt, a second Ctrl-C
or Ctrl-D leaves. A message may span lines: a paste (the terminal brackets it), a block between
\"\"\" lines, or lines that end in a backslash.

    dialogue = Dialogue(run.model, run.tokenizer, run_template(run.path), system="Be terse.", seed=1, reserve=32)
    talk(dialogue)                        # you> ... until /quit, end of input or Ctrl-C at the prompt
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Message
from attnlab.data.tokenizers import Tokenizer
from attnlab.decoding.chat import stream_answer
from attnlab.decoding.sampling import seed_of, settings_of
from attnlab.errors import AttnlabError
from attnlab.models.protocols import CausalLM

PROMPT, MORE = "you> ", "...  "
COMMANDS = {
    "/reset": "forget the conversation (the system text stays)",
    "/quit": "leave (so do Ctrl-D and Ctrl-C at the prompt; Ctrl-C during an answer stops it)",
}
BLOCK = '"""'  # a line that starts with it opens a message of several lines; one that ends with it closes it
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # what a terminal in bracketed paste mode puts around a paste
STOPPED = "stopped: this turn is left out of the conversation"


def trimmed(pieces: Iterable[str]) -> Iterator[str]:
    """The pieces of a text as they come, with its leading and trailing whitespace left out: what they
    join to is the text .strip()ped (a space is held back until text follows it)."""
    started, held = False, ""
    for piece in pieces:
        if not started:
            piece = piece.lstrip()
            started = bool(piece)
        body = (held + piece).rstrip()
        held = (held + piece)[len(body) :]
        if body:
            yield body


def answer_tokens(tok: Tokenizer, template: ChatTemplate, answers: Iterable[str]) -> int:
    """The tokens the longest of `answers` takes as the model writes it: its text and the template's
    end of turn (or the end-of-text token), which the model must write too before the answer stops."""
    end = template.end_of_turn()
    return max((len(tok.encode(a + end)) + (not end) for a in answers), default=0)


class Dialogue:
    """The history of one conversation and how its answers are drawn (sampling: temperature, top_k,
    top_p, max_new_tokens, use_cache, dtype, as stream_text takes them); answer k of a seeded
    dialogue draws with seed + k, so the same inputs give the same conversation. `reserve`: the
    tokens of room a prompt must leave the answer (default min(max_new_tokens, half the context))."""

    def __init__(
        self,
        model: CausalLM,
        tok: Tokenizer,
        template: ChatTemplate,
        system: str | None = None,
        seed: int | None = None,
        reserve: int | None = None,
        **sampling: Any,
    ) -> None:
        sampling.setdefault("max_new_tokens", 256)
        settings_of(None, {**sampling, "seed": seed})  # a generation's settings, each checked (one line)
        context = model.cfg.context
        self.reserve = min(sampling["max_new_tokens"], context // 2) if reserve is None else reserve
        if not 1 <= self.reserve < context:
            raise AttnlabError(
                f"the answer's room must be at least 1 token and less than the model's context "
                f"({context}), got {self.reserve}"
            )
        self.model, self.tok, self.template, self.sampling = model, tok, template, sampling
        self.system = [Message("system", system)] if system else []
        self.seed = seed_of(seed)
        self.answered = 0  # answers drawn so far (a reset does not start again): the next draws with seed + answered
        self.reset()

    def reset(self) -> None:
        """Forget the turns (the system text stays)."""
        self.history: list[Message] = []
        self.before: list[Message] = []  # the history before the last ask(): what withdraw() goes back to
        self.told = False  # whether the user heard that old turns were dropped

    def messages(self) -> list[Message]:
        return [*self.system, *self.history]

    def prompt_tokens(self, messages: list[Message]) -> int:
        return len(self.tok.encode(self.template.prompt(messages)))

    def ask(self, text: str) -> list[str]:
        """Add a user message, dropping the oldest turns while the prompt leaves the answer too little
        room; returns what the user should be told (once: that turns were dropped). A message that
        does not fit even alone is refused (AttnlabError) and the history stays as it was."""
        context = self.model.cfg.context
        limit = context - self.reserve
        history = [*self.history, Message("user", text)]
        while self.prompt_tokens([*self.system, *history]) > limit and len(history) > 1:
            history = history[2:] if history[0].role == "user" and len(history) > 2 else history[1:]
        n = self.prompt_tokens([*self.system, *history])
        if n > limit:
            what = "this message and the system text take" if self.system else "this message takes"
            raise AttnlabError(
                f"{what} {n} tokens as the template renders them; this model reads {context}, "
                f"{self.reserve} of them kept for the answer: say it shorter"
            )
        notes = []
        if len(history) < len(self.history) + 1 and not self.told:
            self.told = True
            notes.append(
                f"the conversation outgrew the model's context ({context} tokens, {self.reserve} of them "
                "kept for the answer): its oldest turns are dropped from now on"
                + (" (the system text stays)" if self.system else "")
            )
        self.before, self.history = self.history, history
        return notes

    def withdraw(self) -> None:
        """Take back the last message and whatever was drawn of its answer: the history is again what it
        was before that ask() (turns it dropped come back)."""
        self.history = self.before

    def answer(self) -> Iterator[str]:
        """The answer to the history, piece by piece as it is drawn (trimmed of whitespace at both ends),
        at most the room the prompt leaves; once whole, it joins the history."""
        seed, self.answered = self.seed + self.answered, self.answered + 1
        room = self.model.cfg.context - self.prompt_tokens(self.messages())
        sampling = {**self.sampling, "max_new_tokens": min(self.sampling["max_new_tokens"], room)}
        text = ""
        for piece in trimmed(
            stream_answer(self.model, self.tok, self.template, self.messages(), seed=seed, **sampling)
        ):
            text += piece
            yield piece
        self.history.append(Message("assistant", text))


def next_message(read: Callable[[str], str]) -> str:
    """One message from the lines read(prompt) gives: a line; a paste the terminal bracketed, all its
    lines (readline hands one over whole; read line by line it is joined here); the lines between a
    line that opens with \"\"\" and one that ends with it; lines ending in a backslash, with the next."""
    line = read(PROMPT)
    if PASTE_START in line:
        while PASTE_END not in line:
            line += "\n" + read("")
        return line.replace(PASTE_START, "").replace(PASTE_END, "")
    if line.lstrip().startswith(BLOCK):
        text = line.lstrip()[len(BLOCK) :]
        while not text.rstrip().endswith(BLOCK):
            text += "\n" + read(MORE)
        return text.rstrip()[: -len(BLOCK)]
    while line.endswith("\\"):
        line = line[:-1] + "\n" + read(MORE)
    return line


class StopOnInterrupt:
    """While an answer is drawn: a first Ctrl-C asks it to stop (`pressed`, read between its pieces, so
    the engine is never cut inside a step), a second one interrupts as Ctrl-C does. Outside the main
    thread, where no handler can be set, Ctrl-C keeps its usual effect."""

    def __enter__(self) -> StopOnInterrupt:
        self.pressed, self.previous = False, None
        try:
            self.previous = signal.signal(signal.SIGINT, self._press)
        except ValueError:  # not the main thread
            pass
        return self

    def _press(self, signum: int, frame: Any) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def talk(
    dialogue: Dialogue,
    read: Callable[[str], str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    remember: Callable[[str], None] | None = None,
) -> None:
    """The terminal loop: read a message (next_message over read(prompt), default input(): EOFError at
    the end), stream the answer to `out` (default stdout), until /quit, the end of input or Ctrl-C at
    the prompt; /reset starts over; Ctrl-C during an answer stops it and the talk goes on. Notes (turns
    dropped, a message refused, an answer stopped) go to `err` (default stderr), one line each.
    `remember(text)` is given each message read, whole, however many lines it took (the terminal's
    input history: one entry a message)."""
    read, out, err = read or input, out or sys.stdout, err or sys.stderr
    try:
        while (text := _remembered(next_message(read).strip(), remember)) != "/quit":
            if text.startswith("/") and not any(c.isspace() for c in text):
                print(f"[{command(dialogue, text)}]", file=out, flush=True)
            elif text:
                reply(dialogue, text, out, err)
    except (EOFError, KeyboardInterrupt):  # Ctrl-D, or Ctrl-C at the prompt or twice: leave on a fresh line
        print(file=out, flush=True)


def _remembered(text: str, remember: Callable[[str], None] | None) -> str:
    if text and remember is not None:
        remember(text)
    return text


def command(dialogue: Dialogue, line: str) -> str:
    """Do what a /command says; what to tell the user."""
    if line == "/reset":
        dialogue.reset()
        return "a new conversation"
    return f"{line} is not a command; the commands: " + "; ".join(f"{k}: {v}" for k, v in COMMANDS.items())


def reply(dialogue: Dialogue, text: str, out: TextIO, err: TextIO) -> None:
    """Answer a user's message, piece by piece as it is drawn, after any note the dialogue has; a first
    Ctrl-C stops the answer and takes its turn back."""
    try:
        notes = dialogue.ask(text)
    except AttnlabError as e:  # a message too long for the context: refused, and the talk goes on
        print(f"[{e}]", file=err, flush=True)
        return
    for note in notes:
        print(f"[{note}]", file=err, flush=True)
    with StopOnInterrupt() as stop:
        pieces = dialogue.answer()
        for piece in pieces:
            print(piece, end="", file=out, flush=True)
            if stop.pressed:
                break
        pieces.close()  # a stopped answer's generator ends here: the engine frees its row
    print(file=out, flush=True)
    if stop.pressed:
        dialogue.withdraw()
        print(f"[{STOPPED}]", file=err, flush=True)
