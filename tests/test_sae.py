"""Sparse autoencoders (interpret/sae*.py): exact reconstruction by identity weights, the metrics
against their formulas computed by hand, unit decoder rows, streaming, synthetic ground truth, saving,
the feature page and the command line."""

from __future__ import annotations

import inspect
import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.data.batches import windows
from attnlab.interpret.sae import KINDS, SAEConfig, SparseAutoencoder, load_sae, save_sae
from attnlab.interpret.sae_page import write_page
from attnlab.interpret.sae_synthetic import SyntheticConfig, SyntheticFeatures, mcc, run_synthetic
from attnlab.interpret.sae_train import (
    activations,
    block_of,
    ce_loss_recovered,
    check_run,
    evaluate_sae,
    fit,
    train_sae,
)
from attnlab.nn.hooks import hooks
from tests.conftest import flags, run_cli, tiny_code_lm

pytestmark = pytest.mark.usefixtures("one_thread")
HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return tiny_code_lm(tmp_path_factory.mktemp("sae"))


def identity_sae(dim: int, negative_too: bool) -> SparseAutoencoder:
    """relu SAE with W_enc = W_dec = I (and -I beside it when negative_too), every bias 0."""
    eye = torch.eye(dim)
    w = torch.cat([eye, -eye]) if negative_too else eye  # (N, D)
    sae = SparseAutoencoder(dim, SAEConfig(latents=len(w), kind="relu"))
    with torch.no_grad():
        sae.W_dec.copy_(w)
        sae.W_enc.copy_(w.t())
        sae.b_enc.zero_(), sae.b_dec.zero_()
    return sae.eval()


def test_identity_weights_reconstruct_exactly():
    x = torch.rand(64, 8) + 0.1  # every coordinate positive: with latents = dim, every latent is on
    sae = identity_sae(8, negative_too=False)
    z = sae.encode(x)
    assert bool((z > 0).all()) and torch.equal(sae(x), x)
    centred = torch.randn(64, 8)
    sae = identity_sae(8, negative_too=True)  # centred data: a latent for each sign of each coordinate
    sae.fit_norm(centred)
    assert torch.allclose(sae(centred), centred, atol=1e-6)


def test_ce_loss_recovered_formula():
    assert ce_loss_recovered(clean=1.0, sae=1.5, zero=3.0) == pytest.approx(0.75)
    assert ce_loss_recovered(clean=1.0, sae=1.0, zero=3.0) == 1.0 and ce_loss_recovered(1.0, 3.0, 3.0) == 0.0


@pytest.fixture(scope="module")
def trained(lm):
    run = attnlab.load(lm, device="cpu")
    cfg = SAEConfig(latents=64, k=4, tokens=20_000, batch=512, lr=3e-3, aux_k=8, dead_after=2048)
    sae, info = train_sae(run, HOOK, cfg, progress=False)
    return run, sae, info


def test_metrics_equal_the_formulas_by_hand(trained):
    run, sae, _ = trained
    got = evaluate_sae(run, HOOK, sae, tokens=2000, batch=4)
    arr = np.asarray(check_run(run, HOOK).splits["val"])[:2001]
    block = block_of(run)
    ce = {"clean": [], "sae": [], "zero": []}
    xs, recon = [], []
    hooked = {
        "clean": {},
        "sae": {HOOK: lambda x: recon.append(sae(x)) or xs.append(x) or recon[-1]},
        "zero": {HOOK: lambda x: torch.zeros_like(x)},
    }
    for xy in windows(arr, block, 1):  # one window at a time: a different batching than evaluate_sae's
        if xy.shape[1] != block + 1:
            continue
        xy = torch.from_numpy(xy)
        for name, fns in hooked.items():
            with torch.no_grad(), hooks(run.model, fns):
                logits = run.model(xy[:, :-1])
            ce[name].append(F.cross_entropy(logits[0], xy[0, 1:], reduction="none"))
    clean, spliced, zero = (float(torch.cat(ce[n]).mean()) for n in ("clean", "sae", "zero"))
    assert got["ce_loss_recovered"] == pytest.approx((zero - spliced) / (zero - clean), rel=1e-4)
    assert got["ce_clean"] == pytest.approx(clean, rel=1e-5) and got["ce_zero"] == pytest.approx(zero, rel=1e-5)
    x, r = torch.cat(xs).flatten(0, 1), torch.cat(recon).flatten(0, 1)
    ev = 1 - float((x - r).pow(2).sum()) / float((x - x.mean(0)).pow(2).sum())
    assert got["explained_variance"] == pytest.approx(ev, rel=1e-4, abs=1e-5)
    assert got["l0"] == pytest.approx(4.0) and got["tokens"] == len(x)  # topk: exactly k a token
    assert got["kl_div"] >= 0 and 0 <= got["dead_fraction"] <= 1 and len(got["density"]) == 64
    assert sum(got["density_histogram"]["counts"]) + got["density_histogram"]["dead"] == 64


