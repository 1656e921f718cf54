"""Text generation: greedy, temperature, top-k and top-p (nucleus) sampling.

Legend: T prompt + generated length, C the model's context, V vocabulary.

With the key/value cache (the default) the prompt is run through the model once and each new
token costs one position's work; without it every step re-runs the whole window. When the
sequence outgrows the context, the window jumps forward to its last C/2 tokens and the cache
is refilled from there: both modes follow the same rule, so their greedy outputs are identical.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.config import option
from attnlab.data.tokenizers import Tokenizer
from attnlab.models.gpt import GPT
from attnlab.runtime.device import DTYPE_NAMES, autocast, pick_dtype


@dataclass
class GenerateConfig:
    """Generation settings: kept apart from the model's config, they belong to each call."""

    prompt: str = option("", "text to continue (default: start of a document)")
    max_new_tokens: int = option(200, "how many tokens to generate")
    temperature: float = option(0.8, "divide logits by this; 0 = greedy (always the most likely token)")
    top_k: int | None = option(None, "sample only among the k most likely tokens")
    top_p: float | None = option(None, "sample only among the most likely tokens that make up probability p")
    seed: int | None = option(None, "random seed, for repeatable samples")
    stop: str | None = option(None, "stop when this text is generated")
    use_cache: bool = option(True, "reuse keys/values of past tokens (--no-use-cache recomputes them)")
    dtype: str = option("auto", "auto (bf16 where measured faster here), float32 or bfloat16", DTYPE_NAMES)

    def __post_init__(self):
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)
        if self.stop:  # typed on a command line, "\n" means a newline
            self.stop = self.stop.replace("\\n", "\n").replace("\\t", "\t")


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (0 <= temperature < math.inf):  # NaN fails this too
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if top_p is not None and not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the top k, and outside the smallest set of tokens
    whose probabilities add up to at least top_p. logits: (V,) or (B, V)."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Mass of the tokens ranked above each one; keep a token while that is < top_p, so
        # the most likely token is always kept.
        before = torch.cumsum(probs, dim=-1) - probs
        drop = (before >= top_p).scatter(-1, order, before >= top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_tokens(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> Tensor:
    """The next token of each row of (B, V) logits, (B,); temperature 0 is greedy."""
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(filter_logits(logits.float() / temperature, top_k, top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def next_token(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> int:
    """Pick the next token from (V,) logits (next_tokens on one row: the same draws)."""
    return int(next_tokens(logits[None], temperature, top_k, top_p, generator)[0])


@torch.no_grad()
def stream_rows(
    model: GPT,
    ids: list[int],
    rows: int = 1,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    dtype: str = "auto",
) -> Iterator[Tensor]:
    """Continue the prompt `ids` in `rows` sequences at once, one batched forward per step;
    yield each step's new tokens, (rows,).

    dtype: 'auto' (bf16 autocast where measured faster), 'float32' or 'bfloat16'.
    """
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    model.eval()
    ctx = model.cfg.context
    device = next(model.parameters()).device
    precision = pick_dtype(dtype, device, model.cfg.d_model)
    ids = list(ids)
    if len(ids) > ctx:
        warnings.warn(
            f"prompt of {len(ids)} tokens is longer than the context of {ctx}; keeping the last {ctx}", stacklevel=3
        )
        ids = ids[-ctx:]
    if not ids:
        raise ValueError("generation needs at least one prompt token")
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device).manual_seed(seed)
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
        token = next_tokens(logits[:, -1], temperature, top_k, top_p, gen)  # (rows,)
        window[:, t] = token
        t += 1
        yield token


def stream(
    model: GPT,
    ids: list[int],
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_token: int | None = None,
    use_cache: bool = True,
    dtype: str = "auto",
) -> Iterator[int]:
    """Yield new token ids one by one, continuing the prompt `ids` (see stream_rows)."""
    for step in stream_rows(model, ids, 1, max_new_tokens, temperature, top_k, top_p, seed, use_cache, dtype):
        token = int(step[0])
        yield token
        if token == stop_token:
            return


def sample_texts(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str = "",
    num_samples: int = 1,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: str | None = None,
    use_cache: bool = True,
    dtype: str = "auto",
) -> list[str]:
    """`num_samples` continuations of `prompt`, sampled as one batch (each cut at its own `stop`);
    decoding ends when every row has met its stop or max_new_tokens."""
    ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_id]
    rows: list[list[int]] = [[] for _ in range(num_samples)]
    done = [False] * num_samples
    steps = stream_rows(model, ids, num_samples, max_new_tokens, temperature, top_k, top_p, seed, use_cache, dtype)
    for step in steps:
        for i, token in enumerate(step.tolist()):
            if not done[i]:
                rows[i].append(token)
                done[i] = bool(stop) and stop in tokenizer.decode(rows[i][-len(stop) * 4 - 8 :])
        if all(done):
            break
    texts = [tokenizer.decode(r) for r in rows]
    return [t[: t.index(stop)] if stop and stop in t else t for t in texts]


def generate_text(model: GPT, tokenizer: Tokenizer, prompt: str = "", **kwargs) -> str:
    """Continue `prompt`; return prompt + continuation. Keyword arguments as in `stream_text`."""
    return prompt + "".join(stream_text(model, tokenizer, prompt, **kwargs))


def stream_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str = "",
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: str | None = None,
    use_cache: bool = True,
    dtype: str = "auto",
    on_token: Callable[[int], None] | None = None,
) -> Iterator[str]:
    """Yield the continuation's text piece by piece as tokens are produced, until
    max_new_tokens or the `stop` text (which is not included); on_token(id) sees each token first."""
    ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_id]
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, use_cache=use_cache, dtype=dtype)
    pieces = TextPieces(tokenizer, [stop] if stop else [])
    for token in stream(model, ids, max_new_tokens, **sampling):
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


