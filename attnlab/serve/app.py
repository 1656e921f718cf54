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
  GET  /metrics                  each generating run's engine counters (Prometheus text): steps, batched
                                 rows, replays, prefill passes, prefix cache hits, misses, tokens reused, bytes
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
/v1/completions and /v1/chat/completions, GET /health; and POST /v1/embeddings over every run whose
family makes text embeddings, encoders included (embeddings.py); its errors are OpenAI's {"error": {"message",
"type", "code"}}. Who may call, how much and how slowly: guard.py (an API key, the Host check, body
limits, read timeouts, the number of streams, CORS).

FastAPI's /docs page is left on: it loads Swagger UI from a CDN, so it needs the network.

Concurrency: requests share only the loaded runs, which they read (inference under no_grad).
Each generation samples from its own torch.Generator, seeded from the request or, without one,
from a seed drawn for it (and returned), never from torch's global RNG: so requests need no
lock, and a seed always gives the same text. Every generation of a run, /api/generate's and /v1's
alike, is decoded by the run's one engine (decoding/engine.py): one forward pass per step over all
of them, each still drawing its seed's tokens. The server imports no task: it asks a run's task.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, File, Form, HTTPException, UploadFile
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from attnlab.decoding.sampling import stream_text
from attnlab.errors import AttnlabError
from attnlab.interpret.experts import routing_json
from attnlab.interpret.report import inspect
from attnlab.interpret.views import views
from attnlab.io import read_metrics
from attnlab.runs.run import Run
from attnlab.serve.circuits import add_circuit_route, attach_transcoders
from attnlab.serve.embeddings import add_embedding_routes
from attnlab.serve.errors import add_error_handlers
from attnlab.serve.guard import (
    Access,
    Gate,
    HostCheck,
    Limits,
    StreamLimit,
    allowed_hosts_for,
    check_exposure,
    is_loopback,
)
from attnlab.serve.lines import caption_lines, finite, live_lines, ndjson, once
from attnlab.serve.openai_api import add_openai_routes
from attnlab.serve.page import page
from attnlab.serve.requests import (
    MAX_INPUT_CHARS,
    MAX_NEW_TOKENS,
    GenerateRequest,
    InspectRequest,
    PredictRequest,
    TextRequest,
)
from attnlab.serve.served import Served, attach_draft, load_runs
from attnlab.serve.server import address, listen, running, server_config
from attnlab.version import __version__
from attnlab.viz.html import views_json

__all__ = ["Limits", "check_exposure", "create_app", "finite", "listen", "running", "serve"]

MAX_IMAGE_BYTES = 10_000_000
MAX_BODY_BYTES = 1_000_000  # a JSON request; the longest valid one is a few KB
MAX_CURVE_ROWS = 5_000  # a loss curve's points: a long run's rows are thinned to about this many
NDJSON = "application/x-ndjson"
STREAMED = {200: {"content": {NDJSON: {}}, "description": "one JSON object per line"}}


# ---- the app ---------------------------------------------------------------------------------


def create_app(
    runs: list[str | Path],
    device: str = "cpu",
    access: Access | None = None,
    limits: Limits | None = None,
    quantize: str | None = None,
    compiled: bool = False,
    transcoders: list[str | Path] = (),
) -> FastAPI:
    """The explorer's app and the OpenAI-compatible API over the run directories `runs`, loaded once
    onto `device`. access: the key, the Host names answered (default: any Host; `attnlab serve`
    always names them) and CORS origins; limits: see guard.Limits; quantize: the language models'
    weights stored int8, int4 or bf16 for decoding (runs/quantized.py); compiled: their lone rows'
    steps compiled (decoding/compiled.py); transcoders: folders of them (serve/circuits.py)."""
    served = load_runs(runs, device, quantize, compiled)
    attach_transcoders(served, list(transcoders))
    access, limits = access or Access(), limits or Limits()
    attach_draft(served, limits.draft, device, compiled)
    for s in served.values():  # each generating run's engine, its batch as large as the limits say,
        if s.run.task.generates:  # its compiled steps built or loaded before the server listens
            s.engine(limits.max_batch, limits.prefill, limits.prefix_cache_mb).warm()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        for s in served.values():  # the engines' threads end with the server
            if s.run.task.generates:
                s.engine().close()

    app = FastAPI(
        title="attnlab explorer",
        version=__version__,
        lifespan=lifespan,
        description="Trained runs: generate, predict, see attention; and an OpenAI-compatible API "
        'under /v1. Errors are {"error": "one line"} (under /v1: OpenAI\'s error object).',
    )
    app.state.runs = list(served)  # the names
    app.state.limits, app.state.access = limits, access
    streams = app.state.streams = StreamLimit(limits.max_streams)
    add_error_handlers(app)
    # The last added runs first: the Host check, then CORS (which answers preflights), then the key and size.
    app.add_middleware(Gate, api_key=access.api_key, limit_of=body_limit)
    if access.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=access.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    if access.allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed=access.allowed_hosts)
    add_openai_routes(app, served, limits, streams)
    add_embedding_routes(app, served, streams)
    finder = find_in(served)
    add_page_routes(app, served, finder)
    add_generate_route(app, finder, limits, streams)
    add_upload_routes(app, finder, limits)
    add_inside_routes(app, finder)
    add_circuit_route(app, finder)
    return app