@pytest.mark.parametrize("kind", KINDS)
def test_decoder_rows_have_unit_norm_after_a_step(kind):
    sae = SparseAutoencoder(16, SAEConfig(latents=48, kind=kind, k=4, lr=1e-2, aux_k=4))
    x = torch.randn(256, 16) @ torch.randn(16, 16)
    sae.fit_norm(x)
    opt = torch.optim.Adam([p for p in sae.parameters() if p.requires_grad], lr=1e-2)
    loss, parts, fired = sae.loss(sae.normalise(x), dead=torch.arange(48) % 2 == 0)  # AuxK on half
    loss.backward()
    sae.remove_parallel_grad()
    assert torch.allclose((sae.W_dec.grad * sae.W_dec).sum(-1), torch.zeros(48), atol=1e-6)  # only turns
    opt.step()
    sae.normalise_decoder()
    assert torch.allclose(sae.W_dec.norm(dim=1), torch.ones(48), atol=1e-5)
    assert np.isfinite(parts["mse"]) and "aux" in parts and fired.shape == (48,)
    if kind == "jumprelu":
        assert sae.log_theta.grad is not None  # the threshold learns through the straight-through kernel


def test_topk_l0_is_k_and_batchtopk_averages_k():
    x = torch.randn(512, 16)
    for kind in ("topk", "batchtopk"):
        sae = SparseAutoencoder(16, SAEConfig(latents=64, kind=kind, k=5))
        sae.fit_norm(x)
        sae.train()
        z = sae.encode(x)
        active = (z > 0).sum(-1).float()
        assert bool((active == 5).all()) if kind == "topk" else float(active.mean()) == pytest.approx(5.0)


def test_activations_are_streamed_in_batches(trained):
    run, _, _ = trained
    source = activations(run, HOOK, check_run(run, HOOK), seqs=3)
    assert inspect.isgenerator(source)  # made one batch at a time, never a stored table
    a, b = next(source), next(source)
    assert a.shape == b.shape == (3 * block_of(run), run.model.cfg.d_model) and not torch.equal(a, b)
    pulled = []

    def counted():
        while True:
            pulled.append(1)
            yield torch.randn(100, 8)

    sae = SparseAutoencoder(8, SAEConfig(latents=16, k=2, tokens=1000, batch=100))
    info = fit(sae, counted(), progress=False)
    assert info["steps"] == 10 and len(pulled) == 10  # exactly one batch drawn per step, none ahead


def test_synthetic_features_are_recovered():
    world = SyntheticConfig(features=32, dim=16, p=1 / 16, seed=1)  # about 2 of 32 active a sample
    r = run_synthetic(
        world,
        SAEConfig(latents=64, k=2, tokens=400_000, batch=1024, lr=1e-2, aux_k=8, dead_after=50_000),
        progress=False,
    )
    assert r["mcc"] >= 0.95, r  # 0.996 to 0.997 in trials (one latent per feature: 0.89 to 0.97)
    assert r["true_l0"] == pytest.approx(2, rel=0.1) and r["seconds"] < 30
    data = SyntheticFeatures(world)
    assert mcc(data.features, data.features[torch.randperm(32)]) == pytest.approx(1.0)  # matching finds the order


