"""The OpenAI-compatible API beside the explorer's: /v1/models, /v1/completions, /v1/chat/completions,
and /health, so that the `openai` package, LangChain or a curl script written for vLLM talk to
`attnlab serve` as they talk to those servers.

Legend: a choice = one sequence generated for a request (prompt p's choice j is number p * n + j);
a step = one token drawn for it by the engine (rows.Step); a chunk = one server-sent event.

Answers follow the public OpenAI API reference: ids "cmpl-..." and "chatcmpl-...", object
"text_completion", "chat.completion" or "chat.completion.chunk", created, model, choices [{index,
text | message | delta, logprobs, finish_reason}], usage {prompt_tokens, completion_tokens,
total_tokens}. A stream is server-sent events, `data: {chunk}` with each choice's new text (what was
drawn since its last chunk: chunks go out at most every STREAM_INTERVAL, the first at once), the
last chunk of a choice carrying its finish_reason, then `data: [DONE]`; with
stream_options.include_usage, a chunk with no choices and the usage comes before it.

What the fields mean here (requests: see openai_schema.py):
- finish_reason "stop": a stop text (cut from the text; for chat also the end of turn of the run's
  chat template, openai_schema.py), the end-of-text token (unless ignore_eos), or a structured
  output's value closed (response_format json_object or json_schema, a grammar); "tool_calls": a
  chat reply of tool calls (openai_tools.py); "length": max_tokens drawn.
- usage: prompt_tokens are the prompts' tokens by the run's tokenizer (an empty prompt is one
  end-of-text token), each prompt once however many choices; completion_tokens are the tokens drawn,
  a cut stop text's and an end-of-text token included.
- logprobs: the model's own log-probabilities (log-softmax of its logits, before temperature,
  top-k and top-p) of every token drawn, and of the most likely alternatives.
- seeds: choice i of a request draws with seed + i (a random seed when none is given). A seeded
  choice is the text `attnlab sample RUN --seed S` prints with the same settings, batched or not.
- Errors: 400 (invalid_value, unknown_parameter, context_length_exceeded), 401 invalid_api_key,
  404 model_not_found, 413 request_too_large, 429 rate_limit_exceeded (over --max-streams), 504
  timeout (past --request-timeout), 500 internal_error; a failure mid-stream is a last event
  `data: {"error": {...}}` with no [DONE].
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from attnlab.decoding.rows import Step
from attnlab.decoding.sampling import TextPieces
from attnlab.errors import AttnlabError
from attnlab.runs.embed import makes_embeddings
from attnlab.serve.guard import Limits, StreamLimit
from attnlab.serve.jobs import Choice, Job
from attnlab.serve.openai_schema import BadField, ChatRequest, CompletionRequest, clip, conversation
from attnlab.serve.openai_tools import ToolReplies, tool_plan
from attnlab.version import __version__

FINGERPRINT = f"attnlab-{__version__}"
# A stream's chunks go out at most this often (the first at once): each is a write to the socket,
# which under load costs about what a decoding step does; 20 ms is below what a reader can see.
STREAM_INTERVAL = 0.02


class APIError(Exception):
    """An error answered in OpenAI's shape: status, one-line message, code, and the field at fault."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


