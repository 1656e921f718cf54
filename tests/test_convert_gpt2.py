"""HuggingFace GPT-2 checkpoints in and out, against transformers itself.

Randomly initialized GPT2LMHeadModels of a few small shapes are saved as transformers saves them
(nothing is downloaded), converted into attnlab runs and compared: logits, greedy tokens and
attention weights. Runs exported back must load in transformers with the same logits, and
every broken input ends in one AttnlabError line.
"""

from __future__ import annotations

import json
import shutil
from functools import cache

import pytest
import torch
from safetensors.torch import load_file

import attnlab
from attnlab.cli.main import main
from attnlab.data.tokenizers import BPETokenizer
from attnlab.decoding.sampling import stream
from attnlab.errors import AttnlabError
from attnlab.interop.convert import convert_from_hf, export_hf
from tests.conftest import TEXT, extra, flags

transformers = extra("transformers", "transformers, the reference here, is a dev extra")
pytestmark = pytest.mark.usefixtures("one_thread")

# name -> GPT2Config keys, the BPE vocabulary to train, and extra (padding) rows beyond it.
# Byte-level BPE starts from 256 bytes + <|endoftext|>, so vocabularies are at least 257.
TANH = {"activation_function": "gelu_pytorch_tanh"}
UNTIED = {"activation_function": "relu", "tie_word_embeddings": False, "layer_norm_epsilon": 1e-6}
CONFIGS = {
    "2x32": (dict(n_layer=2, n_embd=32, n_head=4, n_positions=64), 300, 0),
    "3x48": (dict(n_layer=3, n_embd=48, n_head=6, n_positions=32), 320, 0),
    "n_inner": (dict(n_layer=2, n_embd=40, n_head=5, n_positions=48, n_inner=72, **TANH), 280, 7),
    "untied_relu": (dict(n_layer=1, n_embd=24, n_head=2, n_positions=40, **UNTIED), 290, 0),
}
NEW_TOKENS = 30
# Enough text for a few hundred merges beyond the 257 base tokens.
CORPUS = TEXT + (
    "The quick brown fox jumps over the lazy dog.\n"
    "Attention weights say which earlier tokens each position reads from.\n"
    "for i in range(10):\n    print(i * i, end=' ')\n"
    "import json\nwith open('config.json') as f:\n    settings = json.load(f)\n"
)


@cache
def tokenizer(vocab_size: int) -> BPETokenizer:
    return BPETokenizer.train([CORPUS] * 20, vocab_size)


