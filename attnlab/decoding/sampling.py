"""Text generation: greedy, temperature, top-k and top-p (nucleus) sampling.

Legend: T prompt + generated length, C the model's context, V vocabulary.

With the key/value cache (the default) a sequence is decoded by the model's one engine (engine.py),
batched with whatever else that model is decoding (other samples, the explorer, /v1), and gets the
tokens it gets alone: the prompt is run through the model once and each new token costs one
position's work. `stream_rows` is that lone loop written out, and what use_cache=False runs: every
step re-runs the whole window. When the sequence outgrows the context, the window jumps forward to
its last C/2 tokens and the cache is refilled from there: both follow the same rule, so their greedy
outputs are identical.

A sequence without a seed draws one from torch's random state, so torch.manual_seed still makes it
repeatable.

How tokens are drawn is a Draw (settings.py), what else a generation asks a GenerateConfig (a Draw
with the length, stop text, cache, precision and compile switch); these functions take one, or
their fields as keywords (run.generate(prompt, temperature=0.5, seed=1) as before), turned into one
by `settings_of`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import torch
from torch import Tensor

from attnlab.data.tokenizers import Tokenizer
from attnlab.decoding.draw import Draw, filter_logits, jump_keep, next_token, next_tokens, seed_of
from attnlab.decoding.engine import engine_for
from attnlab.decoding.pieces import TextPieces, first_stop
from attnlab.decoding.settings import GenerateConfig, check_length
from attnlab.decoding.speculate import speculation
from attnlab.errors import ArgumentTypeError, AttnlabError, kind
from attnlab.models.protocols import CausalLM
from attnlab.runtime.device import autocast, pick_dtype

T = TypeVar("T")

__all__ = [
    "Draw",
    "GenerateConfig",
    "TextPieces",
    "filter_logits",
    "first_stop",
    "generate_text",
    "next_token",
    "next_tokens",
    "read_in_turn",
    "read_together",
    "sample_texts",
    "stream",
    "stream_rows",
    "stream_text",
]


def settings_of(config: GenerateConfig | None, settings: dict[str, Any], **defaults: Any) -> GenerateConfig:
    """The one GenerateConfig of a call: `config` with the keyword settings on top, or the settings
    alone over `defaults` (each function's own: stream() draws 100 tokens at temperature 1; the Python
    API compiles nothing unless asked). An unknown keyword is named in one line."""
    try:
        return GenerateConfig(**{**defaults, **settings}) if config is None else replace(config, **settings)
    except TypeError as e:
        if "unexpected keyword" not in str(e):
            raise
        unknown = sorted(set(settings) - set(GenerateConfig.__dataclass_fields__))
        raise ArgumentTypeError(f"unknown generation setting {', '.join(unknown)}; see GenerateConfig") from None


@torch.no_grad()
def stream_rows(
    model: CausalLM,
    ids: list[int],
    rows: int = 1,
    max_new_tokens: int = 100,
    draw: Draw | None = None,
    use_cache: bool = True,
    dtype: str = "auto",
    **settings: Any,
) -> Iterator[Tensor]:
    """Continue the prompt `ids` in `rows` sequences at once, one batched forward per step;
    yield each step's new tokens, (rows,). draw: how (or Draw's fields as keywords; default
    temperature 1).

    dtype: 'auto' (bf16 autocast where measured faster on a CPU; float32 on a GPU), 'float32' or 'bfloat16'.
    """
    draw = draw or Draw(**{"temperature": 1.0, **settings})
    check_length(max_new_tokens)
    model.eval()
    ctx = model.cfg.context
    device = next(model.parameters()).device
    precision = pick_dtype(dtype, device, model.cfg.d_model, use="decode")
    ids = list(ids)
    if len(ids) > ctx:
        warnings.warn(
            f"prompt of {len(ids)} tokens is longer than the context of {ctx}; keeping the last {ctx}", stacklevel=3
        )
        ids = ids[-ctx:]
    if not ids:
        raise ValueError("generation needs at least one prompt token")
    gen = None
    if draw.seed is not None:
        gen = torch.Generator(device=device).manual_seed(draw.seed)
    # The tokens the model sees, written in place (no new tensor per step): at most a full context,
    # plus the slot of the token being drawn. Every row has the same length.
    window = torch.empty(rows, ctx + 1, dtype=torch.long, device=device)  # (rows, C + 1)
    window[:, : len(ids)] = torch.tensor(ids, device=device)
    t, caches, fed = len(ids), None, 0  # tokens in the window; of them, already in the cache
    for _ in range(max_new_tokens):
        if t > ctx:  # the window is full: jump ahead, keep the last half
            keep = jump_keep(ctx)
            window[:, :keep] = window[:, t - keep : t].clone()
            t, caches, fed = keep, None, 0
        with autocast(device, precision):
            if use_cache:
                if caches is None:
                    caches = model.new_caches(ctx)
                logits = model(window[:, fed:t], caches=caches, offset=fed)  # (rows, T_new, V)
                fed = t
            else:
                logits = model(window[:, :t])  # (rows, T, V)
        token = next_tokens(logits[:, -1], draw.temperature, draw.top_k, draw.top_p, gen)  # (rows,)
        window[:, t] = token
        t += 1
        yield token


def stream(
    model: CausalLM,
    ids: list[int],
    max_new_tokens: int | None = None,
    config: GenerateConfig | None = None,
    **settings: Any,
) -> Iterator[int]:
    """Yield new token ids one by one, continuing the prompt `ids`: decoded by the model's engine (with
    the cache), the tokens stream_rows draws for one row with this seed; without the cache, stream_rows.
    config (or its fields as keywords; defaults: 100 tokens, temperature 1, not compiled): how; its
    compile: the engine's one-token steps compiled (decoding/compiled.py)."""
    if max_new_tokens is not None:
        settings["max_new_tokens"] = max_new_tokens
    cfg = settings_of(config, settings, max_new_tokens=100, temperature=1.0, compile=False)
    draw = replace(Draw.of(cfg), seed=seed_of(cfg.seed))
    if cfg.use_cache:
        ids = _cropped(list(ids), model.cfg.context)
        engine = engine_for(model, cfg.dtype, compiled=cfg.compile)
        ask = speculation(cfg.speculate, cfg.draft_tokens)  # drafts checked in one pass (speculate.py)
        yield from (step.token for step in engine.generate(ids, draw, cfg.max_new_tokens, speculate=ask))
    else:
        rows = stream_rows(model, ids, 1, cfg.max_new_tokens, draw, False, cfg.dtype)
        yield from (int(step[0]) for step in rows)


