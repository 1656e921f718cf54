"""GGUF's names, layouts and settings for the families llama.cpp and attnlab share: GPT-2, Llama, Qwen3.

Legend: C model width, F feed-forward width, H query heads, Hkv key/value heads, Dh head width, E experts.

attnlab <-> HuggingFace is interop/hf (gpt2.py, llama.py, qwen3.py), the one mapping of attnlab's names; this
module adds the step HuggingFace <-> GGUF, the way llama.cpp's convert_hf_to_gguf takes it:
  names    gguf's own TensorNameMap, the table llama.cpp's converter reads (transformer.h.0.attn.c_attn.weight
           -> blk.0.attn_qkv.weight, model.layers.0.self_attn.q_proj.weight -> blk.0.attn_q.weight)
  layouts  Llama: the rows of q_proj and k_proj reordered so that each rotary pair is two adjacent rows
           (llama.cpp's llama rotates (x0, x1), (x2, x3), ...; HuggingFace pairs dimension j with
           j + Dh/2); a Mixtral's experts stacked into one tensor per matrix, (E, F, C) or (E, C, F);
           GPT-2: Conv1D's (in, out) weights transposed back to (out, in)
  settings {arch}.block_count, ... <-> config.json's keys
A GGUF tensor is held as numpy holds it: its shape is GGUF's `ne` reversed ((out, in) has ne [in, out]).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import gguf
import torch
from torch import Tensor

from attnlab.errors import AttnlabError, kind
from attnlab.interop.hf import expected_shapes, gpt2, llama, qwen3
from attnlab.models import family_classes

Tensors = dict[str, Tensor]


@dataclass(frozen=True)
class Key:
    """One setting: its GGUF key under the architecture ("block_count" is "{arch}.block_count"), its
    config.json key, how GGUF stores it, and what to write when config.json leaves it None."""

    gguf: str
    hf: str
    kind: type
    required: bool = True
    when_none: Callable[[dict], Any] | None = None


@dataclass(frozen=True)
class Layout:
    """One GGUF architecture: its HuggingFace mapping, its settings, and how its tensors are laid out
    differently from HuggingFace's (`to_gguf` and `from_gguf` undo each other; names stay HuggingFace's)."""

    arch: str
    module: ModuleType
    keys: tuple[Key, ...]
    to_gguf: Callable[[Tensors, dict], Tensors]
    from_gguf: Callable[[Tensors, dict], Tensors]
    computes: tuple[str, str, str]  # what llama.cpp's graph fixes that config.json leaves open: key, value, why
    architecture: Callable[[dict], str]  # the HuggingFace class a config.json of these settings names


# ---- GPT-2: Conv1D weights are stored (in, out) by HuggingFace, (out, in) by GGUF.

CONV1D = tuple(theirs for theirs, transposed in gpt2.BLOCK.values() if transposed)  # c_attn, c_proj, c_fc weights


def _conv1d_flipped(tensors: Tensors, hf: dict) -> Tensors:
    """Transpose GPT-2's Conv1D weights (its own inverse: used both ways)."""
    return {name: t.T.contiguous() if name.endswith(CONV1D) else t for name, t in tensors.items()}


GPT2_KEYS = (
    Key("context_length", "n_positions", int),
    Key("embedding_length", "n_embd", int),
    Key("block_count", "n_layer", int),
    Key("feed_forward_length", "n_inner", int, when_none=lambda hf: 4 * hf["n_embd"]),  # GPT-2's default width
    Key("attention.head_count", "n_head", int),
    Key("attention.layer_norm_epsilon", "layer_norm_epsilon", float),
)

# ---- Llama: rotary pairs as adjacent rows; a Mixtral's experts stacked.


def rotary_to_pairs(w: Tensor, heads: int) -> Tensor:
    """q_proj or k_proj (heads * Dh, C), each head's rows [x0 .. x(Dh/2-1) | y0 .. y(Dh/2-1)] as
    HuggingFace pairs them, -> [x0, y0, x1, y1, ...]: the pairs llama.cpp's llama rotates."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)  # (H, Dh/2, 2, C)


def rotary_from_pairs(w: Tensor, heads: int) -> Tensor:
    """The inverse of rotary_to_pairs."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)  # (H, 2, Dh/2, C)


EXPERT = re.compile(r"^(.*\.experts\.)(\d+)\.(w[123]\.weight)$")  # the Hub's per-expert Mixtral names


def _stack_experts(tensors: Tensors) -> Tensors:
    """...experts.{j}.w1.weight for every j -> ...experts.w1.weight (E, F, C), in expert order."""
    out, groups = {}, {}
    for name, t in tensors.items():
        m = EXPERT.match(name)
        if m is None:
            out[name] = t
        else:
            groups.setdefault(m[1] + m[3], {})[int(m[2])] = t
    for name, by_expert in groups.items():
        out[name] = torch.stack([by_expert[j] for j in range(len(by_expert))])
    return out