def save_hf(path, name: str, seed: int = 0):
    """A random GPT2LMHeadModel saved by save_pretrained, with a tokenizer.json beside it."""
    keys, vocab, pad = CONFIGS[name]
    tok = tokenizer(vocab)
    torch.manual_seed(seed)
    # initializer_range 0.2, not GPT-2's 0.02: at 0.02 a tied random model mostly predicts the token
    # it just read, so greedy decoding repeats one token and would prove little.
    cfg = transformers.GPT2Config(
        vocab_size=tok.vocab_size + pad,
        bos_token_id=None,
        eos_token_id=None,
        initializer_range=0.2,
        attn_implementation="eager",
        **keys,
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(path)
    (path / "tokenizer.json").write_text(tok.to_json())
    return hf


def convert_each(tmp_path_factory, names, save, architecture) -> dict[str, tuple]:
    """name -> (HF model, the attnlab run converted from its saved folder, that folder); each `save`d
    by name, converted whole (every parameter) from `architecture(name)`."""
    out = {}
    for name in names:
        root = tmp_path_factory.mktemp(name)
        hf = save(root / "hf", name)
        summary = convert_from_hf(root / "hf", root / "run")
        assert summary["architecture"] == architecture(name) and summary["parameters"] == hf.num_parameters()
        out[name] = hf, attnlab.load(root / "run", device="cpu"), root
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> (HF model, attnlab run converted from its saved directory)."""
    made = convert_each(tmp_path_factory, CONFIGS, save_hf, lambda name: "GPT2LMHeadModel")
    assert all(run.config["family"] == "gpt" for _, run, _ in made.values())
    return {name: (hf, run) for name, (hf, run, _) in made.items()}


def batch(run, seed: int = 1):
    torch.manual_seed(seed)
    return torch.randint(0, run.model.cfg.vocab_size, (3, run.model.cfg.context // 2))  # (B, T)


@torch.no_grad()
def logit_diff(run, hf, idx) -> float:
    return (run.model(idx) - hf(idx).logits).abs().max().item()


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_transformers(converted, name):
    hf, run = converted[name]
    diff = logit_diff(run, hf, batch(run))
    print(f"{name}: max |logit difference| = {diff:.3g}")
    assert diff < 1e-4, f"{name}: max abs logit difference {diff:.3g}"


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_tokens_match_transformers(converted, name):
    hf, run = converted[name]
    prompt = run.tokenizer.encode(TEXT)[: min(8, run.model.cfg.context - NEW_TOKENS)]  # prompt + 30 fit the context
    ids = torch.tensor([prompt])  # (1, T)
    out = hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
    )
    theirs = out[0, len(prompt) :].tolist()
    ours = list(stream(run.model, prompt, max_new_tokens=NEW_TOKENS, temperature=0, dtype="float32"))
    print(f"{name}: {len(ours)} greedy tokens, {len(set(ours))} distinct, identical: {ours == theirs}")
    assert len(ours) == NEW_TOKENS and len(set(ours)) > 3  # a path, not one token repeated
    assert ours == theirs, f"{name}: greedy tokens differ"


@pytest.mark.parametrize("name", CONFIGS)
def test_attention_weights_match_transformers(converted, name):
    hf, run = converted[name]
    idx = batch(run)
    with torch.no_grad():
        theirs = hf(idx, output_attentions=True).attentions
    ours = run.model.attention(idx)
    assert len(ours) == len(theirs) == run.model.cfg.n_layer
    diff = max((a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True))
    print(f"{name}: max |attention difference| = {diff:.3g}")
    assert ours[0].shape == theirs[0].shape == (3, run.model.cfg.n_head, idx.shape[1], idx.shape[1])
    assert diff < 1e-5, f"{name}: max abs attention difference {diff:.3g}"


@pytest.mark.parametrize("name", ["2x32", "untied_relu"])
def test_export_round_trip(converted, tmp_path, name):
    """attnlab run -> HF directory -> transformers (same logits) and -> attnlab again (same logits)."""
    _, run = converted[name]
    summary = export_hf(run.path, tmp_path / "hf")
    assert summary["tokenizer"] == "tokenizer.json"
    stored = load_file(tmp_path / "hf" / "model.safetensors")
    assert ("lm_head.weight" in stored) == (name == "untied_relu")  # a tied head is stored once, as wte
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.dtype == torch.float32
    idx = batch(run)
    assert logit_diff(run, hf, idx) < 1e-5
    convert_from_hf(tmp_path / "hf", tmp_path / "again")
    again = attnlab.load(tmp_path / "again", device="cpu")
    with torch.no_grad():
        assert torch.equal(run.model(idx), again.model(idx))


def test_trained_run_round_trip(tmp_path, corpus):
    """A run trained by attnlab (plain GELU, BPE) exports and converts back; so does a character-level one."""
    tiny = (
        "--n-layer 2 --n-head 2 --d-model 32 --context 32 --batch-size 4 --max-steps 3 "
        "--eval-interval 3 --eval-batches 1 --device cpu"
    ).split()
    args = ["train", "lm", "--data", str(corpus), "--out", str(tmp_path / "bpe"), "--tokenizer", "bpe"]
    assert main([*args, "--vocab-size", "300", *tiny]) == 0
    export_hf(tmp_path / "bpe", tmp_path / "bpe-hf")
    config = json.loads((tmp_path / "bpe-hf" / "config.json").read_text())
    assert config["activation_function"] == "gelu" and config["eos_token_id"] == 0  # <|endoftext|> is BPE's first
    run = attnlab.load(tmp_path / "bpe", device="cpu")
    idx = batch(run)
    assert logit_diff(run, transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "bpe-hf").eval(), idx) < 1e-5
    convert_from_hf(tmp_path / "bpe-hf", tmp_path / "back")
    with torch.no_grad():
        assert torch.equal(run.model(idx), attnlab.load(tmp_path / "back", device="cpu").model(idx))

    # A character-level run exports its tokenizer as a WordLevel tokenizer.json, and so comes back.
    assert main(["train", "lm", "--data", str(corpus), "--out", str(tmp_path / "char"), *tiny]) == 0
    assert export_hf(tmp_path / "char", tmp_path / "char-hf")["tokenizer"] == "tokenizer.json"
    convert_from_hf(tmp_path / "char-hf", tmp_path / "char-back")
    run, back = attnlab.load(tmp_path / "char", device="cpu"), attnlab.load(tmp_path / "char-back", device="cpu")
    text = "def f(x):\n\treturn x  # \u00e9 unseen: \u20ac<|endoftext|>"
    assert back.tokenizer.encode(text) == run.tokenizer.encode(text)
    ids = list(range(run.tokenizer.vocab_size))
    assert back.tokenizer.decode(ids) == run.tokenizer.decode(ids)
    idx = batch(run)
    with torch.no_grad():
        assert torch.equal(run.model(idx), back.model(idx))
    assert run.generate("def ", max_new_tokens=20, seed=1) == back.generate("def ", max_new_tokens=20, seed=1)


def _refuse_to_unpickle(*args, **kwargs):
    raise AssertionError("torch.load was called: attnlab must never open a pickle")


def test_a_pickled_checkpoint_is_refused_unopened(tmp_path, monkeypatch):
    """pytorch_model.bin, as older transformers wrote it (no "transformer." prefix, the causal mask buffers
    saved along): a pickle, which attnlab never opens, since unpickling can run any code. The refusal
    says how to make safetensors of it with one's own tools."""
    hf = save_hf(tmp_path / "hf", "2x32")
    (tmp_path / "hf" / "model.safetensors").unlink()
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    for i in range(hf.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "hf" / "pytorch_model.bin")
    monkeypatch.setattr(torch, "load", _refuse_to_unpickle)
    with pytest.raises(
        AttnlabError,
        match=r"pytorch_model.bin\): attnlab never loads a pickle.*"
        r"save_pretrained\(DIR, safe_serialization=True\)",
    ) as e:
        convert_from_hf(tmp_path / "hf", tmp_path / "run")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


class Payload:
    """An object a malicious pickle could carry: unpickling it calls print (or anything else)."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_pickle_with_objects_is_refused(tmp_path, capsys, monkeypatch):
    save_hf(tmp_path / "hf", "2x32")
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save({"wte.weight": torch.zeros(2), "x": Payload()}, tmp_path / "hf" / "pytorch_model.bin")
    monkeypatch.setattr(torch, "load", _refuse_to_unpickle)
    with pytest.raises(AttnlabError, match="never loads a pickle"):
        convert_from_hf(tmp_path / "hf", tmp_path / "run")
    assert "unpickled!" not in capsys.readouterr().out


def _no_config(d):
    (d / "config.json").unlink()


def _edit_config(**changes):
    def edit(d):
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**config, **changes}))

    return edit


def _truncate(d):
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def _no_weights(d):
    (d / "model.safetensors").unlink()


def _no_tokenizer(d):
    (d / "tokenizer.json").unlink()


def _big_tokenizer(d):
    (d / "tokenizer.json").write_text(tokenizer(320).to_json())


def _two_token_tokenizer(d):
    (d / "tokenizer.json").write_text(json.dumps({"type": "char", "chars": ""}))


def _far_id(d):
    """A tokenizer of 300 tokens, one of whose ids lies beyond the model's 300 rows."""
    data = json.loads((d / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab[max(vocab, key=vocab.get)] = 400
    (d / "tokenizer.json").write_text(json.dumps(data))


def _nan_weight(d):
    from safetensors.torch import save_file

    tensors = load_file(d / "model.safetensors")
    tensors[next(k for k in tensors if k.endswith("ln_f.weight"))][0] = float("nan")
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


BROKEN = {
    "no_config": (_no_config, "no config.json (not a HuggingFace model directory)"),
    "mamba": (_edit_config(architectures=["MambaForCausalLM"]), "attnlab converts GPT2LMHeadModel"),
    # GPT-2's tensors under a Llama config (of 7B by its defaults): an error before any allocation
    "llama": (_edit_config(architectures=["LlamaForCausalLM"]), "has no tensor model.embed_tokens.weight"),
    "truncated": (_truncate, "model.safetensors is corrupt or truncated"),
    "no_weights": (_no_weights, "no model.safetensors (nor model.safetensors.index.json with its shards)"),
    "wrong_shape": (_edit_config(n_embd=40), "n_embd 40, but the weights hold 32 (columns of transformer.wte.weight)"),
    "activation": (_edit_config(activation_function="swish"), "activation_function 'swish' is not supported"),
    "layer_scaling": (_edit_config(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    "no_tokenizer": (_no_tokenizer, "tokenizer.json is missing"),
    "big_tokenizer": (_big_tokenizer, "tokenizer.json has 320 tokens, more than the model's 300"),
    # a folder whose run could not load back or decode (config.json's keys are checked by kind)
    "nan_epsilon": (_edit_config(layer_norm_epsilon=float("nan")), "layer_norm_epsilon must be a finite number above"),
    "inf_epsilon": (_edit_config(layer_norm_epsilon=float("inf")), "layer_norm_epsilon must be a finite number above"),
    "two_token_tokenizer": (_two_token_tokenizer, "tokenizer.json has 2 tokens for a model of 300"),
    "id_beyond_the_model": (_far_id, "gives ids up to 400, beyond the model's vocabulary of 300"),
    "nan_weight": (_nan_weight, "NaN or infinite"),
}


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "hf"
    save_hf(path, "2x32")
    return path


@pytest.mark.parametrize("case", BROKEN)
def test_broken_checkpoints_are_one_line_errors(good_dir, tmp_path, case):
    break_it, message = BROKEN[case]
    shutil.copytree(good_dir, tmp_path / "hf")
    break_it(tmp_path / "hf")
    with pytest.raises(AttnlabError) as e:
        convert_from_hf(tmp_path / "hf", tmp_path / "run")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_existing_out_is_refused(good_dir, tmp_path):
    convert_from_hf(good_dir, tmp_path / "run")
    with pytest.raises(AttnlabError, match="already exists"):
        convert_from_hf(good_dir, tmp_path / "run")
    convert_from_hf(good_dir, tmp_path / "run", force=True)  # a run may be replaced
    shutil.copytree(good_dir, tmp_path / "other")
    with pytest.raises(AttnlabError, match="not an attnlab run"):  # a HF folder may not
        convert_from_hf(good_dir, tmp_path / "other", force=True)
    assert (tmp_path / "other" / "model.safetensors").is_file()
    with pytest.raises(AttnlabError, match="would replace the model being converted"):
        convert_from_hf(good_dir, good_dir.parent, force=True)
    export_hf(tmp_path / "run", tmp_path / "exported")
    with pytest.raises(AttnlabError, match="already exists"):
        export_hf(tmp_path / "run", tmp_path / "exported")
    export_hf(tmp_path / "run", tmp_path / "exported", force=True)


def test_export_refuses_what_gpt2_cannot_express(tmp_path, corpus):
    args = [
        "train",
        "lm",
        "--data",
        str(corpus),
        "--out",
        str(tmp_path / "run"),
        *flags(n_layer=1, d_model=16, n_head=2, context=16, max_steps=1, eval_interval=1, eval_batches=1),
        *flags(batch_size=2, device="cpu", positions="sinusoidal"),
    ]
    assert main(args) == 0
    with pytest.raises(AttnlabError, match="positions 'sinusoidal'"):
        export_hf(tmp_path / "run", tmp_path / "hf")


def test_commands_work_on_a_converted_run(converted, tmp_path, corpus, capsys):
    _, run = converted["2x32"]
    assert main(["sample", str(run.path), "--max-new-tokens", "10", "--seed", "1", "--device", "cpu"]) == 0
    assert (
        main(["attention", str(run.path), "def add(a, b):", "--out", str(tmp_path / "x.png"), "--device", "cpu"]) == 0
    )
    assert (tmp_path / "x.png").stat().st_size > 0
    assert main(["eval", str(run.path), "--data", str(corpus), "--split", "all", "--device", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["tokens"] > 100 and result["loss"] > 0
