"""Names a package exposes but loads on first use (PEP 562's module __getattr__).

A package whose names pull in torch (seconds to import on a small machine) lists them here instead of
importing them at the top, so that `attnlab --help`, `attnlab runs` and `import attnlab` start
without it: `from attnlab.data import DataConfig` and `attnlab.data.DataConfig` still work.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# Modules that fill registries a lower floor reads: tasks register the kinds of run (runs.kind.KINDS),
# wordvec the folders `load` leaves to another command, adapter_runs the readers --init takes. The
# package's __init__ names them (it stands above every floor); a lower floor calls fill_registries()
# before it reads one, so `from attnlab.runs.run import load` works as `attnlab.load` does.
REGISTRARS: list[str] = []


def fill_registries() -> None:
    """Import every registrar (once: Python keeps imported modules)."""
    for module in REGISTRARS:
        importlib.import_module(module)


def lazy_names(package: str, names: dict[str, str]) -> tuple[Callable, Callable]:
    """(__getattr__, __dir__) for `package`: names[name] is the module that defines name."""
    scope = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        scope[name] = value  # the next access is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*scope, *names})

    return __getattr__, __dir__
