"""Per-layer transcoders: a sparse dictionary that maps a block's MLP input to that block's MLP output.

Legend: B tokens, T positions, D the model's width, N latents, L layers.

    x  = norm_ff(resid_mid)                       what the MLP reads (pre-norm blocks)
    x_n = (x - mean) / scale                      centred and scaled like an SAE's input
    z  = act(x_n W_enc + b_enc)                   sparse codes, by the SAE kinds (sae.py)
    y' = (z W_dec + b_dec) * out_scale + out_mean  the MLP's output, approximated

It is an SAE (sae.py: the same kinds, unit decoder rows, AuxK revival, the same `fit`) whose decoder
aims at another activation: training streams (x, MLP(x)) pairs from the run's own data through
sae_train.activations with a reader of the MLP's input and output. A transcoder's features read
the residual stream linearly and write to it linearly, so with attention and norms frozen the model
is linear from feature activations to the logits: what the attribution graph (circuits.py) needs.

Metrics, on the validation split: explained_variance of each MLP's output, l0, dead_fraction (never
fired on the evaluation tokens), and ce_loss_recovered with every MLP replaced by its transcoder at
once: (CE_zero - CE_tc) / (CE_zero - CE_clean), CE_zero with every MLP's output zeroed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data import TokenData
from attnlab.data.batches import windows
from attnlab.errors import AttnlabError
from attnlab.interpret.own_data import block_of
from attnlab.interpret.sae import SAEConfig, SparseAutoencoder, load_sae, save_sae
from attnlab.interpret.sae_train import activations, ce_loss_recovered, check_run, fit, rebatch
from attnlab.io import read_json, write_json
from attnlab.models.protocols import CausalLM
from attnlab.nn.stack import stacks_of
from attnlab.runs.run import Run

INDEX = "transcoders.json"


class Transcoder(SparseAutoencoder):
    """An SAE whose decoder gives the MLP's output: `encode` takes the MLP's input (..., D), `decode`
    gives its output (..., D). `fit` hands it (B, 2D) rows, input and output side by side."""

    def __init__(self, dim: int, cfg: SAEConfig):
        super().__init__(dim, cfg)
        self.register_buffer("out_mean", torch.zeros(dim))
        self.register_buffer("out_scale", torch.ones(()))

    @torch.no_grad()
    def fit_norm(self, pair: Tensor) -> None:
        x, y = pair.split(self.dim, dim=-1)
        super().fit_norm(x)
        self.out_mean.copy_(y.mean(0))
        self.out_scale.copy_((y - self.out_mean).norm(dim=-1).mean().clamp_min(1e-8))

    def normalise(self, pair: Tensor) -> Tensor:
        """(B, 2D) input and output rows, each normalised by its own mean and scale (what `fit` trains on)."""
        x, y = pair.split(self.dim, dim=-1)
        return torch.cat([(x - self.mean) / self.scale, (y - self.out_mean) / self.out_scale], -1)

    def pre_acts(self, xn: Tensor) -> Tensor:
        return xn @ self.W_enc + self.b_enc  # no b_dec to subtract: it lives in the output's space

    def loss(self, pair: Tensor, dead: Tensor | None = None, target: Tensor | None = None):
        x, y = pair.split(self.dim, dim=-1)
        return super().loss(x, dead, target=y)

    def encode(self, x: Tensor) -> Tensor:
        """The MLP's input (..., D) -> codes (..., N)."""
        z = self.encode_normalised((x.reshape(-1, self.dim) - self.mean) / self.scale)
        return z.view(*x.shape[:-1], z.shape[-1])

    def decode(self, z: Tensor) -> Tensor:
        """Codes (..., N) -> the MLP's output (..., D)."""
        return self.decode_normalised(z) * self.out_scale + self.out_mean

    @classmethod
    def of_mlp(cls, ff: nn.Module) -> Transcoder:
        """A relu MLP (act(x W1 + b1) W2 + b2, act = relu) as the transcoder it already is: a feature per
        neuron, encoder W1, b1 and decoder W2, b2, no normalisation. It reproduces the MLP exactly."""
        tc = cls(ff.up.in_features, SAEConfig(latents=ff.up.out_features, kind="relu"))
        with torch.no_grad():
            tc.W_enc.copy_(ff.up.weight.t()), tc.b_enc.copy_(ff.up.bias)
            tc.W_dec.copy_(ff.down.weight.t()), tc.b_dec.copy_(ff.down.bias)
        return tc.eval()

    def encoder(self) -> tuple[Tensor, Tensor]:
        """pre = x @ enc + enc_bias in raw units: enc (D, N), enc_bias (N,)."""
        enc = self.W_enc / self.scale
        return enc, self.b_enc - self.mean @ enc

    def decoder(self) -> tuple[Tensor, Tensor]:
        """y' = z @ dec + dec_bias in raw units: dec (N, D), dec_bias (D,)."""
        return self.W_dec * self.out_scale, self.b_dec * self.out_scale + self.out_mean


