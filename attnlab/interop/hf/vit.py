"""HuggingFace ViT (ViTForImageClassification, ViTModel) <-> attnlab's ViT (models/vit.py).

Legend: D model width, C channels, P patch side, N patches, T = 1 + N tokens, I = heads * head
size, F feed-forward width, L labels.

The two models compute the same function: pre-norm blocks with exact GELU, attention scaled
by 1/sqrt(head size), [CLS] read after the final LayerNorm. Only names and two shapes differ:

    HuggingFace (Hub checkpoint names)                       attnlab
    vit.embeddings.cls_token                 (1, 1, D)   ->  cls                       (1, 1, D)
    vit.embeddings.position_embeddings       (1, T, D)   ->  pos.embedding.weight      (T, D)
    vit.embeddings.patch_embeddings.projection (D, C, P, P) -> patches.proj            (D, C, P, P)
    vit.encoder.layer.i.attention.attention.query|key|value  (I, D) each
                                                         ->  blocks.i.attn.qkv_proj    (3I, D), rows q|k|v
    vit.encoder.layer.i.attention.output.dense           ->  blocks.i.attn.out_proj
    vit.encoder.layer.i.intermediate.dense   (F, D)      ->  blocks.i.ff.up
    vit.encoder.layer.i.output.dense         (D, F)      ->  blocks.i.ff.down
    vit.encoder.layer.i.layernorm_before|after           ->  blocks.i.norm_attn|norm_ff
    vit.layernorm                                        ->  norm
    classifier                               (L, D)      ->  out

ViTModel has no "vit." prefix and no classifier; its pooler (a tanh layer that
ViTForImageClassification does not use) is dropped. transformers 5 renames the modules in
memory (layers.i.attention.q_proj, mlp.fc1, ...) and writes the Hub names back when saving;
both spellings are read here, the Hub's are written.

HuggingFace's image processor normalizes pixels ((x - mean) / std) before the model sees them,
while attnlab feeds images in [0, 1]: `fold_pixel_normalization` moves that affine map into the
patch projection, exactly, since the patch projection is linear.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.errors import AttnlabError
from attnlab.interop.hf import (
    ACTIVATIONS,
    ENCODER_ACTIVATIONS,
    ENCODER_DEFAULTS,
    ENCODER_KEYS,
    architecture_of,
    encoder_to_hf,
    expected_shapes,
    labels_from_hf,
    labels_to_hf,
)
from attnlab.interop.hf.bounds import Shapes, Size, check_keys, check_values, layers, need
from attnlab.interop.hf.support import Rule, block_problems, classic_block
from attnlab.models.vit import ViT, ViTConfig

ARCHITECTURES = ("ViTForImageClassification", "ViTModel")
EXPORT_ACTIVATIONS = ENCODER_ACTIVATIONS
# transformers' ViTConfig defaults, for the keys a config.json may leave out.
HF_DEFAULTS: dict[str, Any] = {
    **ENCODER_DEFAULTS,
    "image_size": 224,
    "patch_size": 16,
    "num_channels": 3,
    "qkv_bias": True,
}


# The config.json keys read here, and the kind of value each must be (interop/hf/bounds.py).
KEYS: dict[str, str] = {
    "architectures": "names or null",
    **ENCODER_KEYS,
    "image_size": "sides",
    "patch_size": "sides",
    "num_channels": "size",
    "qkv_bias": "flag",
    "head_dim": "size or null",
    "num_labels": "count",
    "id2label": "section or null",
}
CONTEXT_KEY = "image_size"
FILLED = r"^out\.|\.qkv_proj\.bias$"  # ViTModel's head, and qkv_bias false: zeros
# Per block: ours -> (Hub name, transformers-5 in-memory name), under encoder.layer.i. / layers.i.
LAYER = {
    "attn.out_proj": ("attention.output.dense", "attention.o_proj"),
    "ff.up": ("intermediate.dense", "mlp.fc1"),
    "ff.down": ("output.dense", "mlp.fc2"),
    "norm_attn": ("layernorm_before", "layernorm_before"),
    "norm_ff": ("layernorm_after", "layernorm_after"),
}
QKV = (
    ("attention.attention.query", "attention.q_proj"),
    ("attention.attention.key", "attention.k_proj"),
    ("attention.attention.value", "attention.v_proj"),
)
IGNORED = ("pooler.", "embeddings.mask_token")  # ViTModel's pooler; the masked-image-modeling token


def _pair(value: Any, name: str) -> tuple[int, int]:
    """image_size / patch_size: an int or a (height, width) pair."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value[0], value[1]
    raise AttnlabError(f"config.json: {name} must be an integer or [height, width], got {value!r}")


