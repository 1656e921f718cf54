"""Data: where text comes from, and the token caches training reads.

Its names load on first use (attnlab/lazy.py): the chat-template limits (data/template_limits.py)
build `attnlab --help` without the token caches' torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.lazy import lazy_names

if TYPE_CHECKING:
    from attnlab.data.text import DataConfig, read_texts, resolve_sources, stdlib_files
    from attnlab.data.tokens import TokenData, build_token_cache, workers_for

TEXT = dict.fromkeys(("DataConfig", "read_texts", "resolve_sources", "stdlib_files"), "attnlab.data.text")
TOKENS = dict.fromkeys(("TokenData", "build_token_cache", "workers_for"), "attnlab.data.tokens")
__getattr__, __dir__ = lazy_names(__name__, TEXT | TOKENS)

__all__ = [
    "DataConfig",
    "TokenData",
    "build_token_cache",
    "read_texts",
    "resolve_sources",
    "stdlib_files",
    "workers_for",
]