class Jobs:
    """Starts a request's sequences in its model's engine, within the server's limit on streams."""

    def __init__(self, engines: dict, streams: StreamLimit, limits: Limits):
        self.engines, self.streams, self.limits = engines, streams, limits

    def begin(
        self, req, s, prompts, max_tokens: int, stops: list[str], logprobs: int | None, echo: bool = False, grammar=None
    ) -> Job:
        """Reserve the streams and start every (prompt, choice) sequence in the model's engine;
        `grammar`: the constraint of a tool call (else the request's own, if any)."""
        n, streams = len(prompts) * req.n, self.streams
        if grammar is None:  # before streams are taken: a refused schema holds none
            grammar = req.constraint(s.run.tokenizer)
        if n > streams.limit:
            raise BadField(
                f"this request asks for {n} sequences; the server generates at most {streams.limit} at once", "n"
            )
        if not streams.take(n):
            raise APIError(
                429,
                f"the server is generating {streams.active} streams (limit {streams.limit}); retry later",
                "rate_limit_exceeded",
            )
        job = Job(self.engines[req.model], streams, self.limits)
        seed = secrets.randbelow(2**62) if req.seed is None else req.seed
        # A structured output's end-of-text is its value's end, never text: kept even with ignore_eos.
        eot = None if req.ignore_eos and grammar is None else s.run.tokenizer.eot_id
        try:
            for p, (text, ids) in enumerate(prompts):
                for j in range(req.n):
                    draw = req.draw(seed + j)
                    choice = Choice(
                        p * req.n + j,
                        TextPieces(s.run.tokenizer, stops),
                        eot,
                        logprobs is not None,
                        text if echo else "",
                    )
                    matcher = None if grammar is None else grammar.matcher()  # one per choice
                    job.start(choice, ids, draw, max_tokens, logprobs, matcher)
        except Exception:
            job.cancel()
            streams.give(n - len(job.choices))
            raise
        return job


def add_openai_routes(app: FastAPI, served: dict, limits: Limits, streams: StreamLimit) -> None:
    """/health and /v1/* over the served GPT runs (`served`: name -> Served, as app.py keeps them)."""
    engines = {name: s.engine() for name, s in served.items() if s.run.task.generates}
    app.state.engines = engines  # each run's one engine, shared with the explorer (decoding/engine.py)
    begin = Jobs(engines, streams, limits).begin

    def find(name: str):
        if name not in engines:
            raise model_not_found(name, served, engines, "/v1 serves language models")
        return served[name]

    @app.get("/health", summary="whether the server is up (no key needed)")
    def health() -> dict:
        return {"status": "ok"}

    # Listed: every run /v1 answers for, the language models and the runs /v1/embeddings reads (serve/embeddings.py).
    listed = [n for n, s in served.items() if n in engines or makes_embeddings(s.run.model)]

    @app.get("/v1/models", summary="the models served: every GPT run, and every run with text embeddings")
    def models() -> dict:
        return {"object": "list", "data": [model_card(served[n]) for n in listed]}

    @app.get("/v1/models/{name}", summary="one model")
    def model(name: str) -> dict:
        return model_card(served[name] if name in listed else find(name))

    @app.post("/v1/completions", summary="continue a prompt (OpenAI's completions API)")
    async def completions(req: CompletionRequest, request: Request):
        req.check()
        s = find(req.model)
        prompts = prompt_ids(s.run.tokenizer, req.prompt, s.run.model.cfg.context, "prompt")
        echo_lp = [None] * len(prompts)
        if req.echo and req.logprobs is not None:
            echo_lp = [await run_in_threadpool(prompt_logprobs, s.run, ids, req.logprobs) for _, ids in prompts]
        job = begin(req, s, prompts, req.max_tokens, req.stops(), req.logprobs, echo=req.echo)
        reply = Reply("cmpl", "text_completion", req, s, job, prompts, echo_lp)
        return await respond(reply, request)

    @app.post("/v1/chat/completions", summary="reply to a conversation (OpenAI's chat API, the run's chat template)")
    async def chat(req: ChatRequest, request: Request):
        req.check()
        s = find(req.model)
        try:
            plan = tool_plan(req, s.template, s.run.tokenizer)
            text = plan.prompt if plan else s.template.prompt(conversation(req.messages))
        except BadField:
            raise
        except AttnlabError as e:  # the template refuses the conversation (e.g. roles that do not alternate)
            raise BadField(str(e), "messages") from None
        prompts = prompt_ids(s.run.tokenizer, text, s.run.model.cfg.context, "messages")
        k = (req.top_logprobs or 0) if req.logprobs else None
        grammar = plan.grammar if plan else None  # a call's grammar ends the reply: no end-of-turn text
        stops = [] if grammar else [*req.stops(), s.template.end_of_turn()]
        job = begin(req, s, prompts, req.limit(), stops, k, grammar=grammar)
        tools = ToolReplies(plan) if grammar else None
        return await respond(Reply("chatcmpl", "chat.completion", req, s, job, prompts, tools=tools), request)


