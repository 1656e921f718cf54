"""Data: where text comes from, and the token caches training reads."""

from attnlab.data.text import DataConfig, read_texts, resolve_sources, stdlib_files
from attnlab.data.tokens import TokenData, build_token_cache, workers_for

__all__ = [
    "DataConfig",
    "TokenData",
    "build_token_cache",
    "read_texts",
    "resolve_sources",
    "stdlib_files",
    "workers_for",
]