# ---- the MLPs of a decoder ---------------------------------------------------------------------


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of a pre-norm decoder's one stack (what transcoders and attribution graphs read)."""
    stacks = stacks_of(model)
    if not isinstance(model, CausalLM) or len(stacks) != 1 or stacks[0].cfg.norm != "pre":
        raise AttnlabError(
            "transcoders and attribution graphs read a pre-norm decoder (a GPT or Llama-block run of attnlab train lm)"
        )
    return list(stacks[0])


def has_mlps(model: nn.Module) -> bool:
    return stacks_of(model)[0].cfg.feedforward != "none"


def mlp_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks whose MLPs transcoders replace (a pre-norm decoder with MLPs)."""
    blocks = decoder_blocks(model)
    if not has_mlps(model):
        raise AttnlabError("this run's blocks have no MLP (attention only): there is nothing to transcode")
    return blocks


def check_decoder(run: Run) -> TokenData:
    """The run's own data, after checking that it is a decoder with MLPs and names its data."""
    mlp_blocks(run.model)
    return check_run(run, "blocks.0.hook_ff_out")


def _layer(hook: str) -> int:
    return int(hook.split(".")[1])  # blocks.{i}.hook_ff_out


class _Reached(Exception):
    """Raised once the MLP's input and output are read: the layers above are never run."""


@torch.no_grad()
def read_mlp(run: Run, hook: str, ids: Tensor, both: bool = True) -> Tensor:
    """The MLP's input and output of layer `hook` names (blocks.{i}.hook_ff_out) for ids (B, T):
    (B, T, 2D) side by side, or the input (B, T, D) alone when not both."""
    got: list[Tensor] = []

    def grab(module, args, out):
        got.append(torch.cat([args[0], out], -1).float() if both else args[0].float())
        raise _Reached

    handle = mlp_blocks(run.model)[_layer(hook)].ff.register_forward_hook(grab)
    try:
        run.model(ids)
    except _Reached:
        pass
    finally:
        handle.remove()
    return got[0]


def read_mlp_in(run: Run, hook: str, ids: Tensor) -> Tensor:
    """The MLP's input alone (what sae_page.top_contexts hands a transcoder's encoder)."""
    return read_mlp(run, hook, ids, both=False)


