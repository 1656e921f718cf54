"""The local web explorer: `attnlab serve RUN [RUN ...]`, a page and a JSON API over trained runs.

Legend: a run = a trained run directory, served under its directory's name (the /v1 model id).

API (FastAPI; request schemas at /openapi.json). Every error is JSON {"error": "one line"}:
400 a user error (wrong task for the run, text with no tokens, unreadable image or one over
MAX_PIXELS, checked from its header), 404 an unknown run, 413 a body over MAX_BODY_BYTES (an image
over MAX_IMAGE_BYTES), refused before it is read, 422 a request off its schema (bad JSON, a text over
MAX_INPUT_CHARS characters, max_new_tokens over MAX_NEW_TOKENS), 429 a generation while --max-streams
are running, 500 anything else (logged; the server keeps serving).

  GET  /                         the page: inline script and style, nothing from the network
  GET  /api/runs                 [{name, path, family, kind, parameters, step, config}]
  GET  /api/runs/{name}/metrics  the rows of metrics.jsonl: {step, loss, lr, val_loss?, ...}
  POST /api/generate             {run, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop}
                                 GPT runs; NDJSON, one line per piece as it is sampled: {"text": piece},
                                 then {"done": true, "tokens": n, "seconds": s, "seed": seed}; with
                                 attention: true, first {"prompt_tokens": [...]}, and each piece also
                                 has "tokens" and "attention" (L, Tk) of the query that produced it
                                 (or {"error": ...} if it fails midway)
  POST /api/predict              {run, text, top_k, beam} -> classify {label, probability, probabilities},
                                 tag {tokens: [{token, tag, probability}]}, mlm {tokens, masks},
                                 translate {translation}
  POST /api/predict_image        multipart form: run, image -> {label, probability, top (3),
                                 attention: {grid: [rows, cols], weights (L, H, rows, cols)} of
                                 [CLS] over the patches, or null for a model without attention}
  POST /api/caption              multipart form: run, image -> NDJSON: {"image": {height, width, pixels
                                 (base64 gray bytes), grid}}, then one {"word", "attention" (L, H, N)} per
                                 word as the captioner chooses it (the last "</s>"), then {"done": true,
                                 "caption", "seconds"}
  POST /api/inspect              {run, text, what} -> interpret/report.py's numbers: what = lens, heads,
                                 ablate (GPT runs), rollout or flow (any text run)
  POST /api/attention            {run, text} -> {views: [{name, queries, keys, weights (L, H, Tq, Tk)}]}, and
                                 for a mixture of experts experts: {tokens, experts (L, T), gates (L, T), n}

Beside it, the OpenAI-compatible API over the GPT runs (openai_api.py): GET /v1/models, POST
/v1/completions and /v1/chat/completions, GET /health; its errors are OpenAI's {"error": {"message",
"type", "code"}}. Who may call, how much and how slowly: guard.py (an API key, the Host check, body
limits, read timeouts, the number of streams, CORS).

FastAPI's /docs page is left on: it loads Swagger UI from a CDN, so it needs the network.

Concurrency: requests share only the loaded runs, which they read (inference under no_grad).
Each generation samples from its own torch.Generator, seeded from the request or, without one,
from a seed drawn for it (and returned), never from torch's global RNG: so requests need no
lock, and a seed always gives the same text. /v1 generations of one run are decoded together, one
forward pass per step over all of them (batching.py), each still drawing its seed's tokens.
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import uvicorn
from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnlab.decoding.sampling import stream_text
from attnlab.errors import AttnlabError
from attnlab.interpret.experts import routing_json
from attnlab.interpret.report import WHAT, inspect
from attnlab.interpret.views import token_labels, views
from attnlab.runs.run import Run, load
from attnlab.serve.guard import (
    Access,
    Gate,
    HostCheck,
    Limits,
    StreamLimit,
    allowed_hosts_for,
    check_exposure,
    error_response,
    is_loopback,
    timed_h11,
)
from attnlab.serve.live import LiveAttention, in_one_thread
from attnlab.serve.openai_api import APIError, add_openai_routes
from attnlab.serve.openai_schema import BadField
from attnlab.serve.page import page
from attnlab.version import __version__
from attnlab.viz.captions import caption_json
from attnlab.viz.curves import read_metrics
from attnlab.viz.html import views_json

MAX_INPUT_CHARS = 2_000  # a prompt or a text; runs read at most their context anyway
MAX_NEW_TOKENS = 500
MAX_IMAGE_BYTES = 10_000_000
MAX_BODY_BYTES = 1_000_000  # a JSON request; the longest valid one is a few KB
MAX_CURVE_ROWS = 5_000  # a loss curve's points: a long run's rows are thinned to about this many
NDJSON = "application/x-ndjson"


@dataclass
class Served:
    """A loaded run and what the page shows about it."""

    name: str
    run: Run
    parameters: int

    @property
    def kind(self) -> str:
        return self.run.task.name  # lm, classify, tag, mlm, translate or image

    def summary(self) -> dict:
        family = self.run.config["family"]
        return {"name": self.name, "path": str(self.run.path), "family": family, "kind": self.kind,
                "parameters": self.parameters, "step": self.run.step, "config": self.run.config}  # fmt: skip


def load_runs(paths: list[str | Path], device: str) -> dict[str, Served]:
    """Each run by its directory name (a second "lm" becomes "lm-2"); a run that fails to load stops
    the server before it starts, with the run's path in the message."""
    if not paths:
        raise AttnlabError("give at least one run directory to serve")
    served: dict[str, Served] = {}
    seen: set[Path] = set()
    for path in paths:
        resolved = Path(path).resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        try:
            run = load(resolved, device)
        except AttnlabError as e:
            raise AttnlabError(f"cannot serve {path}: {e}") from None
        except Exception as e:  # e.g. a weights file cut short: still one line naming the run
            raise AttnlabError(f"cannot serve {path}: {type(e).__name__}: {one_line(e)}") from None
        name, k = resolved.name or "run", 2
        while name in served:
            name, k = f"{resolved.name}-{k}", k + 1
        served[name] = Served(name, run, sum(p.numel() for p in run.model.parameters()))
    return served


