"""HuggingFace BERT (BertModel, BertForMaskedLM, BertForSequenceClassification,
BertForTokenClassification) <-> attnlab's encoder (models/encoder.py).

Legend: D model width, V vocabulary, T positions, I = heads * head size, F feed-forward width,
L labels, S token types (segments).

BERT is attnlab's encoder with post-norm blocks, exact GELU, learned positions, a LayerNorm on
the embeddings and segment (token type) embeddings, of which a single-sentence input only ever
adds row 0. Only names and the query/key/value layout differ:

    HuggingFace (prefix "bert." except in BertModel)            attnlab
    embeddings.word_embeddings          (V, D)              ->  tok
    embeddings.position_embeddings      (T, D)              ->  pos.embedding
    embeddings.token_type_embeddings    (S, D)              ->  token_type
    embeddings.LayerNorm                                    ->  embed_norm
    encoder.layer.i.attention.self.query|key|value (I, D)   ->  blocks.i.attn.qkv_proj (3I, D), rows q|k|v
    encoder.layer.i.attention.output.dense                  ->  blocks.i.attn.out_proj
    encoder.layer.i.attention.output.LayerNorm              ->  blocks.i.norm_attn
    encoder.layer.i.intermediate.dense  (F, D)              ->  blocks.i.ff.up
    encoder.layer.i.output.dense        (D, F)              ->  blocks.i.ff.down
    encoder.layer.i.output.LayerNorm                        ->  blocks.i.norm_ff
    head mlm:      cls.predictions.transform.dense|LayerNorm -> transform | transform_norm
                   cls.predictions.bias (V,), decoder tied to word_embeddings -> out
    head classify: pooler.dense -> pooler (dense + tanh on [CLS]);  classifier (L, D) -> out
    head tag:      classifier (L, D) -> out

BertModel has no head: it becomes a classify head over its pooler with a zero classifier (every
label equally likely) and the task says "head": "untrained", as for ViTModel. Padding: BERT's
attention_mask and attnlab's pad id 0 keep pad keys out of every softmax alike; attnlab's pad
queries output zeros where BERT's attend anyway, so only real positions are comparable.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from attnlab.errors import AttnlabError
from attnlab.interop.hf import (
    ACTIVATIONS,
    ENCODER_ACTIVATIONS,
    ENCODER_DEFAULTS,
    ENCODER_KEYS,
    Pair,
    architecture_of,
    encoder_to_hf,
    expected_shapes,
    labels_from_hf,
    labels_to_hf,
    map_weights,
)
from attnlab.interop.hf.bounds import Shapes, Size, check_keys, layers, need
from attnlab.interop.hf.support import (
    Only,
    Rule,
    block_problems,
    classic_block,
    field_problems,
    refuse_unfit,
)
from attnlab.models.encoder import HEADS as ENCODER_HEADS
from attnlab.models.encoder import Encoder, EncoderConfig

# architecture -> our head; BertForPreTraining's next-sentence head is dropped, its MLM kept.
HEADS = {
    "BertForMaskedLM": "mlm",
    "BertForPreTraining": "mlm",
    "BertForSequenceClassification": "classify",
    "BertForTokenClassification": "tag",
    "BertModel": "classify",
}
pixels_from_hf = None  # a text model: no preprocessor normalizes its input
ARCHITECTURES = tuple(HEADS)
EXPORT = {"mlm": "BertForMaskedLM", "classify": "BertForSequenceClassification", "tag": "BertForTokenClassification"}
EXPORT_ACTIVATIONS = ENCODER_ACTIVATIONS
# transformers' BertConfig defaults, for the keys a config.json may leave out.
HF_DEFAULTS: dict[str, Any] = {
    **ENCODER_DEFAULTS,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "position_embedding_type": "absolute",
}
# The config.json keys read here, and the kind of value each must be (interop/hf/bounds.py).
KEYS: dict[str, str] = {
    "architectures": "names or null",
    **ENCODER_KEYS,
    "vocab_size": "size",
    "max_position_embeddings": "size",
    "type_vocab_size": "count",
    "position_embedding_type": "name",
    "num_labels": "count",
    "id2label": "section or null",
    "is_decoder": "flag",
    "add_cross_attention": "flag",
}
CONTEXT_KEY = "max_position_embeddings"
FILLED = r"^out\."  # a BertModel's classifier: zeros, every label equally likely
# One block: ours -> HuggingFace's, under blocks.i. / encoder.layer.i. (query, key, value apart).
LAYER = {
    "attn.out_proj": "attention.output.dense",
    "norm_attn": "attention.output.LayerNorm",
    "ff.up": "intermediate.dense",
    "ff.down": "output.dense",
    "norm_ff": "output.LayerNorm",
}
QKV = ("attention.self.query", "attention.self.key", "attention.self.value")
STACKED = "attention.self.query|key|value"  # the name map_weights sees for the three stacked


def config_from_hf(hf: dict) -> tuple[str, EncoderConfig, dict]:
    """("encoder", our config, the run's task) from the dict of a HuggingFace BERT config.json.

    Dropout is 0: a converted model is for inference; fine-tuning sets its own."""
    check_keys(hf, KEYS)
    hf = {**HF_DEFAULTS, **hf}
    architecture = architecture_of(hf, ARCHITECTURES, "BertModel")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise AttnlabError("config.json describes a BERT decoder (is_decoder / add_cross_attention): not supported")
    if hf["position_embedding_type"] != "absolute":
        raise AttnlabError(f"BERT position_embedding_type {hf['position_embedding_type']!r}: attnlab reads absolute")
    if hf["hidden_act"] not in ACTIVATIONS:
        raise AttnlabError(
            f"BERT hidden_act {hf['hidden_act']!r} is not supported; attnlab reads {', '.join(ACTIVATIONS)}"
        )
    head = HEADS[architecture]
    labelled = not ENCODER_HEADS[head].over_vocabulary  # a classifier or a tagger: its labels
    labels = labels_from_hf(hf) if labelled else []
    if labelled and not labels:
        raise AttnlabError("config.json: num_labels is 0 (a classifier without labels); give id2label")
    try:
        cfg = EncoderConfig(
            n_layer=hf["num_hidden_layers"],
            n_head=hf["num_attention_heads"],
            d_model=hf["hidden_size"],
            d_ff=hf["intermediate_size"],
            context=hf["max_position_embeddings"],
            dropout=0.0,
            norm="post",
            activation=ACTIVATIONS[hf["hidden_act"]],
            positions="learned",
            bias=True,
            ln_eps=hf["layer_norm_eps"],
            vocab_size=hf["vocab_size"],
            head=head,
            n_labels=max(len(labels), 1),
            pooling="cls",
            type_vocab_size=hf["type_vocab_size"],
            pooler=ENCODER_HEADS[head].pooled,
        )
    except (TypeError, ValueError) as e:
        raise AttnlabError(f"config.json describes a BERT attnlab cannot build: {e}") from None
    task: dict[str, Any] = {"kind": head, "labels": labels} if labelled else {"kind": head}
    if architecture == "BertModel":
        task["head"] = "untrained"
    return "encoder", cfg, task


def pairs(cfg: EncoderConfig, prefix: str = "bert.") -> list[Pair]:
    """Every tensor of Encoder(cfg): (attnlab name, HuggingFace name, transposed: never for BERT)."""
    emb = f"{prefix}embeddings."
    names = [
        ("tok", f"{emb}word_embeddings"),
        ("pos.embedding", f"{emb}position_embeddings"),
        ("embed_norm", f"{emb}LayerNorm"),
    ]
    if cfg.type_vocab_size:
        names.append(("token_type", f"{emb}token_type_embeddings"))
    for i in range(cfg.n_layer):
        layer = f"{prefix}encoder.layer.{i}."
        names += [(f"blocks.{i}.{ours}", layer + theirs) for ours, theirs in LAYER.items()]
        names.append((f"blocks.{i}.attn.qkv_proj", layer + STACKED))
    if ENCODER_HEADS[cfg.head].over_vocabulary:
        names += [
            ("transform", "cls.predictions.transform.dense"),
            ("transform_norm", "cls.predictions.transform.LayerNorm"),
        ]
    else:
        names.append(("out", "classifier"))
    if cfg.pooler:
        names.append(("pooler", f"{prefix}pooler.dense"))
    out = [(f"{ours}.{kind}", f"{theirs}.{kind}", False) for ours, theirs in names for kind in ("weight", "bias")]
    if ENCODER_HEADS[cfg.head].over_vocabulary:  # the decoder is the word embedding; its bias is cls.predictions.bias
        out += [("out.weight", f"{emb}word_embeddings.weight", False), ("out.bias", "cls.predictions.bias", False)]
    return [p for p in out if not p[0].startswith(("tok.bias", "pos.embedding.bias", "token_type.bias"))]


def _prefix(names) -> str:
    return "bert." if any(k.startswith("bert.") for k in names) else ""


def sizes(cfg: EncoderConfig, shapes: Shapes) -> list[Size]:
    """The sizes config.json gives beside those the tensors hold (interop/hf/bounds.py)."""
    p = _prefix(shapes)
    emb = f"{p}embeddings."
    words, pos = (
        need(shapes, f"{emb}word_embeddings.weight", 2),
        need(shapes, f"{emb}position_embeddings.weight", 2),
    )
    blocks = layers(shapes, rf"{re.escape(p)}encoder\.layer\.(\d+)\.")
    out = [
        Size("num_hidden_layers", cfg.n_layer, blocks, f"layers {p}encoder.layer.N"),
        Size("vocab_size", cfg.vocab_size, words[0], f"rows of {emb}word_embeddings.weight"),
        Size("hidden_size", cfg.d_model, words[1], f"columns of {emb}word_embeddings.weight"),
        Size("max_position_embeddings", cfg.context, pos[0], f"rows of {emb}position_embeddings.weight"),
    ]
    if cfg.type_vocab_size:
        types = need(shapes, f"{emb}token_type_embeddings.weight", 2)
        out.append(Size("type_vocab_size", cfg.type_vocab_size, types[0], f"rows of {emb}token_type_embeddings.weight"))
    if blocks:
        inner = f"{p}encoder.layer.0.intermediate.dense.weight"
        out.append(Size("intermediate_size", cfg.ff_width, need(shapes, inner, 2)[0], f"rows of {inner}"))
    if not ENCODER_HEADS[cfg.head].over_vocabulary and "classifier.weight" in shapes:
        rows = need(shapes, "classifier.weight", 2)[0]
        out.append(Size("num_labels (id2label)", cfg.n_labels, rows, "rows of classifier.weight"))
    return out


def _renamed(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Old TensorFlow-era checkpoints name LayerNorm's parameters gamma and beta."""
    out = {}
    for name, t in tensors.items():
        if "LayerNorm." in name and name.endswith((".gamma", ".beta")):
            name = name.rsplit(".", 1)[0] + (".weight" if name.endswith(".gamma") else ".bias")
        out[name] = t
    return out


def _stack_qkv(tensors: dict[str, Tensor], cfg: EncoderConfig, prefix: str, shapes: dict) -> dict[str, Tensor]:
    """Each layer's query, key and value stacked into one (3I, D) weight, rows q|k|v, and a (3I,)
    bias, under the STACKED name; each of the three checked first, so an error names it."""
    out = dict(tensors)
    for i in range(cfg.n_layer):
        layer = f"{prefix}encoder.layer.{i}."
        for kind in ("weight", "bias"):
            want = shapes[f"blocks.{i}.attn.qkv_proj.{kind}"]
            one = (want[0] // 3, *want[1:])
            parts = []
            for name in (f"{layer}{n}.{kind}" for n in QKV):
                if name not in out:
                    raise AttnlabError(f"the checkpoint has no tensor {name} (expected shape {list(one)})")
                if tuple(out[name].shape) != one:
                    raise AttnlabError(
                        f"tensor {name} has shape {list(out[name].shape)} but config.json implies {list(one)}"
                    )
                parts.append(out.pop(name))
            out[f"{layer}{STACKED}.{kind}"] = torch.cat(parts)
    return out


def weights_from_hf(tensors: dict[str, Tensor], cfg: EncoderConfig) -> dict[str, Tensor]:
    """Our state dict (every key of Encoder(cfg).state_dict()) from a HuggingFace BERT's tensors.

    A BertModel (no "bert." prefix, no classifier) gets a zero classifier. Tensors HuggingFace's
    own loading drops are ignored too: the position_ids buffer, the MLM decoder's stored copies
    (when equal to the tied ones), the next-sentence head and a pooler an mlm or tag head does not
    use. A missing tensor, a shape that does not fit, or any other tensor is an AttnlabError."""
    tensors = _renamed(tensors)
    prefix = _prefix(tensors)
    shapes = expected_shapes(Encoder, cfg)
    labelled = not ENCODER_HEADS[cfg.head].over_vocabulary
    if labelled and not prefix and not any(k.startswith("classifier.") for k in tensors):
        tensors = {
            **tensors,
            "classifier.weight": torch.zeros(shapes["out.weight"]),
            "classifier.bias": torch.zeros(shapes["out.bias"]),
        }
    ignore = {k for k in tensors if k.endswith("embeddings.position_ids") or k.startswith("cls.seq_relationship.")}
    if not cfg.pooler:
        ignore |= {k for k in tensors if k.startswith(f"{prefix}pooler.")}
    for copy, of in (
        ("cls.predictions.decoder.weight", f"{prefix}embeddings.word_embeddings.weight"),
        ("cls.predictions.decoder.bias", "cls.predictions.bias"),
    ):
        if ENCODER_HEADS[cfg.head].over_vocabulary and copy in tensors:
            if of in tensors and not torch.equal(tensors[copy], tensors[of]):
                raise AttnlabError(f"{copy} differs from {of}: attnlab's masked-LM head is tied to it")
            ignore.add(copy)
    return map_weights(_stack_qkv(tensors, cfg, prefix, shapes), pairs(cfg, prefix), shapes, ignore)


# What BERT's block expresses of each block option (interop/hf/support.py).
SUPPORT: dict[str, Rule] = classic_block("BERT", "post", EXPORT_ACTIVATIONS)


def target_name(cfg: EncoderConfig) -> str:
    return "BERT"


def export_problems(cfg: EncoderConfig) -> list[str]:
    """BERT's layout is fixed: which of the run's choices it cannot express ([] if it fits)."""
    problems = block_problems(cfg, SUPPORT, "BERT")
    problems += field_problems(cfg, {"positions": Only(("learned",), "BERT's are learned")})
    if ENCODER_HEADS[cfg.head].pooled and (cfg.pooling != "cls" or not cfg.pooler):
        problems.append("a classify head without pooler=true on [CLS] (BertForSequenceClassification has one)")
    return problems


def check_exportable(cfg: EncoderConfig) -> None:
    refuse_unfit("encoder", "BERT", export_problems(cfg))


def config_to_hf(cfg: EncoderConfig, labels: list[str] | None = None) -> dict[str, Any]:
    """A config.json for BertForMaskedLM / BertForSequenceClassification / BertForTokenClassification
    (by the run's head). An encoder without token types exports one type whose row is zero."""
    check_exportable(cfg)
    hf: dict[str, Any] = {
        "architectures": [EXPORT[cfg.head]],
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        **encoder_to_hf(cfg),
        "max_position_embeddings": cfg.context,
        "type_vocab_size": max(cfg.type_vocab_size, 1),
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    if not ENCODER_HEADS[cfg.head].over_vocabulary:
        hf.update(labels_to_hf(labels, cfg.n_labels))
    return hf


def weights_to_hf(state: dict[str, Tensor], cfg: EncoderConfig) -> dict[str, Tensor]:
    """Hub-named tensors of the architecture config_to_hf names, from our state dict."""
    check_exportable(cfg)
    hf = {}
    for ours, theirs, _ in pairs(cfg):
        if ours == "out.weight" and ENCODER_HEADS[cfg.head].over_vocabulary:
            continue  # tied: stored once, as the word embedding
        hf[theirs] = state[ours]
    if not cfg.type_vocab_size:  # BERT always adds a token-type row: a zero one adds nothing
        hf["bert.embeddings.token_type_embeddings.weight"] = state["tok.weight"].new_zeros(1, cfg.d_model)
    for i in range(cfg.n_layer):
        layer = f"bert.encoder.layer.{i}."
        for kind in ("weight", "bias"):
            stacked = hf.pop(f"{layer}{STACKED}.{kind}")  # (3I, D) or (3I,)
            for name, part in zip(QKV, stacked.chunk(3), strict=True):
                hf[f"{layer}{name}.{kind}"] = part
    return {k: v.detach().contiguous() for k, v in hf.items()}
