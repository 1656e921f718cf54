"""LoRA adapters (nn/lora.py) on every family built on the shared Stack: the formula, B = 0 is the
base exactly, merged == unmerged, only adapters train, and the adapter's state dict round trip."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import from_dict, to_dict
from attnlab.decoding.sampling import stream
from attnlab.errors import AttnlabError
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.nn.lora import (
    TARGETS,
    LoRAConfig,
    LoRALinear,
    adapters_off,
    add_lora,
    available_targets,
    has_lora,
    load_lora_state,
    lora_parameters,
    lora_state_dict,
    merge_lora,
)
from attnlab.nn.stack import set_grad_checkpoint


def _ids(vocab: int, t: int = 12) -> Tensor:
    return torch.randint(0, vocab, (2, t), generator=torch.Generator().manual_seed(1))


# family -> a model (same weights on every call) and its inputs
BUILD = {
    "gpt": lambda: (GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, context=16, vocab_size=50)), (_ids(50),)),
    "gpt-nano-fast": lambda: (GPT(GPTConfig.from_preset("gpt-nano-fast")), (_ids(256),)),
    "llama-nano": lambda: (GPT(GPTConfig.from_preset("llama-nano")), (_ids(256),)),  # grouped k/v, swiglu
    "moe-nano": lambda: (GPT(GPTConfig.from_preset("moe-nano")), (_ids(256),)),
    "encoder": lambda: (
        Encoder(EncoderConfig(n_layer=2, n_head=2, d_model=32, context=24, vocab_size=40)),
        (_ids(40),),
    ),
    # cross-attention reads rows of the stacked matrix (LoRALinear.weight) instead of calling it
    "seq2seq": lambda: (
        Seq2Seq(
            Seq2SeqConfig(n_layer=2, n_head=2, d_model=16, d_ff=32, context=32, src_vocab=23, tgt_vocab=19, norm="pre")
        ),
        (_ids(23, 10), _ids(19, 7)),
    ),
}
FAMILIES = list(BUILD)


def built(family: str) -> tuple[nn.Module, tuple[Tensor, ...]]:
    torch.manual_seed(0)
    model, inputs = BUILD[family]()
    return model.eval(), inputs


def every_target(model: nn.Module, rank: int = 4) -> list[str]:
    """Adapt every matrix the model's blocks have."""
    return add_lora(model, LoRAConfig(rank=rank, targets=tuple(available_targets(model))))


def perturb(model: nn.Module, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-2] == "lora_B":  # `lora_B.q` in a bare LoRALinear
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_B_gives_the_base_logits_exactly(family):
    model, inputs = built(family)
    with torch.no_grad():
        base = model(*inputs)
        names = every_target(model)
        adapted = model(*inputs)
    assert len(names) >= 2 * 2 and has_lora(model)  # attention and feed-forward of two blocks at least
    assert torch.equal(adapted, base)


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_equals_unmerged(family):
    model, inputs = built(family)
    keys = set(model.state_dict())
    with torch.no_grad():
        base = model(*inputs)
        every_target(model)
        perturb(model)
        adapted = model(*inputs)
        merged_names = merge_lora(model)
        merged = model(*inputs)
    assert not torch.allclose(adapted, base, atol=1e-3)  # the adapters do change the model
    assert merged_names and not has_lora(model)
    assert set(model.state_dict()) == keys  # the plain layers are back, under their own names
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["gpt", "gpt-nano-fast", "encoder", "seq2seq"])
def test_only_adapter_parameters_get_gradients_and_change(family):
    model, inputs = built(family)
    every_target(model)
    perturb(model)
    model.train()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" not in n}
    opt = torch.optim.SGD(lora_parameters(model), lr=0.1)
    model(*inputs).float().square().mean().backward()
    for name, p in model.named_parameters():
        if ".lora_" in name:
            assert p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert not p.requires_grad and p.grad is None, name
    opt.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def test_the_state_dict_holds_only_the_adapters():
    model, _ = built("llama-nano")
    names = add_lora(model, LoRAConfig(rank=4, targets=("q", "v", "down")))
    sd = lora_state_dict(model)
    params = dict(model.named_parameters())
    expected = {
        f"{n}.lora_{ab}.{part}"
        for n in names
        for ab in "AB"
        for part in (("q", "v") if n.endswith("qkv_proj") else ("down",))
    }
    assert set(sd) == expected and len(sd) == 4 * 3 * 2  # 4 blocks x (q, v, down) x (A, B)
    assert all(torch.equal(t, params[k]) and params[k].requires_grad for k, t in sd.items())
    assert {k for k, p in params.items() if p.requires_grad} == expected


