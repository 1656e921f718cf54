"""Threads sharing one set of vectors without locks (Hogwild, Niu et al. 2011), as word2vec does.

The compiled training loops release the GIL, so Python threads run them side by side on every
core; updates of the same row by two threads at once are rare and harmless to SGD.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_POOLS: dict[int, ThreadPoolExecutor] = {}  # kept between calls: a pool per thread count


def hogwild(fn: Callable[[Any], Any], items: Iterable, threads: int) -> list:
    """fn over items, `threads` at a time (in order, in this thread, when threads is 1: repeatable)."""
    if threads <= 1:
        return [fn(item) for item in items]
    pool = _POOLS.setdefault(threads, ThreadPoolExecutor(threads, thread_name_prefix="attnlab-vectors"))
    return list(pool.map(fn, items))
