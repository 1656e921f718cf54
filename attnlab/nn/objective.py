"""An objective around a model: what the training loop calls when the loss is not the model's own.

The loop trains `objective(*batch) -> (output, loss)`; the run saves and loads `objective.model`
alone (runs/weights.py asks `isinstance(module, Objective)`), so a run trained with DPO is a GPT
run like any other. `metrics()` gives what the loop logs beside the loss (DPO's reward accuracy
and margin), from the last batch.
"""

from __future__ import annotations

from torch import nn


class Objective(nn.Module):
    """A loss over `model`'s outputs; its parameters are the model's."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.last: dict[str, float] = {}

    def metrics(self) -> dict[str, float]:
        """Numbers of the last training batch to log beside the loss (name -> value)."""
        return dict(self.last)


def inner(module: nn.Module) -> nn.Module:
    """The model an objective trains (or the module itself)."""
    return module.model if isinstance(module, Objective) else module
