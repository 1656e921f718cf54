"""Patching (interpret/patching.py, attribution.py): exact where it must be, on every family, and the
`attnlab patch` command's JSON, picture and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from attnlab.cli.main import main
from attnlab.errors import AttnlabError
from attnlab.interpret.attribution import attribution_patching, edge_attribution
from attnlab.interpret.patching import activation_patching, record
from attnlab.interpret.patching_inputs import AnswerMetric
from attnlab.interpret.patching_paths import path_patching
from attnlab.models import build_model
from attnlab.models.encoder import EncoderConfig
from attnlab.models.gpt import GPTConfig
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.models.vit import ViTConfig
from attnlab.nn.hooks import Tap, hooks
from tests.conftest import flags, perturb, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py
PNG = b"\x89PNG\r\n\x1a\n"


# ---- a linear toy model: where AtP is exact ---------------------------------------------------------


class LinearBlock(nn.Module):
    """A block with the shared hook points whose every map is linear: heads read a fixed causal
    average of the positions (no softmax), the feed-forward has no activation, and there is no norm."""

    def __init__(self, c: int, h: int, t: int, ff: bool = True):
        super().__init__()
        self.h, self.dh, self.has_ff = h, c // h, ff
        self.v, self.o, self.ff = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(c, c)
        self.register_buffer("mix", torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None])  # (T, T)
        self.hook_resid_pre, self.hook_attn_out, self.hook_ff_out = Tap(), Tap(), Tap()
        self.hook_resid_mid, self.hook_resid_post = Tap(), Tap()
        self.attn = nn.Module()
        self.attn.hook_head_out, self.attn.n_heads = Tap(heads=h), h

    def forward(self, x):
        b, t, c = x.shape
        x = self.hook_resid_pre(x)
        v = self.v(x).view(b, t, self.h, self.dh).transpose(1, 2)  # (B, H, T, Dh)
        heads = self.attn.hook_head_out(self.mix @ v)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.o(heads.transpose(1, 2).reshape(b, t, c))))
        return self.hook_resid_post(x + self.hook_ff_out(self.ff(x)) if self.has_ff else x)


class LinearToy(nn.Module):
    def __init__(self, c: int = 8, h: int = 2, t: int = 5, v: int = 6, layers: int = 2, ff: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList([LinearBlock(c, h, t, ff) for _ in range(layers)])
        self.unembed = nn.Linear(c, v)

    def forward(self, x):  # x (B, T, C): the input vectors themselves
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)  # (B, T, V)


def test_atp_equals_activation_patching_on_a_linear_model_and_effects_sum_to_the_total():
    torch.manual_seed(0)
    model, metric = LinearToy().double(), AnswerMetric("logit-diff", 1, 2, position=4)
    clean, corrupted = (torch.randn(1, 5, 8, dtype=torch.double),), (torch.randn(1, 5, 8, dtype=torch.double),)
    act = activation_patching(model, clean, corrupted, metric)
    atp = attribution_patching(model, clean, corrupted, metric)
    assert [s.point for s in act.sites] == [s.point for s in atp.sites] and len(act.sites) == 2 * 5 + 2 * 2 + 2 * 3
    torch.testing.assert_close(atp.changes.double(), act.changes.double(), atol=1e-9, rtol=1e-9)
    assert atp.clean == pytest.approx(act.clean) and atp.corrupted == pytest.approx(act.corrupted)
    for layer in range(2):  # linear: a layer's positions add up to the whole stream, which restores everything
        assert act.grid("resid", "resid_pre", "blocks")[layer].sum() == pytest.approx(1.0, abs=1e-9)
        heads = act.grid("heads", "head", "blocks")[layer].sum()
        assert heads == pytest.approx(float(act.grid("components", "attn_out", "blocks")[layer, 0]), abs=1e-9)
    assert act.grid("components", "resid_pre", "blocks")[:, 0].tolist() == pytest.approx([1.0, 1.0], abs=1e-9)


def test_path_patching_splits_a_heads_effect_into_its_direct_path_and_its_path_through_the_receivers():
    """Linear and attention-only: the sender's whole effect is its direct path (the later heads frozen)
    plus its path through every later head, exactly; through an earlier head it has none."""
    torch.manual_seed(1)
    model, metric = LinearToy(ff=False).double(), AnswerMetric("logit-diff", 1, 2, position=4)
    clean, corrupted = (torch.randn(1, 5, 8, dtype=torch.double),), (torch.randn(1, 5, 8, dtype=torch.double),)
    whole = activation_patching(model, clean, corrupted, metric, ["heads"])
    total = float(whole.changes[0])  # layer 1 head 1, patched with everything downstream of it
    late = record(model, corrupted, {"blocks.1.attn.hook_head_out"})[1]["blocks.1.attn.hook_head_out"]
    with hooks(model, {"blocks.1.attn.hook_head_out": lambda x: late.expand_as(x)}):  # layer 2's heads frozen
        direct = float(activation_patching(model, clean, corrupted, metric, ["heads"]).changes[0])
    through = path_patching(model, clean, corrupted, metric, "1.1", "2")
    assert through["m_patched"] - through["m_corrupt"] == pytest.approx(total - direct, abs=1e-9)
    assert abs(total - direct) > 1e-3 and abs(direct) > 1e-3  # both paths carry something
    back = path_patching(model, clean, corrupted, metric, "2.1", "1.2")
    assert back["m_patched"] == back["m_corrupt"] and back["effect"] == 0.0
    with pytest.raises(AttnlabError, match="both sender and receiver"):
        path_patching(model, clean, corrupted, metric, "1.1", "1")


def test_eap_edges_into_the_output_sum_to_the_total_and_ig_equals_eap_on_a_linear_model():
    torch.manual_seed(2)
    model, metric = LinearToy().double(), AnswerMetric("logit-diff", 1, 2, position=4)
    clean, corrupted = (torch.randn(1, 5, 8, dtype=torch.double),), (torch.randn(1, 5, 8, dtype=torch.double),)
    eap = edge_attribution(model, clean, corrupted, metric)
    ig = edge_attribution(model, clean, corrupted, metric, steps=4)
    # the embedding and 2 x (attention, MLP) write; 4 sublayers and the output read: 1+2+3+4+5 edges
    assert len(eap["edges"]) == 15 and eap["method"] == "eap" and ig["method"] == "eap-ig"
    into_out = [e for e in eap["edges"] if e["to"] == "blocks.out"]
    assert sum(e["score"] for e in into_out) == pytest.approx(eap["total"], abs=1e-9)
    assert sum(e["effect"] for e in into_out) == pytest.approx(1.0, abs=1e-9)
    for a, b in zip(eap["edges"], ig["edges"]):  # a linear model's gradient is the same on the whole line
        assert (a["from"], a["to"]) == (b["from"], b["to"]) and a["score"] == pytest.approx(b["score"], abs=1e-9)


def test_eap_ig_follows_a_real_model_closer_than_eap():
    """On a GPT (grouped-query), the edges into the output add up to AtP's estimate of the whole change:
    EAP-IG's, averaged along the line from corrupted to clean, lands nearer the true total."""
    model, ids = gpt(n_kv_head=2), ids_of(8, 1)
    metric = AnswerMetric("logit-diff", 3, 5, position=7)
    miss = []
    for steps in (0, 8):
        r = edge_attribution(model, (ids,), (corrupt(ids, 3),), metric, steps=steps)
        assert len(r["edges"]) == 15 and {e["stack"] for e in r["edges"]} == {"blocks"}
        miss.append(abs(sum(e["score"] for e in r["edges"] if e["to"] == "blocks.out") - r["total"]))
    assert miss[1] < miss[0]


