"""A HuggingFace config.json checked against the weights beside it, before any model is built.

config.json comes with the checkpoint, from whoever made it, and every number in it says how much
to build: a config of a million layers, a vocabulary of 10^9 or a context of 10^12 would cost
minutes or terabytes before anything noticed it does not match the files. So, in this order:

    keys      each value config.json gives is of the right kind (a size a whole number >= 1, an
              epsilon a finite number > 0, a dropout rate in [0, 1)); each family declares its KEYS
    sections  what would change the arithmetic and that attnlab does not compute (rope_scaling,
              quantization_config, ...) is refused by name, unless absent or neutral
    sizes     layers, width, vocabulary, positions, experts and labels equal what the tensors'
              shapes hold (each family's `sizes`)
    context   positions that are no table in the files (rotary) at most MAX_CONTEXT
    count     the parameters config.json implies at most the values the files hold
All from names and shapes alone (safetensors headers: interop/hf/io.py), so a refusal costs
milliseconds whatever the numbers.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from attnlab.errors import AttnlabError
from attnlab.interop.hf import module_for
from attnlab.models import family_classes

Shapes = dict[str, tuple[int, ...]]  # the files' tensors by HuggingFace name: their shapes only

# The longest context of positions that are no table in the files (rotary), 2^20. attnlab allocates
# for the whole context when it decodes: a sequence's key/value cache (decoding/slots.py, the compiled
# step), at 2^20 for a Llama-3-8B shape (32 layers x 8 key/value heads of 128) 128 GiB in bfloat16,
# a whole large GPU's memory, and the rotary table (cos and sin, float32: 512 MiB for heads of 128). Models tuned
# longer with default angles exist; no one device decodes them at their whole context.
MAX_CONTEXT = 2**20

# Sections that change what the model computes and that no family here computes: refused by name
# unless absent, null or neutral (section -> (neutral?, why not)). rope_scaling is rotary angles on
# another schedule (linear, dynamic, YaRN, Llama 3.1's); quantization_config packs the weights (GPTQ,
# AWQ, bitsandbytes) into other tensors; transformers reads partial_rotary_factor for any rotary model.
ROPE = "attnlab computes the default rotary angles only"
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "rope_scaling": (lambda v: v is None or (isinstance(v, dict) and _default_rope(v)), ROPE),
    "rope_parameters": (lambda v: v is None or (isinstance(v, dict) and _default_rope(v)), ROPE),
    "quantization_config": (
        lambda v: v is None,
        "attnlab reads unquantized weights: convert the model before it was quantized",
    ),
    "partial_rotary_factor": (lambda v: v is None or v == 1, "attnlab rotates every feature of a head"),
    "use_sliding_window": (lambda v: v is None or v is False, "attnlab's attention sees the whole context"),
    "layer_types": (
        lambda v: v is None or (isinstance(v, list) and all(t == "full_attention" for t in v)),
        "attnlab's attention sees the whole context in every layer",
    ),
    "attn_logit_softcapping": (lambda v: v is None, "attnlab does not cap attention scores"),
    "final_logit_softcapping": (lambda v: v is None, "attnlab reads no capped logits from HuggingFace"),
}


def _default_rope(section: dict) -> bool:
    """A rope section that asks for the default angles: its type "default" (or none) and no other key."""
    rope_type = section.get("rope_type", section.get("type", "default"))
    return rope_type == "default" and set(section) <= {"rope_type", "type", "rope_theta"}


def shown(value: Any) -> str:
    """A value from a file, short and safe to print: a few levels and characters of it, and its type
    (reprlib stops at a depth where repr would recurse through a deeply nested list)."""
    text = _SHORT.repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 2, 40, 40, 40


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# The kinds of value a file's key may be declared to hold (a family's KEYS: key -> kind; "KIND or null"
# takes null too): name -> (the test, what the value must be, for the message).
KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "size": (lambda v: _whole(v) and v >= 1, "a whole number of at least 1"),
    "count": (lambda v: _whole(v) and v >= 0, "a whole number of at least 0"),
    "number": (_number, "a finite number"),
    "positive": (lambda v: _number(v) and v > 0, "a finite number above 0"),
    "nonnegative": (lambda v: _number(v) and v >= 0, "a finite number of at least 0"),
    "rate": (lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "name": (lambda v: isinstance(v, str), "a string"),
    "names": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), "a list of strings"),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "section": (lambda v: isinstance(v, dict), "an object"),
    "sides": (
        lambda v: _whole(v) and v >= 1 or isinstance(v, list) and len(v) == 2 and all(_whole(n) and n >= 1 for n in v),
        "a whole number of at least 1, or [height, width] of them",
    ),
    "numbers": (
        lambda v: _number(v) or isinstance(v, list) and bool(v) and all(map(_number, v)),
        "a number, or a list of numbers",
    ),
}
# A key's kind: a name of KINDS, or a function of the value that says what it must be when it is not.
Kind = str | Callable[[Any], str | None]


def fits(value: Any, kind: Kind) -> str | None:
    """None when `value` is of `kind`, else what it must be."""
    if callable(kind):
        return kind(value)
    base, _, null = kind.partition(" or ")
    test, what = KINDS[base]
    if (null and value is None) or test(value):
        return None
    return what + (" (or null)" if null else "")


def check_values(values: dict[str, Any], keys: dict[str, Kind], where: str) -> None:
    """Every key of `keys` that the file gives is of its kind (keys it does not give take defaults)."""
    for key, kind in keys.items():
        if key in values and (why := fits(values[key], kind)):
            raise AttnlabError(f"{where}: {key} must be {why}, got {shown(values[key])}")


def check_keys(hf: dict[str, Any], keys: dict[str, Kind]) -> None:
    """config.json's keys of `keys` each of its kind, and no section that changes the arithmetic."""
    check_values(hf, keys, "config.json")
    for key, (neutral, why) in NEUTRAL.items():
        if key in hf and not neutral(value := hf[key]):
            kind = value.get("rope_type", value.get("type")) if isinstance(value, dict) else None
            said = f"of type {_SHORT.repr(kind)}" if kind is not None else shown(value)  # a rope section's type
            raise AttnlabError(
                f"config.json sets {key} {said}: {why}, and converting without it would give another model"
            )


