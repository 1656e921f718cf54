"""attnlab convert FILE.gguf --out RUN: a llama.cpp model file as an attnlab run.

    FILE.gguf -> gguf_header: the header read and checked (every count and length against the bytes
                 there, every tensor's bytes inside the file and shared with no other); nothing in it
                 is executed, and the tensors' bytes stay in the file, memory-mapped
              -> gguf_layout, gguf_checks: config.json's keys from the metadata, each in range, every
                 size checked against the tensors present, settings attnlab would drop refused by name
              -> gguf_vocab: the tokenizer, checked, as a tokenizer.json, and the chat template
              -> every tensor checked by name, type and shape against what the settings imply, then
                 dequantized (gguf.quants.dequantize) to float32 and laid out as HuggingFace lays it
              -> convert_hf_parts: the path a HuggingFace folder takes (interop/convert.py), so the run
                 is what `convert DIR` would make of the same model

It reads general.architecture gpt2, llama (a llama with experts is a Mixtral) and qwen3 in the weight types
F32, F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K. A quantized tensor becomes the float32 values its blocks
stand for: the run computes what llama.cpp computes from the file, in float32, and fine-tunes from there.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.interop.convert import convert_hf_parts
from attnlab.interop.gguf_checks import check_keys, check_sizes
from attnlab.interop.gguf_header import Header, TensorInfo, read_header
from attnlab.interop.gguf_layout import LAYOUTS, Layout, expected, settings_from_gguf, tensors_from_gguf
from attnlab.interop.gguf_vocab import chat_template, tokenizer_json, vocab_from_metadata
from attnlab.runs.folder import check_new_run

Q = gguf.GGMLQuantizationType
READ_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q6_K)


def convert_from_gguf(src: str | Path, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Write the model in GGUF file `src` as an attnlab run in `out` (replaced only with force, and only
    if it is an attnlab run). Returns a summary: family, architecture, parameters, run, types."""
    src, out = Path(src), Path(out)
    check_new_run(out, force, {src: "the model being converted"})
    header = _open(src)
    meta = header.metadata
    layout = _layout(meta, src)
    hf = hf_config(meta, header, layout, src)
    vocab = vocab_from_metadata(meta, str(src), hf["vocab_size"])  # the cheap checks before the tensors
    tokenizer = tokenizer_json(vocab, str(src))
    template = chat_template(vocab, f"tokenizer.chat_template of {src}")  # tried as it is read
    tensors = read_tensors(header, src, hf, layout)
    types = dict(Counter(t.type.name for t in header.tensors.values()))
    summary = convert_hf_parts(hf, tensors, tokenizer, src, out, {"gguf": str(src), "types": types}, template)
    return summary | {"types": types}


def _open(src: Path) -> Header:
    if not src.is_file():
        raise AttnlabError(f"GGUF file not found: {src}")
    return read_header(src)


def _layout(meta: dict[str, Any], src: Path) -> Layout:
    arch = meta.get(gguf.Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or arch not in LAYOUTS:
        *others, last = LAYOUTS
        raise AttnlabError(
            f"{src} holds a {arch!r:.60} model: attnlab converts GGUF's {', '.join(others)} and {last} architectures"
        )
    return LAYOUTS[arch]


def hf_config(meta: dict[str, Any], header: Header, layout: Layout, src: Path) -> dict[str, Any]:
    """The config.json a HuggingFace folder of this model would have, its sizes checked against the
    file's tensors before anything is built from them."""
    check_keys(meta, layout, str(src))  # rotary scaling and other settings attnlab would drop: refused by name
    hf = settings_from_gguf(meta, layout, str(src))
    shapes = {name: t.shape for name, t in header.tensors.items()}
    if "token_embd.weight" not in shapes:
        raise AttnlabError(f"{src} has no token_embd.weight (the token embedding)")
    check_sizes(meta, hf, shapes, layout, str(src))
    hf["vocab_size"] = shapes["token_embd.weight"][0]  # (rows, width)
    hf["tie_word_embeddings"] = "output.weight" not in shapes  # llama.cpp reads the embedding again
    key, value, _ = layout.computes
    hf |= {key: value, "architectures": [layout.architecture(hf)], "bos_token_id": None, "eos_token_id": None}
    if hf["architectures"] == ["MixtralForCausalLM"]:
        hf |= {"model_type": "mixtral", "sliding_window": None}
    return hf


def read_tensors(header: Header, src: Path, hf: dict[str, Any], layout: Layout) -> dict[str, torch.Tensor]:
    """The file's tensors under HuggingFace's names and layouts, float32; each checked before it is read."""
    wanted = expected(hf, layout)
    missing = [name for name in wanted if name not in header.tensors]
    if missing:
        raise AttnlabError(f"{src} has no tensor {missing[0]}, which its {layout.arch} settings imply")
    data = np.memmap(src, dtype=np.uint8, mode="r")  # the file's bytes, read as each tensor is copied
    out = {}
    for name, t in header.tensors.items():
        if name not in wanted:
            raise AttnlabError(f"{src} has a tensor {name} that attnlab's {layout.arch} has no place for")
        if t.shape != wanted[name][1]:
            raise AttnlabError(f"{src}: tensor {name} has shape {t.shape}; the file's settings imply {wanted[name][1]}")
        out[name] = torch.from_numpy(_values(data, t, src).reshape(t.shape))
    names = {gguf_name: hf_name for gguf_name, (hf_name, _) in wanted.items()}
    return tensors_from_gguf(out, names, hf, layout)


def _values(data: np.ndarray, t: TensorInfo, src: Path) -> np.ndarray:
    """One tensor's values as float32 (a copy: the file stays closed to writes and may be unmapped)."""
    if t.type not in READ_TYPES:
        raise AttnlabError(
            f"{src}: tensor {t.name} is {t.type.name}; attnlab reads the weight types "
            f"{', '.join(q.name for q in READ_TYPES)}"
        )
    blocks = data[t.start : t.start + t.n_bytes].reshape(gguf.quant_shape_to_byte_shape(t.shape, t.type))
    return np.array(gguf.quants.dequantize(blocks, t.type), dtype=np.float32)