# ---- every family, from tiny random models ----------------------------------------------------------


def gpt(**kw) -> nn.Module:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=32, context=16, vocab_size=20, **kw)
    return build_model("gpt", cfg).eval()


def corrupt(ids: torch.Tensor, at: int) -> torch.Tensor:
    """ids with another token at `at`, never one of the ids below 3 (PAD, BOS, EOS in some families)."""
    out = ids.clone()
    out[0, at] = (out[0, at] - 3 + 1) % 17 + 3
    return out


def ids_of(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 20, (1, n), generator=torch.Generator().manual_seed(seed))  # (1, T)


@pytest.mark.parametrize(
    "kw",
    [{"n_kv_head": 1}, {"n_kv_head": 2, "block": "llama"}, {"feedforward": "moe"}],
    ids=["multi-query", "grouped-query-llama", "moe"],
)
def test_a_site_patched_with_its_own_value_changes_nothing_and_the_whole_stream_restores_the_clean_run(kw):
    model = gpt(**{k: v for k, v in kw.items() if k != "block"}, **_block(kw))
    ids = ids_of(8, 1)
    metric = AnswerMetric("logit-diff", 3, 5, position=7)
    same = activation_patching(model, (ids,), (ids,), metric)
    assert same.changes.abs().max() == 0 and same.clean == same.corrupted  # exactly: clean into clean is m_clean
    assert set(same.effects()) == {0.0}
    heads = [s for s in same.sites if s.component == "head"]
    assert len(heads) == 2 * 4 and {s.head for s in heads} == set(range(4))  # query heads, not the 1-2 kv heads
    result = activation_patching(model, (ids,), (corrupt(ids, 3),), metric, ["resid", "components"])
    grid = result.grid("resid", "resid_pre", "blocks")  # (L, T)
    assert grid[0, 3] == pytest.approx(1.0, abs=1e-5)  # the only changed token, at the first layer: all of it
    assert grid[0, :3].abs().max() == 0 and grid[0, 4:].abs().max() == 0  # the same tokens: nothing to patch
    assert result.grid("components", "resid_pre", "blocks")[0, 0] == pytest.approx(1.0, abs=1e-5)


