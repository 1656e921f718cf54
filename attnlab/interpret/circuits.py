"""The local replacement model of one prompt and its attribution graph (transcoders: transcoder.py).

Legend: B rows (targets at once), T positions, C width, L layers, n_f active features, V vocabulary.

On one prompt, freeze every attention pattern and every norm's scale at their values there (a
LayerNorm becomes x -> (x - mean x) * (gamma / sigma) + beta with sigma a constant, RMSNorm likewise),
and replace each MLP by its transcoder plus an error node, err = MLP(x) - transcoder(x) at each
position (a constant). The model is then affine in its sources: the embeddings (token + position, the
stream entering block 0), each active feature's activation a times its decoder row, and the errors;
the rest (norm betas, attention's output biases, the transcoders' output biases, the encoders'
biases) is a constant per target, the `bias`. So for every target node t

    value(t) = sum over sources s of edge(s -> t) + bias(t)          exactly

where edge(s -> t) = (the vector s writes) . d value(t) / d (the stream where s writes): gradients
taken through frozen attention and norms only, with the MLP paths cut, so an edge is s's direct
effect. Targets: each active feature (its pre-activation, equal to its activation a since it is
active) and the target logit, read as logit(target) - mean over the vocabulary of the logits at
the last position (before any soft-cap), which no constant added to every logit moves. bias(t) is
the same model run with every source zero (the frozen scales and patterns kept). Scores and
pruning: circuits_graph.py; the intervention check: circuits_check.py; the page: circuits_page.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.errors import AttnlabError
from attnlab.interpret.transcoder import Transcoder, decoder_blocks, has_mlps
from attnlab.nn.hooks import hooks
from attnlab.nn.norm import LayerNorm, RMSNorm

FF = Callable[[int, Tensor, Tensor], Tensor]  # (layer, MLP input, MLP output) -> the output used


@dataclass
class Frozen:
    """What one clean pass of the prompt fixes: the stream into block 0, every pattern and norm scale,
    each MLP's input and output, the final hidden state."""

    ids: Tensor  # (1, T)
    emb: Tensor  # (1, T, C)
    patterns: dict[str, Tensor]  # hook point -> (1, H, T, T)
    scales: dict[nn.Module, Tensor]  # norm -> (1, ..., T, 1): 1 / sigma (LayerNorm) or 1 / rms (RMSNorm)
    mlp_in: list[Tensor] = field(default_factory=list)  # L x (1, T, C)
    mlp_out: list[Tensor] = field(default_factory=list)
    hidden: Tensor | None = None  # (1, T, C) after the final norm


def _norms(model: nn.Module) -> list[nn.Module]:
    """Every norm whose scale the local replacement model freezes (those inside attention too: harmless,
    as the patterns they feed are frozen anyway)."""
    return [m for m in model.modules() if isinstance(m, LayerNorm | RMSNorm)]


def _scale(norm: nn.Module, x: Tensor) -> Tensor:
    if isinstance(norm, LayerNorm):
        return torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
    return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)


def _linear_norm(norm: nn.Module, x: Tensor, scale: Tensor) -> Tensor:
    """The norm with its scale held at `scale`: affine in x."""
    if isinstance(norm, LayerNorm):
        y = (x - x.mean(-1, keepdim=True)) * scale * norm.weight
        return y if norm.bias is None else y + norm.bias
    return x * scale * norm.weight


def _pattern_points(model: nn.Module) -> list[str]:
    stack = model.readout()[0]
    return [f"{stack}.{i}.attn.hook_pattern" for i in range(len(decoder_blocks(model)))]


def mlps(model: nn.Module) -> list[nn.Module]:
    """The blocks whose MLPs the graph replaces: none in an attention-only model, whose graph holds the
    embeddings alone (each position's direct share of the target, through the frozen attention)."""
    blocks = decoder_blocks(model)
    return blocks if has_mlps(model) else []


@torch.no_grad()
def freeze(model: nn.Module, ids: Tensor) -> Frozen:
    """One clean pass of ids (1, T), recording what the local replacement model holds fixed."""
    fz = Frozen(ids, None, {}, {})

    def scale(norm: nn.Module, args: tuple, out: Tensor) -> None:
        fz.scales[norm] = _scale(norm, args[0])

    def mlp(ff: nn.Module, args: tuple, out: Tensor) -> None:
        fz.mlp_in.append(args[0])
        fz.mlp_out.append(out)

    handles = [n.register_forward_hook(scale) for n in _norms(model)]
    handles += [block.ff.register_forward_hook(mlp) for block in mlps(model)]
    handles.append(model.readout()[1].register_forward_hook(lambda m, a, out: setattr(fz, "hidden", out)))
    stack = model.readout()[0]
    points = {p: (lambda x, p=p: fz.patterns.__setitem__(p, x.clone())) for p in _pattern_points(model)}
    points[f"{stack}.0.hook_resid_pre"] = lambda x: setattr(fz, "emb", x.clone())
    try:
        with hooks(model, points):
            model(ids)
    finally:
        for h in handles:
            h.remove()
    return fz


