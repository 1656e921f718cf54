"""Moved to attnlab/quant/quantize.py: this old path re-exports it until lessons/ import the new one."""

from attnlab.quant.quantize import *  # noqa: F403  (allowed upward by tests/test_layers.py SHIMS)