class Reply:
    """The answer to one request, whole or as chunks, in the shape of its endpoint."""

    def __init__(self, prefix, kind, req, s, job, prompts, echo_lp=None, tools: ToolReplies | None = None):
        self.id = f"{prefix}-{secrets.token_hex(12)}"
        self.kind, self.req, self.job, self.prompts, self.echo_lp = kind, req, job, prompts, echo_lp
        self.tools = tools  # a chat whose replies may be tool calls
        self.tok, self.model, self.created = s.run.tokenizer, req.model, int(time.time())
        self.chat = kind == "chat.completion"

    def head(self) -> dict:
        kind = "chat.completion.chunk" if self.chat and self.req.stream else self.kind
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
        }

    def usage(self) -> dict:
        prompt = sum(len(ids) for _, ids in self.prompts)
        completion = sum(len(c.steps) for c in self.job.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def logprobs(self, c: Choice, steps: list[Step], start: int) -> dict | None:
        """The logprobs object for `steps` (the choice's, from its token number `start`)."""
        if not c.logprobs:
            return None
        word = lambda i: self.tok.decode([i])  # noqa: E731
        if self.chat:
            alt = lambda i, lp: {"token": word(i), "logprob": lp, "bytes": list(word(i).encode())}  # noqa: E731
            content = [{**alt(s.token, s.logprob), "top_logprobs": [alt(i, lp) for i, lp in s.top]} for s in steps]
            return {"content": content, "refusal": None}
        out = {
            "tokens": [word(s.token) for s in steps],
            "token_logprobs": [s.logprob for s in steps],
            "top_logprobs": [{word(i): lp for i, lp in s.top} for s in steps],
            "text_offset": c.offsets[start : start + len(steps)],
        }
        echo = self.echo_lp[c.index // self.req.n] if start == 0 and self.echo_lp else None
        return out if echo is None else {k: echo[k] + out[k] for k in out}

    def whole(self) -> dict:
        choices = []
        for c in self.job.choices:
            lp = self.logprobs(c, c.steps, 0)
            message, finish = {"role": "assistant", "content": c.text, "refusal": None}, c.finish
            if self.tools:
                message, finish = self.tools.message(c.text, c.finish)
            body = {"message": message} if self.chat else {"text": c.text}
            choices.append({"index": c.index, **body, "logprobs": lp, "finish_reason": finish})
        return {**self.head(), "choices": choices, "usage": self.usage()}

    def chunk(self, c: Choice, text: str, steps: list[Step], first: bool) -> dict:
        lp = self.logprobs(c, steps, len(c.steps) - len(steps))
        finish = c.finish
        if self.tools:
            delta, finish = self.tools.delta(c.index, text, finish, first)
            body = {"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        elif self.chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {})
            body = {"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            text = (c.prefix if first else "") + text  # echo: the prompt comes in the first chunk
            body = {"index": c.index, "text": text, "logprobs": lp, "finish_reason": finish}
        usage = {"usage": None} if self.include_usage else {}
        return {**self.head(), "choices": [body], **usage}

    @property
    def include_usage(self) -> bool:
        return bool(self.req.stream_options and self.req.stream_options.include_usage)

    async def events(self) -> AsyncIterator[str]:
        """The server-sent events of a stream."""
        started: set[int] = set()
        try:
            async for update in self.job.updates(STREAM_INTERVAL):
                for i, (text, steps) in sorted(update.items()):
                    c = self.job.choices[i]
                    if text or steps or c.finish or i not in started:
                        chunk = self.chunk(c, text, steps, i not in started)
                        started.add(i)
                        if not held(chunk["choices"][0]):
                            yield sse(chunk)
        except Exception as e:  # the status line is long gone: the error is the last event
            yield sse({"error": error_body(e)})
            return
        finally:
            self.job.cancel()
        if self.include_usage:
            yield sse({**self.head(), "choices": [], "usage": self.usage()})
        yield "data: [DONE]\n\n"


def held(body: dict) -> bool:
    """A chunk with nothing to say: text a tool reply holds back while it may still become a call."""
    return body.get("delta") == {} and body["finish_reason"] is None and not body["logprobs"]


async def respond(reply: Reply, request: Request):
    """A stream of events, or the whole answer once every choice is done."""
    if reply.req.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(reply.events(), media_type="text/event-stream", headers=headers)
    watch = asyncio.create_task(cancel_on_disconnect(request, reply.job))
    try:
        async for _ in reply.job.updates():
            pass
    except Exception as e:
        status = 504 if isinstance(e, TimeoutError) else 500
        return JSONResponse({"error": error_body(e)}, status_code=status)
    finally:
        watch.cancel()
        reply.job.cancel()
    return JSONResponse(reply.whole())


async def cancel_on_disconnect(request: Request, job: Job) -> None:
    """Stop the generation if the client goes away before its answer is ready."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


def error_body(e: Exception) -> dict:
    if isinstance(e, TimeoutError):
        return {
            "message": str(e) or "the generation ran past its time limit",
            "type": "server_error",
            "param": None,
            "code": "timeout",
        }
    message = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return {
        "message": f"internal error: {type(e).__name__}: {message}",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def model_not_found(name: str, served: dict, offered, why: str) -> APIError:
    """The 404 for a model a route does not offer: what the run is and `why` if it is served, and
    the names the route does offer."""
    what = f" ({served[name].run.task.noun} run: {why})" if name in served else ""
    message = f"the model {clip(name)} does not exist{what}; serving: {', '.join(offered)}"
    return APIError(404, message, "model_not_found", "model")


def model_card(s) -> dict:
    weights = s.run.path / "model.safetensors"
    created = int(weights.stat().st_mtime) if weights.exists() else 0
    return {"id": s.name, "object": "model", "created": created, "owned_by": "attnlab"}


def prompt_ids(tokenizer, prompt, context: int, param: str) -> list[tuple[str, list[int]]]:
    """[(text, ids)] of each prompt: text is encoded (empty: the end-of-text token), ids are checked
    against the vocabulary and decoded; a prompt longer than the context is a 400."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    out = []
    vocab = tokenizer.vocab_size
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            ids = tokenizer.encode(p) if p else [tokenizer.eot_id]
        else:
            if not p or min(p) < 0 or max(p) >= vocab:
                raise BadField(f"{param}: token ids must be 0..{vocab - 1}, and at least one", param)
            ids, p = list(p), tokenizer.decode(p)
        if len(ids) > context:
            raise APIError(
                400,
                too_long(param, i if len(prompt) > 1 else None, len(ids), context),
                "context_length_exceeded",
                param,
            )
        out.append((p, ids))
    return out


def too_long(param: str, index: int | None, tokens: int, context: int) -> str:
    """The one line for a prompt (or a chat's messages) over the context, in tokens both sides."""
    if param == "messages":  # the template's role markers count too: say so, or the user counts only their text
        what, advice = "the messages take", " (the chat template included); shorten them or leave out earlier turns"
    else:
        what = "the prompt takes" if index is None else f"prompt {index} (from 0) takes"
        advice = "; shorten it"
    return f"this model's context is {context:,} tokens, but {what} {tokens:,} tokens{advice}"


@torch.no_grad()
def prompt_logprobs(run, ids: list[int], k: int) -> dict:
    """Echo's logprobs of the prompt's own tokens (the first has none), under the model."""
    lp = torch.log_softmax(run.model(torch.tensor([ids], device=run.device))[0].float(), dim=-1)  # (T, V)
    word = lambda i: run.tokenizer.decode([i])  # noqa: E731
    tokens, chosen, top, offsets, at = [], [], [], [], 0
    for t, token in enumerate(ids):
        tokens.append(word(token))
        offsets.append(at)
        at += len(word(token))
        if t == 0:
            chosen.append(None)
            top.append(None)
            continue
        best = lp[t - 1].topk(min(k, lp.shape[-1]))
        chosen.append(float(lp[t - 1, token]))
        top.append({word(i): v for i, v in zip(best.indices.tolist(), best.values.tolist())})
    return {"tokens": tokens, "token_logprobs": chosen, "top_logprobs": top, "text_offset": offsets}
