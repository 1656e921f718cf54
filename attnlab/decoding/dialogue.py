"""A conversation with a language model, turn by turn: what `attnlab chat RUN` runs in the terminal.

Legend: a turn = a user message and the answer to it; the history = the turns so far (the system
text, when there is one, stands before them and is never dropped).

Each answer streams as the model writes it (decoding/chat.py's stream_answer: the run's template,
cut at its end of turn) and joins the history, so the next prompt renders every earlier turn with
the template. A prompt must leave the answer room in the context, min(max_new_tokens, half the
context) tokens: when it does not, the oldest turns go first, and the user is told once.

    dialogue = Dialogue(run.model, run.tokenizer, run_template(run.path), system="Be terse.", seed=1)
    talk(dialogue)                        # you> ... until /quit, end of input or Ctrl-C
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Message
from attnlab.data.tokenizers import Tokenizer
from attnlab.decoding.chat import stream_answer
from attnlab.decoding.draw import check_sampling
from attnlab.decoding.sampling import seed_of
from attnlab.errors import AttnlabError
from attnlab.models.protocols import CausalLM

PROMPT = "you> "
COMMANDS = {"/reset": "forget the conversation (the system text stays)", "/quit": "leave (so do Ctrl-D and Ctrl-C)"}


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


class Dialogue:
    """The history of one conversation and how its answers are drawn (sampling: temperature, top_k,
    top_p, max_new_tokens, use_cache, dtype, as stream_text takes them); answer k of a seeded
    dialogue draws with seed + k, so the same inputs give the same conversation."""

    def __init__(self, model: CausalLM, tok: Tokenizer, template: ChatTemplate, system: str | None = None,
                 seed: int | None = None, **sampling: Any) -> None:  # fmt: skip
        sampling.setdefault("max_new_tokens", 256)
        check_sampling(sampling["max_new_tokens"], sampling.get("temperature", 0.8), sampling.get("top_k"),
                       sampling.get("top_p"), seed)  # fmt: skip
        self.model, self.tok, self.template, self.sampling = model, tok, template, sampling
        self.system = [Message("system", system)] if system else []
        self.seed = seed_of(seed)
        self.answered = 0  # answers drawn so far (a reset does not start again): the next draws with seed + answered
        self.reset()

    def reset(self) -> None:
        """Forget the turns (the system text stays)."""
        self.history: list[Message] = []
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
        limit = context - min(self.sampling["max_new_tokens"], context // 2)
        history = [*self.history, Message("user", text)]
        while self.prompt_tokens([*self.system, *history]) > limit and len(history) > 1:
            history = history[2:] if history[0].role == "user" and len(history) > 2 else history[1:]
        n = self.prompt_tokens([*self.system, *history])
        if n > limit:
            what = "this message and the system text take" if self.system else "this message takes"
            raise AttnlabError(f"{what} {n} tokens as the template renders them; this model reads {context}, "
                               f"{context - limit} of them kept for the answer: say it shorter")  # fmt: skip
        notes = []
        if len(history) < len(self.history) + 1 and not self.told:
            self.told = True
            notes.append(f"the conversation outgrew the model's context ({context} tokens): its oldest turns are "
                         "dropped from now on" + (" (the system text stays)" if self.system else ""))  # fmt: skip
        self.history = history
        return notes

    def answer(self) -> Iterator[str]:
        """The answer to the history, piece by piece as it is drawn (trimmed of whitespace at both ends);
        once whole, it joins the history."""
        seed, self.answered = self.seed + self.answered, self.answered + 1
        text = ""
        for piece in trimmed(stream_answer(self.model, self.tok, self.template, self.messages(), seed=seed,
                                           **self.sampling)):  # fmt: skip
            text += piece
            yield piece
        self.history.append(Message("assistant", text))


def talk(dialogue: Dialogue, read: Callable[[str], str] | None = None, out: TextIO | None = None) -> None:
    """The terminal loop: read a line (read(PROMPT), default input(): EOFError at the end), stream the
    answer to `out` (default stdout), until /quit, the end of input or Ctrl-C; /reset starts over."""
    read, out = read or input, out or sys.stdout
    try:
        while (line := read(PROMPT).strip()) != "/quit":
            if line.startswith("/") and " " not in line:
                print(f"[{command(dialogue, line)}]", file=out, flush=True)
            elif line:
                reply(dialogue, line, out)
    except (EOFError, KeyboardInterrupt):  # Ctrl-D or Ctrl-C: leave on a fresh line
        print(file=out, flush=True)


def command(dialogue: Dialogue, line: str) -> str:
    """Do what a /command says; what to tell the user."""
    if line == "/reset":
        dialogue.reset()
        return "a new conversation"
    return f"{line} is not a command; the commands: " + "; ".join(f"{k}: {v}" for k, v in COMMANDS.items())


def reply(dialogue: Dialogue, line: str, out: TextIO) -> None:
    """Answer a user's line, piece by piece as it is drawn, after any note the dialogue has."""
    try:
        notes = dialogue.ask(line)
    except AttnlabError as e:  # a message too long for the context: refused, and the talk goes on
        print(f"[{e}]", file=out, flush=True)
        return
    for note in notes:
        print(f"[{note}]", file=out, flush=True)
    for piece in dialogue.answer():
        print(piece, end="", file=out, flush=True)
    print(file=out, flush=True)