def _block(kw: dict) -> dict:
    """Llama's block: RMSNorm, rotary positions, a gated feed-forward."""
    if kw.get("block") != "llama":
        return {}
    return {"norm_kind": "rmsnorm", "positions": "rope", "feedforward": "swiglu", "bias": False}


def test_atp_ranks_sites_as_activation_patching_does_on_a_random_gpt():
    model, ids = gpt(n_kv_head=2), ids_of(8, 2)
    metric = AnswerMetric("logit-diff", 3, 5, position=7)
    act = activation_patching(model, (ids,), (corrupt(ids, 2),), metric, ["resid"])
    atp = attribution_patching(model, (ids,), (corrupt(ids, 2),), metric, ["resid"])
    rank = lambda x: x.argsort().argsort().double()
    assert torch.corrcoef(torch.stack([rank(act.changes), rank(atp.changes)]))[0, 1] > 0.8
    # Where the clean and corrupted activations agree both say 0; the swapped token itself AtP underestimates
    # (a softmax far from linear over a whole token's change: why benchmarks/patching.py compares ranks).
    same = torch.ones(8, dtype=torch.bool)
    same[2] = False
    assert atp.grid("resid", "resid_pre", "blocks")[0, same].abs().max() == 0
    assert atp.grid("resid", "resid_pre", "blocks")[0, 2] > 0


def test_encoder_masked_lm_and_classifier():
    torch.manual_seed(0)
    for head, position in (("mlm", 2), ("classify", None)):
        model = build_model(
            "encoder", EncoderConfig(n_layer=2, n_head=2, d_model=16, context=8, vocab_size=20, n_labels=3, head=head)
        ).eval()
        ids = ids_of(6, 3)
        metric = AnswerMetric("prob", 1, position=position)
        result = activation_patching(model, (ids,), (corrupt(ids, 4),), metric)
        grid = result.grid("resid", "resid_pre", "blocks")
        assert grid[0, 4] == pytest.approx(1.0, abs=1e-5) and grid[0, :4].abs().max() == 0  # bidirectional
        assert attribution_patching(model, (ids,), (corrupt(ids, 4),), metric).changes.shape == result.changes.shape


def test_encoder_decoder_patches_the_encoder_the_decoder_and_cross_attention():
    torch.manual_seed(0)
    model = build_model(
        "seq2seq", Seq2SeqConfig(n_layer=2, n_head=2, d_model=16, context=8, src_vocab=20, tgt_vocab=20)
    ).eval()
    src = ids_of(6, 4)
    tgt = ids_of(4, 5)
    metric = AnswerMetric("logit-diff", 4, 6, position=3)
    result = activation_patching(model, (src, tgt), (corrupt(src, 1), tgt), metric)
    stacks = {(s.stack, s.component) for s in result.sites}
    assert {("encoder", "head"), ("decoder", "head"), ("decoder", "cross_head"), ("decoder", "cross_out")} <= stacks
    assert result.grid("resid", "resid_pre", "encoder")[0, 1] == pytest.approx(1.0, abs=1e-5)
    cross = result.grid("heads", "cross_head", "decoder")  # (L, H): the source reaches the decoder only here
    assert cross.shape == (2, 2) and cross.abs().sum() > 0
    assert result.grid("resid", "resid_pre", "decoder")[0].abs().max() == 0  # the decoder's input is the same


