"""attnlab export RUN --to gguf FILE: a GPT run as one GGUF file, the format llama.cpp and ollama run.

    run -> interop/hf: HuggingFace's config and tensors (GPT-2, Llama / Mixtral or Qwen3: `exporter`)
        -> gguf_layout: GGUF's settings, names and layouts;  gguf_vocab: the tokenizer
        -> each tensor stored as --type says -> gguf.GGUFWriter, into a temporary file renamed over FILE

What --type stores, the choices llama.cpp's convert_hf_to_gguf makes:
  f32   every tensor float32
  f16   matrices float16
  q8_0  matrices in blocks of 32 weights, each an 8-bit integer times the block's f16 scale (8.5 bits a
        weight), the token embedding and the output matrix too: they are the largest matrices of a small
        model, and 8 bits keep their error under the block's absmax / 254
  q4_0  the blocks' matrices 4-bit (4.5 bits a weight); the token embedding and the output stay q8_0:
        every logit goes through the output and every token through the embedding, so 4-bit rows there
        cost the most (llama.cpp's llama-quantize keeps them wider for the same reason)
In every type 1-D tensors (norms, biases), the position embedding and a mixture's router stay float32,
and a matrix whose rows are not whole blocks of 32 is stored f16, as llama.cpp's converter falls back.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from attnlab.config import from_dict
from attnlab.data.chat import ChatTemplate
from attnlab.data.tokenizers import load_tokenizer
from attnlab.errors import AttnlabError
from attnlab.interop.convert import EXPORTERS, exporter
from attnlab.interop.gguf_layout import LAYOUTS, Layout, layout_of, settings_to_gguf, tensors_to_gguf
from attnlab.interop.gguf_vocab import Vocab, ids_only, vocab_of_run
from attnlab.io import atomic_write, read_json
from attnlab.models import FAMILIES, family_classes
from attnlab.runs.adapted import CHAT_TEMPLATE, adapter_of
from attnlab.runs.folder import WEIGHTS, check_run_dir, read_run_config
from attnlab.runs.outputs import check_output
from attnlab.runs.weights import load_weights

Q = gguf.GGMLQuantizationType
# --type -> (the type of block matrices, of the token embedding and output, general.file_type)
TYPES = {
    "f32": (Q.F32, Q.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (Q.F16, Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (Q.Q8_0, Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (Q.Q4_0, Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
T = gguf.MODEL_TENSOR
KEEP_F32 = (T.POS_EMBD, T.FFN_GATE_INP)  # float32 in every file (llama.cpp's converter's rule)
VOCAB_ROWS = (T.TOKEN_EMBD, T.OUTPUT)


def export_gguf(run_dir: str | Path, path: str | Path, qtype: str = "f32", force: bool = False) -> dict[str, Any]:
    """Write GPT run `run_dir` as GGUF file `path` of weight type `qtype` (f32, f16, q8_0, q4_0), its
    tokenizer and chat template inside. Everything is checked before the file is written; an existing
    `path` is replaced only with force.
    Returns {"architecture", "type", "out", "bytes", "tensors": {type: count}, "tokenizer"}."""
    check_output(path, force, (".gguf",), "OUT")  # before the run is read
    run = check_run_dir(run_dir)
    model = _model(run)  # a LoRA run's adapters alone are refused
    _layout(model, str(run))  # a model GGUF cannot hold is refused before its tokenizer is looked at
    vocab = vocab_of_run(load_tokenizer(run), model.cfg.vocab_size, str(run))  # refuses a word-level tokenizer
    vocab.template = _template(run)
    return write_gguf(model, path, qtype, force, vocab, run.name, str(run))


def write_gguf(
    model: torch.nn.Module,
    path: str | Path,
    qtype: str = "f32",
    force: bool = False,
    vocab: Vocab | None = None,
    name: str = "attnlab",
    where: str = "this model",
) -> dict[str, Any]:
    """Write an attnlab GPT (a model of a family that exports as GPT-2 or a Llama) held in memory as
    GGUF file `path`, as export_gguf writes a run's. Without a
    vocabulary (`gguf_vocab.vocab_of_run`) the file's tokens are placeholders, for a caller that feeds
    llama.cpp token ids (benchmarks/): ids 0..255 stand for the bytes, any beyond for nothing."""
    if qtype not in TYPES:
        raise AttnlabError(f"--type {qtype!r} is not a GGUF weight type attnlab writes: {', '.join(TYPES)}")
    out = check_output(path, force, (".gguf",), "OUT")
    cfg = model.cfg
    layout = _layout(model, where)
    hf = layout.module.config_to_hf(cfg)
    _check_computes(hf, layout, where)
    vocab = vocab or ids_only(cfg.vocab_size)
    tensors = tensors_to_gguf(layout.module.weights_to_hf(model.state_dict(), cfg), hf, layout)
    named = roles(layout, cfg.n_layer)
    stored = {name: _stored(name, t, qtype, named) for name, t in tensors.items()}
    settings = settings_to_gguf(hf, layout) | {f"{layout.arch}.vocab_size": cfg.vocab_size}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: _write(tmp, layout.arch, name, qtype, settings, vocab, stored))
    return {
        "architecture": layout.arch,
        "type": qtype,
        "out": str(out),
        "bytes": out.stat().st_size,
        "tensors": dict(Counter(kind.name for _, kind in stored.values())),
        "tokenizer": vocab.note,
    }


def _model(run: Path) -> torch.nn.Module:
    """The run's model with its weights (a LoRA run's weights file holds its adapters alone: refused)."""
    config = read_run_config(run)
    if adapter_of(config) is not None:
        raise AttnlabError(
            f"{run} is a LoRA run: merge its adapters into its base first (attnlab merge {run} "
            "--out DIR) and export that"
        )
    config_cls, model_cls = family_classes(config["family"])
    model = model_cls(from_dict(config_cls, config["model"], where="model config"))
    load_weights(model, run / WEIGHTS)
    return model


def _layout(model: torch.nn.Module, where: str) -> Layout:
    """The GGUF layout of the HuggingFace form `exporter` picks for the model's family (GPT-2, Llama, Qwen3);
    a family with no such form, or a model neither form expresses, is refused in one line."""
    family = next(name for name, (_, cls) in FAMILIES.items() if type(model) is cls)
    with_layout = {layout.module for layout in LAYOUTS.values()}
    if not with_layout & set(EXPORTERS.get(family, ())):
        writes = [f for f, modules in EXPORTERS.items() if with_layout & set(modules)]
        raise AttnlabError(
            f"{where} holds a model of the {family} family: GGUF export writes {', '.join(writes)} "
            "runs (llama.cpp's gpt2, llama and qwen3)"
        )
    return layout_of(exporter(family, model.cfg, where))  # one line saying what no form expresses


def _check_computes(hf: dict[str, Any], layout: Layout, where: str) -> None:
    key, value, why = layout.computes
    if hf.get(key) != value:
        raise AttnlabError(
            f"{where} does not fit GGUF's {layout.arch}: {why} (HuggingFace's {key} is {hf.get(key)} here)"
        )


def _template(run: Path) -> str | None:
    """The run's chat template (chat_template.json), which llama.cpp and ollama read from the file."""
    path = run / CHAT_TEMPLATE
    return ChatTemplate.from_dict(read_json(path), str(path)).source if path.is_file() else None


