"""The explorer's request bodies (/api/...), each checked by pydantic before a route runs: a run's name,
a text of at most MAX_INPUT_CHARS characters, a generation's settings within their ranges. The
OpenAI-compatible routes have their own (openai_schema.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

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


class GenerateRequest(BaseModel):
    run: RunName
    prompt: str = Field("", max_length=MAX_INPUT_CHARS, description="text to continue ('' = a new document)")
    max_new_tokens: int = Field(200, ge=1, le=MAX_NEW_TOKENS, description="how many tokens to sample")
    temperature: float = Field(0.8, ge=0, allow_inf_nan=False, description="0 = greedy")
    top_k: int | None = Field(None, ge=1, description="sample among the k most likely tokens")
    top_p: float | None = Field(None, gt=0, le=1, description="sample among the tokens that make up probability p")
    seed: int | None = Field(None, ge=0, lt=2**63, description="the same seed gives the same text (default: random)")
    stop: str | None = Field(None, max_length=100, description="stop when this text is generated")
    attention: bool = Field(False, description="send with each token the attention that produced it (slower)")


class InspectRequest(TextRequest):
    what: Literal[WHAT] = Field(description="lens, heads, ablate (GPT runs), rollout or flow (any text run)")