def find_in(served: dict[str, Served]) -> Callable[..., Served]:
    def find(name: str, endpoint: str | None = None) -> Served:
        """The run called `name`; with `endpoint`, one whose task answers there (else a 400 naming the
        endpoint that does)."""
        if name not in served:
            raise HTTPException(404, f"unknown run {name!r}; serving: {', '.join(served)}")
        s = served[name]
        if endpoint is not None and s.run.task.endpoint != endpoint:
            raise AttnlabError(f"{name} is {s.run.task.noun} run: use {s.run.task.endpoint}")
        return s

    return find


def add_page_routes(app: FastAPI, served: dict[str, Served], find: Callable[..., Served]) -> None:
    """The page, and the runs it lists with their loss curves."""
    html = page(MAX_INPUT_CHARS, MAX_NEW_TOKENS)

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

    @app.get("/metrics", summary="the decoding engines' counters, Prometheus' text format")
    def engine_metrics() -> Response:
        lines = [
            f'attnlab_{key.replace(" ", "_")}{{run="{name}"}} {value}'
            for name, s in served.items()
            if s.run.task.generates
            for key, value in sorted(s.engine().report().items())
        ]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def add_generate_route(app: FastAPI, find: Callable[..., Served], limits: Limits, streams: StreamLimit) -> None:
    @app.post(
        "/api/generate",
        summary="stream a GPT's continuation (NDJSON)",
        response_class=StreamingResponse,
        responses=STREAMED,
    )
    def generate(req: GenerateRequest) -> StreamingResponse:
        s = find(req.run, "/api/generate")
        if not streams.take(1):
            raise HTTPException(429, f"the server is generating {streams.active} streams already; retry later")
        release = once(lambda: streams.give(1))
        seed = secrets.randbelow(2**53) if req.seed is None else req.seed  # 2**53: exact as a JavaScript number
        t0 = time.perf_counter()
        cfg = req.config(seed, s.compiled)
        try:
            if req.attention:
                lines = live_lines(s.run, cfg, s.engine())
            else:
                texts = stream_text(s.run.model, s.run.tokenizer, req.prompt, cfg)
                lines = ({"text": p} for p in texts)
            # The first line is made here, so that an error before it still gets its status code.
            first = next(lines, None)
        except Exception:
            release()
            raise
        body = ndjson(first, lines, seed, t0, limits.request_timeout, release)
        return StreamingResponse(body, media_type=NDJSON, background=BackgroundTask(release))


def add_upload_routes(app: FastAPI, find: Callable[..., Served], limits: Limits) -> None:
    """What a run's task answers for a text, and for an uploaded image."""

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

    @app.post(
        "/api/caption",
        summary="a captioner's caption of an uploaded image, word by word (NDJSON)",
        response_class=StreamingResponse,
        responses=STREAMED,
    )
    def caption_upload(run: Annotated[str, Form()], image: Annotated[UploadFile, File()]) -> StreamingResponse:
        s = find(run, "/api/caption")
        pixels = read_upload(image, lambda path: s.run.task.image(s.run, path))
        return StreamingResponse(caption_lines(s.run, pixels, limits.request_timeout), media_type=NDJSON)


def add_inside_routes(app: FastAPI, find: Callable[..., Served]) -> None:
    """Inside a run: its attention maps, and the interpretability views of interpret/report.py."""

    @app.post("/api/inspect", summary="inside the model: logit lens, head detectors, head ablation, rollout, flow")
    def inspect_text(req: InspectRequest) -> dict:
        s = find(req.run)
        if s.run.task.reads_images:
            raise AttnlabError(
                f"{req.run} is {s.run.task.noun} run: these views read text; for an image, "
                "attnlab inspect RUN IMAGE --what rollout"
            )
        return inspect(s.run, req.text, req.what)

    @app.post("/api/attention", summary="every attention map of a run on a text, for the head and model views")
    def attention(req: TextRequest) -> dict:
        s = find(req.run)
        if s.run.task.reads_images:  # an image: its attention comes with its prediction or caption
            raise AttnlabError(
                f"{req.run} is {s.run.task.noun} run: send the image to {s.run.task.endpoint}, "
                "whose answer carries its attention"
            )
        return views_json(views(s.run, req.text), routing_json(s.run, req.text))


def predict(run: Run, text: str, options: dict) -> dict:
    """What the run's task answers for a text: a label, tags, [MASK] fills or a translation."""
    return run.task.predict(run, text, options)


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


def body_limit(path: str) -> int:
    """The most bytes a request body may have on `path` (read at each request: a test may lower it)."""
    upload = path in ("/api/predict_image", "/api/caption")
    return MAX_IMAGE_BYTES + 100_000 if upload else MAX_BODY_BYTES  # + the form's other fields


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
    quantize: str | None = None,
    compiled: bool = False,
    transcoders: list[str | Path] = (),
) -> None:
    """Load `runs` and serve the explorer and the OpenAI-compatible API at http://host:port/ until
    Ctrl-C. Beyond loopback it needs `api_key` (or insecure_no_key); it answers the Host names of
    guard.allowed_hosts_for(host, allowed_hosts)."""
    check_exposure(host, api_key, insecure_no_key)
    access = Access(api_key, allowed_hosts_for(host, allowed_hosts), list(cors_origins or []))
    app = create_app(runs, device, access, limits, quantize, compiled, transcoders)
    sock = listen(host, port)
    if not is_loopback(host) and not api_key:
        print(f"attnlab: warning: --host {host} --insecure-no-key: anyone who reaches this machine can use these runs")
    print(
        f"attnlab: serving {', '.join(app.state.runs)} at {address(sock)}/ (OpenAI-compatible API at "
        f"{address(sock)}/v1{'; key required' if api_key else ''}; Ctrl-C stops)",
        flush=True,
    )
    uvicorn.Server(server_config(app)).run(sockets=[sock])