def test_load_lora_state_round_trip():
    model, (ids,) = built("gpt-nano-fast")
    cfg = LoRAConfig(rank=4, targets=("q", "k", "v", "out", "up", "down"))
    add_lora(model, cfg)
    perturb(model)
    with torch.no_grad():
        want = model(ids)
    sd = lora_state_dict(model)
    other, _ = built("gpt-nano-fast")  # the same base weights, new random A and zero B
    add_lora(other, cfg)
    with torch.no_grad():
        assert not torch.allclose(other(ids), want, atol=1e-3)
        load_lora_state(other, sd)
        assert torch.equal(other(ids), want)
    with pytest.raises(AttnlabError, match="missing blocks.0.attn.qkv_proj.lora_A.k"):
        load_lora_state(other, {k: v for k, v in sd.items() if k != "blocks.0.attn.qkv_proj.lora_A.k"})
    sd["blocks.0.ff.up.lora_B.up"] = torch.zeros(3, 4)
    with pytest.raises(AttnlabError, match=r"blocks.0.ff.up.lora_B.up is \(3, 4\)"):
        load_lora_state(other, sd)


def test_trainable_parameters_are_r_times_in_plus_out_per_matrix():
    model, _ = built("llama-nano")
    assert available_targets(model) == list(TARGETS)
    r = 8
    add_lora(model, LoRAConfig(rank=r, targets=TARGETS))
    block = model.blocks[0].cfg
    c, dh = block.d_model, block.d_model // block.n_head
    q, kv, f = block.n_head * dh, block.n_kv_head * dh, block.ff_width  # 128, 64, and the swiglu width
    per_block = r * ((c + q) + 2 * (c + kv) + (q + c) + 2 * (c + f) + (f + c))  # q, k, v, out, gate, up, down
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == len(model.blocks) * per_block and kv < q  # grouped-query: k and v rows are fewer


def test_lora_linear_is_the_formula():
    torch.manual_seed(0)
    base = nn.Linear(5, 7)
    lora = LoRALinear(base, {"q": (0, 2), "v": (4, 7)}, rank=3, alpha=6.0)
    a_q, a_v = lora.lora_A["q"], lora.lora_A["v"]  # (3, 5)
    assert torch.equal(lora.lora_B["v"], torch.zeros(3, 3)) and a_q.abs().max() <= 1 / math.sqrt(5)
    perturb(lora)
    b_q, b_v = lora.lora_B["q"], lora.lora_B["v"]  # (2, 3), (3, 3)
    assert b_q.abs().sum() > 0 and b_v.abs().sum() > 0
    x = torch.randn(2, 4, 5)
    want = x @ base.weight.T + base.bias
    want[..., 0:2] += x @ a_q.T @ b_q.T * 2.0  # alpha / r = 2
    want[..., 4:7] += x @ a_v.T @ b_v.T * 2.0
    torch.testing.assert_close(lora(x), want, atol=1e-6, rtol=1e-6)
    weight = base.weight.detach().clone()
    weight[0:2] += 2.0 * b_q @ a_q
    weight[4:7] += 2.0 * b_v @ a_v
    torch.testing.assert_close(lora.weight, weight, atol=1e-6, rtol=1e-6)