def test_synthetic_options_change_the_firing():
    base = SyntheticFeatures(SyntheticConfig(features=40, dim=8, p=0.1)).firing(20000).float()
    corr = SyntheticFeatures(SyntheticConfig(features=40, dim=8, p=0.1, correlated=True)).firing(20000).float()
    together = lambda on: float((on[:, 0] * on[:, 1]).mean())  # noqa: E731  features 0 and 1 share a group
    assert corr[:, 0].mean() == pytest.approx(0.1, abs=0.01) and together(corr) > 2 * together(base)
    tree = SyntheticFeatures(SyntheticConfig(features=40, dim=8, p=0.1, hierarchical=True))
    on = tree.firing(5000)
    kids = on[:, 8:40].view(-1, 8, 4)  # 8 parents, 4 children each
    assert bool((kids.sum(-1) <= 1).all()) and bool((kids.any(-1) <= on[:, :8]).all())


def test_save_and_load_give_the_same_sae(trained, tmp_path):
    run, sae, info = trained
    save_sae(sae, tmp_path / "s", {"hook": HOOK, "run": str(run.path), "training": info})
    back = load_sae(tmp_path / "s")
    for name, t in sae.state_dict().items():
        assert torch.equal(back.sae.state_dict()[name], t), name
    x = torch.randn(10, sae.dim)
    assert torch.equal(back.sae(x), sae(x)) and back.info["hook"] == HOOK
    assert back.sae.cfg == sae.cfg and float(back.sae.scale) == float(sae.scale) != 1.0


def test_the_feature_page_is_self_contained(trained, tmp_path):
    run, sae, info = trained
    save_sae(
        sae,
        tmp_path / "s",
        {"hook": HOOK, "run": str(run.path), "training": info, "metrics": evaluate_sae(run, HOOK, sae, tokens=1000)},
    )
    page = write_page(run, load_sae(tmp_path / "s"), tmp_path / "page.html", count=6, tokens=2000).read_text()
    assert not re.search(r"https?://", page) and "<script src" not in page and "<link" not in page
    assert "@@" not in page and page.count('class="feature"') == 6
    assert "promoted:" in page and "suppressed:" in page and "rgba(255,140,0,1.00)" in page  # its top token


def test_the_command_line(lm, tmp_path, capsys):
    out = tmp_path / "sae"
    args = [
        "sae",
        "train",
        lm,
        "--hook",
        HOOK,
        *flags(latents=32, k=4, tokens=4000, batch=256, eval_tokens=500, device="cpu"),
        "--out",
        out,
        "--json",
    ]
    code, said, err = run_cli(args, capsys)
    assert code == 0, err
    found = json.loads(said)
    assert found["l0"] == pytest.approx(4.0) and set(found) >= {"explained_variance", "kl_div", "dead_fraction"}
    assert (out / "sae.safetensors").is_file() and "density" in json.loads((out / "sae.json").read_text())["metrics"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "already holds an SAE" in err
    code, said, err = run_cli(["sae", "show", out, "--features", "4", "--tokens", "500"], capsys)
    assert code == 0 and (out / "features.html").is_file(), err
    code, _, err = run_cli(["sae", "train", lm, "--hook", "blocks.9.hook_resid_post", "--out", tmp_path / "x"], capsys)
    assert code == 2 and "blocks.1.hook_resid_post" in err and len(err.strip().splitlines()) == 1


def test_a_run_without_data_is_one_line(lm, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in lm.iterdir():
        if f.is_file():
            (bare / f.name).write_bytes(f.read_bytes())
    config = json.loads((bare / "config.json").read_text())
    for data, said in (("", "names no training data"), (str(tmp_path / "gone.txt"), "gone.txt")):
        config["data"]["data"] = data
        (bare / "config.json").write_text(json.dumps(config))
        code, _, err = run_cli(["sae", "train", bare, "--hook", HOOK, "--out", tmp_path / "x"], capsys)
        assert code == 2 and said in err and "own data" in err and len(err.strip().splitlines()) == 1, err


def test_synthetic_command(capsys):
    code, said, err = run_cli(
        ["sae", "synthetic", "--features", "24", "--dim", "12", "--tokens", "20000", "--json"], capsys
    )
    r = json.loads(said)
    assert code == 0 and set(r) >= {"mcc", "dead_fraction", "true_l0", "learned_l0", "seconds"} and 0 < r["mcc"] <= 1