def test_edge_attribution_of_the_encoder_decoder_reads_each_stack_and_refuses_post_norm():
    torch.manual_seed(0)
    src, tgt = ids_of(6, 4), ids_of(4, 5)
    metric = AnswerMetric("logit-diff", 4, 6, position=3)
    for norm in ("pre", "post"):
        model = build_model(
            "seq2seq", Seq2SeqConfig(n_layer=2, n_head=2, d_model=16, context=8, src_vocab=20, tgt_vocab=20, norm=norm)
        ).eval()
        if norm == "post":
            with pytest.raises(AttnlabError, match="pre-norm"):
                edge_attribution(model, (src, tgt), (corrupt(src, 1), tgt), metric)
            continue
        edges = edge_attribution(model, (src, tgt), (corrupt(src, 1), tgt), metric, steps=2)["edges"]
        # encoder: 2 x (attention, MLP) -> 1+2+3+4+5 edges; decoder: 2 x (self, cross, MLP) -> 1+...+7
        assert sum(e["stack"] == "encoder" for e in edges) == 15 and sum(e["stack"] == "decoder" for e in edges) == 28
        assert {e["to"] for e in edges if e["from"] == "decoder.1.hook_cross_out"} == {"decoder.1.ff", "decoder.out"}


def test_vit_patches_are_positions():
    torch.manual_seed(0)
    model = perturb(
        build_model(
            "vit", ViTConfig(n_layer=2, n_head=2, d_model=16, image_size=8, channels=1, patch_size=4, n_labels=3)
        )
    )  # its head starts at zero
    clean = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(6))
    bad = clean.clone()
    bad[..., :4, :4] = 0  # the first patch only
    result = activation_patching(model, (clean,), (bad,), AnswerMetric("logit-diff", 0, 1))
    grid = result.grid("resid", "resid_pre", "blocks")  # (L, 1 + 4): [CLS] and the four patches
    assert grid.shape == (2, 5) and grid[0, 1] == pytest.approx(1.0, abs=1e-5) and grid[0, 2:].abs().max() == 0


def test_inputs_of_different_lengths_are_one_line():
    model = gpt()
    with pytest.raises(AttnlabError, match="same length"):
        activation_patching(
            model,
            (torch.zeros(1, 5, dtype=torch.long),),
            (torch.zeros(1, 6, dtype=torch.long),),
            AnswerMetric("prob", 1, position=4),
        )


# ---- attnlab patch -----------------------------------------------------------------------------------

TRAIN = ["--max-steps", "3", "--batch-size", "4", "--eval-interval", "3", "--eval-batches", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("patch")
    (root / "corpus.txt").write_text("def add(a, b):\n    return a + b\n" * 100)
    args = [
        "train",
        "lm",
        "--data",
        root / "corpus.txt",
        "--out",
        root / "lm",
        *flags(preset="gpt-nano", n_layer=2, d_model=32, n_head=4, n_kv_head=2, context=32, tokenizer="char"),
        *TRAIN,
    ]
    assert main([str(a) for a in args]) == 0
    return root / "lm"


def patch_add(run, capsys, *more) -> tuple[int, str, str]:
    """`attnlab patch` of `run` on "def add(a, b):" against "def add(b, b):" with `more` flags."""
    return run_cli(["patch", run, "--clean", "def add(a, b):", "--corrupted", "def add(b, b):", *more], capsys)


def test_patch_json_has_every_effect_keyed_by_component_layer_head_and_position(lm_run, capsys):
    code, out, _ = patch_add(lm_run, capsys, "--target", "a", "--wrong", "b", "--json")
    data = json.loads(out)
    assert code == 0 and data["method"] == "activation" and (data["target"], data["wrong"]) == ("a", "b")
    assert data["positions"]["blocks"][:4] == ["d", "e", "f", "·"] and data["position"] == 13
    keys = {"granularity", "component", "stack", "layer", "head", "position", "point", "effect", "change"}
    assert all(set(e) == keys for e in data["effects"])
    kinds = {(e["granularity"], e["component"]) for e in data["effects"]}
    assert kinds == {
        ("resid", "resid_pre"),
        ("heads", "head"),
        ("components", "attn_out"),
        ("components", "mlp_out"),
        ("components", "resid_pre"),
    }
    assert len(data["effects"]) == 2 * 14 + 2 * 4 + 2 * 3
    first = next(e for e in data["effects"] if e["granularity"] == "resid" and e["layer"] == 0 and e["position"] == 8)
    assert first["effect"] == pytest.approx(1.0, abs=1e-5)  # the changed character, before any layer


def test_patch_png_and_attribution(lm_run, tmp_path, capsys):
    out = tmp_path / "p.png"
    code, printed, _ = patch_add(
        lm_run, capsys, "--wrong", "b", "--method", "attribution", "--granularity", "resid", "--out", out
    )
    assert code == 0 and out.read_bytes()[:8] == PNG and printed.startswith("attribution patching")


def test_patch_sender_and_receivers_is_path_patching(lm_run, capsys):
    code, out, _ = patch_add(lm_run, capsys, "--wrong", "b", "--sender", "1.2", "--receivers", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["method"] == "path" and data["sender"] == {"blocks.0.attn.hook_head_out": [1]}
    assert data["receivers"] == {"blocks.1.attn.hook_head_out": [0, 1, 2, 3]} and data["effect"] is not None
    code, _, err = patch_add(lm_run, capsys, "--sender", "1.2")
    assert code == 2 and "both --sender HEADS and --receivers HEADS" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--corrupted", "def add(ab, b):"], "same length"),
        (["--corrupted", "def add(b, b):", "--target", "zz"], "not a single token or label"),
        (["--corrupted", "def add(a, b):"], "name another with --wrong"),
    ],
)
def test_patch_errors_are_one_line(lm_run, capsys, args, message):
    code, _, err = run_cli(["patch", lm_run, "--clean", "def add(a, b):", *args], capsys)
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_run_without_attention_heads_is_one_line(tmp_path, capsys):
    run = tmp_path / "bow"
    assert main([str(a) for a in ["train", "classify", "--model", "bow", "--out", run, *TRAIN]]) == 0
    capsys.readouterr()
    code, _, err = run_cli(["patch", run, "--clean", "good food", "--corrupted", "bad food"], capsys)
    assert code == 2 and "patching reads" in err and len(err.strip().splitlines()) == 1