def _unstack_experts(tensors: Tensors) -> Tensors:
    out = {}
    for name, t in tensors.items():
        m = re.match(r"^(.*\.experts\.)(w[123]\.weight)$", name)
        if m is None:
            out[name] = t
        else:
            out |= {f"{m[1]}{j}.{m[2]}": expert.contiguous() for j, expert in enumerate(t)}
    return out


def _rotary(tensors: Tensors, hf: dict, turn: Callable[[Tensor, int], Tensor]) -> Tensors:
    kv = hf.get("num_key_value_heads") or hf["num_attention_heads"]  # llama.cpp's default: as many as queries
    heads = {"q_proj": hf["num_attention_heads"], "k_proj": kv}
    out = {}
    for name, t in tensors.items():
        proj = name.split(".")[-2]
        out[name] = turn(t, heads[proj]).contiguous() if proj in heads and name.endswith(".weight") else t
    return out


def _llama_to_gguf(tensors: Tensors, hf: dict) -> Tensors:
    return _stack_experts(_rotary(tensors, hf, rotary_to_pairs))


def _llama_from_gguf(tensors: Tensors, hf: dict) -> Tensors:
    return _rotary(_unstack_experts(tensors), hf, rotary_from_pairs)


LLAMA_KEYS = (
    Key("context_length", "max_position_embeddings", int),
    Key("embedding_length", "hidden_size", int),
    Key("block_count", "num_hidden_layers", int),
    Key("feed_forward_length", "intermediate_size", int),
    Key("attention.head_count", "num_attention_heads", int),
    Key("attention.head_count_kv", "num_key_value_heads", int, required=False),
    Key("attention.key_length", "head_dim", int, required=False),
    Key("attention.value_length", "head_dim", int, required=False),  # attnlab's values are as wide as its keys
    Key("rope.dimension_count", "head_dim", int, required=False),  # every dimension of a head rotates
    Key("attention.layer_norm_rms_epsilon", "rms_norm_eps", float),
    Key("rope.freq_base", "rope_theta", float, required=False),
    Key("expert_count", "num_local_experts", int, required=False),
    Key("expert_used_count", "num_experts_per_tok", int, required=False),
)

# ---- Qwen3: Llama's settings without experts; llama.cpp's qwen3 rotates HuggingFace's half-split pairs
# (its NeoX rotation), so q and k keep their rows, and each head's q_norm / k_norm is one (Dh,) vector.

QWEN3_KEYS = tuple(key for key in LLAMA_KEYS if not key.gguf.startswith("expert"))
_as_is: Callable[[Tensors, dict], Tensors] = lambda tensors, hf: tensors  # noqa: E731  (both ways)


LAYOUTS = {
    "gpt2": Layout(
        "gpt2",
        gpt2,
        GPT2_KEYS,
        _conv1d_flipped,
        _conv1d_flipped,
        (
            "activation_function",
            "gelu_new",
            "llama.cpp's GPT-2 computes the tanh GELU: train with --activation gelu_tanh",
        ),
        lambda hf: "GPT2LMHeadModel",
    ),
    "llama": Layout(
        "llama",
        llama,
        LLAMA_KEYS,
        _llama_to_gguf,
        _llama_from_gguf,
        ("hidden_act", "silu", "llama.cpp's llama gates with SiLU: train with --feedforward swiglu"),
        lambda hf: "MixtralForCausalLM" if hf.get("num_local_experts") else "LlamaForCausalLM",
    ),
    "qwen3": Layout(
        "qwen3",
        qwen3,
        QWEN3_KEYS,
        _as_is,
        _as_is,
        ("hidden_act", "silu", "llama.cpp's qwen3 gates with SiLU: train with --feedforward swiglu"),
        lambda hf: "Qwen3ForCausalLM",
    ),
}


def layout_of(module: ModuleType) -> Layout:
    """The GGUF layout of a HuggingFace mapping (interop/hf/gpt2.py or interop/hf/llama.py)."""
    return next(layout for layout in LAYOUTS.values() if layout.module is module)


def settings_to_gguf(hf: dict, layout: Layout) -> dict[str, int | float]:
    """config.json's values -> GGUF's metadata (full keys: "llama.block_count"). A key config.json
    has no value for is left out (a dense Llama writes no expert_count)."""
    out = {}
    for key in layout.keys:
        value = hf.get(key.hf)
        if value is None and key.when_none is not None:
            value = key.when_none(hf)
        if value is not None:
            out[f"{layout.arch}.{key.gguf}"] = key.kind(value)
    return out


def settings_from_gguf(meta: dict[str, Any], layout: Layout, where: str) -> dict[str, Any]:
    """GGUF's metadata -> config.json's keys, each in range; two keys that name one config.json key
    must agree (a rotary width or a value width other than the key width is a model attnlab does not build)."""
    hf: dict[str, Any] = {}
    for key in layout.keys:
        full = f"{layout.arch}.{key.gguf}"
        value = meta.get(full)
        if value is None:
            if key.required:
                raise AttnlabError(f"{where} has no {full}, which a {layout.arch} model needs")
            continue
        value = _in_range(key, full, value, where)
        if value == 0:  # an expert count of 0: a dense model, as llama.cpp reads it
            continue
        if key.hf in hf and hf[key.hf] != value:
            raise AttnlabError(f"{where}: {full} is {value} but attnlab builds it as {hf[key.hf]} (its {key.hf})")
        hf[key.hf] = value
    return hf