# ---- requests --------------------------------------------------------------------------------

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


# ---- the app ---------------------------------------------------------------------------------


def create_app(
    runs: list[str | Path], device: str = "cpu", access: Access | None = None, limits: Limits | None = None
) -> FastAPI:
    """The explorer's app and the OpenAI-compatible API over the run directories `runs`, loaded once
    onto `device`. access: the key, the Host names answered (default: any Host; `attnlab serve`
    always names them) and CORS origins; limits: see guard.Limits."""
    served = load_runs(runs, device)
    access, limits = access or Access(), limits or Limits()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        for batcher in app.state.batchers.values():  # their threads end with the server
            batcher.close()

    app = FastAPI(title="attnlab explorer", version=__version__, lifespan=lifespan,
                  description="Trained runs: generate, predict, see attention; and an OpenAI-compatible API "
                  "under /v1. Errors are {\"error\": \"one line\"} (under /v1: OpenAI's error object).")  # fmt: skip
    app.state.runs = list(served)  # the names
    app.state.limits, app.state.access = limits, access
    streams = app.state.streams = StreamLimit(limits.max_streams)
    add_error_handlers(app)
    # The last added runs first: the Host check, then CORS (which answers preflights), then the key and size.
    app.add_middleware(Gate, api_key=access.api_key, limit_of=body_limit)
    if access.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=access.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])  # fmt: skip
    if access.allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed=access.allowed_hosts)
    add_openai_routes(app, served, limits, streams)
    html = page(MAX_INPUT_CHARS, MAX_NEW_TOKENS)

    def find(name: str, endpoint: str | None = None) -> Served:
        """The run called `name`; with `endpoint`, one whose task answers there (else a 400 naming the
        endpoint that does)."""
        if name not in served:
            raise HTTPException(404, f"unknown run {name!r}; serving: {', '.join(served)}")
        s = served[name]
        if endpoint is not None and s.run.task.endpoint != endpoint:
            raise AttnlabError(f"{name} is {s.run.task.noun} run: use {s.run.task.endpoint}")
        return s

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> str:
        return html

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:  # browsers ask for one: answer "none", not an error in the console
        return Response(status_code=204)

    @app.get("/api/runs", summary="the runs served")
    def list_runs() -> list[dict]:
        return [s.summary() for s in served.values()]

    @app.get("/api/runs/{name}/metrics", summary="a run's training metrics, for its loss curve")
    def metrics(name: str) -> list[dict]:
        s = find(name)
        return [finite(row) for row in read_metrics(s.run.path / "metrics.jsonl", max_rows=MAX_CURVE_ROWS)]

    @app.post("/api/generate", summary="stream a GPT's continuation (NDJSON)", response_class=StreamingResponse,
              responses={200: {"content": {NDJSON: {}}, "description": "one JSON object per line"}})  # fmt: skip
    def generate(req: GenerateRequest) -> StreamingResponse:
        s = find(req.run, "/api/generate")
        if not streams.take(1):
            raise HTTPException(429, f"the server is generating {streams.active} streams already; retry later")
        release = once(lambda: streams.give(1))
        seed = secrets.randbelow(2**53) if req.seed is None else req.seed  # 2**53: exact as a JavaScript number
        t0 = time.perf_counter()
        sampling = (req.max_new_tokens, req.temperature, req.top_k, req.top_p, seed, req.stop)
        try:
            if req.attention:
                lines = live_lines(s.run, req.prompt, sampling)
            else:
                lines = ({"text": p} for p in stream_text(s.run.model, s.run.tokenizer, req.prompt, *sampling))
            # The first line is made here, so that an error before it still gets its status code.
            first = next(lines, None)
        except Exception:
            release()
            raise
        body = ndjson(first, lines, seed, t0, limits.request_timeout, release)
        return StreamingResponse(body, media_type=NDJSON, background=BackgroundTask(release))

    @app.post("/api/predict", summary="a classifier's label, a tagger's tags, a masked LM's fills, a translation")
    def predict_text(req: PredictRequest) -> dict:
        s = find(req.run, "/api/predict")
        return predict(s.run, req.text, {"top_k": req.top_k, "beam": req.beam})

    @app.post("/api/predict_image", summary="an image run's label for an uploaded image, and its attention")
    def predict_upload(run: Annotated[str, Form()], image: Annotated[UploadFile, File()]) -> dict:
        s = find(run, "/api/predict_image")
        pixels = read_upload(image, lambda path: s.run.task.image(s.run, path))  # once, for label and attention
        out = s.run.task.answer_image(s.run, pixels, image.filename)
        return {**out, "image": image.filename}

    @app.post("/api/caption", summary="a captioner's caption of an uploaded image, word by word (NDJSON)",
              response_class=StreamingResponse,
              responses={200: {"content": {NDJSON: {}}, "description": "one JSON object per line"}})  # fmt: skip
    def caption_upload(run: Annotated[str, Form()], image: Annotated[UploadFile, File()]) -> StreamingResponse:
        s = find(run, "/api/caption")
        pixels = read_upload(image, lambda path: s.run.task.image(s.run, path))
        return StreamingResponse(caption_lines(s.run, pixels, limits.request_timeout), media_type=NDJSON)

    @app.post("/api/inspect", summary="inside the model: logit lens, head detectors, head ablation, rollout, flow")
    def inspect_text(req: InspectRequest) -> dict:
        s = find(req.run)
        if s.run.task.reads_images:
            raise AttnlabError(f"{req.run} is {s.run.task.noun} run: these views read text; for an image, "
                               "attnlab inspect RUN IMAGE --what rollout")  # fmt: skip
        return inspect(s.run, req.text, req.what)

    @app.post("/api/attention", summary="every attention map of a run on a text, for the head and model views")
    def attention(req: TextRequest) -> dict:
        s = find(req.run)
        if s.run.task.reads_images:  # an image: its attention comes with its prediction or caption
            raise AttnlabError(f"{req.run} is {s.run.task.noun} run: send the image to {s.run.task.endpoint}, "
                               "whose answer carries its attention")  # fmt: skip
        return views_json(views(s.run, req.text), routing_json(s.run, req.text))

    return app