def _cropped(ids: list[int], context: int) -> list[int]:
    if len(ids) > context:
        warnings.warn(
            f"prompt of {len(ids)} tokens is longer than the context of {context}; keeping the last {context}",
            stacklevel=4,
        )
    return ids[-context:]


def sample_texts(
    model: CausalLM, tokenizer: Tokenizer, prompt: str = "", num_samples: int = 1, seed: int | None = None, **kw
) -> list[str]:
    """`num_samples` continuations of `prompt`, decoded together: sample i draws with seed + i (what
    stream_text gives with that seed), each cut at its own `stop`. Other keyword arguments (length,
    temperature, top-k/top-p, stop, use_cache, dtype) as in `stream_text`."""
    base = seed_of(seed)
    return read_together([stream_text(model, tokenizer, prompt, seed=base + i, **kw) for i in range(num_samples)])


def read_in_turn(streams: list[Iterator[T]]) -> list[list[T]]:
    """Every item of each stream, read one item of each in turn: the engine decodes every row each
    turn, so reading them in turn never waits long."""
    items: list[list[T]] = [[] for _ in streams]
    live = dict(enumerate(streams))
    while live:
        for i, s in list(live.items()):
            item = next(s, None)
            if item is None:
                del live[i]
            else:
                items[i].append(item)
    return items


def read_together(streams: list[Iterator[str]]) -> list[str]:
    """The whole text of each stream, read one piece of each in turn (read_in_turn)."""
    return ["".join(pieces) for pieces in read_in_turn(streams)]


def generate_text(model: CausalLM, tokenizer: Tokenizer, prompt: str = "", **kwargs) -> str:
    """Continue `prompt`; return prompt + continuation. Keyword arguments as in `stream_text`."""
    return prompt + "".join(stream_text(model, tokenizer, prompt, **kwargs))


def stream_text(
    model: CausalLM,
    tokenizer: Tokenizer,
    prompt: str = "",
    config: GenerateConfig | None = None,
    on_token: Callable[[int], None] | None = None,
    stop_token: int | None = None,
    **settings: Any,
) -> Iterator[str]:
    """Yield the continuation's text piece by piece as tokens are produced, until max_new_tokens, the
    `stop` text or the token `stop_token` (neither included); on_token(id) sees each token first.
    config, or its fields as keywords (max_new_tokens=200, temperature=0.8, top_k, top_p, seed, stop,
    use_cache, dtype, compile=False): how (GenerateConfig; its prompt is not read: `prompt` is)."""
    stop = settings.get("stop", None if config is None else config.stop)
    for name, text in (("prompt", prompt), ("stop", stop)):
        if text is not None and not isinstance(text, str):
            raise ArgumentTypeError(f"{name}: expected a text (str), got {kind(text)}")
    if not prompt and tokenizer.eot_id is None:  # a converted Llama's tokenizer has no <|endoftext|> to start from
        raise AttnlabError(
            "an empty prompt starts from the end-of-text token, which this run's tokenizer does not have: give a prompt"
        )
    ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_id]
    cfg = settings_of(config, settings, compile=False)
    pieces = TextPieces(tokenizer, [cfg.stop] if cfg.stop else [])
    for token in stream(model, ids, cfg.max_new_tokens, config=cfg):
        if token == stop_token and stop_token is not None:  # the end of a text: not part of it
            break
        if on_token is not None:
            on_token(token)
        piece = pieces.add(token)
        if piece is None:
            continue  # a multi-byte character is still incomplete
        yield piece
        if pieces.stopped:
            return
    tail = pieces.flush()  # the end came while a possible start of a stop text was held back
    if tail:
        yield tail
