"""What the tasks' prepare steps share: a model config from a preset as the base, then the user's
flags, then the sizes the data decides, each step with a one-line error a user can act on; the
encoder-decoders' preset and context; a builder that starts from --init; config.json's settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.config import from_dict
from attnlab.errors import AttnlabError
from attnlab.models import build_model
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.weights import load_weights

if TYPE_CHECKING:
    from torch import nn

    from attnlab.engine.train import TrainRequest


def preset_fields(presets: dict[str, Any], name: str | None, default: str, what: str = "") -> dict[str, Any]:
    """The fields of preset `name` (or `default` when None), as a dict to override."""
    name = name or default
    if name not in presets:
        raise AttnlabError(f"unknown {what + ' ' if what else ''}preset {name!r}; choose from {', '.join(presets)}")
    return dataclasses.asdict(presets[name])


def decoder_preset(choice: Any, overrides: dict, max_len: int, rnn: str) -> tuple[dict, dict]:
    """An encoder-decoder's (preset fields, sizes), `overrides` without the preset and context it
    takes out: the Transformer's preset (named, or its default) and its context, room for max_len
    tokens + BOS or EOS unless given; an RNN (`rnn` names it in the error) has no preset to take."""
    if choice.presets:
        base = preset_fields(choice.presets, overrides.pop("preset", None), choice.default_preset)
        return base, {"context": overrides.pop("context", None) or max_len + 1}
    if "preset" in overrides:
        raise AttnlabError(f"--preset names a Transformer size: it does not apply to {rnn}")
    return {}, {}


def build_config(model: str, cls: type, base: dict, overrides: dict, sizes: dict) -> Any:
    """cls from base < overrides (the user's flags, which must all be fields of cls) < sizes."""
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise AttnlabError(f"--{unknown[0].replace('_', '-')} does not apply to --model {model}")
    try:
        return from_dict(cls, {**base, **overrides, **sizes}, where=f"{model} model config")
    except ValueError as e:
        raise AttnlabError(f"{model} model config: {e}") from None


def init_builder(family: str, cfg: Any, req: TrainRequest) -> Callable[[], nn.Module]:
    """The model builder of a task whose --init run has the same model: every weight from it when a
    new run starts from one (resuming reads the run's own checkpoint instead)."""

    def build() -> nn.Module:
        net = build_model(family, cfg)
        if req.init is not None and not req.resume:
            load_weights(net, Path(req.init) / WEIGHTS)
        return net

    return build


def config_json(req: TrainRequest, family: str, model: Any, task: dict | None = None, data: Any = None) -> dict:
    """config.json's settings: the model's family and fields (a config or a dict of them), the
    training and data settings (`data`: the request's, or what the task made of them), the task's
    section where it has one, and the --init run it started from."""
    fields = model if isinstance(model, dict) else dataclasses.asdict(model)
    config = {"family": family, "model": fields, "train": dataclasses.asdict(req.train)}
    config["data"] = dataclasses.asdict(req.data if data is None else data)
    if task is not None:
        config["task"] = task
    if req.init is not None:
        config["init"] = str(req.init)
    return config
