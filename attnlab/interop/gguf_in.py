"""attnlab convert FILE.gguf --out RUN: a llama.cpp model file as an attnlab run.

    FILE.gguf -> gguf.GGUFReader (memory-mapped; nothing in it is executed)
              -> gguf_layout: config.json's keys from the metadata; every tensor checked by name, type and
                 shape against what those settings imply, then dequantized (gguf.quants.dequantize) to
                 float32 and laid out as HuggingFace lays it
              -> gguf_vocab: the tokenizer as a tokenizer.json, and the chat template
              -> convert_hf_parts: the path a HuggingFace folder takes (interop/convert.py), so the run
                 is what `convert DIR` would make of the same model

It reads general.architecture gpt2 and llama (a llama with experts is a Mixtral) in the weight types
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
    reader = _open(src)
    meta = metadata(reader)
    layout = _layout(meta, src)
    hf = hf_config(meta, reader, layout, src)
    tensors = read_tensors(reader, hf, layout, src)
    vocab = vocab_from_metadata(meta, str(src))
    types = dict(Counter(t.tensor_type.name for t in reader.tensors))
    summary = convert_hf_parts(hf, tensors, tokenizer_json(vocab, str(src)), src, out,
                               {"gguf": str(src), "types": types}, chat_template(vocab))  # fmt: skip
    return summary | {"types": types}


def _open(src: Path) -> gguf.GGUFReader:
    if not src.is_file():
        raise AttnlabError(f"GGUF file not found: {src}")
    try:
        return gguf.GGUFReader(src)
    except Exception as e:  # a truncated or foreign file: one user error, whatever numpy says
        raise AttnlabError(f"{src} is not a readable GGUF file ({type(e).__name__}: {e})") from None


def metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Every key-value pair of the file, as Python values (a list for an array)."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _layout(meta: dict[str, Any], src: Path) -> Layout:
    arch = meta.get(gguf.Keys.General.ARCHITECTURE)
    if arch not in LAYOUTS:
        raise AttnlabError(f"{src} holds a {arch!r} model: attnlab converts GGUF's {' and '.join(LAYOUTS)} "
                           "architectures")  # fmt: skip
    return LAYOUTS[arch]


def hf_config(meta: dict[str, Any], reader: gguf.GGUFReader, layout: Layout, src: Path) -> dict[str, Any]:
    """The config.json a HuggingFace folder of this model would have."""
    scaling = meta.get(gguf.Keys.Rope.SCALING_TYPE.format(arch=layout.arch))
    if scaling not in (None, "none"):
        raise AttnlabError(f"{src} scales its rotary angles ({scaling!r}): attnlab computes the default angles only")
    hf = settings_from_gguf(meta, layout, str(src))
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise AttnlabError(f"{src} has no token_embd.weight (the token embedding)")
    hf["vocab_size"] = int(names["token_embd.weight"].shape[1])  # ne: [width, rows]
    hf["tie_word_embeddings"] = "output.weight" not in names  # llama.cpp reads the embedding again
    key, value, _ = layout.computes
    hf |= {key: value, "architectures": [layout.architecture(hf)], "bos_token_id": None, "eos_token_id": None}
    if hf["architectures"] == ["MixtralForCausalLM"]:
        hf |= {"model_type": "mixtral", "sliding_window": None}
    return hf


def read_tensors(reader: gguf.GGUFReader, hf: dict[str, Any], layout: Layout, src: Path) -> dict[str, torch.Tensor]:
    """The file's tensors under HuggingFace's names and layouts, float32; each checked before it is read."""
    wanted = expected(hf, layout)
    found = {t.name: t for t in reader.tensors}
    missing = [name for name in wanted if name not in found]
    if missing:
        raise AttnlabError(f"{src} has no tensor {missing[0]}, which its {layout.arch} settings imply")
    out = {}
    for name, t in found.items():
        if name not in wanted:
            raise AttnlabError(f"{src} has a tensor {name} that attnlab's {layout.arch} has no place for")
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF's ne, fastest first -> numpy's order
        if shape != wanted[name][1]:
            raise AttnlabError(f"{src}: tensor {name} has shape {shape}; the file's settings imply {wanted[name][1]}")
        out[name] = torch.from_numpy(_values(t, src).reshape(shape))
    names = {gguf_name: hf_name for gguf_name, (hf_name, _) in wanted.items()}
    return tensors_from_gguf(out, names, hf, layout)


def _values(t: Any, src: Path) -> np.ndarray:
    """One tensor's values as float32 (a copy: the file stays closed to writes and may be unmapped)."""
    if t.tensor_type not in READ_TYPES:
        raise AttnlabError(f"{src}: tensor {t.name} is {t.tensor_type.name}; attnlab reads the weight types "
                           f"{', '.join(q.name for q in READ_TYPES)}")  # fmt: skip
    return np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
