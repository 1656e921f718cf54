"""Which heads to take out: `--remove 2.3` or `--keep 1.1,2.4` in sample and predict.

A head is named LAYER.HEAD, both counted from 1 as in every picture and table ("2.3": layer 2,
head 3); a layer alone ("2") means all its heads. In an encoder-decoder a prefix names the
attention: "encoder:1.2", "decoder:1.2" (self-attention) or "cross:1.2"; without one, the
model's first stack. --remove zeroes the named heads' outputs; --keep zeroes every other head
of the same kind of attention (`--keep 2.1` on a GPT: layer 2's head 1 is the only head left).
Zeroing a head's output before the output projection removes exactly its contribution (the
ablation of interpret/ablation.py), and works on the fast attention path, so sampling keeps its
speed.
"""

from __future__ import annotations

from torch import nn

from attnlab.errors import AttnlabError
from attnlab.nn.hooks import Hook, taps, zero_heads

KINDS = {"encoder": ("encoder", "attn"), "decoder": ("decoder", "attn"), "cross": ("decoder", "cross")}


def _points(model: nn.Module) -> dict[tuple[str, str], list[str]]:
    """(stack, attention kind) -> its layers' hook_head_out names in order."""
    out: dict[tuple[str, str], list[str]] = {}
    for name in taps(model):
        parts = name.split(".")
        if len(parts) == 4 and parts[3] == "hook_head_out" and parts[1].isdigit():
            out.setdefault((parts[0], parts[2]), []).append(name)
    return out


def parse_heads(spec: str, model: nn.Module) -> dict[str, set[int]]:
    """'1.2,2' -> {hook name: {0-based heads}}, checked against the model."""
    points = _points(model)
    if not points:
        raise AttnlabError("this model has no attention heads to remove")
    default = next(iter(points))
    found: dict[str, set[int]] = {}
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        kind, _, where = item.rpartition(":")
        if kind and kind not in KINDS:
            raise AttnlabError(f"{item!r}: the prefix is one of {', '.join(KINDS)} (e.g. cross:1.2)")
        key = KINDS[kind] if kind else default
        if key not in points:
            raise AttnlabError(f"{item!r}: this model has no {kind or key[1]} attention")
        layer, _, head = where.partition(".")
        name = _layer(points[key], layer, item)
        n = model.get_submodule(name.rsplit(".", 1)[0]).n_heads
        heads = set(range(n)) if not head else {_number(head, n, "head", item) - 1}
        found.setdefault(name, set()).update(heads)
    if not found:
        raise AttnlabError("name at least one head, e.g. 2.3 (layer 2, head 3) or 2 (all of layer 2)")
    return found


def _number(text: str, most: int, what: str, item: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise AttnlabError(f"{item!r}: the {what} is a number from 1 to {most}")
    return int(text)


def _layer(names: list[str], layer: str, item: str) -> str:
    return names[_number(layer, len(names), "layer", item) - 1]


def head_hooks(model: nn.Module, keep: str | None = None, remove: str | None = None) -> dict[str, Hook]:
    """The hooks that zero the heads `remove` names, or all but those `keep` names ({} for neither)."""
    if keep and remove:
        raise AttnlabError("give --keep or --remove, not both")
    if not (keep or remove):
        return {}
    named = parse_heads(keep or remove, model)
    if remove:
        return {name: zero_heads(sorted(heads)) for name, heads in named.items()}
    kinds = {tuple(name.split(".")[::2][:2]) for name in named}  # (stack, kind) pairs that keep named heads
    hooks: dict[str, Hook] = {}
    for key, names in _points(model).items():
        if key not in kinds:
            continue
        for name in names:
            n = model.get_submodule(name.rsplit(".", 1)[0]).n_heads
            gone = sorted(set(range(n)) - named.get(name, set()))
            if gone:
                hooks[name] = zero_heads(gone)
    return hooks


def describe(model: nn.Module, fns: dict[str, Hook]) -> str:
    """'zeroed 5 of 16 heads' for a status line."""
    total = sum(model.get_submodule(n.rsplit(".", 1)[0]).n_heads for names in _points(model).values() for n in names)
    return f"zeroed {sum(len(fn.heads) for fn in fns.values())} of {total} heads"
