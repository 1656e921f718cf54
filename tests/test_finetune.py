"""The sft, dpo and reward tasks: what a fine-tuned run holds, what its model computes, what it logs."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Message
from attnlab.data.finetune import ChatData, PreferenceData
from attnlab.data.instructions import instructions, preferences
from attnlab.data.supervised import Pairs, pair_examples
from attnlab.decoding.chat import answers
from attnlab.io import read_safetensors
from attnlab.nn.lora import LoRALinear, adapters_off
from attnlab.nn.preference import RewardObjective
from attnlab.quant.quantize import QuantizedLinear
from attnlab.runs.adapted import build_base
from attnlab.runtime.distributed import Dist
from attnlab.tasks import TASKS
from attnlab.tasks.request import python_request
from attnlab.tasks.reward import best_of, score_answers
from tests.conftest import flags, quick_stages, run_cli, tiny_chat_base, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")
SFT = ChatData(examples=48, test_examples=6)
PAIRS = PreferenceData(examples=48, test_examples=6)
LORA = {"lora_rank": 4, "lora_alpha": 8.0, "lora_targets": ("q", "v", "up")}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tiny_chat_base(tmp_path_factory.mktemp("base"))


def train(task, out, base, data, steps=3, **options):
    return attnlab.train(
        out,
        None,
        tiny_train(max_steps=steps, eval_interval=steps),
        data,
        init=base,
        task=task,
        progress=False,
        **options,
    )


def logits(model, n=2):
    torch.manual_seed(3)
    return model.eval()(torch.randint(0, 20, (n, 12)))


def test_a_lora_run_saves_only_its_adapters_and_loads_as_trained(base, tmp_path):
    result = train("sft", tmp_path / "s", base, SFT, **LORA)
    tensors, _ = read_safetensors(tmp_path / "s" / "model.safetensors")
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert [c["kind"] for c in config["converters"]] == ["lora"] and config["converters"][0]["rank"] == 4
    assert config["adapter"]["base"] == str(base.resolve())
    run = attnlab.load(tmp_path / "s")
    assert any(isinstance(m, LoRALinear) for m in run.model.modules())
    assert any(t.abs().sum() > 0 for k, t in tensors.items() if ".lora_B." in k)  # it trained
    # the adapted model differs from its base, which it computes with its adapters off
    plain = build_base(base, "gpt", config["model"])
    with adapters_off(run.model):
        assert torch.equal(logits(run.model), logits(plain))
    assert not torch.allclose(logits(run.model), logits(plain))
    assert 0 <= result["test"]["exact"] <= 1 and result["test"]["examples"] == 6


def test_a_new_lora_model_computes_its_base_exactly(base, tmp_path):
    task = TASKS["sft"]
    req = task.complete(python_request(task, tmp_path / "x", "gpt", {}, tiny_train(), SFT, init=base, options=LORA))
    model = task.model_config(req)
    adapted = task.builder(req, model)()
    assert torch.equal(logits(adapted), logits(build_base(base, "gpt", model)))
    trainable = {n for n, p in adapted.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_lora_on_a_quantized_base(base, tmp_path, kind):
    train("sft", tmp_path / "q", base, SFT, quantize_base=kind, **LORA)
    run = attnlab.load(tmp_path / "q")
    quantized = [m for m in run.model.modules() if isinstance(m, QuantizedLinear)]
    assert quantized and all(m.kind == kind for m in quantized)
    converters = json.loads((tmp_path / "q" / "config.json").read_text())["converters"]
    assert [c["kind"] for c in converters] == ["quantize", "lora"] and converters[0]["base"] == kind  # in order


def test_a_quantized_base_needs_adapters(base, tmp_path, capsys):
    code, _, err = run_cli(["train", "sft", "--init", base, "--out", tmp_path / "q", "--quantize-base", "nf4"], capsys)
    assert code == 2 and "--lora-rank" in err and len(err.strip().splitlines()) == 1


def test_a_full_fine_tune_trains_every_weight_and_answers(base, tmp_path, capsys):
    train("sft", tmp_path / "f", base, SFT)
    capsys.readouterr()
    tensors, _ = read_safetensors(tmp_path / "f" / "model.safetensors")
    assert "blocks.0.attn.qkv_proj.weight" in tensors
    code, out, _ = run_cli(["eval", tmp_path / "f", "--json"], capsys)
    assert code == 0 and json.loads(out)["examples"] == 6 and 0 <= json.loads(out)["exact"] <= 1


def test_show_masks_marks_the_trained_tokens(base, tmp_path, capsys):
    args = [
        "train",
        "sft",
        "--init",
        base,
        "--out",
        tmp_path / "m",
        *flags(show_masks=True, examples=8, test_examples=2, max_steps=1, device="cpu"),
    ]
    code, _, err = run_cli(args, capsys)
    assert code == 0
    shown = err.split("in green:\n", 1)[1]
    first = instructions("train", 8, 0)[0]
    answer = first.messages[-1].content
    assert f"\x1b[1;32m{answer}<|im_end|>" in shown and shown.count("\x1b[1;32m") == 1  # one assistant turn


def test_a_conversation_file_and_a_bad_row(base, tmp_path, capsys):
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
            ]
        },
        {"prompt": "2 + 2?", "completion": "4"},
        {"instruction": "Say yes", "input": "", "output": "yes"},
    ] * 10
    good = tmp_path / "chats.jsonl"
    good.write_text("\n".join(json.dumps(r) for r in rows))
    train("sft", tmp_path / "c", base, ChatData(data=str(good), val_fraction=0.2), steps=2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in [rows[0], {"messages": [{"role": "user", "content": 5}]}]))
    capsys.readouterr()
    code, _, err = run_cli(["train", "sft", "--init", base, "--out", tmp_path / "b", "--data", bad], capsys)
    assert code == 2 and "row 2" in err and "messages" in err and len(err.strip().splitlines()) == 1


def by_loop(model, example) -> float:
    """log p(answer | prompt), one trained token at a time."""
    ids = torch.tensor(example.ids)
    with torch.no_grad():
        logp = F.log_softmax(model.eval()(ids[None, :-1])[0].double(), -1)  # (T - 1, V)
    return sum(float(logp[t - 1, ids[t]]) for t in range(1, len(ids)) if example.trained[t])


def test_dpo_reference_is_the_init_model_and_its_accuracy_is_logged(base, tmp_path):
    sft = tmp_path / "sft"
    train("sft", sft, base, SFT)
    result = train("dpo", tmp_path / "d", sft, PAIRS, steps=2, beta=0.1)
    rows = [json.loads(line) for line in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    assert all("reward_acc" in r and "margin" in r for r in rows if "loss" in r)
    assert {"preference_accuracy", "exact", "pairs"} <= set(result["test"])
    # the reference log-probabilities the batches carry are the init model's, answer tokens only
    req = python_request(TASKS["dpo"], tmp_path / "d", "gpt", {}, tiny_train(), PAIRS, init=sft, options={"beta": 0.1})
    prepared = TASKS["dpo"].prepare(TASKS["dpo"].complete(req), Dist())
    init = attnlab.load(sft).model
    for (chosen, rejected), ref in list(zip(prepared.batches.pairs["train"], prepared.batches.refs["train"]))[:3]:
        assert ref == pytest.approx([by_loop(init, chosen), by_loop(init, rejected)], abs=1e-4)


def test_the_reward_models_loss_is_bradley_terry(base, tmp_path):
    train("reward", tmp_path / "r", base, PAIRS, steps=2)
    run = attnlab.load(tmp_path / "r")
    assert run.config["family"] == "reward"
    tok = run.tokenizer
    pairs = [pair_examples(p, ChatTemplate(), tok) for p in preferences("test", 4, 1)]
    x, last, answer = Pairs({"train": pairs}).batch("train", 4, np.random.default_rng(0), (0, 1))
    scores, loss = RewardObjective(run.model)(x, last, answer)
    by_hand = torch.stack([-F.logsigmoid(scores[i] - scores[4 + i]) for i in range(4)]).mean()
    assert torch.allclose(loss, by_hand)
    # each row's score is read at its own last token: padding after it changes nothing
    alone = run.model.score(x[:1, : int(last[0]) + 1], answer=answer[:1, : int(last[0]) + 1])
    assert torch.allclose(alone, scores[:1], atol=1e-5)


def test_best_of_n_picks_the_answer_the_reward_model_scores_highest(base, tmp_path, capsys):
    train("reward", tmp_path / "r", base, PAIRS, steps=2)
    policy, reward = attnlab.load(base), attnlab.load(tmp_path / "r")
    with torch.no_grad():  # a reward head that is not flat, so the answers' scores differ
        reward.model.reward_head.weight.normal_()
    messages = [Message("user", "What is 2 + 3?")]
    ranked = best_of(policy, reward, messages, 5, seed=4, temperature=1.0, max_new_tokens=8)
    drawn = answers(
        policy.model, policy.tokenizer, ChatTemplate(), [messages] * 5, seed=4, temperature=1.0, max_new_tokens=8
    )
    assert sorted(a for _, a in ranked) == sorted(drawn)
    assert [s for s, _ in ranked] == sorted(score_answers(reward, messages, drawn), reverse=True)
    code, _, err = run_cli(["sample", base, "--best-of", "3"], capsys)
    assert code == 2 and "--reward" in err
    code, _, err = run_cli(["sample", base, "--chat", "Hi", "--best-of", "2", "--reward", base], capsys)
    assert code == 2 and "give a reward run" in err


LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_init_from_a_huggingface_folder_converts_it_once_and_keeps_its_template(tmp_path, capsys):
    transformers = pytest.importorskip("transformers", reason="transformers, the reference here, is a dev extra")
    from attnlab.data.tokenizers import BPETokenizer

    hf_dir = tmp_path / "hf"
    texts = [ChatTemplate(LLAMA3_STYLE).render(c.messages) for c in instructions("train", 200, 2)]
    tok = BPETokenizer.train(texts, 300)
    sizes = dict(vocab_size=tok.vocab_size, n_layer=1, n_embd=16, n_head=2, n_positions=256)
    cfg = transformers.GPT2Config(**sizes, bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_text(tok.to_json())
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": LLAMA3_STYLE, "bos_token": "<s>"}))
    train("sft", tmp_path / "s", hf_dir, SFT, **LORA)
    stored = json.loads((tmp_path / "s" / "chat_template.json").read_text())
    assert stored["template"] == LLAMA3_STYLE and stored["bos_token"] == "<s>"
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    converted = config["adapter"]["base"]
    assert converted.startswith(os.environ["ATTNLAB_CACHE"]) and config["init"] == str(hf_dir)
    ids = torch.randint(0, tok.vocab_size, (2, 10))
    run = attnlab.load(tmp_path / "s")
    with torch.no_grad(), adapters_off(run.model):
        assert torch.allclose(run.model(ids), hf(ids).logits, atol=1e-4)
    shutil.rmtree(converted)  # the cache cleared: the run reads its --init folder again
    again = attnlab.load(tmp_path / "s")
    with torch.no_grad():
        assert torch.equal(again.model(ids), run.model(ids))


def test_the_chat_demo_chains_the_tasks(base, tmp_path, monkeypatch, capsys):
    import attnlab.cli.demo_chat as demo

    quick_stages(monkeypatch, demo, ("SFT_TRAIN", "DPO_TRAIN", "REWARD_TRAIN", "GRPO_CHAIN"), eval_interval=2)
    monkeypatch.setattr(demo, "TEST", 4)
    monkeypatch.setattr(demo, "SAMPLED", 2)
    monkeypatch.setattr(demo, "BEST_OF", 2)
    code, out, _ = run_cli(["demo", "--chat", "--base", base, "--out", tmp_path / "chat"], capsys)
    assert code == 0
    for run in ("sft", "dpo", "reward", "grpo"):
        assert (tmp_path / "chat" / run / "eval.json").is_file()
    assert "exact answers on 4 held-out instructions: before" in out and "best of 2 by the reward model" in out
    assert not (tmp_path / "chat" / "base").exists()  # --base reused, not pretrained


def test_a_base_read_a_tensor_at_a_time_checks_what_load_checks(base, tmp_path):
    from attnlab.io import write_safetensors
    from attnlab.runs.weights import load_streamed

    model = json.loads((base / "config.json").read_text())["model"]
    tensors, _ = read_safetensors(base / "model.safetensors")
    streamed, whole = build_base(base, "gpt", model), attnlab.load(base).model
    assert all(torch.equal(streamed.state_dict()[k], whole.state_dict()[k]) for k in whole.state_dict())
    cases = {
        "nan": {**tensors, "norm.weight": torch.full_like(tensors["norm.weight"], float("nan"))},
        "shape": {**tensors, "norm.weight": torch.ones(3)},
        "missing": {k: v for k, v in tensors.items() if k != "norm.weight"},
    }
    says = {
        "nan": "NaN or infinite values (first in norm.weight)",
        "shape": "norm.weight is (3,)",
        "missing": "missing ['norm.weight']",
    }
    for name, bad in cases.items():
        write_safetensors(tmp_path / f"{name}.safetensors", bad, {})
        with pytest.raises(attnlab.AttnlabError, match=re.escape(says[name])):
            load_streamed(build_base(base, "gpt", model), tmp_path / f"{name}.safetensors")


def test_a_reward_lora_run_merges_with_the_head_it_trained(base, tmp_path):
    from attnlab.runs.merge import merge_run

    train("reward", tmp_path / "r", base, PAIRS, steps=2, lora_rank=2)
    merge_run(tmp_path / "r", tmp_path / "m")
    lora, merged = attnlab.load(tmp_path / "r").model, attnlab.load(tmp_path / "m").model
    ids = torch.randint(0, 20, (2, 12))
    with torch.no_grad():
        assert torch.allclose(lora.score(ids), merged.score(ids), atol=1e-5)
        assert lora.reward_head.weight.abs().sum() > 0  # the head trained, and the merged run kept it
