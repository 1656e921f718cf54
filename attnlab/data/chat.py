"""Chat templates: how a conversation becomes the text a model reads, and which characters of that text
are the assistant's (the spans supervised fine-tuning trains on).

A converted checkpoint brings its own template (tokenizer_config.json's "chat_template", the Jinja
language HuggingFace uses); attnlab's own models use BUILTIN. A template is a file from somebody else:
it is rendered in Jinja2's immutable sandbox (no attribute of Python's internals, no changing what it
is given) within limits of time, size and call depth (data/template_limits.py), and a template that
fails, or passes a limit, is one line naming where it came from. One read from a file is tried on a
three-turn conversation when it is read, so that one which cannot render is refused then.

The assistant's spans are found by rendering prefixes, which works for any template: the turns before
assistant turn i with the generation prompt give the text up to where the answer starts; the turns up
to and with turn i give the text up to where it ends (its end-of-turn marker included, so the model
learns to stop). That is quadratic in the turns, so all of one conversation's renders share one deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError

from attnlab.data.conversations import Message
from attnlab.data.template_limits import OPTIONS, PER_TURN, LimitHit, template_limits
from attnlab.data.template_sandbox import compile_template, render_bounded
from attnlab.errors import AttnlabError
from attnlab.io import read_json

# ChatML's layout (as Qwen and others use it), for attnlab's own models: plain text a character model
# can learn, one marker per turn.
BUILTIN = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# What a template read from a file is tried on: alternating turns, as the strictest templates want.
PROBE = (Message("user", "Hello."), Message("assistant", "Hi."), Message("user", "Thanks."))


class Refusal(TemplateError):
    """The template's own raise_exception(): a rule about conversations, not a broken template."""


def _raise(message: Any) -> None:
    raise Refusal(str(message))


def _brief(e: BaseException) -> str:
    """An error as a few words on one line (a template's own message may be long or span lines)."""
    if isinstance(e, TemplateSyntaxError):
        text = f"{e.message} (line {e.lineno})"
    else:
        text = str(e) if isinstance(e, TemplateError) else f"{type(e).__name__}: {e}"
    text = " ".join(text.split()) or type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _help(limit: str) -> str:
    return f"limit: attnlab {OPTIONS[limit]}; raise it only for a folder you trust"


