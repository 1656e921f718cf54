"""The streamed answers of the explorer: NDJSON lines of a generation (with attention, if asked) and
of a caption, each ending in a `done` line, or an error line when the status line is long gone."""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine
from attnlab.decoding.pieces import TextPieces
from attnlab.decoding.settings import GenerateConfig
from attnlab.errors import one_line
from attnlab.interpret.views import token_labels
from attnlab.runs.run import Run
from attnlab.viz.captions import caption_json


def live_lines(run: Run, cfg: GenerateConfig, engine: Engine) -> Iterator[dict]:
    """/api/generate's lines with attention: {"prompt_tokens": [...]} first, then per piece {"text",
    "tokens": the tokens it holds, "attention": (L, Tk) the newest query's weights, mean of heads}.
    Decoded by the run's engine (Served.engine) like every generation, alone: it asks for each step's
    attention, which the ordinary forward gives."""
    tok = run.tokenizer
    ids = (tok.encode(cfg.prompt) if cfg.prompt else [tok.eot_id])[-run.model.cfg.context :]
    steps = engine.generate(ids, Draw.of(cfg), cfg.max_new_tokens, attention=True)
    yield {"prompt_tokens": token_labels(tok, ids)}
    pieces, new, seen = TextPieces(tok, [cfg.stop] if cfg.stop else []), [], []
    for step in steps:
        new.append(step.token)
        seen, piece = step.attention, pieces.add(step.token)
        if piece is None:
            continue  # a multi-byte character is still incomplete
        yield {"text": piece, "tokens": token_labels(tok, new), "attention": seen}
        new.clear()
        if pieces.stopped:
            return
    tail = pieces.flush()  # the end came while a possible start of a stop text was held back
    if tail:
        yield {"text": tail, "tokens": token_labels(tok, new), "attention": seen}


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


def once(fn: Callable[[], None]) -> Callable[[], None]:
    """fn, made to run at most once however many times, and from however many threads, it is called."""
    first = threading.Lock()  # taken by the first call, never given back

    def call() -> None:
        if first.acquire(blocking=False):
            fn()

    return call