def config_from_hf(hf: dict) -> tuple[str, ViTConfig, dict | None]:
    """("vit", our config, the run's task) from the dict of a HuggingFace ViT config.json.

    qkv_bias=False is read as zero query/key/value biases (our bias flag covers every linear and
    norm). ViTModel has no classifier: the head gets id2label's classes (HuggingFace's default
    is two) and the task says "head": "untrained". Dropout is 0: a converted model is for
    inference; fine-tuning sets its own.
    """
    check_keys(hf, KEYS)
    hf = {**HF_DEFAULTS, **hf}
    architecture = architecture_of(hf, ARCHITECTURES, "ViTForImageClassification")
    if hf["hidden_act"] not in ACTIVATIONS:
        raise AttnlabError(
            f"ViT hidden_act {hf['hidden_act']!r} is not supported; attnlab reads {', '.join(ACTIVATIONS)}"
        )
    h, w = _pair(hf["image_size"], "image_size")
    p, pw = _pair(hf["patch_size"], "patch_size")
    if p != pw:
        raise AttnlabError(f"config.json: patches of {p}x{pw} pixels; attnlab's ViT cuts square patches only")
    labels = labels_from_hf(hf)
    if not labels:
        raise AttnlabError("config.json: num_labels is 0 (a classifier without classes); give id2label")
    d_model, n_head = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim")  # transformers 5 reads it when present; d_model / heads otherwise
    try:
        cfg = ViTConfig(
            n_layer=hf["num_hidden_layers"],
            n_head=n_head,
            d_model=d_model,
            d_ff=hf["intermediate_size"],
            d_head=head_dim if head_dim and head_dim * n_head != d_model else None,
            dropout=0.0,
            norm="pre",
            activation=ACTIVATIONS[hf["hidden_act"]],
            positions="learned",
            bias=True,
            ln_eps=hf["layer_norm_eps"],
            image_size=h,
            image_width=None if w == h else w,
            channels=hf["num_channels"],
            patch_size=p,
            n_labels=len(labels),
            pooling="cls",
            patch_embed="conv",
            label_smoothing=0.0,
        )
    except ValueError as e:
        raise AttnlabError(f"config.json describes a ViT attnlab cannot build: {e}") from None
    task = {"kind": "image", "labels": labels, "size": [h, w], "channels": hf["num_channels"]}
    if architecture == "ViTModel":
        task["head"] = "untrained"
    return "vit", cfg, task


def sizes(cfg: ViTConfig, shapes: Shapes) -> list[Size]:
    """The sizes config.json gives beside those the tensors hold (interop/hf/bounds.py), with or
    without the "vit." prefix, Hub or transformers-5 names."""
    t = {k.removeprefix("vit."): v for k, v in shapes.items()}
    cls, pos = need(t, "embeddings.cls_token", 3), need(t, "embeddings.position_embeddings", 3)
    proj = need(t, "embeddings.patch_embeddings.projection.weight", 4)  # (D, C, P, P)
    blocks = layers(t, r"(?:encoder\.layer|layers)\.(\d+)\.")
    out = [
        Size("num_hidden_layers", cfg.n_layer, blocks, "layers encoder.layer.N"),
        Size("hidden_size", cfg.d_model, cls[2], "the width of embeddings.cls_token"),
        Size("num_channels", cfg.channels, proj[1], "channels of the patch projection"),
        Size("patch_size", cfg.patch_size, proj[2], "the patch projection's height"),
        Size("patch_size", cfg.patch_size, proj[3], "the patch projection's width"),
        Size(
            "positions (1 + patches of image_size / patch_size)",
            cfg.context,
            pos[1],
            "rows of embeddings.position_embeddings",
        ),
    ]
    inner = next((n for n in ("encoder.layer.0.intermediate.dense.weight", "layers.0.mlp.fc1.weight") if n in t), None)
    if blocks and inner:
        out.append(Size("intermediate_size", cfg.ff_width, need(t, inner, 2)[0], f"rows of {inner}"))
    if "classifier.weight" in t:
        out.append(
            Size("num_labels (id2label)", cfg.n_labels, need(t, "classifier.weight", 2)[0], "rows of classifier.weight")
        )
    return out


class _Reader:
    """HF tensors by name with the "vit." prefix taken off; says which were used."""

    def __init__(self, tensors: dict[str, Tensor]):
        self.original = {k.removeprefix("vit."): k for k in tensors}
        self.prefix = "vit." if any(k.startswith("vit.") for k in tensors) else ""  # for messages
        self.tensors = {k.removeprefix("vit."): v for k, v in tensors.items()}
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str, shape: tuple[int, ...]) -> Tensor:
        if name not in self.tensors:
            where = self.prefix if not name.startswith("classifier.") else ""
            raise AttnlabError(f"the HuggingFace checkpoint has no tensor {where}{name} (expected shape {list(shape)})")
        t = self.tensors[name]
        if tuple(t.shape) != shape:
            raise AttnlabError(
                f"HuggingFace tensor {self.original[name]} has shape {list(t.shape)}, "
                f"expected {list(shape)} from config.json"
            )
        self.used.add(name)
        return t

    def leftover(self) -> list[str]:
        return [self.original[k] for k in self.tensors if k not in self.used and not k.startswith(IGNORED)]


