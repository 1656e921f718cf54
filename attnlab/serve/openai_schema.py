"""The OpenAI API's requests, as attnlab takes them (schemas for /v1/completions and /v1/chat/completions).

Legend: n choices per prompt; k alternatives per token (logprobs); a stop text ends the text before it.

Fields follow the public OpenAI API reference. Supported: model, prompt (a string, a list of
strings, token ids or lists of them) or messages, max_tokens (max_completion_tokens for chat),
temperature (0-2, 0 = greedy), top_p, n, stop (a string or up to 4), seed, stream,
stream_options.include_usage, logprobs (completions: how many alternatives, 0-20; chat: true with
top_logprobs 0-20), echo. Accepted at their neutral values only (any other is a 400 that says
so): presence_penalty and frequency_penalty 0, logit_bias empty, best_of 1, suffix null. `user` is
accepted and ignored. Chat takes tools, tool_choice and parallel_tool_calls (openai_tools.py).

response_format (both endpoints): {"type": "text"}, {"type": "json_object"} (any JSON object) or
{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: each token is drawn under a
mask that keeps the text a valid value (decoding/structured, docs/structured-outputs.md), and the
choice ends, finish_reason "stop", when the value closes. `grammar` (an extension, as vLLM's
guided_grammar; both endpoints): a Lark grammar whose `start` rule the reply must match, within the
subset decoding/structured/lark_subset.py lists (anything outside it a 400 naming it), not together
with a response_format other than text. A schema keyword the mask cannot enforce, or a run whose
tokenizer cannot be constrained, is a 400 whose message names it. Any other field is a 400
("Unrecognized request argument"), as OpenAI answers.

Messages: role system, developer (read as system), user, assistant (with tool_calls) or tool
(openai_tools.py); content a text, a list of text parts ([{"type": "text", "text": ...}], joined)
or null (empty); other fields (name, ...) are ignored. Role "function" and function_call (the
deprecated function calling) are a 400 that says so, as is content of any other kind (one message,
not one per form it could have taken). A field given as a string of digits is read as
its number, as Pydantic reads it; an error message quotes a client's value clipped and escaped.

Extensions, with the names vLLM uses so that scripts written for it work: top_k (sample among the k
most likely tokens; 0 or -1 = off) and ignore_eos (go on past the end-of-text token).

Chat template: the run's own (chat_template.json, which a fine-tuned or converted run keeps; a run
without one gets attnlab's built-in ChatML, data/chat.py), rendered with the generation prompt (a
developer message counts as a system message); the reply is the model's continuation, cut at the
template's end of turn (ChatML's "<|im_end|>", Llama 3's "<|eot_id|>", never part of the reply) as
well as at the request's own stop texts.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from attnlab.data.conversations import Message as Turn
from attnlab.decoding.settings import Draw
from attnlab.decoding.structured import from_grammar, from_response_format
from attnlab.errors import AttnlabError

MAX_COMPLETION_TOKENS = 2048
MAX_N = 16  # choices per prompt
MAX_PROMPTS = 16  # prompts per completion request
MAX_PROMPT_CHARS = 100_000
MAX_STOPS = 4
CHAT_MAX_TOKENS = 256  # a chat reply's default length
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}  # as the template sees it
TOOL_ROLE = "tool"  # a tool's result (openai_tools.py)
FORMATS = ("text", "json_object", "json_schema")  # response_format types
OLD_TOOL_FIELDS = ("function_call",)  # the deprecated function calling (tools took its place): refused

Text = Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
StopText = Annotated[str, Field(max_length=100)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = Field(False, description="send a last chunk with the usage, with empty choices")


class Sampling(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="a served run's name, as /v1/models lists it")
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False, description="0 = greedy")
    top_p: float = Field(
        1.0, gt=0, le=1, allow_inf_nan=False, description="sample among the tokens that make up probability p"
    )
    top_k: int = Field(0, ge=-1, description="(extension) sample among the k most likely tokens; 0 or -1: off")
    n: int = Field(1, ge=1, le=MAX_N, description="choices per prompt")
    stop: StopText | list[StopText] | None = Field(None, description="stop before this text (or any of up to 4)")
    seed: int | None = Field(None, ge=0, lt=2**62, description="choice i draws with seed + i: the same text again")
    stream: bool = Field(False, description="server-sent events, one chunk per piece of text")
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="(extension) go on past the end-of-text token")
    presence_penalty: float = Field(0.0, description="not supported: 0 only")
    frequency_penalty: float = Field(0.0, description="not supported: 0 only")
    logit_bias: dict[str, float] | None = Field(None, description="not supported: empty only")
    user: str | None = Field(None, max_length=256, description="ignored")
    response_format: dict | None = Field(
        None, description="{'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'json_schema': {...}}"
    )
    grammar: str | None = Field(
        None, description="(extension) a Lark grammar the reply must match (docs/structured-outputs.md#grammars)"
    )

    @field_validator("stop", mode="before")
    @classmethod
    def stop_texts(cls, value):
        """One message for a stop of the wrong kind or length (not one per member of the union)."""
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise PydanticCustomError(
                "stop", f"must be a text or a list of up to {MAX_STOPS} texts, got {_kind(value)}"
            )
        if any(len(t) > 100 for t in texts):
            raise PydanticCustomError("stop", "a stop text has at most 100 characters")
        return value

    @model_validator(mode="before")
    @classmethod
    def nulls_are_defaults(cls, data):
        """A field sent as null takes its default, as OpenAI's API does (clients send e.g. "n": null)."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    def check(self) -> None:
        """Refuse the settings attnlab cannot honour, one line each (Pydantic has checked the types)."""
        unsupported = {"presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty}
        for name, value in unsupported.items():
            if value != 0:
                raise BadField(f"{name} is not supported (only 0)", name)
        if self.logit_bias:
            raise BadField("logit_bias is not supported (only empty)", "logit_bias")
        if len(self.stops()) > MAX_STOPS:
            raise BadField(f"stop takes at most {MAX_STOPS} texts", "stop")
        kind = (self.response_format or {}).get("type", "text")
        if kind not in FORMATS:
            raise BadField(f"response_format type {clip(kind)} is not one of {', '.join(FORMATS)}", "response_format")
        if kind != "text" and self.grammar is not None:
            raise BadField("give a grammar or a response_format other than text, not both", "grammar")

    def constraint(self, tokenizer):
        """The structured output's compiled constraint (decoding/structured), None for plain text; a
        keyword or grammar feature it cannot enforce, or a tokenizer it cannot read, is a 400 naming it."""
        field = "grammar" if self.grammar is not None else "response_format"
        try:
            if self.grammar is not None:
                return from_grammar(self.grammar, tokenizer)
            return from_response_format(self.response_format, tokenizer) if self.response_format else None
        except AttnlabError as e:
            raise BadField(str(e), field) from None

    def stops(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return [s for s in stop if s]

    def draw(self, seed: int) -> Draw:
        """The wire's sampling settings as attnlab's one schema: top_k 0 or -1 and top_p 1 are off."""
        return Draw(
            self.temperature, self.top_k if self.top_k > 0 else None, self.top_p if self.top_p < 1 else None, seed
        )


class CompletionRequest(Sampling):
    prompt: Text | list[Text] | list[int] | list[list[int]] = Field(
        "", description="text to continue, several, or token ids ('' = a new document)"
    )
    max_tokens: int = Field(16, ge=0, le=MAX_COMPLETION_TOKENS, description="tokens to generate at most")
    logprobs: int | None = Field(None, ge=0, le=20, description="log-probabilities of the tokens and this many others")
    echo: bool = Field(False, description="put the prompt before the completion")
    best_of: int = Field(1, description="not supported: 1 only")
    suffix: str | None = Field(None, description="not supported: null only")

    @field_validator("prompt", mode="before")
    @classmethod
    def prompt_shape(cls, value):
        """One message for a prompt of none of its four shapes (not one per member of the union)."""
        ids = lambda v: isinstance(v, list) and all(type(i) is int for i in v)  # noqa: E731
        if isinstance(value, str) or ids(value):
            texts = [value] if isinstance(value, str) else []
        elif isinstance(value, list) and (all(isinstance(p, str) for p in value) or all(ids(p) for p in value)):
            texts = [p for p in value if isinstance(p, str)]
        else:
            raise PydanticCustomError(
                "prompt", f"must be a text, a list of texts, token ids or lists of token ids, got {_kind(value)}"
            )
        if any(len(t) > MAX_PROMPT_CHARS for t in texts):
            raise PydanticCustomError("prompt", f"a prompt has at most {MAX_PROMPT_CHARS:,} characters")
        return value

    def check(self) -> None:
        super().check()
        if self.best_of != 1:
            raise BadField("best_of is not supported (only 1)", "best_of")
        if self.suffix:
            raise BadField("suffix is not supported", "suffix")
        if isinstance(self.prompt, list) and len(self.prompt) > MAX_PROMPTS:
            raise BadField(f"prompt takes at most {MAX_PROMPTS} prompts", "prompt")
        if isinstance(self.prompt, list) and not self.prompt:
            raise BadField("prompt is an empty list", "prompt")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: Text


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, refusal, ...: nothing a base model reads (tool calls: check)
    role: str
    content: Text | list[TextPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def text_parts_only(cls, value):
        """One message for a content of the wrong kind, not Pydantic's one per member of the union."""
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise PydanticCustomError(
                "content_type", f"must be a text, a list of text parts or null, got {_kind(value)}"
            )
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                what = f"type {clip(kind)}" if isinstance(part, dict) else _kind(part)
                raise PydanticCustomError(
                    "content_part", f"part {i}: only parts of type 'text' are supported, got {what}"
                )
            if not isinstance(part.get("text"), str):
                raise PydanticCustomError(
                    "content_part", f"part {i}: its text must be a text, got {_kind(part.get('text'))}"
                )
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=0, le=MAX_COMPLETION_TOKENS, description=f"default {CHAT_MAX_TOKENS}")
    max_completion_tokens: int | None = Field(None, ge=0, le=MAX_COMPLETION_TOKENS, description="max_tokens' new name")
    logprobs: bool = Field(False, description="log-probabilities of the reply's tokens")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="with logprobs: this many alternatives per token")
    tools: list | None = Field(None, description="functions the model may call (openai_tools.py)")
    tool_choice: str | dict | None = Field(None, description="auto, none, required or {'type': 'function', ...}")
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call a reply")

    def check(self) -> None:
        super().check()
        for i, m in enumerate(self.messages):
            if m.role == "function":
                raise BadField(f"messages[{i}].role 'function' is deprecated: use 'tool'", f"messages[{i}].role")
            if m.role not in ROLES and m.role != TOOL_ROLE:
                roles = ", ".join([*ROLES, TOOL_ROLE])
                raise BadField(f"messages[{i}].role {clip(m.role)} is not one of {roles}", f"messages[{i}].role")
            used = [f for f in OLD_TOOL_FIELDS if (m.model_extra or {}).get(f) is not None]
            if used:
                raise BadField(f"messages[{i}].{used[0]} is deprecated: use tool_calls", f"messages[{i}].{used[0]}")

    def limit(self) -> int:
        given = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return CHAT_MAX_TOKENS if given is None else given


def conversation(messages: list[Message]) -> list[Turn]:
    """The request's messages as a chat template reads them (roles system, user, assistant)."""
    return [Turn(ROLES[m.role], m.text()) for m in messages]


def clip(value: object, most: int = 40) -> str:
    """A client's value for a message: its repr (quotes, escapes: one line), cut to `most` characters."""
    text = repr(value)
    return text if len(text) <= most else f"{text[:most]}..."


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


class BadField(AttnlabError):
    """A request field attnlab cannot honour: a 400 naming it."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
