"""The explorer's request bodies (/api/...), each checked by pydantic before a route runs: a run's name,
a text of at most MAX_INPUT_CHARS characters, a generation's settings within their ranges (how it
draws: the fields and checks of decoding/settings.py's Draw). The OpenAI-compatible routes have their
own (openai_schema.py)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, create_model, model_validator

from attnlab.decoding.settings import Draw, GenerateConfig
from attnlab.interpret.report import WHAT

MAX_INPUT_CHARS = 2_000  # a prompt or a text; runs read at most their context anyway
MAX_NEW_TOKENS = 500

RunName = Annotated[str, Field(description="a run's name, as /api/runs lists it")]


class TextRequest(BaseModel):
    run: RunName
    text: str = Field(max_length=MAX_INPUT_CHARS, description="the input text")


class PredictRequest(TextRequest):
    top_k: int = Field(5, ge=1, le=50, description="masked LM: candidates per [MASK]")
    beam: int = Field(1, ge=1, le=16, description="translation: beam width (1 = greedy)")


def draw_fields() -> dict[str, Any]:
    """Draw's fields as pydantic's (type, Field): the request declares none of them again."""
    hints = typing.get_type_hints(Draw)
    return {f.name: (hints[f.name], Field(f.default, description=f.metadata["help"])) for f in dataclasses.fields(Draw)}


class Generation(BaseModel):
    """/api/generate's body but for how it draws (GenerateRequest adds Draw's fields)."""

    run: RunName
    prompt: str = Field("", max_length=MAX_INPUT_CHARS, description="text to continue ('' = a new document)")
    max_new_tokens: int = Field(200, ge=1, le=MAX_NEW_TOKENS, description="how many tokens to sample")
    stop: str | None = Field(None, max_length=100, description="stop when this text is generated")
    attention: bool = Field(False, description="send with each token the attention that produced it (slower)")

    @model_validator(mode="after")
    def drawable(self):
        """Draw's own checks, one line each (a ValueError here is the client's 422)."""
        try:
            Draw.of(self)
        except TypeError as e:  # pydantic has the types checked: a bool where a number goes, say
            raise ValueError(str(e)) from None
        return self

    def config(self, seed: int, compile: bool) -> GenerateConfig:
        """The generation's settings with its seed (drawn by the route when the request has none)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(Draw)}
        return GenerateConfig(
            **{**fields, "seed": seed},
            prompt=self.prompt,
            max_new_tokens=self.max_new_tokens,
            stop=self.stop,
            compile=compile,
        )


GenerateRequest = create_model("GenerateRequest", __base__=Generation, **draw_fields())


class InspectRequest(TextRequest):
    what: Literal[WHAT] = Field(description="lens, heads, ablate (GPT runs), rollout or flow (any text run)")