def test_dropout_acts_on_the_adapter_input_only():
    torch.manual_seed(0)
    base = nn.Linear(6, 4)
    lora = LoRALinear(base, {"up": (0, 4)}, rank=2, alpha=2.0, dropout=0.5).train()
    perturb(lora)
    x = torch.randn(3, 6)
    torch.manual_seed(5)
    got = lora(x)
    torch.manual_seed(5)
    want = base(x) + F.dropout(x, 0.5, training=True) @ lora.lora_A["up"].T @ lora.lora_B["up"].T
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(got, base(x) + x @ lora.lora_A["up"].T @ lora.lora_B["up"].T)


class Int8Linear(nn.Module):
    """A stand-in quantized layer: int8 weight with one scale per row, dequantized in the product."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        scale = linear.weight.detach().abs().amax(1, keepdim=True) / 127
        self.register_buffer("q", torch.round(linear.weight.detach() / scale).to(torch.int8))
        self.register_buffer("scale", scale)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.q.float() * self.scale)


def test_a_quantized_base_adapts_but_refuses_to_merge():
    torch.manual_seed(0)
    base = Int8Linear(nn.Linear(8, 6))
    lora = LoRALinear(base, {"out": (0, 6)}, rank=2, alpha=4.0)
    x = torch.randn(5, 8)
    assert torch.equal(lora(x), base(x))
    perturb(lora)
    assert lora.lora_A["out"].dtype == torch.float32 and not torch.allclose(lora(x), base(x))
    model = nn.Sequential(lora)
    with pytest.raises(AttnlabError, match="cannot merge a LoRA adapter into a Int8Linear"):
        merge_lora(model)


def test_adapters_off_runs_the_base():
    model, (ids,) = built("gpt")
    with torch.no_grad():
        base = model(ids)
        add_lora(model, LoRAConfig(rank=2))
        perturb(model)
        adapted = model(ids)
        with adapters_off(model):
            assert torch.equal(model(ids), base)
        assert torch.equal(model(ids), adapted)


def test_bad_targets_and_settings_are_one_clear_error():
    with pytest.raises(AttnlabError, match="unknown LoRA target 'qkv'; choose from q, k, v, out, gate, up, down"):
        LoRAConfig(targets=("qkv",))
    model, _ = built("gpt")  # a plain MLP: no gate
    assert available_targets(model) == ["q", "k", "v", "out", "up", "down"]
    only = "no 'gate' matrix to adapt; choose LoRA targets from q, k, v, out, up, down$"
    with pytest.raises(AttnlabError, match=only):
        add_lora(model, LoRAConfig(targets=("q", "gate")))
    assert not has_lora(model) and all(p.requires_grad for p in model.parameters())  # left untouched
    for bad in (dict(rank=0), dict(alpha=0.0), dict(dropout=1.0), dict(targets=("q", "q")), dict(targets=())):
        with pytest.raises(AttnlabError):
            LoRAConfig(**bad)
    add_lora(model, LoRAConfig())
    with pytest.raises(AttnlabError, match="has LoRA adapters already"):
        add_lora(model, LoRAConfig())


def test_the_config_round_trips_through_json_and_reads_a_comma_list():
    cfg = LoRAConfig(rank=4, alpha=8.0, dropout=0.1, targets=("q", "v", "up"))
    assert from_dict(LoRAConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg
    assert LoRAConfig(targets="q, v,up").targets == ("q", "v", "up") and cfg.scaling == 2.0
    with pytest.raises(AttnlabError, match="unknown LoRA target 'qv'"):
        LoRAConfig(targets="qv")


def test_an_adapted_model_decodes_through_the_engine_as_its_merged_self():
    """The cached step loop (self-attention's cache; cross-attention's source keys, computed once from
    LoRALinear.weight) gives an adapted model's tokens: the merged model's, also without the cache."""
    model, _ = built("gpt-nano-fast")
    add_lora(model, LoRAConfig(rank=4, targets=("q", "k", "v", "out")))
    perturb(model)
    prompt = [5, 6, 7, 8]
    adapted = list(stream(model, prompt, max_new_tokens=20, temperature=0, seed=0, dtype="float32"))
    uncached = list(stream(model, prompt, max_new_tokens=20, temperature=0, seed=0, use_cache=False, dtype="float32"))
    merge_lora(model)
    merged = list(stream(model, prompt, max_new_tokens=20, temperature=0, seed=0, dtype="float32"))
    assert len(adapted) == 20 and adapted == uncached == merged
    translator, (src, tgt) = built("seq2seq")
    add_lora(translator, LoRAConfig(rank=4, targets=("q", "k", "v", "out", "up")))
    perturb(translator)
    adapted, merged = stepped(translator, src, tgt), stepped(merged_copy(translator), src, tgt)
    torch.testing.assert_close(adapted, merged, atol=1e-5, rtol=1e-5)


def stepped(model: Seq2Seq, src: Tensor, tgt: Tensor) -> Tensor:
    """The decoder's logits (T, B, V) fed tgt one token at a time through its caches."""
    with torch.no_grad():
        state, out = model.start(src), []
        for t in range(tgt.shape[1]):
            logits, state = model.step(tgt[:, t], state)
            out.append(logits)
    return torch.stack(out)