@dataclass(frozen=True)
class Size:
    """One size config.json gives, beside the same size read from the tensors' shapes."""

    key: str  # config.json's name for it, as the user reads it
    value: int  # what config.json gives (after defaults)
    held: int  # what the files hold
    what: str  # where the files say so ("rows of wte.weight")


def need(shapes: Shapes, name: str, dims: int) -> tuple[int, ...]:
    """The shape of a tensor the files must hold, with `dims` dimensions."""
    if name not in shapes:
        raise AttnlabError(f"the checkpoint has no tensor {name}")
    if len(shapes[name]) != dims:
        raise AttnlabError(f"tensor {name} has shape {list(shapes[name])}; a {dims}-dimensional tensor was expected")
    return shapes[name]


def layers(shapes: Shapes, pattern: str) -> int:
    """How many blocks the files hold: the distinct numbers i in names matching `pattern` (one group)."""
    found = re.compile(pattern)
    return len({m[1] for name in shapes if (m := found.match(name))})


def check_sizes(sizes: list[Size], src: Path) -> None:
    for s in sizes:
        if s.value != s.held:
            raise AttnlabError(
                f"{said_by(src)} gives {s.key} {s.value:,}, but the weights hold {s.held:,} "
                f"({s.what}): give the config.json saved with these weights"
            )


def said_by(src: Path) -> str:
    """Who gives the settings: a folder's config.json, or a GGUF file's metadata (read as one)."""
    return f"{src}'s metadata (as config.json)" if src.suffix == ".gguf" else f"{src}: config.json"


def check_context(cfg: Any, key: str, src: Path) -> None:
    """A context of MAX_CONTEXT at most. Rotary positions hold no tensor, so only this bounds them (the
    weights do not depend on it); a learned table's rows are checked against the file with the sizes."""
    if cfg.context > MAX_CONTEXT:
        raise AttnlabError(
            f"{said_by(src)} gives {key} {cfg.context:,}, more than the {MAX_CONTEXT:,} "
            f"positions attnlab decodes ({cfg.positions} positions allocate for the whole "
            f"context): set {key} to the context you need, at most {MAX_CONTEXT:,}; the "
            "weights do not change"
        )


def _required(model_cls: type, cfg: Any, filled: str | None) -> int:
    """The parameters of model_cls(cfg) that the files must give (a tied one once; not those the
    conversion fills itself, such as a headless checkpoint's zero head), counted on the meta device."""
    with torch.device("meta"):
        model = model_cls(cfg)
    skip = re.compile(filled) if filled else None
    return sum(p.numel() for name, p in model.named_parameters() if not (skip and skip.search(name)))


def check_count(model_cls: type, cfg: Any, shapes: Shapes, filled: str | None, src: Path) -> None:
    """The parameters config.json implies, at most the values the files hold. Counted on models of 1
    and 2 blocks and extrapolated (every block alike), so a config of a million layers costs no more
    than one of two. More values than parameters is no error here: files keep buffers (GPT-2's masks)
    and tied copies, and map_weights names any tensor without a place."""
    one, two = (_required(model_cls, replace(cfg, n_layer=n), filled) for n in (1, 2))
    implied = one + (cfg.n_layer - 1) * (two - one)
    held = sum(math.prod(shape) for shape in shapes.values())
    if implied > held:
        raise AttnlabError(
            f"{said_by(src)} implies {cfg.n_layer:,} layers and {implied:,} parameters; the "
            f"weights hold {held:,} values: a tensor is missing, or the config.json is not theirs; "
            "give the config.json saved with these weights"
        )


def architecture(hf: dict[str, Any]) -> str:
    archs = hf.get("architectures")
    if not archs or not isinstance(archs, list) or not isinstance(archs[0], str):
        raise AttnlabError('config.json names no architecture (its "architectures" list of names is missing)')
    return archs[0]


def checked_config(hf: dict[str, Any], shapes: Shapes, src: Path) -> tuple[str, ModuleType, str, Any, dict | None]:
    """(architecture, family module, family, attnlab model config, task) of config.json `hf`, whose
    every size was checked against the tensors' `shapes`: one line and nothing built otherwise."""
    try:
        arch = architecture(hf)
        module = module_for(arch)
        family, cfg, task = module.config_from_hf(hf)  # the module checks its KEYS first
    except AttnlabError as e:  # say which folder's config.json: a run may convert several (its base)
        raise AttnlabError(f"{src}: {e}") from None
    check_sizes(module.sizes(cfg, shapes), src)
    check_context(cfg, module.CONTEXT_KEY, src)
    check_count(family_classes(family)[1], cfg, shapes, module.FILLED, src)
    return arch, module, family, cfg, task