@contextlib.contextmanager
def frozen_run(model: nn.Module, fz: Frozen, rows: int, ff: FF, emb: Tensor | None = None) -> Iterator[dict]:
    """Run the model (on fz.ids repeated `rows` times) with fz's patterns and norm scales, block 0's
    input replaced by emb (rows, T, C) when given, and layer i's MLP output by ff(i, input, output).
    Yields a dict that holds "hidden", the final norm's output (rows, T, C), once the pass is run
    with out["run"]()."""
    out: dict = {}
    handles = [n.register_forward_hook(lambda m, a, o: _linear_norm(m, a[0], fz.scales[m])) for n in _norms(model)]
    for i, block in enumerate(mlps(model)):
        handles.append(block.ff.register_forward_hook(lambda m, a, o, i=i: ff(i, a[0], o)))
    handles.append(model.readout()[1].register_forward_hook(lambda m, a, o: out.__setitem__("hidden", o)))
    points = {p: (lambda x, p=p: fz.patterns[p].expand(rows, -1, -1, -1)) for p in _pattern_points(model)}
    if emb is not None:
        points[f"{model.readout()[0]}.0.hook_resid_pre"] = lambda x: emb
    try:
        with hooks(model, points):
            out["run"] = lambda: model(fz.ids.expand(rows, -1))
            yield out
    finally:
        for h in handles:
            h.remove()


def metric(model: nn.Module, hidden: Tensor, target: int) -> Tensor:
    """logit(target) - mean logit at the last position, (rows,): read before any soft-cap."""
    logits = model.output_layer()(hidden[:, -1])  # (rows, V)
    return logits[:, target] - logits.mean(-1)


@dataclass
class Nodes:
    """The graph's nodes, in the adjacency's order: features, errors (layer-major, L x T), embeddings
    (T), the target logit."""

    layer: Tensor  # (n_f,) each active feature's layer, position, index and activation
    pos: Tensor
    index: Tensor
    act: Tensor
    n_layers: int
    n_pos: int

    @property
    def n_features(self) -> int:
        return len(self.layer)

    def slices(self) -> dict[str, slice]:
        f, e = self.n_features, self.n_layers * self.n_pos
        return {
            "features": slice(0, f),
            "errors": slice(f, f + e),
            "embeddings": slice(f + e, f + e + self.n_pos),
            "logit": slice(f + e + self.n_pos, f + e + self.n_pos + 1),
        }

    def __len__(self) -> int:
        return self.n_features + (self.n_layers + 1) * self.n_pos + 1


@dataclass
class Attribution:
    """The full (unpruned) graph: adjacency[t, s] = edge(s -> t); bias and value per node (zero for
    nodes with no inputs); the errors; what was frozen."""

    nodes: Nodes
    adjacency: Tensor  # (n, n)
    bias: Tensor  # (n,)
    value: Tensor  # (n,)
    errors: Tensor  # (L, T, C)
    frozen: Frozen
    target: int

    def linearity_gap(self) -> float:
        """max over target nodes of |value - (sum of edges in + bias)|: 0 up to rounding."""
        s = self.nodes.slices()
        rows = torch.cat([torch.arange(s["features"].stop), torch.tensor([s["logit"].start])])
        return float((self.value[rows] - self.adjacency[rows].sum(1) - self.bias[rows]).abs().max())


@torch.no_grad()
def active_features(tcs: list[Transcoder], fz: Frozen) -> tuple[Nodes, list[Tensor], Tensor]:
    """Every feature active on the prompt, the codes per layer (T, N), and the errors (L, T, C)."""
    layer, pos, index, act, codes, errs = [], [], [], [], [], []
    for i, tc in enumerate(tcs):
        x = fz.mlp_in[i][0].to(tc.W_enc.dtype)
        z = tc.encode(x)  # (T, N)
        p, f = (z > 0).nonzero(as_tuple=True)
        layer.append(torch.full_like(p, i)), pos.append(p), index.append(f), act.append(z[p, f])
        codes.append(z)
        errs.append(fz.mlp_out[i][0] - tc.decode(z))
    T, none = fz.ids.shape[1], torch.zeros(0, dtype=torch.long)
    if not tcs:  # an attention-only model: no features, no errors
        return Nodes(none, none, none, torch.zeros(0, dtype=fz.emb.dtype), 0, T), [], fz.emb.new_zeros(0, T, 0)
    nodes = Nodes(torch.cat(layer), torch.cat(pos), torch.cat(index), torch.cat(act), len(tcs), T)
    return nodes, codes, torch.stack(errs)


