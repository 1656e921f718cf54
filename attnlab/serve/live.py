"""Attention while text streams: each generated token comes with where the model looked to write it.

Legend: L layers, H heads, Tk the tokens before the new one (in the model's window).

The row is the attention of the last query of the forward pass that produced the token (the
newest token fed, or the prompt's last), averaged over the heads: one (Tk,) row per layer. The
hooks that read it make decoding take the attention path that writes its probabilities out, so
a generation with attention is slower than one without; the rows are the ones the model used.

Hooks fire only in the thread that set them (nn/hooks.py), and a web server may hand a streaming
response's steps to different threads; so the whole generation runs in one thread of its own,
passing its lines to the response through a queue (`in_one_thread`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from torch import Tensor, nn

from attnlab.nn.hooks import hooks, taps

DECIMALS = 3
_END = object()


class LiveAttention:
    """Hooks that keep, for each layer, the newest query's attention row (mean over heads)."""

    def __init__(self, model: nn.Module):
        self.names = [n for n in taps(model) if n.startswith("blocks.") and n.endswith(".attn.hook_pattern")]
        self.rows: list[Tensor | None] = [None] * len(self.names)

    def hooks(self) -> dict[str, Callable]:
        def keep(layer: int):
            def fn(pattern: Tensor) -> None:  # (B, H, Tq, Tk): the newest query is the last row
                self.rows[layer] = pattern[0, :, -1].float().mean(0)  # (Tk,)

            return fn

        return {name: keep(i) for i, name in enumerate(self.names)}

    def latest(self) -> list[list[float]]:
        """(L, Tk): each layer's row from the last forward pass."""
        return [[round(float(w), DECIMALS) for w in row] for row in self.rows if row is not None]


def in_one_thread(make: Callable[[], Iterator], model: nn.Module, fns: dict[str, Callable]) -> Iterator:
    """Run the iterator make() returns in one new thread, with `fns` hooked on `model` there, and
    yield its items here as they come (an exception is re-raised here)."""
    lines: queue.Queue = queue.Queue(maxsize=64)
    stop = threading.Event()  # set when the reader goes away: the producer ends at its next item

    def produce() -> None:
        try:
            with hooks(model, fns):
                for item in make():
                    if stop.is_set():
                        return
                    lines.put(item)
        except Exception as e:  # handed to the reader, raised there
            lines.put(e)
        finally:
            lines.put(_END)

    threading.Thread(target=produce, daemon=True, name="attnlab-live-attention").start()
    try:
        while (item := lines.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        stop.set()
        while not lines.empty():  # unblock a producer waiting on a full queue
            lines.get_nowait()