def weights_from_hf(tensors: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """Our state dict (every key of ViT(cfg).state_dict()) from a HuggingFace ViT's tensors, Hub
    or transformers-5 names, with or without the "vit." prefix. ViTModel has no classifier: its
    head is zero, as ViT initializes it (every class equally likely; the task says "untrained").
    A missing tensor, a shape that does not fit the config, or a tensor this mapping does not
    know is an AttnlabError naming it."""
    shapes = {name: tuple(shape) for name, shape in expected_shapes(ViT, cfg).items()}
    src = _Reader(tensors)
    ours: dict[str, Tensor] = {
        "cls": src.take("embeddings.cls_token", shapes["cls"]),
        "pos.embedding.weight": src.take("embeddings.position_embeddings", (1, *shapes["pos.embedding.weight"]))[0],
        "norm.weight": src.take("layernorm.weight", shapes["norm.weight"]),
        "norm.bias": src.take("layernorm.bias", shapes["norm.bias"]),
    }
    has_head = src.has("classifier.weight") or src.has("classifier.bias")  # ViTModel has none
    for kind in ("weight", "bias"):
        name = f"patches.proj.{kind}"
        ours[name] = src.take(f"embeddings.patch_embeddings.projection.{kind}", shapes[name])
        name = f"out.{kind}"
        ours[name] = src.take(f"classifier.{kind}", shapes[name]) if has_head else ours["cls"].new_zeros(shapes[name])
    hub = not src.has("layers.0.layernorm_before.weight")  # else transformers 5's in-memory names
    for i in range(cfg.n_layer):
        prefix, at = (f"encoder.layer.{i}.", 0) if hub else (f"layers.{i}.", 1)
        for mine, names in LAYER.items():
            for kind in ("weight", "bias"):
                name = f"blocks.{i}.{mine}.{kind}"
                ours[name] = src.take(f"{prefix}{names[at]}.{kind}", shapes[name])
        ours.update(_qkv(src, prefix, at, shapes, f"blocks.{i}.attn.qkv_proj"))
    if extra := src.leftover():
        raise AttnlabError(
            f"the HuggingFace checkpoint has tensors a {cfg.n_layer}-layer ViT does not use: "
            f"{', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}"
        )
    return {k: v.contiguous() for k, v in ours.items()}


def _qkv(src: _Reader, prefix: str, at: int, shapes: dict, name: str) -> dict[str, Tensor]:
    """Query, key and value stacked into one (3I, D) matrix, rows q|k|v (nn/attention.py)."""
    inner = shapes[f"{name}.weight"][0] // 3
    weight = torch.cat([src.take(f"{prefix}{n[at]}.weight", (inner, shapes[f"{name}.weight"][1])) for n in QKV])
    biases = [f"{prefix}{n[at]}.bias" for n in QKV]
    if not any(src.has(b) for b in biases):  # qkv_bias=False: no bias is a zero bias
        return {f"{name}.weight": weight, f"{name}.bias": weight.new_zeros(3 * inner)}
    return {f"{name}.weight": weight, f"{name}.bias": torch.cat([src.take(b, (inner,)) for b in biases])}


PREPROCESSOR: dict[str, str] = {
    "do_normalize": "flag",
    "do_rescale": "flag",
    "rescale_factor": "positive",
    "image_mean": "numbers",
    "image_std": "numbers",
}


def pixels_from_hf(processor: Any, channels: int) -> tuple[list[float], list[float]] | None:
    """(mean, std) on attnlab's [0, 1] scale from a preprocessor_config.json dict, or None when
    the processor does not normalize. HuggingFace's pixels are (x * rescale - mean) / std with
    x in 0..255, that is (x01 - mean / k) / (std / k) with k = 255 * rescale."""
    if not isinstance(processor, dict):
        raise AttnlabError("preprocessor_config.json is corrupt: expected a JSON object")
    check_values(processor, PREPROCESSOR, "preprocessor_config.json")
    if not processor.get("do_normalize", True):
        return None
    k = 255 * processor.get("rescale_factor", 1 / 255) if processor.get("do_rescale", True) else 255.0
    mean, std = (processor.get(key, 0.5) for key in ("image_mean", "image_std"))  # 0.5: HF's ViT default
    mean, std = ([v] * channels if isinstance(v, float | int) else list(v) for v in (mean, std))
    if len(mean) != channels or len(std) != channels:
        raise AttnlabError(
            f"preprocessor_config.json: image_mean/image_std need {channels} values, got {len(mean)} and {len(std)}"
        )
    if not all(s > 0 for s in std):
        raise AttnlabError(f"preprocessor_config.json: image_std must be above 0 (it divides), got {std}")
    return [m / k for m in mean], [s / k for s in std]


def fold_pixel_normalization(weights: dict[str, Tensor], mean: list[float], std: list[float]) -> dict[str, Tensor]:
    """Our weights that take [0, 1] pixels, from weights that take (x - mean) / std per channel.

    The patch projection is linear: W * ((x - m) / s) + b = (W / s) * x + (b - sum (W / s) m),
    summed over channels and the patch's pixels.
    """
    w, b = weights["patches.proj.weight"], weights["patches.proj.bias"]  # (D, C, P, P), (D,)
    m = torch.tensor(mean, dtype=torch.float64)[None, :, None, None]  # (1, C, 1, 1)
    s = torch.tensor(std, dtype=torch.float64)[None, :, None, None]
    scaled = w.double() / s  # (D, C, P, P)
    shift = (scaled * m).sum(dim=(1, 2, 3))  # (D,)
    folded = {"patches.proj.weight": scaled.to(w.dtype), "patches.proj.bias": (b.double() - shift).to(b.dtype)}
    return {**weights, **folded}


def _one_kv_per_head(cfg: ViTConfig) -> str | None:
    if (cfg.n_kv_head or cfg.n_head) != cfg.n_head:
        return f"n_kv_head {cfg.n_kv_head} (ViT has a key and value per head)"
    return None


# What HuggingFace's ViT block expresses of each block option (interop/hf/support.py).
SUPPORT: dict[str, Rule] = classic_block("ViT", "pre", EXPORT_ACTIVATIONS, heads=_one_kv_per_head)


def config_to_hf(cfg: ViTConfig, labels: list[str] | None = None) -> dict:
    """A config.json for transformers' ViTForImageClassification with the same function."""
    for field, wanted in {"positions": "learned", "pooling": "cls"}.items():
        if getattr(cfg, field) != wanted:
            raise AttnlabError(f"HuggingFace's ViT needs {field}={wanted}; this run has {field}={getattr(cfg, field)}")
    problems = block_problems(cfg, SUPPORT, "ViT")
    if problems:
        raise AttnlabError(f"this ViT does not fit HuggingFace's ViT: {'; '.join(problems)}")
    h, w = cfg.size
    hf = {
        "architectures": ["ViTForImageClassification"],
        "model_type": "vit",
        **encoder_to_hf(cfg),
        "image_size": h if h == w else [h, w],
        "patch_size": cfg.patch_size,
        "num_channels": cfg.channels,
        "qkv_bias": True,
        **labels_to_hf(labels, cfg.n_labels),
    }
    if cfg.head_width * cfg.n_head != cfg.d_model:
        hf["head_dim"] = cfg.head_width  # read by transformers 5
    return hf


def processor_to_hf(cfg: ViTConfig) -> dict:
    """A preprocessor_config.json for an exported run: resize, scale to [0, 1], no normalization,
    which is what attnlab's ViT was trained on (its images are read in [0, 1])."""
    h, w = cfg.size
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": h, "width": w},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": False,
        "image_mean": [0.5] * cfg.channels,
        "image_std": [0.5] * cfg.channels,
    }


