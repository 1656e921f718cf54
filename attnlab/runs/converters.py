"""What turns a base model into the one a run trains: an ordered list of typed converters, as
torchtitan records a model (a base, then its converters). config.json holds the list:

    "converters": [{"kind": "quantize", "base": "nf4"}, {"kind": "lora", "rank": 8, "alpha": 16.0, ...}]

The frozen base's block matrices are quantized first, LoRA adapters go on top. Runs written before
the list (issue 52) kept both in their adapter section (adapter.lora, adapter.quantize_base):
`converters_of` reads either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from attnlab.config import checked, option
from attnlab.errors import AttnlabError
from attnlab.nn.lora import LoRAConfig
from attnlab.quant.quantize import KINDS as QUANTIZED


@dataclass
class QuantizeConfig:
    """The frozen base's block matrices kept quantized (flags --quantize-*)."""

    base: str | None = option(
        None,
        "keep the frozen base's block matrices quantized: int8 (per channel) or nf4 (4-bit NormalFloat "
        "in blocks of 64, as QLoRA); needs --lora-rank",
        QUANTIZED,
    )


CONVERTERS: dict[str, type] = {"quantize": QuantizeConfig, "lora": LoRAConfig}  # kind -> its settings


def kind_of_converter(converter: Any) -> str:
    return next(k for k, cls in CONVERTERS.items() if isinstance(converter, cls))


def as_records(converters: tuple) -> list[dict[str, Any]]:
    """config.json's list: each converter's kind and fields, in the order they apply."""
    return [{"kind": kind_of_converter(c), **asdict(c)} for c in converters]


def from_records(records: list) -> tuple:
    """The converters of config.json's list."""
    out = []
    for r in records:
        if not isinstance(r, dict) or r.get("kind") not in CONVERTERS:
            raise AttnlabError(f"config.json's converters are corrupt: {r!r} is none of {', '.join(CONVERTERS)}")
        fields = {k: v for k, v in r.items() if k != "kind"}
        out.append(checked(CONVERTERS[r["kind"]], fields, where=f"converter {r['kind']}"))
    return tuple(out)


def converters_of(config: dict[str, Any]) -> tuple:
    """A run's converters: config.json's list, or those of a run written before it (adapter.lora and
    adapter.quantize_base); () for a run whose weights are the whole model."""
    if "converters" in config:
        return from_records(config["converters"])
    adapter = config.get("adapter")
    if not isinstance(adapter, dict) or "lora" not in adapter:
        return ()
    lora = checked(LoRAConfig, adapter["lora"], where="adapter lora")
    scheme = adapter.get("quantize_base")
    return ((QuantizeConfig(scheme),) if scheme else ()) + (lora,)


def converters_given(lora: dict[str, Any], quantize: dict[str, Any]) -> tuple:
    """The converters the flags (or a TOML file's [lora] and [quantize]) ask for: none without a LoRA
    rank (every weight trains; a quantized base would be frozen, so that is refused)."""
    q = checked(QuantizeConfig, quantize, where="[quantize]")
    if not lora.get("rank"):
        if q.base:
            raise AttnlabError("--quantize-base freezes the base: give --lora-rank too (e.g. --lora-rank 8)")
        return ()
    return ((q,) if q.base else ()) + (checked(LoRAConfig, lora, where="[lora]"),)


def lora_of(converters: tuple) -> LoRAConfig | None:
    return next((c for c in converters if isinstance(c, LoRAConfig)), None)


def quantized_base(converters: tuple) -> str | None:
    return next((c.base for c in converters if isinstance(c, QuantizeConfig)), None)
