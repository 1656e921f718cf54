"""A PEFT adapter folder's adapter_config.json: read bounded, and every value checked by its kind.

An adapter folder comes from somebody else. Its config is read as interop/hf/io.py reads a model's
(a regular file inside the folder, of a bounded size, however deeply nested), then: peft_type LORA;
r a whole number >= 1; lora_alpha a finite number > 0; lora_dropout in [0, 1); target_modules module
names; rank_pattern and alpha_pattern mappings of module names to ranks and alphas, matched as the end
of a module's name. PEFT reads pattern keys (and a target_modules string) as regular expressions;
attnlab runs none from a file (a pattern such as (a*)*b takes ages on a module's name): a key that is
not a plain name is refused, and a string target_modules is left to the file's tensors. DoRA, rsLoRA,
biases and adapters of some layers only are refused by name: attnlab's adapters are plain LoRA.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.interop.hf.bounds import Kind, check_values, fits, shown
from attnlab.interop.hf.io import JSON_LIMIT, folder_file, read_json_file

CONFIG = "adapter_config.json"
PLAIN = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")  # a module's name or the end of one, nothing more


def _names(v: Any) -> str | None:
    """target_modules: module names (a string is PEFT's regular expression: not run here, the file's
    tensors say what it adapts)."""
    ok = (
        v is None
        or isinstance(v, str)
        or (isinstance(v, list) and all(isinstance(n, str) and PLAIN.fullmatch(n) for n in v))
    )
    return None if ok else "a list of module names (q_proj, c_attn, ...)"


def _pattern(value: str) -> Kind:
    """rank_pattern, alpha_pattern: module name -> a value of its kind, matched as the end of a module's
    name. PEFT reads the keys as regular expressions; attnlab runs none from a file (some take ages)."""

    def kind(v: Any) -> str | None:
        if v is None or isinstance(v, dict) and all(PLAIN.fullmatch(k) and not fits(x, value) for k, x in v.items()):
            return None
        return f"an object of module names (c_fc, model.layers.0.mlp.c_fc) to values, each {fits(None, value)}"

    return kind


KEYS: dict[str, Kind] = {
    "r": "size",
    "lora_alpha": "positive",
    "lora_dropout": "rate or null",
    "target_modules": _names,
    "rank_pattern": _pattern("size"),
    "alpha_pattern": _pattern("positive"),
    "bias": "name",
    "use_dora": "flag",
    "use_rslora": "flag",
    "lora_bias": "flag",
}
# Options that adapt part of the model, or more than LoRA's matrices: refused by name unless null.
PARTIAL = ("layers_to_transform", "layers_pattern", "modules_to_save", "trainable_token_indices")


def check_peft_config(peft: Any) -> None:
    """One line for a config that is broken, or that attnlab's plain LoRA cannot express."""
    if not isinstance(peft, dict) or peft.get("peft_type") != "LORA":
        kind = peft.get("peft_type") if isinstance(peft, dict) else None
        raise AttnlabError(f"{CONFIG}: peft_type {shown(kind)}; attnlab reads LORA adapters")
    check_values(peft, KEYS, CONFIG)
    for key in ("use_dora", "use_rslora", "lora_bias"):
        if peft.get(key):
            raise AttnlabError(f"{CONFIG}: {key} is set; attnlab reads plain LoRA")
    if peft.get("bias", "none") != "none":
        raise AttnlabError(f"{CONFIG}: bias {peft['bias']!r}; attnlab's adapters train no biases")
    for key in PARTIAL:
        if peft.get(key) not in (None, [], {}):
            raise AttnlabError(
                f"{CONFIG}: {key} is {shown(peft[key])}; attnlab's adapters are LoRA's A and B "
                "on the same matrices of every block"
            )


def read_peft_config(d: Path) -> dict[str, Any]:
    """A folder's adapter_config.json, read bounded and checked (check_peft_config)."""
    if folder_file(d, CONFIG, JSON_LIMIT) is None:
        raise AttnlabError(f"{d} has no {CONFIG}: not a PEFT adapter folder")
    peft = read_json_file(d, CONFIG)
    try:
        check_peft_config(peft)
    except AttnlabError as e:  # its lines start "adapter_config.json: ...": say which folder's
        raise AttnlabError(f"{d / str(e)}" if str(e).startswith(CONFIG) else str(e)) from None
    return peft


def matched(patterns: Any, key: str) -> Any:
    """The value of the first pattern naming module `key` or its end (as PEFT matches plain names)."""
    return next((v for p, v in (patterns or {}).items() if key == p or key.endswith("." + p)), None)


def alpha_of(peft: dict[str, Any], key: str) -> float:
    """A module's lora_alpha: alpha_pattern's, or the adapter's."""
    own = matched(peft.get("alpha_pattern"), key)
    return float(own if own is not None else peft.get("lora_alpha", 8))


def rank_of(peft: dict[str, Any], key: str) -> int:
    """A module's rank: rank_pattern's, or the adapter's r."""
    own = matched(peft.get("rank_pattern"), key)
    return int(own if own is not None else peft.get("r", 8))
