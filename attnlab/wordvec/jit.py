"""numba's njit, deferred: the word-vector loops are compiled on their first call, so that numba (0.8 s
to import) is paid by training word vectors alone, not by every attnlab command.

    @njit(cache=True, nogil=True)
    def _train_chunk(...): ...          # a plain Python function until it is first called

On the first call of any deferred function, every deferred function of its module becomes a numba
dispatcher in the module's namespace, so that the compiled loops call each other compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Deferred:
    """A function to be compiled by numba.njit(**options) when it is first called."""

    def __init__(self, fn: Callable, options: dict[str, Any]):
        self.fn, self.options = fn, options
        self.dispatcher: Callable | None = None
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def __call__(self, *args: Any) -> Any:
        if self.dispatcher is None:
            compile_module(self.fn.__globals__)
        return self.dispatcher(*args)


def compile_module(namespace: dict[str, Any]) -> None:
    """Replace every Deferred function of a module by its numba dispatcher (numba compiles each on its
    first call with the types it gets; calls between them resolve through these names)."""
    import numba  # numba: 0.8 s to import, paid only when word vectors train

    for name, value in list(namespace.items()):
        if isinstance(value, Deferred):
            value.dispatcher = value.dispatcher or numba.njit(**value.options)(value.fn)
            namespace[name] = value.dispatcher


def njit(**options: Any) -> Callable[[Callable], Deferred]:
    """numba.njit(**options), compiled on first call (see the module's docstring)."""
    return lambda fn: Deferred(fn, options)
