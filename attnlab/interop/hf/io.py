"""HuggingFace model directories on disk: read one, write one. Nothing is downloaded, nothing unpickled.

A HuggingFace directory (what `save_pretrained` writes) holds
    config.json                       the model's settings, with "architectures": [class name]
    model.safetensors                 the weights (or model.safetensors.index.json + shards)
    tokenizer.json                    the tokenizer, when saved with the model
Older checkpoints keep their weights as pickles (pytorch_model.bin, *.pt, *.ckpt). Unpickling runs
whatever code the file names, so attnlab never opens one: such a folder is refused in one line that
says how to make safetensors from it with the user's own tools, if they trust it.

A folder comes from somebody else, so reading it is bounded: each file must be a regular file of at
most its kind's size, found inside the folder (a link is followed only to a file inside it, or to
the blobs of a HuggingFace cache snapshot, whose files are links to ../../blobs); a shard index
names files inside the folder. The config is checked against the weights' shapes (safetensors
headers, interop/hf/bounds.py) before the tensors themselves are read. Names stay HuggingFace's
here; each family's module (gpt2.py, ...) maps them to attnlab's.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from attnlab.errors import AttnlabError, one_line
from attnlab.interop.hf.bounds import Shapes, checked_config
from attnlab.io import read_safetensors, write_json, write_text
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS
from attnlab.runs.weights import write_weights

SAFE_INDEX = "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"  # recognised, refused, never opened
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MIB = 2**20
JSON_LIMIT = 16 * MIB  # config.json, an index: kilobytes; a config with 20,000 labels, about a megabyte
TOKENIZER_LIMIT = 64 * MIB  # the largest tokenizer.json we know (Gemma 3's) is 33 MB


def read_hf_dir(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], str | None]:
    """(config.json as a dict, every weight tensor by its HuggingFace name, tokenizer.json text or None)."""
    d = Path(path)
    if not d.is_dir():
        raise AttnlabError(f"HuggingFace model directory not found: {d}")
    if folder_file(d, CONFIG, JSON_LIMIT) is None:
        raise AttnlabError(f"{d}: no config.json (not a HuggingFace model directory)")
    config = read_json_file(d, CONFIG)
    if not isinstance(config, dict):
        raise AttnlabError(f"{d / CONFIG} is corrupt: expected a JSON object")
    files = weight_files(d)
    checked_config(config, shapes_of(files), d)  # before gigabytes are read for a config that cannot fit them
    tokenizer = read_text_file(d, TOKENIZER, TOKENIZER_LIMIT)
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f)[0])
    return config, tensors, tokenizer


def folder_file(d: Path, name: str, limit: int) -> Path | None:
    """File `name` of model folder d, to read; None where there is none. Refused in one line: a name
    that leaves the folder, a link to a file outside it, anything but a regular file, a file over `limit`."""
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\\" in name:
        raise AttnlabError(f"{d}: {name!r} names a file outside the model folder: refusing to read it")
    path = d / rel
    if not path.exists() and not path.is_symlink():
        return None
    target = path.resolve()
    if not (target.is_relative_to(d.resolve()) or _cache_blob(d, target)):
        raise AttnlabError(
            f"{path} is a link to {target}, outside the model folder: attnlab reads only the "
            "folder's own files; copy that file in if it belongs to the model"
        )
    if not target.is_file():
        what = "a broken link" if not target.exists() else "a device, pipe or folder"
        raise AttnlabError(f"{path} is not a regular file ({what}): give the model's own file")
    if target.stat().st_size > limit:
        raise AttnlabError(
            f"{path} is {target.stat().st_size:,} bytes, more than any {rel.name} attnlab reads "
            f"({limit:,}): it is not the model's"
        )
    return path


def _cache_blob(d: Path, target: Path) -> bool:
    """Whether target is a blob of the HuggingFace cache snapshot d (models--org--name/snapshots/REV,
    whose files link to models--org--name/blobs/HASH), a real folder, not itself a link."""
    root = d.resolve()
    blobs = root.parent.parent / "blobs"
    return root.parent.name == "snapshots" and blobs.is_dir() and not blobs.is_symlink() and target.parent == blobs


def read_text_file(d: Path, name: str, limit: int) -> str | None:
    """A text file of the folder (None if absent): UTF-8, a leading byte-order mark dropped."""
    path = folder_file(d, name, limit)
    if path is None:
        return None
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise AttnlabError(
            f"{path} is not UTF-8 text (byte {e.start} is {data[e.start]:#04x}): give the model's own file"
        ) from None


def read_json_file(d: Path, name: str) -> Any:
    """A JSON file of the folder (None if absent), however broken or deeply nested: one line if unreadable."""
    text = read_text_file(d, name, JSON_LIMIT)
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: lists nested thousands deep
        raise AttnlabError(f"{d / name} is not valid JSON ({one_line(e) or 'nested too deeply'})") from None


def weight_files(d: Path) -> list[Path]:
    """The safetensors files of folder d: model.safetensors, else the shards its index names."""
    single = folder_file(d, WEIGHTS, 2**62)  # a weight file is as big as the model: its header says more
    if single is not None:
        return [single]
    if folder_file(d, SAFE_INDEX, JSON_LIMIT) is not None:
        return [_shard(d, shard) for shard in sorted(set(_weight_map(d).values()))]
    pickles = sorted(p.name for p in d.iterdir() if p.name == BIN_INDEX or p.suffix in PICKLES)
    if pickles:
        raise AttnlabError(pickle_refusal(d, pickles))
    raise AttnlabError(f"{d}: no model.safetensors (nor {SAFE_INDEX} with its shards), the weights attnlab reads")


# How to make a HuggingFace folder's safetensors from its pickles, with one's own trusted tools.
HOW = (
    "transformers: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True), "
    "or the model's own Auto class; or safetensors.torch.save_file(torch.load(FILE), 'model.safetensors')"
)


def pickle_refusal(d: Path, pickles: list[str], how: str = HOW) -> str:
    """Why a pickle is never opened, and how to make safetensors from it where the user trusts it."""
    return (
        f"{d} keeps its weights only as pickles ({', '.join(pickles[:3])}): attnlab never loads a pickle, "
        "since unpickling can run any code the file holds; if you trust the file, save it as safetensors "
        f"with your own Python ({how}) and try again"
    )


def _weight_map(d: Path) -> dict[str, str]:
    index = read_json_file(d, SAFE_INDEX)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise AttnlabError(f"{d / SAFE_INDEX} is corrupt: it has no weight_map of tensor names to files")
    return weight_map


def _shard(d: Path, name: str) -> Path:
    """A shard the index names: a safetensors file inside the folder (an index may come from anywhere,
    and "../../etc/passwd" is not a weight file of this model)."""
    path = folder_file(d, name, 2**62)  # first: a name that leaves the folder is refused as such
    if not name.endswith(".safetensors"):
        raise AttnlabError(f"{d / SAFE_INDEX} names {name!r} as a shard: attnlab reads safetensors shards only")
    if path is None:
        raise AttnlabError(f"{d / SAFE_INDEX} names {name!r}, which {d} does not hold")
    return path


def shapes_of(files: list[Path]) -> Shapes:
    """Every tensor's shape, from the files' headers alone (nothing else is read); a name in two files,
    or a header that does not describe its file (safetensors checks every offset), is one line."""
    shapes: Shapes = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name in shapes:
                        raise AttnlabError(f"{path.parent}: tensor {name} is in two weight files")
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except (SafetensorError, OSError, ValueError) as e:
            raise AttnlabError(f"{path} is corrupt or truncated ({one_line(e)})") from None
    return shapes


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