def predict(run: Run, text: str, options: dict) -> dict:
    """What the run's task answers for a text: a label, tags, [MASK] fills or a translation."""
    return run.task.predict(run, text, options)


def live_lines(run: Run, prompt: str, sampling: tuple) -> Iterator[dict]:
    """/api/generate's lines with attention: {"prompt_tokens": [...]} first, then per piece {"text",
    "tokens": the tokens it holds, "attention": (L, Tk) the newest query's weights, mean of heads}."""

    tok, live, new = run.tokenizer, LiveAttention(run.model), []
    ids = (tok.encode(prompt) if prompt else [tok.eot_id])[-run.model.cfg.context :]

    def make() -> Iterator[dict]:
        yield {"prompt_tokens": token_labels(tok, ids)}
        for piece in stream_text(run.model, tok, prompt, *sampling, on_token=new.append):
            yield {"text": piece, "tokens": token_labels(tok, new), "attention": live.latest()}
            new.clear()

    return in_one_thread(make, run.model, live.hooks())


def read_upload(image: UploadFile, decode: Callable[[Path], Any]) -> Any:
    """An uploaded image file, decoded by `decode(path)`; a 413 past MAX_IMAGE_BYTES, and errors that
    name the user's file rather than the temporary one."""
    data = image.file.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES:
        raise HTTPException(413, f"the image is over {MAX_IMAGE_BYTES // 1_000_000} MB")
    with tempfile.TemporaryDirectory() as tmp:  # the library reads image files
        path = Path(tmp) / "upload"
        path.write_bytes(data)
        del data
        try:
            return decode(path)
        except AttnlabError as e:
            raise AttnlabError(str(e).replace(str(path), image.filename or "the upload")) from None


