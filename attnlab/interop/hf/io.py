"""HuggingFace model directories on disk: read one, write one. Nothing is downloaded.

A HuggingFace directory (what `save_pretrained` writes) holds
    config.json                       the model's settings, with "architectures": [class name]
    model.safetensors                 the weights (or model.safetensors.index.json + shards),
    or pytorch_model.bin              in older checkpoints: a pickled state dict
    tokenizer.json                    the tokenizer, when saved with the model
Pickles are read with `torch.load(weights_only=True)`, which refuses anything but tensors and
plain containers, so reading a checkpoint never runs code from it. Names stay HuggingFace's
here; each family's module (gpt2.py, ...) maps them to attnlab's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.errors import AttnlabError, one_line
from attnlab.io import read_json, read_safetensors, write_json, write_text
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS
from attnlab.runs.weights import write_weights

SAFE_INDEX = "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


def read_hf_dir(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], str | None]:
    """(config.json as a dict, every weight tensor by its HuggingFace name, tokenizer.json text or None)."""
    d = Path(path)
    if not d.is_dir():
        raise AttnlabError(f"HuggingFace model directory not found: {d}")
    if not (d / CONFIG).is_file():
        raise AttnlabError(f"{d}: no config.json (not a HuggingFace model directory)")
    config = read_json(d / CONFIG)
    if not isinstance(config, dict):
        raise AttnlabError(f"{d / CONFIG} is corrupt: expected a JSON object")
    tokenizer = d / TOKENIZER
    return config, read_hf_weights(d), tokenizer.read_text(encoding="utf-8") if tokenizer.is_file() else None


def read_hf_weights(d: Path) -> dict[str, torch.Tensor]:
    """The weights of directory d: safetensors preferred (as transformers does), then pickles."""
    if (d / WEIGHTS).is_file():
        return read_safetensors(d / WEIGHTS)[0]
    if (d / SAFE_INDEX).is_file():
        return _read_shards(d, SAFE_INDEX, lambda p: read_safetensors(p)[0])
    if (d / BIN).is_file():
        return _read_bin(d / BIN)
    if (d / BIN_INDEX).is_file():
        return _read_shards(d, BIN_INDEX, _read_bin)
    raise AttnlabError(f"{d}: no model.safetensors or pytorch_model.bin (the weight files attnlab reads)")


def _read_shards(d: Path, index: str, read) -> dict[str, torch.Tensor]:
    """A sharded checkpoint: the index's weight_map names the file of every tensor."""
    index_json = read_json(d / index)
    weight_map = index_json.get("weight_map") if isinstance(index_json, dict) else None
    if not isinstance(weight_map, dict):
        raise AttnlabError(f"{d / index} is corrupt: it has no weight_map")
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read(shard_path(d, index, shard)))
    return tensors


def shard_path(d: Path, index: str, shard: Any) -> Path:
    """A shard named by the index, which must be a file inside the model folder: an index may come
    from anywhere, and "../../etc/passwd" is not a weight file of this model."""
    if not isinstance(shard, str) or not shard:
        raise AttnlabError(f"{d / index} is corrupt: its weight_map names {shard!r} as a file")
    path = (d / shard).resolve()
    if not path.is_relative_to(d.resolve()):
        raise AttnlabError(f"{d / index} names {shard!r}, which lies outside {d}: refusing to read it")
    return path


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    """A pickled state dict, unpickled safely: tensors and plain containers only."""
    if not path.is_file():
        raise AttnlabError(f"missing {path.name} in {path.parent}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, bad pickle, or a pickle of other objects: all one user error
        raise AttnlabError(f"{path} is corrupt or truncated, or holds more than tensors ({one_line(e)})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise AttnlabError(f"{path} is not a state dict (a mapping of names to tensors)")
    return state


def write_hf_dir(
    path: str | Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], tokenizer_json: str | None
) -> None:
    """Write config.json, model.safetensors and (when given) tokenizer.json into directory path.

    A tensor that shares its storage with an earlier one (a tied weight) is written once, under
    its first name, as transformers does: from_pretrained ties it again from the config.
    """
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    seen, once = set(), {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if key not in seen:
            seen.add(key)
            once[name] = t
    write_json(d / CONFIG, config)
    write_weights(once, d / WEIGHTS, {"format": "pt"})  # transformers checks the "format" entry
    if tokenizer_json is not None:
        write_text(d / TOKENIZER, tokenizer_json)
