"""Counting a model's parameters as a reader means them: every weight it computes with.

A layer stored packed or quantized (quant/packed.py's int8/int4/bf16 for inference, quant/quantize.py's
int8/NF4 frozen QLoRA base) holds its matrix as codes and scales in buffers, not Parameters, so
`sum(p.numel() for p in model.parameters())` leaves it out: a LoRA run on an NF4 base said "0.08M
parameters" of a 0.87M model. Such a layer says how many weights it stands for
(`logical_parameters()`: O x I and its bias) and how many bytes it keeps (`stored_bytes()`).

    n = count_parameters(model)
    n.logical, n.trained, n.packed, n.stored_bytes
    n.line()   # "0.87M parameters (0.79M of them packed, in 0.46 MB)"
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ParameterCount:
    logical: int  # every weight the model computes with; a packed matrix counts O x I
    trained: int  # of them, those an optimizer updates (requires_grad)
    packed: int  # of them, those stored packed or quantized
    stored_bytes: int  # bytes the parameters and the packed layers keep (a tied weight once)

    def line(self) -> str:
        """ "0.87M parameters (0.008M trained, the rest frozen; 0.79M of them packed, in 0.46 MB)"."""
        notes = []
        if self.trained < self.logical:
            notes.append(f"{self.trained / 1e6:.3f}M trained, the rest frozen")
        if self.packed:
            notes.append(f"{self.packed / 1e6:.2f}M of them packed, {self.stored_bytes / 1e6:.2f} MB stored in all")
        return f"{self.logical / 1e6:.2f}M parameters" + (f" ({'; '.join(notes)})" if notes else "")


def count_parameters(model: nn.Module) -> ParameterCount:
    """Parameters (a tied weight once) plus what each packed or quantized layer stands for."""
    logical = trained = packed = stored = 0
    inside: set[int] = set()  # parameters of a packed layer (none today) are its own to count
    for m in model.modules():
        if hasattr(m, "logical_parameters"):
            n = m.logical_parameters()
            logical, packed, stored = logical + n, packed + n, stored + m.stored_bytes()
            inside |= {id(p) for p in m.parameters()}
    for p in model.parameters():  # each tensor once, however many modules share it
        if id(p) not in inside:
            logical, stored = logical + p.numel(), stored + p.numel() * p.element_size()
            trained += p.numel() if p.requires_grad else 0
    return ParameterCount(logical, trained, packed, stored)