def caption_lines(run: Run, pixels, limit: float = math.inf) -> Iterator[str]:
    """The lines of /api/caption: {"image": the image and its patch grid}, then one {"word", "attention"
    (L, H, N)} per word as it is chosen (the last "</s>"), then {"done", "caption", "seconds"}."""

    t0, words = time.perf_counter(), []
    shown = caption_json(pixels, [], [], run.model.cfg.grid)
    yield json.dumps({"image": {k: shown[k] for k in ("height", "width", "pixels", "grid")}}) + "\n"
    try:
        for word, weights in run.task.stream_image(run, pixels):
            words.append(word)
            yield json.dumps({"word": word, "attention": np.round(weights, 4).tolist()}) + "\n"
            if time.perf_counter() - t0 > limit:
                raise TimeoutError(f"the caption ran past its time limit of {limit:g} s")
    except Exception as e:  # the status line is long gone: the error is the last line
        yield json.dumps({"error": one_line(e)}) + "\n"
        return
    caption = " ".join(words[:-1])
    yield json.dumps({"done": True, "caption": caption, "seconds": round(time.perf_counter() - t0, 4)}) + "\n"


def ndjson(
    first: dict | None, lines: Iterator[dict], seed: int, t0: float, limit: float = math.inf, done=lambda: None
) -> Iterator[str]:
    """The lines of /api/generate. tokens counts the pieces: one per token, except that a character
    split over several byte-level tokens comes as one piece. Past `limit` seconds the generation
    stops with an error line; done() runs at the end, however it ends."""
    n = 0
    try:
        for line in itertools.chain([] if first is None else [first], lines):
            n += "text" in line
            yield json.dumps(line, ensure_ascii=False) + "\n"
            if time.perf_counter() - t0 > limit:
                raise TimeoutError(f"the generation ran past its time limit of {limit:g} s")
    except Exception as e:  # the status line is long gone: the error is the last line
        yield json.dumps({"error": one_line(e)}) + "\n"
        return
    finally:
        done()
    seconds = round(time.perf_counter() - t0, 4)
    yield json.dumps({"done": True, "tokens": n, "seconds": seconds, "seed": seed}) + "\n"


def finite(row: dict) -> dict:
    """JSON has no NaN or infinity: a diverged loss is sent as null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def body_limit(path: str) -> int:
    """The most bytes a request body may have on `path` (read at each request: a test may lower it)."""
    upload = path in ("/api/predict_image", "/api/caption")
    return MAX_IMAGE_BYTES + 100_000 if upload else MAX_BODY_BYTES  # + the form's other fields


def once(fn: Callable[[], None]) -> Callable[[], None]:
    """fn, made to run at most once however many times, and from however many threads, it is called."""
    first = threading.Lock()  # taken by the first call, never given back

    def call() -> None:
        if first.acquire(blocking=False):
            fn()

    return call


# ---- errors: one JSON shape for all -----------------------------------------------------------


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def invalid(e: RequestValidationError) -> str:
    """Pydantic's complaints as one line: "prompt: String should have at most 2000 characters"."""
    parts = []
    for err in e.errors():
        loc = [str(x) for x in err.get("loc", ())]
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'cannot parse it')})")
            continue
        where = ".".join(loc[1:] if loc[:1] == ["body"] and len(loc) > 1 else loc)
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return "; ".join(parts) or "invalid request"