MAX_SIZE = 2**31 - 1  # llama.cpp reads every size setting as a 32-bit integer


def _in_range(key: Key, full: str, value: Any, where: str) -> int | float:
    """A size: a whole number from 1 (0 for the expert counts) to MAX_SIZE; an epsilon or a rotary
    base: a finite number above 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AttnlabError(f"{where}: {full} is {kind(value)}; attnlab reads one number there (not one per layer)")
    if key.kind is int:
        least = 0 if key.gguf.startswith("expert") else 1
        if not isinstance(value, int) or not least <= value <= MAX_SIZE:
            raise AttnlabError(
                f"{where}: {full} is {value!r}; attnlab reads a whole number from {least} to {MAX_SIZE:,} there"
            )
        return value
    if not math.isfinite(value) or value <= 0:
        raise AttnlabError(f"{where}: {full} is {value!r}; it must be a finite number above 0")
    return float(value)


def n_blocks(hf: dict, layout: Layout) -> int:
    """The number of blocks config.json gives (each layout names it its own way)."""
    return hf[next(key.hf for key in layout.keys if key.gguf == "block_count")]


def gguf_names(names: list[str], layout: Layout, n_layer: int) -> dict[str, str]:
    """HuggingFace's names (laid out: experts stacked) -> GGUF's, through gguf's own table."""
    table = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == layout.arch), n_layer)
    out = {}
    for name in names:
        found = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if found is None:  # a gap between interop/hf's names and gguf's table, not the user's doing
            raise RuntimeError(f"gguf's {layout.arch} table has no name for {name}")
        out[name] = found
    return out


def tensors_to_gguf(tensors: Tensors, hf: dict, layout: Layout) -> Tensors:
    """HuggingFace tensors (what weights_to_hf gives) -> GGUF's names and layouts."""
    laid = layout.to_gguf(tensors, hf)
    names = gguf_names(list(laid), layout, n_blocks(hf, layout))
    return {names[name]: t for name, t in laid.items()}


Expected = dict[str, tuple[str, tuple[int, ...]]]  # GGUF name -> (HuggingFace name, numpy shape)


def expected(hf: dict, layout: Layout) -> Expected:
    """Every tensor a GGUF file of these settings holds: GGUF name -> (HuggingFace name, laid out as
    GGUF lays it; its numpy shape). Found by exporting a model of these settings built on the meta
    device (no memory), so reading expects exactly what writing writes; with at most two blocks, the
    others named after the second (a stack's blocks are all alike: nn/stack.py), so the shapes of a file
    of 1,000 blocks take what those of 2 take (building 1,000 on the meta device takes seconds)."""
    key, n = next(key.hf for key in layout.keys if key.gguf == "block_count"), n_blocks(hf, layout)
    built = _expected_built(hf | {key: min(n, 2)}, layout)
    first = {name: v for name, v in built.items() if name.startswith("blk.0.")}
    second = {name: v for name, v in built.items() if name.startswith("blk.1.")}
    if n > 1 and dict(_renamed(name, v, 1, 0) for name, v in second.items()) != first:
        raise RuntimeError(f"the blocks of a {layout.arch} model differ: expected() cannot name the others")
    out = {name: v for name, v in built.items() if name not in second}
    for i in range(1, n):
        out |= dict(_renamed(name, v, 1, i) for name, v in second.items())
    return out


def _renamed(name: str, v: tuple[str, tuple[int, ...]], i: int, j: int) -> tuple[str, tuple[str, tuple[int, ...]]]:
    """Block i's tensor as block j's: its GGUF name (blk.i.) and its HuggingFace name (the first .i.)."""
    hf_name, shape = v
    return name.replace(f"blk.{i}.", f"blk.{j}.", 1), (hf_name.replace(f".{i}.", f".{j}.", 1), shape)


def _expected_built(hf: dict, layout: Layout) -> Expected:
    family, cfg, _ = layout.module.config_from_hf(hf)
    shapes = expected_shapes(family_classes(family)[1], cfg)
    meta = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    laid = layout.to_gguf(layout.module.weights_to_hf(meta, cfg), hf)
    names = gguf_names(list(laid), layout, n_blocks(hf, layout))
    return {names[name]: (name, tuple(t.shape)) for name, t in laid.items()}


def tensors_from_gguf(tensors: Tensors, names: dict[str, str], hf: dict, layout: Layout) -> Tensors:
    """GGUF tensors -> HuggingFace's names and layouts; `names`: GGUF name -> HuggingFace name (laid out)."""
    return layout.from_gguf({names[name]: t for name, t in tensors.items()}, hf)
