"""Work spread over the machine's cores: an ordered map over worker processes.

Used where a pure-Python/numpy step is the bottleneck of a pass over a corpus and its result
is small (the character tokenizer's alphabet: the distinct code points of each piece). Results come back in input
order, and only a few items are in flight at once, so memory stays bounded however long the
input stream is.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def ordered_map(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    workers: int,
) -> Iterator[Any]:
    """fn(item) for each item, in order, computed by `workers` processes (in this one if <= 1).

    Worth it when fn's result is small next to its work: items and results travel between
    processes by pickling. At most 2 * workers items are in flight.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    # fork starts workers in milliseconds and shares the parent's memory copy-on-write;
    # where there is no fork (macOS defaults, Windows) spawn re-imports the modules instead.
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(workers, mp_context=mp.get_context(method)) as pool:
        pending: deque = deque()
        try:
            for item in items:
                with warnings.catch_warnings():  # 3.12+ warns on fork when threads exist; the
                    # workers only run numpy and Python, never the parent's thread pools
                    warnings.filterwarnings("ignore", ".*fork.*", DeprecationWarning)
                    pending.append(pool.submit(fn, item))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # stopped early (an error, Ctrl-C, a consumer that broke off): drop queued work
            for f in pending:
                f.cancel()
