"""HuggingFace-format checkpoints: one module per family maps configs and weights both ways.

Each family module (gpt2.py, vit.py, ...) exposes
    ARCHITECTURES                       the config.json "architectures" values it reads
    KEYS                                the config.json keys it reads -> the kind of value each must be
    config_from_hf(hf) -> (family, attnlab model config, task dict or None)
    sizes(cfg, shapes) -> [Size]        the sizes config.json gives beside what the tensors' shapes hold
    CONTEXT_KEY, FILLED                 config.json's name for the context; the parameters the
                                        conversion fills itself (a regex, or None): bounds.py reads them
    weights_from_hf(tensors, cfg) -> attnlab state dict (exactly model.state_dict()'s keys)
pixels_from_hf(preprocessor, channels) -> (mean, std) for image models (None for text models),
and, where export is supported,
    config_to_hf(cfg) -> config.json dict;  weights_to_hf(state, cfg) -> HuggingFace tensors.
`module_for(architecture)` finds the module; `map_weights` is the renaming and shape checking
every family's weights_from_hf shares.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from types import ModuleType

import torch
from torch import nn

from attnlab.errors import AttnlabError

# The family modules, by name under attnlab.interop.hf; one that is not there (yet) is skipped.
FAMILY_MODULES = ("gpt2", "llama", "qwen3", "vit", "bert")

# HuggingFace's activation names (hidden_act, activation_function) -> attnlab's; the same in every family.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
# attnlab's -> the encoders' (BERT, ViT) hidden_act; gelu_new and gelu_pytorch_tanh are both the tanh one.
ENCODER_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
# What BertConfig and ViTConfig share: BERT-base's sizes as their defaults, and the kind of value each
# key must be (interop/hf/bounds.py).
ENCODER_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
ENCODER_DEFAULTS |= dict(hidden_act="gelu", layer_norm_eps=1e-12)
ENCODER_KEYS = dict.fromkeys(("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"), "size")
ENCODER_KEYS |= {"hidden_act": "name", "layer_norm_eps": "positive"}


def encoder_to_hf(cfg) -> dict:
    """The config.json keys that BERT's and ViT's exports write alike, from the run's block settings."""
    sizes = {"hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head}
    block = {"intermediate_size": cfg.ff_width, "hidden_act": ENCODER_ACTIVATIONS[cfg.activation]}
    dropout = dict.fromkeys(("hidden_dropout_prob", "attention_probs_dropout_prob"), cfg.dropout)
    return sizes | block | dropout | {"layer_norm_eps": cfg.ln_eps}


# The most classes a headless checkpoint's num_labels may ask for (ImageNet-21k has 21,843): each becomes
# a LABEL_i name before the classifier rows, if any, are counted.
MAX_LABELS = 2**20

# (attnlab name, HuggingFace name, transposed): one tensor of a mapping, read in either direction.
Pair = tuple[str, str, bool]


def family_modules() -> list[ModuleType]:
    modules = []
    for name in FAMILY_MODULES:
        try:
            modules.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # the module exists but an import inside it failed
                raise
    return modules


def architectures() -> dict[str, ModuleType]:
    """Every HuggingFace architecture attnlab reads -> the module that maps it."""
    return {arch: m for m in family_modules() for arch in m.ARCHITECTURES}


def module_for(architecture: str) -> ModuleType:
    known = architectures()
    if architecture not in known:
        raise AttnlabError(
            f"HuggingFace architecture {architecture[:80]!r} is not supported: attnlab converts {', '.join(known)}"
        )
    return known[architecture]


def architecture_of(hf: dict, supported: tuple[str, ...], default: str) -> str:
    """The first of `supported` that config.json's "architectures" names; `default` when it names none."""
    named = [a for a in hf.get("architectures") or [] if a in supported]
    if hf.get("architectures") and not named:
        raise AttnlabError(f"config.json names {hf['architectures']}, not one of {', '.join(supported)}")
    return named[0] if named else default


def labels_from_hf(hf: dict) -> list[str]:
    """Label names in index order from id2label (keys are strings in config.json), else LABEL_i."""
    id2label = hf.get("id2label")
    if not id2label:
        n = hf.get("num_labels", 2)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_LABELS:
            raise AttnlabError(
                f"config.json: num_labels must be a whole number from 0 to {MAX_LABELS:,}; give "
                "id2label for the model's classes"
            )
        return [f"LABEL_{i}" for i in range(n)]
    if not isinstance(id2label, dict) or not all(_label_number(k) for k in id2label):
        raise AttnlabError('config.json: id2label must map label numbers to names ({"0": "cat", "1": "dog"})')
    by_index = {int(k): str(v) for k, v in id2label.items()}
    if sorted(by_index) != list(range(len(by_index))):
        numbers = sorted(by_index)
        raise AttnlabError(
            f"config.json: id2label must number the labels 0 to n-1, got {numbers[:5]}"
            f"{' ...' if len(numbers) > 5 else ''}"
        )
    return [by_index[i] for i in range(len(by_index))]


def _label_number(key: object) -> bool:
    """An id2label key: a number as text in config.json ("3"), an int in transformers' to_dict()."""
    if isinstance(key, int) and not isinstance(key, bool):
        return 0 <= key < 10**9
    return isinstance(key, str) and re.fullmatch(r"[0-9]{1,9}", key) is not None


def labels_to_hf(labels: list[str] | None, n_labels: int) -> dict[str, dict]:
    """config.json's id2label and label2id for a head of n_labels classes (LABEL_i without names)."""
    labels = labels or [f"LABEL_{i}" for i in range(n_labels)]
    if len(labels) != n_labels:
        raise AttnlabError(f"{len(labels)} labels for a head of {n_labels} classes")
    return {
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
    }


def expected_shapes(model_cls: type[nn.Module], cfg) -> dict[str, torch.Size]:
    """The state-dict shapes of model_cls(cfg), without allocating it (built on the meta device)."""
    with torch.device("meta"):
        model = model_cls(cfg)
    return {k: v.shape for k, v in model.state_dict().items()}


def map_weights(
    tensors: dict[str, torch.Tensor],
    pairs: Iterable[Pair],
    expected: dict[str, torch.Size],
    ignore: Iterable[str] = (),
) -> dict[str, torch.Tensor]:
    """HuggingFace tensors -> attnlab's state dict, renamed (and transposed) as `pairs` say.

    Every tensor is checked against the shape the config implies; a missing tensor, a shape that
    does not fit, or a tensor no pair reads (except those named in `ignore`) is a one-line error,
    since converting it silently would give a different model.
    """
    out, used = {}, set(ignore)
    for ours, theirs, transposed in pairs:
        if theirs not in tensors:
            raise AttnlabError(f"the checkpoint has no tensor {theirs} (attnlab's {ours} is read from it)")
        t = tensors[theirs].T if transposed else tensors[theirs]
        if t.shape != expected[ours]:
            want = tuple(expected[ours])[::-1] if transposed else tuple(expected[ours])
            raise AttnlabError(
                f"tensor {theirs} has shape {tuple(tensors[theirs].shape)} but config.json implies {want}"
            )
        out[ours] = t
        used.add(theirs)
    unread = sorted(set(tensors) - used)
    if unread:
        more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
        raise AttnlabError(f"the checkpoint has tensors attnlab's model has no place for: {unread[:3]}{more}")
    if set(out) != set(expected):  # a gap in the family's mapping table, not in the user's files
        raise RuntimeError(f"mapping misses {sorted(set(expected) - set(out))[:3]}")
    return out
