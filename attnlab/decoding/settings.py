"""The settings of a generation: how tokens are drawn (Draw, the one sampling schema) and the rest of
`attnlab sample`'s flags (GenerateConfig), checked without torch, so that `attnlab sample --help` and
`attnlab chat --help` are built before torch is imported."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, fields

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
PREFILL_BUDGET = 64

# runtime/device.py's DTYPE_NAMES, which names torch's dtypes (tests/test_startup.py holds them equal)
DTYPE_NAMES = ("auto", "float32", "bfloat16")


@dataclass
class Draw:
    """How one sequence picks its tokens (decoding/draw.py next_tokens: greedy, temperature, top-k,
    top-p) and the seed of its generator: the one sampling schema. The command line's flags
    (GenerateConfig, cli ChatOptions), the explorer's request and the engine's rows take these fields
    from here; the OpenAI wire format maps to it in one place (serve/openai_schema.py Sampling.draw)."""

    temperature: float = option(0.8, "divide logits by this; 0 = greedy (always the most likely token)")
    top_k: int | None = option(None, "sample only among the k most likely tokens")
    top_p: float | None = option(None, "sample only among the most likely tokens that make up probability p")
    seed: int | None = option(None, "random seed, for repeatable samples (default: one drawn from torch's state)")

    def __post_init__(self):
        """Each setting of its type and range, one line each (a library caller's "5" is named)."""
        for name, number in (("temperature", numbers.Real), ("top_k", numbers.Integral), ("top_p", numbers.Real)):
            check_number(name, getattr(self, name), number)
        check_number("seed", self.seed, numbers.Integral)
        check_seed("seed", self.seed)
        if not (0 <= self.temperature < math.inf):  # NaN fails this too
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @classmethod
    def of(cls, settings: object) -> Draw:
        """The Draw of anything that carries its fields (GenerateConfig, ChatOptions): a Draw only."""
        return cls(*(getattr(settings, f.name) for f in fields(cls)))


def check_number(name: str, value: object, number: type) -> None:
    """None, or a number of that kind (a bool is not one)."""
    if value is not None and (not isinstance(value, number) or isinstance(value, bool)):
        expected = "a whole number" if number is numbers.Integral else "a number"
        raise ArgumentTypeError(f"{name}: expected {expected}, got {kind(value)}")


def check_length(max_new_tokens: int) -> None:
    """A generation's length in tokens: a whole number >= 0."""
    check_number("max_new_tokens", max_new_tokens, numbers.Integral)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")


SPECULATE_MODES = ("off", "prompt", "draft", "auto")  # decoding/speculate.py MODES


@dataclass
class Speculates:
    """Speculative decoding's switches (decoding/speculate.py), for sample, chat and serve."""

    speculate: str = option(
        "off",
        "draft tokens and check them in one forward pass when a sequence is decoded alone: prompt (copies "
        "from the text so far), draft (the --draft model), auto (prompt where it finds a match, else the "
        "draft model); greedy output is the same tokens, sampled output the same distribution; drafting "
        "backs off where it does not pay (docs/cpu.md)",
        SPECULATE_MODES,
    )
    draft_tokens: int = option(4, "--speculate: the most tokens drafted a pass", at_least=1, metavar="K")

    def check_speculation(self) -> None:
        if self.speculate not in SPECULATE_MODES:
            raise ValueError(f"speculate must be one of {', '.join(SPECULATE_MODES)}, got {self.speculate!r}")
        check_number("draft_tokens", self.draft_tokens, numbers.Integral)
        if self.draft_tokens < 1:
            raise ValueError(f"draft_tokens must be at least 1, got {self.draft_tokens}")


@dataclass
class GenerateConfig(Speculates, Draw):
    """Generation settings: kept apart from the model's config, they belong to each call. The draw's
    fields come from Draw."""

    prompt: str = option("", "text to continue (default: start of a document)")
    max_new_tokens: int = option(200, "how many tokens to generate")
    stop: str | None = option(None, "stop when this text is generated")
    use_cache: bool = option(True, "reuse keys/values of past tokens (--no-use-cache recomputes them)")
    dtype: str = option(
        "auto", "auto (on a CPU bf16 where measured faster here; float32 on a GPU), float32 or bfloat16", DTYPE_NAMES
    )
    compile: bool = option(True, COMPILE_HELP)

    def __post_init__(self):
        super().__post_init__()  # the draw's and the length's own words first ("seed: expected a whole number")
        check_length(self.max_new_tokens)
        self.check_speculation()
        check_types(self)
        if self.stop:  # typed on a command line, "\n" means a newline
            self.stop = self.stop.replace("\\n", "\n").replace("\\t", "\t")