def merged_copy(model: nn.Module) -> nn.Module:
    merged = copy.deepcopy(model)
    merge_lora(merged)
    return merged


def test_activation_checkpointing_gives_the_adapters_the_same_gradients():
    grads = []
    for recompute in (False, True):
        model, (ids,) = built("gpt-nano-fast")
        add_lora(model, LoRAConfig(rank=4, targets=("q", "v", "up"), dropout=0.1))
        perturb(model)
        set_grad_checkpoint(model.train(), recompute)
        torch.manual_seed(7)  # the same dropout masks, also when a block is run again in backward
        model(ids).float().square().mean().backward()
        grads.append([p.grad for p in lora_parameters(model)])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))


def test_adapters_train_in_float32_on_a_bfloat16_base():
    torch.manual_seed(0)
    base = nn.Linear(8, 6).to(torch.bfloat16)
    lora = LoRALinear(base, {"up": (0, 6)}, rank=2, alpha=2.0)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    assert lora.lora_A["up"].dtype == lora.lora_B["up"].dtype == torch.float32
    assert lora(x).dtype == torch.bfloat16 and torch.equal(lora(x), base(x))
    perturb(lora)
    want = base(x).float() + x.float() @ lora.lora_A["up"].T @ lora.lora_B["up"].T
    torch.testing.assert_close(lora(x).float(), want, atol=2e-2, rtol=2e-2)  # bf16's rounding of the sum
    lora(x).float().sum().backward()
    assert lora.lora_B["up"].grad.dtype == torch.float32


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_lora_on_a_quantized_base_is_qlora(kind):
    """The two halves together: the blocks' matrices quantized and frozen, adapters on top (QLoRA).
    B = 0 gives the quantized model's logits exactly; only the adapters learn; merging is refused."""
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.nn.lora import LoRAConfig, add_lora, lora_parameters, merge_lora
    from attnlab.quant.quantize import quantize_model

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=64, context=16, vocab_size=50, dropout=0.0)).eval()
    quantize_model(model, kind)
    idx = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        before = model(idx)
    wrapped = add_lora(model, LoRAConfig(rank=4, alpha=8, targets=("q", "v", "up", "down")))
    assert wrapped
    with torch.no_grad():
        assert torch.equal(model(idx), before)
    model.train()
    model(idx, idx)[1].backward()
    adapters = {id(p) for p in lora_parameters(model)}
    assert all(p.grad is not None for p in lora_parameters(model))
    assert all(p.grad is None for p in model.parameters() if id(p) not in adapters)
    with pytest.raises(AttnlabError):
        merge_lora(model)