SMALL = ["--n-layer", "1", "--d-model", "16", "--n-head", "2"]


@pytest.mark.slow  # three runs trained (a translation decodes its whole test split): ~35 s on 2 busy cores
def test_patch_runs_of_every_kind_from_their_own_inputs(tmp_path, capsys):
    """A translation (clean and corrupted sources, cross-attention heads), a masked LM (at [MASK]) and an
    image classifier (image files, patches as positions), each through `attnlab patch --json`."""
    from PIL import Image
    from sklearn.datasets import load_digits

    (tmp_path / "corpus.txt").write_text("def add(a, b):\n    return a + b\n" * 100)
    runs = {
        "tr": ["translate", "--data", "reverse", "--n-train", "100"],
        "mlm": ["mlm", "--data", tmp_path / "corpus.txt", "--context", "32", "--block-size", "16"],
        "vit": ["image", "--data", "digits"],
    }
    for name, args in runs.items():
        assert main([str(a) for a in ["train", *args, "--out", tmp_path / name, *SMALL, *TRAIN]]) == 0
    for i in (0, 1):
        Image.fromarray((load_digits().images[i] / 16 * 255).astype("uint8")).save(tmp_path / f"{i}.png")
    capsys.readouterr()
    cases = {
        "tr": ("abcd", "abed"),
        "mlm": ("def [MASK](a, b):", "def [MASK](b, b):"),
        "vit": (tmp_path / "0.png", tmp_path / "1.png"),
    }
    found = {}
    for name, (clean, bad) in cases.items():
        code, out, err = run_cli(
            ["patch", tmp_path / name, "--clean", clean, "--corrupted", bad, "--metric", "prob", "--json"], capsys
        )
        assert code == 0, err
        found[name] = json.loads(out)
    tr = found["tr"]
    assert tr["positions"]["encoder"] == ["a", "b", "c", "d"] and tr["positions"]["decoder"][0] == "<s>"
    assert {"cross_head", "cross_out"} <= {e["component"] for e in tr["effects"] if e["stack"] == "decoder"}
    changed = next(e for e in tr["effects"] if (e["stack"], e["layer"], e["position"]) == ("encoder", 0, 2))
    assert changed["effect"] == pytest.approx(1.0, abs=1e-4)  # the one changed source letter, before any layer
    mlm = found["mlm"]
    assert mlm["position"] == mlm["positions"]["blocks"].index("[MASK]") and mlm["wrong"] is None
    vit = found["vit"]
    assert vit["positions"]["blocks"] == ["[CLS]", "patch 1", "patch 2", "patch 3", "patch 4"]
    assert vit["target"] in [str(d) for d in range(10)] and vit["position"] is None


def test_the_parser_choices_are_the_registries():
    """cli/choices.py names them so that `attnlab patch --help` starts without torch."""
    from attnlab.cli import choices
    from attnlab.cli.patch import EDGES
    from attnlab.interpret.patching import GRANULARITIES
    from attnlab.interpret.patching_inputs import METRICS
    from attnlab.interpret.patching_run import METHODS

    assert choices.PATCH_METRICS == METRICS and choices.PATCH_GRANULARITIES == tuple(GRANULARITIES)
    assert choices.PATCH_METHODS == (*METHODS, *EDGES)