@contextlib.contextmanager
def mlps_replaced(model: nn.Module, fns: dict[int, Callable[[Tensor, Tensor], Tensor]]) -> Iterator[None]:
    """Run with layer i's MLP output replaced by fns[i](input, output); removed on leaving."""
    blocks = mlp_blocks(model)
    handles = [blocks[i].ff.register_forward_hook(lambda m, a, out, f=f: f(a[0], out)) for i, f in fns.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# ---- training, evaluation, files -------------------------------------------------------------


def train_transcoders(run: Run, cfg: SAEConfig, progress: bool = True) -> tuple[list[Transcoder], dict]:
    """One transcoder per layer, each trained like an SAE on (input, output) pairs of its MLP streamed
    from the run's own training split."""
    tokens = check_decoder(run)
    seqs = max(1, cfg.batch // block_of(run))
    out, infos, start = [], [], time.perf_counter()
    layers = len(mlp_blocks(run.model))
    for i in range(layers):
        hook = f"blocks.{i}.hook_ff_out"
        tc = Transcoder(run.model.cfg.d_model, cfg).to(run.device)
        source = activations(run, hook, tokens, seqs, cfg.seed + i, reader=read_mlp)
        infos.append(fit(tc, rebatch(source, cfg.batch), progress, desc=f"transcoder {i + 1} of {layers}"))
        out.append(tc)
    return out, {"run": str(run.path.resolve()), "layers": infos, "seconds": round(time.perf_counter() - start, 2)}


@torch.no_grad()
def evaluate_transcoders(
    run: Run, tcs: list[Transcoder], tokens: int = 16384, batch: int = 8, data: TokenData | None = None
) -> dict:
    """Each layer's explained variance, l0 and dead fraction, and the CE loss recovered with every MLP
    replaced at once, on the first `tokens` tokens of the validation split."""
    data = data if data is not None else check_decoder(run)
    split = "val" if len(data.splits["val"]) > block_of(run) else "train"
    arr = np.asarray(data.splits[split])[: tokens + 1]
    block = min(block_of(run), len(arr) - 1)
    model, L = run.model.eval(), len(tcs)
    ce = {"clean": 0.0, "transcoders": 0.0, "zero": 0.0}
    sse, xs, xsq, l0 = [0.0] * L, [0.0] * L, [0.0] * L, [0.0] * L
    fired = [torch.zeros(tc.cfg.latents, device=run.device) for tc in tcs]
    count = 0

    def measure(i: int, x: Tensor, y: Tensor) -> Tensor:  # on the clean model: each MLP on its own input
        z = tcs[i].encode(x.float())
        y = y.float().flatten(0, 1)
        sse[i] += float((y - tcs[i].decode(z).flatten(0, 1)).pow(2).sum())
        xs[i], xsq[i] = y.sum(0) + xs[i], y.pow(2).sum(0) + xsq[i]
        l0[i] += float((z > 0).sum())
        fired[i] += (z > 0).flatten(0, 1).sum(0)
        return None

    for xy in windows(arr, block, batch):
        if xy.shape[1] != block + 1:
            continue
        xy = torch.from_numpy(xy).to(run.device)
        ids, target = xy[:, :-1], xy[:, 1:].flatten()
        with mlps_replaced(model, {i: lambda x, y, i=i: measure(i, x, y) for i in range(L)}):
            clean = model(ids)
        with mlps_replaced(model, {i: lambda x, y, i=i: tcs[i](x.float()).to(y.dtype) for i in range(L)}):
            spliced = model(ids)
        with mlps_replaced(model, {i: lambda x, y: torch.zeros_like(y) for i in range(L)}):
            zeroed = model(ids)
        for name, logits in (("clean", clean), ("transcoders", spliced), ("zero", zeroed)):
            ce[name] += float(F.cross_entropy(logits.flatten(0, 1).float(), target, reduction="sum"))
        count += len(target)
    if not count:
        raise AttnlabError(f"the run's data has fewer than {block + 1} tokens: too few to measure transcoders")
    layers = [
        {
            "explained_variance": 1 - sse[i] / max(float((xsq[i] - xs[i].pow(2) / count).sum()), 1e-12),
            "l0": l0[i] / count,
            "dead_fraction": float((fired[i] == 0).float().mean()),
        }
        for i in range(L)
    ]
    ce = {k: v / count for k, v in ce.items()}
    return {
        "explained_variance": float(np.mean([m["explained_variance"] for m in layers])),
        "l0": float(np.mean([m["l0"] for m in layers])),
        "dead_fraction": float(np.mean([m["dead_fraction"] for m in layers])),
        "ce_loss_recovered": ce_loss_recovered(ce["clean"], ce["transcoders"], ce["zero"]),
        "ce_clean": ce["clean"],
        "ce_transcoders": ce["transcoders"],
        "ce_zero": ce["zero"],
        "tokens": count,
        "layers": layers,
    }


def save_transcoders(folder: str | Path, tcs: list[Transcoder], info: dict) -> Path:
    """FOLDER/layer_{i}/ (sae.safetensors + sae.json, as save_sae writes them) and FOLDER/transcoders.json."""
    out = Path(folder)
    for i, tc in enumerate(tcs):
        save_sae(
            tc, out / f"layer_{i}", {"hook": f"blocks.{i}.hook_ff_out", "transcoder": True, "run": info.get("run", "")}
        )
    write_json(out / INDEX, {"layers": len(tcs), **info})
    return out


def load_transcoders(folder: str | Path, device: str | torch.device = "cpu") -> tuple[list[Transcoder], dict]:
    """The transcoders save_transcoders wrote (safetensors and JSON: nothing is unpickled), and its index."""
    p = Path(folder)
    if not (p / INDEX).is_file():
        raise AttnlabError(f"{p} holds no transcoders: it needs {INDEX} (attnlab circuits writes it)")
    info = read_json(p / INDEX)
    tcs = [load_sae(p / f"layer_{i}", device, cls=Transcoder).sae for i in range(int(info.get("layers", 0)))]
    return tcs, info