def check_transcoders(model: nn.Module, tcs: list[Transcoder]) -> None:
    blocks = mlps(model)
    if len(tcs) != len(blocks) or any(tc.dim != model.cfg.d_model for tc in tcs):
        raise AttnlabError(
            f"these transcoders ({len(tcs)} of width {tcs[0].dim if tcs else '?'}) do not fit this "
            f"run ({len(blocks)} layers of {model.cfg.d_model}): train them on it"
        )


def attribute(model: nn.Module, ids: Tensor, target: int, tcs: list[Transcoder], batch: int = 64) -> Attribution:
    """The attribution graph of `target` (a token id) after ids (1, T): every edge into every active
    feature and into the target logit, computed `batch` targets per backward pass."""
    check_transcoders(model, tcs)
    model.eval()
    fz = freeze(model, ids)
    nodes, _, errors = active_features(tcs, fz)
    s, n = nodes.slices(), len(nodes)
    dtype = fz.emb.dtype
    encs = [tc.encoder() for tc in tcs]
    decs = [tc.decoder() for tc in tcs]
    feat_dec = [decs[i][0][nodes.index[nodes.layer == i]].detach() for i in range(nodes.n_layers)]  # (n_l, C)
    adjacency, bias, value = torch.zeros(n, n, dtype=dtype), torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
    value[s["features"]] = nodes.act.detach()
    value[s["logit"]] = metric(model, fz.hidden, target).detach()
    # bias: every source zero (the transcoders' output biases are their MLPs' outputs), scales kept
    with (
        torch.no_grad(),
        frozen_run(model, fz, 1, lambda i, x, o: decs[i][1].expand_as(o), torch.zeros_like(fz.emb)) as out,
    ):
        ins: list[Tensor] = []
        with mlp_inputs(model, ins):
            out["run"]()
        bias[s["logit"]] = metric(model, out["hidden"], target)
        for i in range(nodes.n_layers):
            m = nodes.layer == i
            enc, enc_bias = encs[i][0][:, nodes.index[m]], encs[i][1][nodes.index[m]]  # (C, n_l), (n_l,)
            bias[m.nonzero().flatten()] = (ins[i][0, nodes.pos[m]] * enc.t()).sum(-1) + enc_bias  # features first
    rows = list(range(nodes.n_features)) + [s["logit"].start]
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        adjacency[chunk] = _edges_into(model, fz, nodes, chunk, target, encs, feat_dec, errors).detach()
    return Attribution(nodes, adjacency, bias, value, errors.detach(), fz, target)


@contextlib.contextmanager
def mlp_inputs(model: nn.Module, ins: list[Tensor]) -> Iterator[None]:
    """Collect each MLP's input (in layer order) into `ins` while inside."""
    handles = [b.ff.register_forward_pre_hook(lambda m, a: ins.append(a[0]) and None) for b in mlps(model)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _edges_into(
    model: nn.Module, fz: Frozen, nodes: Nodes, rows: list[int], target: int, encs, feat_dec, errors: Tensor
) -> Tensor:
    """Edges into the nodes `rows` (features by number, or the logit), (len(rows), n): one backward
    pass through the frozen model, one row of the batch per target."""
    B, L = len(rows), nodes.n_layers
    s = nodes.slices()
    emb = fz.emb.expand(B, -1, -1).clone().requires_grad_()
    outs = [o.expand(B, -1, -1).clone().requires_grad_() for o in fz.mlp_out]
    ins: list[Tensor] = []
    with torch.enable_grad(), frozen_run(model, fz, B, lambda i, x, o: outs[i], emb) as out, mlp_inputs(model, ins):
        out["run"]()
        r = torch.tensor(rows)
        total = torch.zeros((), dtype=emb.dtype)
        is_feat = r < nodes.n_features
        if bool((~is_feat).any()):
            total = total + metric(model, out["hidden"][~is_feat], target).sum()
        b = is_feat.nonzero().flatten()
        for i in range(L):
            sel = b[nodes.layer[r[b]] == i]  # batch rows whose target feature is in layer i
            if len(sel):
                f = r[sel]
                enc = encs[i][0][:, nodes.index[f]].t()  # (k, C)
                total = total + (ins[i][sel, nodes.pos[f]] * enc).sum()
        grads = torch.autograd.grad(total, [emb, *outs], allow_unused=True)
    g_emb = grads[0] if grads[0] is not None else torch.zeros_like(emb)
    g_out = [g if g is not None else torch.zeros_like(outs[0]) for g in grads[1:]]
    edges = torch.zeros(B, len(nodes), dtype=emb.dtype)
    edges[:, s["embeddings"]] = (g_emb * fz.emb).sum(-1)
    if L:  # (B, L*T)
        edges[:, s["errors"]] = torch.stack([(g_out[i] * errors[i]).sum(-1) for i in range(L)], 1).flatten(1)
    for i in range(L):
        m = (nodes.layer == i).nonzero().flatten()
        if len(m):
            g = g_out[i][:, nodes.pos[m]]  # (B, n_l, C)
            edges[:, m] = (g * feat_dec[i]).sum(-1) * nodes.act[m]
    return edges