def _stored(name: str, t: torch.Tensor, qtype: str, role_of: dict[str, T]) -> tuple[np.ndarray, Q]:
    """One tensor as the file stores it: (its data, quantized blocks as bytes, and its type)."""
    data = t.detach().to(torch.float32).contiguous().numpy()
    kind = _kind(name, data.shape, qtype, role_of)
    if kind == Q.F32:
        return data, kind
    if kind == Q.F16:
        return data.astype(np.float16), kind
    return gguf.quants.quantize(data, kind), kind


def _kind(name: str, shape: tuple[int, ...], qtype: str, role_of: dict[str, T]) -> Q:
    """The type one tensor is stored in (the module's docstring says why)."""
    matrices, vocab_rows, _ = TYPES[qtype]
    role = role_of.get(name.rsplit(".", 1)[0])
    if len(shape) < 2 or role in KEEP_F32:
        return Q.F32
    kind = vocab_rows if role in VOCAB_ROWS else matrices
    block = gguf.GGML_QUANT_SIZES[kind][0]
    return kind if shape[-1] % block == 0 else Q.F16


def roles(layout: Layout, n_layer: int) -> dict[str, T]:
    """Every tensor name of the architecture (without .weight / .bias) -> what it is, from gguf's table."""
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == layout.arch)
    return {gguf.TENSOR_NAMES[role].format(bid=i): role for role in gguf.MODEL_TENSORS[arch] for i in range(n_layer)}


def _write(tmp: Path, arch: str, name: str, qtype: str, settings: dict, vocab: Vocab, stored: dict) -> None:
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name(name)
    writer.add_file_type(TYPES[qtype][2])
    if qtype.startswith("q"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value in settings.items():
        (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(key, value)
    for key, value in vocab.to_metadata().items():
        _add(writer, key, value)
    for tensor_name, (data, kind) in stored.items():
        writer.add_tensor(tensor_name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    """One tokenizer key by its Python type (token types and ids are GGUF's int32 / uint32)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif key == gguf.Keys.Tokenizer.TOKEN_TYPE:
        writer.add_array(key, [int(v) for v in value])  # int32 as llama.cpp's converter writes them
    else:
        writer.add_array(key, value)