class ChatTemplate:
    """A compiled template and the special texts it may name (bos_token, eos_token). `where`: the file
    it was read from, named by its errors; a template read from a file is tried once when it is read."""

    def __init__(
        self, source: str = BUILTIN, bos_token: str = "", eos_token: str = "", where: str | None = None
    ) -> None:
        self.name = f"the chat template in {where}" if where else "the chat template"
        if not isinstance(source, str) or not source.strip():
            raise AttnlabError(f"{self.name} must be a non-empty text")
        self.source, self.bos_token, self.eos_token, self.where = source, bos_token, eos_token, where
        try:
            self.template = compile_template(source, template_limits(), {"raise_exception": _raise})
        except LimitHit as e:
            raise AttnlabError(f"{self.name} {e} ({_help(e.limit)})") from None
        except Exception as e:  # a syntax error, or Python's compiler refusing code nested too deep
            raise AttnlabError(f"{self.name} does not compile ({_brief(e)})") from None
        if where is not None:
            self._probe()

    def _probe(self) -> None:
        try:
            self._render(PROBE, True)
        except Refusal:  # its own rule (e.g. a system turn first): a conversation it refuses, not a fault
            pass
        except Exception as e:
            raise self._failure(e, "a three-turn test conversation, tried as it is read") from None

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool, deadline: float | None = None) -> str:
        if self.source == BUILTIN:
            return _chatml(messages, add_generation_prompt)
        rows = [{"role": m.role, "content": m.content} for m in messages]
        chars = sum(len(m.role) + len(m.content) + PER_TURN for m in messages) + len(self.bos_token + self.eos_token)
        variables = {
            "messages": rows,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        return render_bounded(self.template, variables, chars, template_limits(), deadline)

    def _failure(self, e: Exception, on: str = "this conversation") -> AttnlabError:
        """Any way a render fails, as one line: the limit passed, else what the template did."""
        if isinstance(e, LimitHit):
            return AttnlabError(f"{self.name} {e}, on {on} ({_help(e.limit)})")
        if isinstance(e, RecursionError):  # a value nested thousands deep (its text, its JSON, a comparison)
            return AttnlabError(f"{self.name} nests a value or calls deeper than Python can follow, on {on}")
        return AttnlabError(f"{self.name} failed on {on} ({_brief(e)})")

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        """The text of the conversation (and, with add_generation_prompt, the start of the next answer)."""
        try:
            return self._render(messages, add_generation_prompt)
        except Exception as e:
            raise self._failure(e) from None

    def render_rows(self, rows: Sequence[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        """render() for messages as dicts with fields past role and content (tool_calls, tool_call_id)
        and the `tools` a request offers, as HuggingFace's apply_chat_template hands them over."""
        variables = {"messages": list(rows), "add_generation_prompt": add_generation_prompt, "tools": tools}
        variables |= {"bos_token": self.bos_token, "eos_token": self.eos_token}
        chars = len(json.dumps([rows, tools], ensure_ascii=False)) + PER_TURN * len(rows)
        try:
            return render_bounded(
                self.template, variables, chars + len(self.bos_token + self.eos_token), template_limits()
            )
        except Exception as e:
            raise self._failure(e) from None

    def to_dict(self) -> dict[str, str]:
        """What a run stores of its template (chat_template.json), read back by from_dict."""
        return {"template": self.source, "bos_token": self.bos_token, "eos_token": self.eos_token}

    @classmethod
    def from_dict(cls, d: Any, where: str | None = None) -> ChatTemplate:
        if not isinstance(d, dict) or not isinstance(d.get("template"), str):
            raise AttnlabError(f'{where or "chat template"} is corrupt: it needs a "template" text')
        bos, eos = str(d.get("bos_token", "")), str(d.get("eos_token", ""))
        return cls(d["template"], bos, eos, where or "a run's chat_template.json")

    def prompt(self, messages: Sequence[Message]) -> str:
        """The text a model continues to answer the conversation: the turns and the answer's start."""
        return self.render(messages, add_generation_prompt=True)

    def end_of_turn(self) -> str:
        """What the template writes after an answer's text (ChatML's "<|im_end|>", Llama 3's
        "<|eot_id|>"), found by rendering a sentinel answer: generation stops where it appears."""
        probe = "\x00answer\x00"
        text = self.render([Message("user", "hi"), Message("assistant", probe)])
        after = text[text.index(probe) + len(probe) :] if probe in text else ""
        return after.strip() or self.eos_token

    def assistant_spans(self, messages: Sequence[Message]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the [start, end) character spans of its assistant turns."""
        if self.source == BUILTIN:
            return _chatml_spans(messages)
        deadline = time.monotonic() + template_limits().seconds  # one for all its renders: they cost turns^2
        text, spans = self._spanning(messages, False, deadline, len(messages)), []
        for i, m in enumerate(messages):
            if m.role != "assistant":
                continue
            before = self._spanning(messages[:i], True, deadline, len(messages))
            last = i + 1 == len(messages)  # the whole conversation, rendered already
            upto = text if last else self._spanning(messages[: i + 1], False, deadline, len(messages))
            if not (text.startswith(upto) and upto.startswith(before)):
                raise AttnlabError(
                    f"{self.name} renders turn {i + 1} differently once later turns follow: "
                    "the assistant's part of the text cannot be found"
                )
            spans.append((len(before), len(upto)))
        return text, spans

    def _spanning(self, turns: Sequence[Message], add_generation_prompt: bool, deadline: float, n: int) -> str:
        """One render of assistant_spans, by the conversation's deadline."""
        try:
            return self._render(turns, add_generation_prompt, deadline)
        except LimitHit as e:
            if e.limit != "seconds":
                raise self._failure(e) from None
            raise AttnlabError(
                f"{self.name} took more than {template_limits().seconds:g} s to find the assistant "
                f"turns of a {n:,}-turn conversation, which renders every prefix of it "
                f"({_help('seconds')}, or split the conversation)"
            ) from None
        except Exception as e:
            raise self._failure(e) from None


# attnlab's own template (BUILTIN) is rendered by Python: the same text as Jinja renders it (tested on
# long, odd conversations), without the sandbox's cost (three renders a conversation: a million rows
# took minutes; docs/log.md, "Data"), and its spans found in one pass instead of every prefix.
def _turn(m: Message) -> str:
    return f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n"


def _chatml(messages: Sequence[Message], add_generation_prompt: bool) -> str:
    return "".join(map(_turn, messages)) + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _chatml_spans(messages: Sequence[Message]) -> tuple[str, list[tuple[int, int]]]:
    """BUILTIN's text and assistant spans: an answer starts after its turn's header and ends after its
    end-of-turn marker, as the prefix renders of assistant_spans find them."""
    pieces, spans, at = [], [], 0
    for m in messages:
        piece = _turn(m)
        if m.role == "assistant":
            spans.append((at + len("<|im_start|>assistant\n"), at + len(piece)))
        pieces.append(piece)
        at += len(piece)
    return "".join(pieces), spans


def _special(value: Any) -> str:
    """tokenizer_config.json writes a special token as a text or as {"content": text, ...}."""
    if isinstance(value, dict):
        value = value.get("content", "")
    return value if isinstance(value, str) else ""


def hf_template(folder: str | Path) -> ChatTemplate | None:
    """The chat template of a HuggingFace folder (tokenizer_config.json), if it has one; with several
    named templates, the one named "default"."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return None
    config = read_json(path, limit=64 * 2**20)  # a template with its tokens: kilobytes to a few megabytes
    source = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is None:
        return None
    return ChatTemplate(source, _special(config.get("bos_token")), _special(config.get("eos_token")), str(path))