def add_error_handlers(app: FastAPI) -> None:
    """Every error as JSON in its route's shape (guard.error_response): one line, the right status."""

    def reply(request: Request, status: int, message: str, code: str | None = None, param=None, headers=None):
        return error_response(request.url.path, status, message, code, param, headers)

    def validation(request: Request, e: RequestValidationError):
        if not request.url.path.startswith("/v1"):
            return reply(request, 422, invalid(e))
        errors = e.errors()
        extra = [str(err["loc"][-1]) for err in errors if err.get("type") == "extra_forbidden"]
        if extra:  # OpenAI's words for a field it does not know
            return reply(request, 400, f"Unrecognized request argument supplied: {', '.join(extra)}",
                         "unknown_parameter", extra[0])  # fmt: skip
        loc = [str(x) for x in errors[0].get("loc", ())] if errors else []
        return reply(request, 400, invalid(e), "invalid_value", ".".join(loc[1:]) or None)

    codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 429: "rate_limit_exceeded"}
    app.add_exception_handler(APIError, lambda r, e: reply(r, e.status, str(e), e.code, e.param))
    app.add_exception_handler(BadField, lambda r, e: reply(r, 400, one_line(e), "invalid_value", e.param))
    app.add_exception_handler(AttnlabError, lambda r, e: reply(r, 400, one_line(e), "invalid_value"))
    app.add_exception_handler(RequestValidationError, validation)

    def http_error(r: Request, e: StarletteHTTPException):
        return reply(r, e.status_code, str(e.detail), codes.get(e.status_code), None, getattr(e, "headers", None))

    app.add_exception_handler(StarletteHTTPException, http_error)
    # Anything else is a bug: the client gets one line, the log the traceback, and the server goes on.
    app.add_exception_handler(
        Exception, lambda r, e: reply(r, 500, f"internal error: {type(e).__name__}: {one_line(e)}", "internal_error")
    )


# ---- running it -------------------------------------------------------------------------------


def serve(
    runs: list[str | Path],
    host: str = "127.0.0.1",
    port: int = 8765,
    device: str = "auto",
    api_key: str | None = None,
    insecure_no_key: bool = False,
    allowed_hosts: list[str] | None = None,
    cors_origins: list[str] | None = None,
    limits: Limits | None = None,
) -> None:
    """Load `runs` and serve the explorer and the OpenAI-compatible API at http://host:port/ until
    Ctrl-C. Beyond loopback it needs `api_key` (or insecure_no_key); it answers the Host names of
    guard.allowed_hosts_for(host, allowed_hosts)."""
    check_exposure(host, api_key, insecure_no_key)
    access = Access(api_key, allowed_hosts_for(host, allowed_hosts), list(cors_origins or []))
    app = create_app(runs, device, access, limits)
    sock = listen(host, port)
    if not is_loopback(host) and not api_key:
        print(f"attnlab: warning: --host {host} --insecure-no-key: anyone who reaches this machine can use these runs")
    print(f"attnlab: serving {', '.join(app.state.runs)} at {address(sock)}/ (OpenAI-compatible API at "
          f"{address(sock)}/v1{'; key required' if api_key else ''}; Ctrl-C stops)", flush=True)  # fmt: skip
    uvicorn.Server(server_config(app)).run(sockets=[sock])


def server_config(app: FastAPI):
    """uvicorn's settings for the app: its read deadlines, keep-alive and header size (guard.Limits)."""
    limits: Limits = app.state.limits
    return uvicorn.Config(app, log_level="warning", http=timed_h11(limits), timeout_keep_alive=limits.keep_alive,
                          h11_max_incomplete_event_size=limits.max_header_bytes)  # fmt: skip


@contextmanager
def running(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` from a background thread for the with-block (a notebook, a test); yields its URL.
    Port 0 takes a free port."""
    sock = listen(host, port)
    server = uvicorn.Server(server_config(app))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server stopped while starting; see its log")
            time.sleep(0.01)
        yield address(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or an AttnlabError that says why not (e.g. the port is taken)."""
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets
    # that say they are TCP; with it on, every answer on a kept-alive connection waited 40 ms for an ACK.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait for TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise AttnlabError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port") from None
    return sock


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
