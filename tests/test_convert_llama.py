"""HuggingFace Llama and Mixtral checkpoints in and out, against transformers itself.

Random LlamaForCausalLM (grouped-query attention and an untied head; a tied one with wide heads)
and MixtralForCausalLM models are built locally by transformers (nothing is downloaded), saved as
it saves them, converted into attnlab runs and compared: logits, greedy tokens, attention weights.
Exported runs load in transformers with the same logits; a second conversion gives the same model.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnlab
from attnlab.cli.main import main
from attnlab.decoding.sampling import stream
from attnlab.errors import AttnlabError
from attnlab.interop.convert import convert_from_hf, export_hf
from tests.conftest import TEXT, TINY_LLAMA, extra, flags, random_hf_model
from tests.test_convert_gpt2 import convert_each, tokenizer

extra("transformers", "transformers, the reference here, is a dev extra")
pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 300
ROPE = lambda theta: {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}  # noqa: E731
# name -> (transformers config class, model class, config keys)
CONFIGS = {
    "llama_gqa_untied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(TINY_LLAMA, hidden_size=32, intermediate_size=48, num_key_value_heads=2, rms_norm_eps=1e-6, **ROPE(5e5)),
    ),
    "llama_tied_wide_heads": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(TINY_LLAMA, hidden_size=32, intermediate_size=40, head_dim=16, tie_word_embeddings=True, **ROPE(1e4)),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(TINY_LLAMA, hidden_size=32, intermediate_size=24, num_key_value_heads=1, sliding_window=None, **ROPE(1e6))
        | dict(num_local_experts=4, num_experts_per_tok=2),
    ),
}
NEW_TOKENS = 30


def save_hf(path, name: str):
    config_cls, model_cls, keys = CONFIGS[name]
    hf = random_hf_model(
        config_cls,
        model_cls,
        vocab_size=VOCAB,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        initializer_range=0.2,
        **keys,
    )
    hf.save_pretrained(path)
    (path / "tokenizer.json").write_text(tokenizer(VOCAB).to_json())
    return hf


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_each(tmp_path_factory, CONFIGS, save_hf, lambda name: CONFIGS[name][1])


def batch(run, seed: int = 1):
    torch.manual_seed(seed)
    return torch.randint(0, VOCAB, (3, 24))  # (B, T)


@torch.no_grad()
def logit_diff(run, hf, idx) -> float:
    return (run.model(idx) - hf(idx).logits).abs().max().item()


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_and_attention_match_transformers(converted, name):
    hf, run, _ = converted[name]
    idx = batch(run)
    diff = logit_diff(run, hf, idx)
    print(f"{name}: max |logit difference| = {diff:.3g}")
    assert diff < 1e-4
    with torch.no_grad():
        theirs = hf(idx, output_attentions=True).attentions
    ours = run.model.attention(idx)
    assert len(ours) == len(theirs) == 2 and ours[0].shape == theirs[0].shape == (3, 4, 24, 24)
    assert max((a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True)) < 1e-5


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_tokens_match_transformers(converted, name):
    hf, run, _ = converted[name]
    prompt = run.tokenizer.encode(TEXT)[:8]
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
    )
    theirs = out[0, len(prompt) :].tolist()
    ours = list(stream(run.model, prompt, max_new_tokens=NEW_TOKENS, temperature=0, dtype="float32"))
    assert len(ours) == NEW_TOKENS and len(set(ours)) > 3
    assert ours == theirs


def test_the_mapping_reads_the_config(converted):
    cfg = converted["llama_gqa_untied"][1].model.cfg
    assert (cfg.n_kv_head, cfg.rope_theta, cfg.ln_eps, cfg.tie_weights, cfg.bias) == (2, 500000.0, 1e-6, False, False)
    assert converted["llama_gqa_untied"][1].model.blocks[0].attn.n_kv_heads == 2
    wide = converted["llama_tied_wide_heads"][1].model.cfg
    assert wide.head_width == 16 and wide.tie_weights
    moe = converted["mixtral"][1].model.cfg
    assert (moe.feedforward, moe.n_experts, moe.experts_per_token, moe.expert_ff) == ("moe", 4, 2, "swiglu")


@pytest.mark.parametrize("name", CONFIGS)
def test_export_round_trip(converted, tmp_path, name):
    hf_cls = CONFIGS[name][1]
    _, run, _ = converted[name]
    summary = export_hf(run.path, tmp_path / "hf")
    assert summary["architecture"] == hf_cls
    import transformers

    again_hf = getattr(transformers, hf_cls).from_pretrained(tmp_path / "hf").eval()
    idx = batch(run)
    assert logit_diff(run, again_hf, idx) < 1e-5
    convert_from_hf(tmp_path / "hf", tmp_path / "again")
    with torch.no_grad():
        assert torch.equal(run.model(idx), attnlab.load(tmp_path / "again", device="cpu").model(idx))


def _other_expert_layout(tensors: dict[str, torch.Tensor], experts: int) -> dict[str, torch.Tensor]:
    """Mixtral's experts in the layout the checkpoint does not use: per-expert w1/w2/w3 (the Hub's)
    <-> fused gate_up_proj / down_proj (transformers 5's)."""
    out = {}
    if any(".block_sparse_moe." in k for k in tensors):  # the Hub's -> fused
        for i in range(2):
            hub = f"model.layers.{i}.block_sparse_moe."
            w = lambda j, n, hub=hub: tensors[f"{hub}experts.{j}.{n}.weight"]  # noqa: E731
            out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.stack(
                [torch.cat([w(j, "w1"), w(j, "w3")]) for j in range(experts)]
            )
            out[f"model.layers.{i}.mlp.experts.down_proj"] = torch.stack([w(j, "w2") for j in range(experts)])
            out[f"model.layers.{i}.mlp.gate.weight"] = tensors[f"{hub}gate.weight"]
        return out | {k: v for k, v in tensors.items() if ".block_sparse_moe." not in k}
    for i in range(2):  # fused -> the Hub's
        fused = f"model.layers.{i}.mlp."
        gate, up = tensors[f"{fused}experts.gate_up_proj"].chunk(2, dim=1)
        for j in range(experts):
            hub = f"model.layers.{i}.block_sparse_moe.experts.{j}."
            out |= {
                hub + "w1.weight": gate[j],
                hub + "w3.weight": up[j],
                hub + "w2.weight": tensors[f"{fused}experts.down_proj"][j],
            }
        out[f"model.layers.{i}.block_sparse_moe.gate.weight"] = tensors[f"{fused}gate.weight"]
    return out | {k: v for k, v in tensors.items() if ".mlp." not in k}


def test_mixtral_experts_are_read_in_either_layout(converted, tmp_path):
    hf, run, root = converted["mixtral"]
    (tmp_path / "hf").mkdir()
    for f in ("config.json", "tokenizer.json"):
        (tmp_path / "hf" / f).write_bytes((root / "hf" / f).read_bytes())
    tensors = _other_expert_layout(load_file(root / "hf" / "model.safetensors"), 4)
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "hf" / "model.safetensors")
    convert_from_hf(tmp_path / "hf", tmp_path / "run")
    idx = batch(run)
    with torch.no_grad():
        assert torch.equal(run.model(idx), attnlab.load(tmp_path / "run", device="cpu").model(idx))


