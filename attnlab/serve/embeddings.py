"""/v1/embeddings: OpenAI's embeddings API over every served run whose family makes text embeddings
(runs/embed.py: GPT runs, encoder runs of any task, encoder-decoders), so that the `openai` package,
LangChain or a script written for vLLM's embeddings talk to `attnlab serve` as they talk to those.

Legend: an input = one text or one list of token ids, embedded as one unit vector.

Request (the public OpenAI API reference): model, input (a text, a list of texts, token ids or
lists of them: the run's tokenizer's ids; at most MAX_INPUTS, none empty), encoding_format "float"
(a list of numbers; the default, also when null) or "base64" (the vector's float32 bytes,
little-endian, as OpenAI sends them), dimensions (keep the first D and normalise again, as OpenAI's
text-embedding-3 models do), user (accepted, ignored). Any other field is a 400 ("Unrecognized
request argument").

Answer: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage":
{"prompt_tokens", "total_tokens"}}: the tokens the model read, its framing included (an encoder's
[CLS]). Each vector is the family's default pooling (runs/embed.py says which and why), equal to
`attnlab.embed(run, input)`. Errors are OpenAI's error object, as the other /v1 routes': 400
invalid_value or context_length_exceeded (an input over the context: never cut short silently), 404
model_not_found (a run without embeddings: a ViT, a baseline), 429 rate_limit_exceeded while the
server holds --max-streams sequences (a request counts as one while it runs). The key, Host check
and body limit are the server's middleware (guard.py), as for every route.
"""

from __future__ import annotations

import base64
from typing import Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError
from starlette.concurrency import run_in_threadpool
from torch import Tensor

from attnlab.errors import AttnlabError, one_line
from attnlab.runs.embed import TooLong, embed_ids, makes_embeddings, model_ids
from attnlab.serve.guard import StreamLimit
from attnlab.serve.openai_api import APIError, model_not_found
from attnlab.serve.openai_schema import MAX_PROMPT_CHARS, BadField

MAX_INPUTS = 2048  # inputs per request, as OpenAI allows


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="a served run's name, as /v1/models lists it")
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text, texts, token ids or lists of them (the run's tokenizer's ids)"
    )
    encoding_format: Literal["float", "base64"] | None = Field(
        None, description="numbers (the default), or float32 bytes in base64"
    )
    dimensions: int | None = Field(None, ge=1, description="keep the first this many, normalised again")
    user: str | None = Field(None, max_length=256, description="ignored")

    @field_validator("input", mode="before")
    @classmethod
    def input_shape(cls, value):
        """One message for an input of none of its four shapes (not one per member of the union)."""
        ids = lambda v: isinstance(v, list) and all(type(i) is int for i in v)  # noqa: E731
        several = isinstance(value, list) and (all(isinstance(p, str) for p in value) or all(ids(p) for p in value))
        if not (isinstance(value, str) or ids(value) or several):
            kind = "null" if value is None else type(value).__name__
            raise PydanticCustomError(
                "input", f"must be a text, a list of texts, token ids or lists of token ids, got {kind}"
            )
        texts = [value] if isinstance(value, str) else [p for p in value if isinstance(p, str)]
        if any(len(t) > MAX_PROMPT_CHARS for t in texts):
            raise PydanticCustomError("input", f"an input has at most {MAX_PROMPT_CHARS:,} characters")
        if isinstance(value, list) and not ids(value) and len(value) > MAX_INPUTS:
            raise PydanticCustomError("input", f"at most {MAX_INPUTS:,} inputs a request")
        if value == [] or value == "":
            raise PydanticCustomError("input", "is empty: give at least one text or token id")
        return value


def add_embedding_routes(app: FastAPI, served: dict, streams: StreamLimit) -> None:
    """POST /v1/embeddings over the served runs whose models make text embeddings."""
    embedders = {name: s for name, s in served.items() if makes_embeddings(s.run.model)}

    def find(name: str):
        if name not in embedders:
            raise model_not_found(name, served, embedders, "it has no text embedding")
        return embedders[name]

    @app.post("/v1/embeddings", summary="unit-length vectors of texts (OpenAI's embeddings API)")
    async def embeddings(req: EmbeddingRequest) -> dict:
        s = find(req.model)
        ids = checked_ids(s.run, req.input)
        if not streams.take(1):
            raise APIError(
                429,
                f"the server is generating {streams.active} streams (limit {streams.limit}); retry later",
                "rate_limit_exceeded",
            )
        try:  # a thread of its own: the event loop goes on serving streams meanwhile
            vectors = await run_in_threadpool(embed_ids, s.run.model, ids, "auto", req.dimensions)
        finally:
            streams.give(1)
        tokens = sum(len(i) for i in ids)
        data = [
            {"object": "embedding", "index": i, "embedding": encoded(v, req.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": req.model, "usage": usage}


def checked_ids(run, inputs) -> list[list[int]]:
    """The model ids of the inputs; one over the context is OpenAI's context_length_exceeded."""
    try:
        return model_ids(run, inputs)
    except TooLong as e:  # before AttnlabError, which it is
        raise APIError(
            400,
            f"this model's context is {e.context:,} tokens, but input {e.index} (from 0) takes {e.tokens:,} "
            "tokens; shorten it",
            "context_length_exceeded",
            "input",
        ) from None
    except AttnlabError as e:  # a text with no tokens, ids outside the vocabulary
        raise BadField(one_line(e), "input") from None


def encoded(vector: Tensor, encoding_format: str | None) -> list[float] | str:
    """A vector as numbers, or as base64 of its float32 bytes, little-endian (what OpenAI sends)."""
    if encoding_format == "base64":
        return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()  # float32 values, each exact as a JSON number
