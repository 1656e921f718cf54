"""The local web explorer: `attnlab serve RUN [RUN ...]`, a page and a JSON API over trained runs.

API (FastAPI; request schemas at /openapi.json). Every error is JSON {"error": "one line"}:
400 a user error (wrong task for the run, text with no tokens, unreadable image or one over
MAX_PIXELS, checked from its header), 404 an unknown run, 413 a body over MAX_BODY_BYTES (an image
over MAX_IMAGE_BYTES), refused before it is read, 422 a request off its schema (bad JSON, a text over
MAX_INPUT_CHARS characters, max_new_tokens over MAX_NEW_TOKENS), 500 anything else (logged; the
server keeps serving).

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
  POST /api/inspect              {run, text, what} -> interpret/report.py's numbers: what = lens, heads,
                                 ablate (GPT runs), rollout or flow (any text run)
  POST /api/attention            {run, text} -> {views: [{name, queries, keys, weights (L, H, Tq, Tk)}]}, and
                                 for a mixture of experts experts: {tokens, experts (L, T), gates (L, T), n}

FastAPI's /docs page is left on: it loads Swagger UI from a CDN, so it needs the network.

Concurrency: requests share only the loaded runs, which they read (inference under no_grad).
Each generation samples from its own torch.Generator, seeded from the request or, without one,
from a seed drawn for it (and returned), never from torch's global RNG: so requests need no
lock, and a seed always gives the same text.
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import torch
from fastapi import FastAPI, File, Form, HTTPException, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnlab import __version__
from attnlab.decoding.sampling import stream_text
from attnlab.errors import AttnlabError
from attnlab.interpret.report import WHAT, inspect
from attnlab.run import Run, load
from attnlab.serve.page import page
from attnlab.tasks.image import load_image, predict_image
from attnlab.viz.curves import read_metrics
from attnlab.viz.experts import routing_json
from attnlab.viz.html import views_json
from attnlab.viz.views import views

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


def create_app(runs: list[str | Path], device: str = "cpu") -> FastAPI:
    """The explorer's app over the run directories `runs`, loaded once onto `device`."""
    served = load_runs(runs, device)
    app = FastAPI(title="attnlab explorer", version=__version__, description="Trained runs: generate, predict, "
                  "see attention. Every error is {\"error\": \"one line\"}.")  # fmt: skip
    app.state.runs = list(served)  # the names
    add_error_handlers(app)
    app.add_middleware(BodyLimit)
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
        seed = secrets.randbelow(2**53) if req.seed is None else req.seed  # 2**53: exact as a JavaScript number
        t0 = time.perf_counter()
        sampling = (req.max_new_tokens, req.temperature, req.top_k, req.top_p, seed, req.stop)
        if req.attention:
            lines = live_lines(s.run, req.prompt, sampling)
        else:
            lines = ({"text": p} for p in stream_text(s.run.model, s.run.tokenizer, req.prompt, *sampling))
        # The first line is made here, so that an error before it still gets its status code.
        first = next(lines, None)
        return StreamingResponse(ndjson(first, lines, seed, t0), media_type=NDJSON)

    @app.post("/api/predict", summary="a classifier's label, a tagger's tags, a masked LM's fills, a translation")
    def predict_text(req: PredictRequest) -> dict:
        s = find(req.run, "/api/predict")
        return predict(s.run, req.text, {"top_k": req.top_k, "beam": req.beam})

    @app.post("/api/predict_image", summary="an image run's label for an uploaded image, and its attention")
    def predict_upload(run: Annotated[str, Form()], image: Annotated[UploadFile, File()]) -> dict:
        s = find(run, "/api/predict_image")
        data = image.file.read(MAX_IMAGE_BYTES + 1)
        if len(data) > MAX_IMAGE_BYTES:
            raise HTTPException(413, f"the image is over {MAX_IMAGE_BYTES // 1_000_000} MB")
        with tempfile.TemporaryDirectory() as tmp:  # the library reads image files
            path = Path(tmp) / "upload"
            path.write_bytes(data)
            del data
            try:
                pixels = load_image(s.run, path)  # decoded once, for the label and the attention
            except AttnlabError as e:  # name the user's file, not ours
                raise AttnlabError(str(e).replace(str(path), image.filename or "the upload")) from None
        out = predict_image(s.run, pixels, top=3, name=image.filename)
        out["attention"] = cls_attention(s.run, pixels)
        return {**out, "image": image.filename}

    @app.post("/api/inspect", summary="inside the model: logit lens, head detectors, head ablation, rollout, flow")
    def inspect_text(req: InspectRequest) -> dict:
        s = find(req.run)
        if not s.run.task.tokenized:
            raise AttnlabError(f"{req.run} is {s.run.task.noun} run: use attnlab inspect RUN IMAGE --what rollout")
        return inspect(s.run, req.text, req.what)

    @app.post("/api/attention", summary="every attention map of a run on a text, for the head and model views")
    def attention(req: TextRequest) -> dict:
        s = find(req.run)
        if not s.run.task.tokenized:  # an image: its attention comes with its prediction
            raise AttnlabError(f"{req.run} is {s.run.task.noun} run: send the image to {s.run.task.endpoint}, "
                               "whose answer has [CLS]'s attention")  # fmt: skip
        return views_json(views(s.run, req.text), routing_json(s.run, req.text))

    return app