def _edited(converted, tmp_path, name: str, **keys):
    root = converted[name][2]
    (tmp_path / "hf").mkdir()
    for f in ("model.safetensors", "tokenizer.json"):
        (tmp_path / "hf" / f).write_bytes((root / "hf" / f).read_bytes())
    config = json.loads((root / "hf" / "config.json").read_text()) | keys
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    return tmp_path / "hf"


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "of type 'llama3'"),
        ({"attention_bias": True}, "sets attention_bias"),
        ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
        ({"sliding_window": 16}, "sliding window of 16"),
        ({"num_key_value_heads": 4}, r"num_key_value_heads x head_dim 32, but the weights hold 16 \(rows of"),
    ],
)
def test_what_attnlab_cannot_read_is_one_line(converted, tmp_path, keys, message):
    src = _edited(converted, tmp_path, "llama_gqa_untied", **keys)
    with pytest.raises(AttnlabError, match=message):
        convert_from_hf(src, tmp_path / "run")


def test_a_trained_llama_nano_exports_and_a_modern_gpt_says_what_does_not_fit(tmp_path, corpus):
    from transformers import LlamaForCausalLM

    tiny = [
        *flags(context=32, batch_size=4, max_steps=2, eval_interval=2, eval_batches=1, device="cpu"),
        "--data",
        str(corpus),
    ]
    assert main(["train", "lm", "--preset", "llama-nano", "--out", str(tmp_path / "llama"), *tiny]) == 0
    assert export_hf(tmp_path / "llama", tmp_path / "llama-hf")["architecture"] == "LlamaForCausalLM"
    run = attnlab.load(tmp_path / "llama", device="cpu")
    idx = torch.randint(0, run.model.cfg.vocab_size, (2, 16))
    assert logit_diff(run, LlamaForCausalLM.from_pretrained(tmp_path / "llama-hf").eval(), idx) < 1e-5
    assert main(["train", "lm", "--preset", "gpt-nano-fast", "--out", str(tmp_path / "fast"), *tiny]) == 0
    with pytest.raises(AttnlabError, match=r"fit HuggingFace's Llama: .*qk_norm.*logit_softcap.*bigram_vocab"):
        export_hf(tmp_path / "fast", tmp_path / "fast-hf")
