"""Chat templates: how a conversation becomes the text a model reads, and which characters of that text
are the assistant's (the spans supervised fine-tuning trains on).

A converted checkpoint brings its own template (tokenizer_config.json's "chat_template", the Jinja
language HuggingFace uses); attnlab's own models use BUILTIN. A template is a file from somebody else:
it is rendered in Jinja2's immutable sandbox (no attribute of Python's internals, no changing what it
is given), and a template that fails is one line.

The assistant's spans are found by rendering prefixes, which works for any template: the turns before
assistant turn i with the generation prompt give the text up to where the answer starts; the turns up
to and with turn i give the text up to where it ends (its end-of-turn marker included, so the model
learns to stop).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from attnlab.data.conversations import Message
from attnlab.errors import AttnlabError

# ChatML's layout (as Qwen and others use it), for attnlab's own models: plain text a character model
# can learn, one marker per turn.
BUILTIN = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """A compiled template and the special texts it may name (bos_token, eos_token)."""

    def __init__(self, source: str = BUILTIN, bos_token: str = "", eos_token: str = "") -> None:
        if not isinstance(source, str) or not source.strip():
            raise AttnlabError("a chat template must be a non-empty text")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise AttnlabError(f"the chat template does not compile ({e})") from None
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        """The text of the conversation (and, with add_generation_prompt, the start of the next answer)."""
        rows = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self.template.render(messages=rows, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)  # fmt: skip
        except TemplateError as e:  # the sandbox's SecurityError is one too
            raise AttnlabError(f"the chat template failed on this conversation ({e})") from None

    def to_dict(self) -> dict[str, str]:
        """What a run stores of its template (chat_template.json), read back by from_dict."""
        return {"template": self.source, "bos_token": self.bos_token, "eos_token": self.eos_token}

    @classmethod
    def from_dict(cls, d: Any, where: str = "chat template") -> ChatTemplate:
        if not isinstance(d, dict) or not isinstance(d.get("template"), str):
            raise AttnlabError(f'{where} is corrupt: it needs a "template" text')
        return cls(d["template"], str(d.get("bos_token", "")), str(d.get("eos_token", "")))

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
        text, spans = self.render(messages), []
        for i, m in enumerate(messages):
            if m.role != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[: i + 1])
            if not (text.startswith(upto) and upto.startswith(before)):
                raise AttnlabError(f"the chat template renders turn {i + 1} differently once later turns follow: "
                                   "the assistant's part of the text cannot be found")  # fmt: skip
            spans.append((len(before), len(upto)))
        return text, spans


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
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise AttnlabError(f"{path} is not valid JSON ({e})") from None
    source = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is None:
        return None
    return ChatTemplate(source, _special(config.get("bos_token")), _special(config.get("eos_token")))
