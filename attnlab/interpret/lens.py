"""The logit lens (nostalgebraist 2020): what the model would predict if it stopped after layer l.

Legend: L layers, T positions, V vocabulary.

The residual stream after each block (and the embeddings before the first) is passed through the
model's own final norm and output head, giving a next-token distribution per layer and position.
In a trained model the last rows agree with the output, and one can see at which depth the answer
forms. Works for a GPT (`blocks`, `norm`, `logits`) and for the encoder-decoder's decoder
(`decoder`, `dec_norm`, `out`), given the source: logit_lens(model, tgt_in, decode, src=src).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError
from attnlab.interpret.trace import trace
from attnlab.models.protocols import CausalLM, ReadOut
from attnlab.viz.figures import pyplot, save_figure
from attnlab.viz.picture import Picture


@dataclass
class Lens:
    tokens: list[str]  # the input, one string per position
    layers: list[str]  # "embed", "block 1", ..., "block L"
    top: list[list[str]]  # (L + 1, T): the most likely next token
    prob: Tensor  # (L + 1, T): its probability
    target_prob: Tensor | None  # (L + 1, T - 1): the probability of the token that comes next

    def as_json(self) -> dict:
        return {
            "tokens": self.tokens,
            "layers": self.layers,
            "top": self.top,
            "prob": self.prob.tolist(),
            "target_prob": None if self.target_prob is None else self.target_prob.tolist(),
        }

    def __repr__(self) -> str:  # the dataclass's would print both tensors
        return f"Lens({len(self.tokens)} positions read after {', '.join(self.layers)}; see .top and .prob)"

    def _repr_png_(self) -> bytes:
        """A notebook shows the lens as plot_lens draws it."""
        return Picture.of(lambda path: plot_lens(self, path)).data


def _reader(model: nn.Module, src: Tensor | None) -> tuple[str, nn.Module, nn.Module]:
    """The stack whose stream is read, and the final norm and head to read it through (models/protocols.py)."""
    if not isinstance(model, ReadOut) or isinstance(model, CausalLM) != (src is None):
        raise AttnlabError(
            "the logit lens needs a decoder language model (a GPT run) or a translation Transformer with its source"
        )
    return model.readout()


@torch.no_grad()
def logit_lens(model: nn.Module, ids: Tensor, decode=lambda i: str(i), src: Tensor | None = None) -> Lens:
    """ids (1, T) -> the lens of each layer; decode(id) -> the token's text. For an encoder-decoder,
    ids are the decoder's inputs and src (1, S) the source."""
    stack, norm, head = _reader(model, src)
    t = trace(model, ids) if src is None else trace(model, src, ids)
    n = sum(1 for name in t.names() if name.startswith(f"{stack}.") and name.endswith(".hook_resid_post"))
    streams = [t[f"{stack}.0.hook_resid_pre"]] + [t[f"{stack}.{i}.hook_resid_post"] for i in range(n)]
    probs = torch.stack([head(norm(x)).float().softmax(-1)[0] for x in streams])  # (L + 1, T, V)
    prob, top = probs.max(-1)  # (L + 1, T)
    nxt = ids[0, 1:]
    target = None
    if len(nxt):  # (L + 1, T - 1): the probability each depth gives the token that came next
        target = probs[:, :-1].gather(-1, nxt.view(1, -1, 1).expand(len(streams), -1, 1))[..., 0].cpu()
    return Lens(
        [decode(int(i)) for i in ids[0]],
        ["embed"] + [f"block {i + 1}" for i in range(n)],
        [[decode(int(i)) for i in row] for row in top],
        prob.cpu(),
        target,
    )


def plot_lens(lens: Lens, path: str | Path, max_positions: int = 40) -> Picture:
    """Layers x positions, each cell the top next token, coloured by its probability (PNG or SVG)."""
    plt = pyplot()

    T = min(len(lens.tokens), max_positions)
    L = len(lens.layers)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * T + 2), max(3, 0.45 * L + 1.5)), dpi=110)
    im = ax.imshow(lens.prob[:, :T].numpy(), aspect="auto", cmap="Blues", vmin=0, vmax=1, origin="lower")
    size = 8 if T <= 24 else 6
    for layer in range(L):
        for pos in range(T):
            p = float(lens.prob[layer, pos])
            ax.text(
                pos,
                layer,
                repr(lens.top[layer][pos])[1:-1][:8],
                ha="center",
                va="center",
                fontsize=size,
                color="white" if p > 0.55 else "black",
            )
    ax.set_xticks(range(T), [repr(tok)[1:-1][:10] for tok in lens.tokens[:T]], rotation=60, ha="right", fontsize=size)
    ax.set_yticks(range(L), lens.layers, fontsize=9)
    ax.set_xlabel("input position (the cell: the next token predicted there)")
    ax.set_title("logit lens: top next token after each layer, shaded by its probability")
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    fig.tight_layout()
    return save_figure(fig, path)