def predict(run: Run, text: str, options: dict) -> dict:
    """What the run's task answers for a text: a label, tags, [MASK] fills or a translation."""
    return run.task.predict(run, text, options)


def live_lines(run: Run, prompt: str, sampling: tuple) -> Iterator[dict]:
    """/api/generate's lines with attention: {"prompt_tokens": [...]} first, then per piece {"text",
    "tokens": the tokens it holds, "attention": (L, Tk) the newest query's weights, mean of heads}."""
    from attnlab.serve.live import LiveAttention, in_one_thread
    from attnlab.viz.views import token_labels

    tok, live, new = run.tokenizer, LiveAttention(run.model), []
    ids = (tok.encode(prompt) if prompt else [tok.eot_id])[-run.model.cfg.context :]

    def make() -> Iterator[dict]:
        yield {"prompt_tokens": token_labels(tok, ids)}
        for piece in stream_text(run.model, tok, prompt, *sampling, on_token=new.append):
            yield {"text": piece, "tokens": token_labels(tok, new), "attention": live.latest()}
            new.clear()

    return in_one_thread(make, run.model, live.hooks())


def ndjson(first: dict | None, lines: Iterator[dict], seed: int, t0: float) -> Iterator[str]:
    """The lines of /api/generate. tokens counts the pieces: one per token, except that a character
    split over several byte-level tokens comes as one piece."""
    n = 0
    try:
        for line in itertools.chain([] if first is None else [first], lines):
            n += "text" in line
            yield json.dumps(line, ensure_ascii=False) + "\n"
    except Exception as e:  # the status line is long gone: the error is the last line
        yield json.dumps({"error": one_line(e)}) + "\n"
        return
    seconds = round(time.perf_counter() - t0, 4)
    yield json.dumps({"done": True, "tokens": n, "seconds": seconds, "seed": seed}) + "\n"


@torch.no_grad()
def cls_attention(run: Run, pixels) -> dict | None:
    """[CLS]'s attention over the patches of a ViT, {grid: [rows, cols], weights (L, H, rows, cols)};
    None for the MLP, which has none."""
    if not hasattr(run.model, "attention"):
        return None
    from attnlab.viz.patches import cls_maps

    x = torch.from_numpy(pixels)[None].to(run.device)  # (1, C, H, W)
    grid = run.model.cfg.grid
    weights = cls_maps([w[0] for w in run.model.attention(x)], grid)  # (L, H, rows, cols)
    return {"grid": list(grid), "weights": weights.tolist()}


def finite(row: dict) -> dict:
    """JSON has no NaN or infinity: a diverged loss is sent as null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


class BodyLimit:
    """Refuse a request body over its limit before reading it (by its Content-Length), or as soon
    as a body sent without one passes the limit: a 200 MB body never sits in memory."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = scope["path"] == "/api/predict_image"
        limit = MAX_IMAGE_BYTES + 100_000 if upload else MAX_BODY_BYTES  # the form's other fields
        what = f"{limit / 1e6:g} MB" if upload else f"{limit / 1e3:g} KB"
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > limit:
            return await _error(413, f"the request body is over {what}")(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise StarletteHTTPException(413, f"the request body is over {what}")
            return message

        return await self.app(scope, limited, send)


# ---- errors: one JSON shape for all -----------------------------------------------------------


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


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
    app.add_exception_handler(AttnlabError, lambda request, e: _error(400, one_line(e)))
    app.add_exception_handler(RequestValidationError, lambda request, e: _error(422, invalid(e)))
    app.add_exception_handler(
        StarletteHTTPException, lambda request, e: _error(e.status_code, str(e.detail), getattr(e, "headers", None))
    )
    # Anything else is a bug: the client gets one line, the log the traceback, and the server goes on.
    app.add_exception_handler(
        Exception, lambda request, e: _error(500, f"internal error: {type(e).__name__}: {one_line(e)}")
    )


# ---- running it -------------------------------------------------------------------------------


def serve(runs: list[str | Path], host: str = "127.0.0.1", port: int = 8765, device: str = "auto") -> None:
    """Load `runs` and serve the explorer at http://host:port/ until Ctrl-C."""
    import uvicorn

    app = create_app(runs, device)
    sock = listen(host, port)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"attnlab: warning: --host {host} lets other machines use these runs; there is no login")
    print(f"attnlab: serving {', '.join(app.state.runs)} at {address(sock)}/ (Ctrl-C stops)", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


@contextmanager
def running(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` from a background thread for the with-block (a notebook, a test); yields its URL.
    Port 0 takes a free port."""
    import uvicorn

    sock = listen(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
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
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
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