def jump_keep(context: int) -> int:
    """How many tokens the window keeps when the sequence outgrows the context: the last half."""
    return context // 2


class TextPieces:
    """The text of tokens that come one by one, cut into pieces safe to show as they come.

    A token that leaves a multi-byte character incomplete gives no piece (None) until the
    character is whole; the text ends before the first of the `stops` texts, and a tail that may
    be the start of one is held back (an empty piece) until the next tokens tell. The whole text
    is decoded again at each token, so a tokenizer's merges across tokens are honoured.
    """

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.text = ""  # the text so far, up to its last complete character
        self.emitted = 0  # characters of it given out as pieces
        self.stopped = False

    def add(self, token: int) -> str | None:
        """The piece `token` completes: new text, '' while a tail may start a stop text, None while
        a character is incomplete. After a stop text, `stopped` is set and the piece ends before it."""
        self.ids.append(token)
        decoded = self.tokenizer.decode(self.ids)
        if decoded.endswith("\ufffd"):
            return None
        self.text = decoded
        cut = first_stop(decoded, self.stops)
        end = len(decoded) - max((_held_back(decoded, s) for s in self.stops), default=0) if cut is None else cut
        piece, self.emitted = decoded[self.emitted : end], end
        self.stopped = cut is not None
        return piece

    def flush(self) -> str:
        """The text held back at the end, when no more tokens come."""
        tail, self.emitted = self.text[self.emitted :], len(self.text)
        return tail


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first of the stop texts that occur in `text` begins (None: none occurs)."""
    found = [text.index(s) for s in stops if s in text]
    return min(found) if found else None


def _held_back(text: str, stop: str | None) -> int:
    """Length of the longest end of `text` that is a proper start of `stop` (0 if none)."""
    for k in range(min(len(stop or "") - 1, len(text)), 0, -1):
        if stop.startswith(text[-k:]):
            return k
    return 0