def weights_to_hf(state: dict[str, Tensor], cfg: ViTConfig) -> dict[str, Tensor]:
    """Hub-named tensors of ViTForImageClassification from our state dict (the inverse map)."""
    inner = cfg.head_width * cfg.n_head
    hf = {
        "vit.embeddings.cls_token": state["cls"],
        "vit.embeddings.position_embeddings": state["pos.embedding.weight"][None],  # (1, T, D)
        "vit.layernorm.weight": state["norm.weight"],
        "vit.layernorm.bias": state["norm.bias"],
    }
    for kind in ("weight", "bias"):
        hf[f"vit.embeddings.patch_embeddings.projection.{kind}"] = state[f"patches.proj.{kind}"]
        hf[f"classifier.{kind}"] = state[f"out.{kind}"]
    for i in range(cfg.n_layer):
        prefix = f"vit.encoder.layer.{i}."
        for mine, (name, _) in LAYER.items():
            for kind in ("weight", "bias"):
                hf[f"{prefix}{name}.{kind}"] = state[f"blocks.{i}.{mine}.{kind}"]
        for kind in ("weight", "bias"):
            stacked = state[f"blocks.{i}.attn.qkv_proj.{kind}"]  # (3I, D) or (3I,)
            for j, (name, _) in enumerate(QKV):
                hf[f"{prefix}{name}.{kind}"] = stacked[j * inner : (j + 1) * inner]
    return {k: v.detach().contiguous() for k, v in hf.items()}
