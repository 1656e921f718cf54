"""The settings of a generation (GenerateConfig: `attnlab sample`'s flags), checked without torch, so
that `attnlab sample --help` and `attnlab chat --help` are built before torch is imported."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass

from attnlab.config import check_seed, check_types, option
from attnlab.errors import ArgumentTypeError, kind

COMPILE_HELP = (
    "compile the decode step (ahead of time with torch.export and AOTInductor, else torch.compile): on "
    "by default, the fastest step for one sequence on a CPU (docs/cpu.md); the first run for a model's "
    "shape compiles it (about a minute on 2 cores, said in one line), later runs load it in a second; "
    "--no-compile decodes without it, and ATTNLAB_COMPILE=0 turns the default off for a whole process"
)
SWITCH = "ATTNLAB_COMPILE"  # "0": no compiled decode step unless one is asked for in code


def compiling(asked: bool) -> bool:
    """Whether a command's decode step is compiled: as its --compile/--no-compile says, unless
    ATTNLAB_COMPILE=0 (a test suite, a machine without a C++ compiler) turns it off."""
    return asked and os.environ.get(SWITCH, "1") != "0"


# Prompt tokens the decoding engine prefills together a turn, between its rows' steps (decoding/prefill.py;
# measured: docs/serving.md, "Prefill"). Here, without torch, for the serve command's --prefill.
PREFILL_BUDGET = 256

# runtime/device.py's DTYPE_NAMES, which names torch's dtypes (tests/test_startup.py holds them equal)
DTYPE_NAMES = ("auto", "float32", "bfloat16")


def check_sampling(
    max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None, seed: int | None = None
) -> None:
    """The settings of a generation, each of its type and range (a library caller's "5" is named)."""
    for name, value, number in (
        ("max_new_tokens", max_new_tokens, numbers.Integral),
        ("temperature", temperature, numbers.Real),
        ("top_k", top_k, numbers.Integral),
        ("top_p", top_p, numbers.Real),
        ("seed", seed, numbers.Integral),
    ):
        if value is not None and (not isinstance(value, number) or isinstance(value, bool)):
            expected = "a whole number" if number is numbers.Integral else "a number"
            raise ArgumentTypeError(f"{name}: expected {expected}, got {kind(value)}")
    check_seed("seed", seed)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not (0 <= temperature < math.inf):  # NaN fails this too
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if top_p is not None and not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


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
    dtype: str = option(
        "auto", "auto (on a CPU bf16 where measured faster here; float32 on a GPU), float32 or bfloat16", DTYPE_NAMES
    )
    compile: bool = option(True, COMPILE_HELP)

    def __post_init__(self):
        check_types(self)
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p, self.seed)
        if self.stop:  # typed on a command line, "\n" means a newline
            self.stop = self.stop.replace("\\n", "\n").replace("\\t", "\t")
