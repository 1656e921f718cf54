"""The newcomer's journey out of attnlab (issue 54): the runs the docs have a user train export to GGUF.

Without llama.cpp: the demo's model (cli/demo.py's PRESET) and the chat demo's base (cli/demo_chat.py's
BASE_MODEL) export without a refusal and read back from the file with the same logits, and the ollama
Modelfile in docs/fine-tuning.md renders the built-in chat template's text. With llama-cpp-python (the
llamacpp extra): a demo-recipe run continues prompts in llama.cpp as `attnlab sample --temperature 0`
does, and a chat run (a tanh-GELU base + `attnlab train sft`) answers held-out instructions in llama.cpp,
through the chat template the file carries and llama.cpp's own tokenizer, as attnlab's greedy answers.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import gguf
import jinja2
import pytest
import torch

import attnlab
from attnlab.cli import demo, demo_chat
from attnlab.data import DataConfig
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Message
from attnlab.data.instructions import instructions
from attnlab.decoding.chat import answers
from attnlab.interop.gguf_in import convert_from_gguf
from attnlab.interop.gguf_out import export_gguf
from attnlab.models.gpt import GPTConfig
from attnlab.runs.adapted import run_template
from tests.conftest import flags, run_cli, tiny_train
from tests.test_gguf import ids, logits, make_run, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
DOCS = Path(__file__).parent.parent / "docs"
has_llamacpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama.cpp's Python binding: pip install -e '.[llamacpp]'"
)


@pytest.mark.parametrize("name", ["demo", "chat_base"])
def test_the_demos_models_export_and_read_back(tmp_path, name):
    """No refusal for the models the two demos train, and the file's model is attnlab's, logit for logit."""
    cfg = GPTConfig.from_preset(demo.PRESET) if name == "demo" else replace(demo_chat.BASE_MODEL)
    run = attnlab.load(make_run(tmp_path / "run", cfg, tokenizer("char"), scale=0.05), device="cpu")
    summary = export_gguf(run.path, tmp_path / "m.gguf")
    assert summary["architecture"] == "qwen3"  # both demos train Qwen3's block
    convert_from_gguf(tmp_path / "m.gguf", tmp_path / "back")
    back = attnlab.load(tmp_path / "back", device="cpu")
    idx = ids(run, n=48)
    assert torch.equal(logits(back.model, idx), logits(run.model, idx))


def test_a_run_of_the_old_demo_recipe_still_loads_and_is_refused_with_the_way_out(tmp_path, capsys):
    """gpt-nano-fast (the demo's model before): its runs load as they were (config.json holds the whole
    config) and `export --to gguf` is one line naming the parts GGUF lacks and the preset without them."""
    run = make_run(tmp_path / "old", GPTConfig.from_preset("gpt-nano-fast"), tokenizer("char"))
    assert attnlab.load(run, device="cpu").model.bigram is not None
    code, _, err = run_cli(["export", run, "--to", "gguf", tmp_path / "m.gguf"], capsys)
    assert code == 2 and err.count("\n") == 1 and "bigram_vocab (Qwen3 has no bigram embedding)" in err
    assert "--preset qwen3-nano-fast is the fast recipe without them" in err and not (tmp_path / "m.gguf").exists()


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers: a dev extra")
def test_qwen3_both_ways_with_transformers(tmp_path):
    """The demo's block is Qwen3's: a run exports as a Qwen3ForCausalLM with transformers' logits, and a
    transformers Qwen3 converts with its own; an rms_norm_eps attnlab's QK-norm does not use is refused."""
    import transformers

    from attnlab.errors import AttnlabError
    from attnlab.interop.convert import convert_from_hf, export_hf
    from tests.conftest import TINY_LLAMA, random_hf_model

    cfg = replace(GPTConfig.from_preset(demo.PRESET), n_layer=2, d_model=64, n_kv_head=2)
    run = attnlab.load(make_run(tmp_path / "run", cfg, tokenizer("char")), device="cpu")
    export_hf(run.path, tmp_path / "hf")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = ids(run)
    assert type(theirs).__name__ == "Qwen3ForCausalLM"
    assert (logits(theirs, idx) - logits(run.model, idx)).abs().max() < 1e-4
    keys = dict(TINY_LLAMA, vocab_size=run.model.cfg.vocab_size, hidden_size=64, intermediate_size=96, head_dim=16)
    keys |= dict(num_key_value_heads=2, rms_norm_eps=1e-5, initializer_range=0.2)
    random_hf_model("Qwen3Config", "Qwen3ForCausalLM", **keys).save_pretrained(tmp_path / "q3")
    (tmp_path / "q3" / "tokenizer.json").write_text((tmp_path / "hf" / "tokenizer.json").read_text())
    convert_from_hf(tmp_path / "q3", tmp_path / "back")
    back, q3 = (
        attnlab.load(tmp_path / "back", device="cpu"),
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q3").eval(),
    )
    assert back.model.cfg.qk_norm and (logits(back.model, idx) - logits(q3, idx)).abs().max() < 1e-4
    random_hf_model("Qwen3Config", "Qwen3ForCausalLM", **{**keys, "rms_norm_eps": 1e-6}).save_pretrained(tmp_path / "e")
    (tmp_path / "e" / "tokenizer.json").write_text((tmp_path / "hf" / "tokenizer.json").read_text())
    with pytest.raises(AttnlabError, match="rms_norm_eps is 1e-06: attnlab's QK-norm divides with epsilon 1e-05"):
        convert_from_hf(tmp_path / "e", tmp_path / "refused")


def modelfile() -> tuple[str, str]:
    """The TEMPLATE and PARAMETER stop of the ollama Modelfile docs/fine-tuning.md gives."""
    text = (DOCS / "fine-tuning.md").read_text()
    block = re.search(r"```\n(FROM \./sft\.gguf\n.*?)```", text, re.S)
    assert block, "docs/fine-tuning.md has no Modelfile block starting FROM ./sft.gguf"
    template = re.search(r'TEMPLATE """(.*?)"""', block[1], re.S)[1]
    return template, re.search(r'PARAMETER stop "(.*?)"', block[1])[1]


def go_as_jinja(template: str) -> str:
    """The Go-template subset the Modelfile uses (range over .Messages, .Role, .Content, end) as Jinja,
    so the test renders it without ollama; anything else in it fails the test."""
    out = template.replace("{{- range .Messages }}", "{%- for m in messages %}").replace("{{ end }}", "{% endfor %}")
    out = out.replace("{{ .Role }}", "{{ m.role }}").replace("{{ .Content }}", "{{ m.content }}")
    assert "{{ ." not in out and "{{- ." not in out, f"Go template parts this test cannot read: {out}"
    return out


def test_the_modelfile_renders_the_runs_chat_template():
    """ollama's TEMPLATE in the docs writes the text attnlab's built-in template writes (the one a chat
    run is trained with) for a conversation with a system turn and two user turns, and stops where it does."""
    template, stop = modelfile()
    builtin = ChatTemplate()
    conversation = [
        Message("system", "Be brief."),
        Message("user", "Reverse: abc"),
        Message("assistant", "cba"),
        Message("user", "Uppercase: dog"),
    ]
    messages = [{"role": m.role, "content": m.content} for m in conversation]
    assert jinja2.Template(go_as_jinja(template), keep_trailing_newline=True).render(messages=messages) == (
        builtin.prompt(conversation)
    )
    assert stop == builtin.end_of_turn()


# ---- llama.cpp itself (skipped without the llamacpp extra)


def demo_run(root: Path, capsys) -> Path:
    """A demo-recipe run: the demo's preset and training settings, a few steps on a small corpus."""
    (root / "corpus.txt").write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x = 1\n" * 300)
    args = [
        "train",
        "lm",
        "--preset",
        demo.PRESET,
        "--data",
        root / "corpus.txt",
        *flags(
            tokenizer="char", max_steps=40, warmup_steps=5, batch_size=8, eval_interval=40, eval_batches=1, device="cpu"
        ),
        "--out",
        root / "demo",
    ]
    assert run_cli(args, capsys)[0] == 0
    return root / "demo"


@has_llamacpp
def test_llamacpp_continues_the_demo_run_as_attnlab_sample(tmp_path, capsys):
    from attnlab.interop.llamacpp import greedy_text

    run = demo_run(tmp_path, capsys)
    assert run_cli(["export", run, "--to", "gguf", tmp_path / "demo.gguf"], capsys)[0] == 0
    said = []
    for prompt in ("def ", "class P", "    return", "x = "):
        code, ours, _ = run_cli(
            [
                "sample",
                run,
                "--prompt",
                prompt,
                *flags(temperature=0, max_new_tokens=48, dtype="float32", device="cpu"),
            ],
            capsys,
        )
        theirs = prompt + greedy_text(tmp_path / "demo.gguf", prompt, 48)
        said.append(f"attnlab   {ours[:-1]!r}\nllama.cpp {theirs!r}")
        assert code == 0 and ours[:-1] == theirs and len(set(theirs)) > 5  # sample ends its text with a newline
    with capsys.disabled():
        print("", *said, sep="\n")


def chat_run(root: Path, capsys) -> Path:
    """A Qwen3-block character GPT (the chat demo's base, smaller) and `attnlab train sft` from it."""
    corpus = root / "chats.txt"
    corpus.write_text("".join(ChatTemplate().render(c.messages) for c in instructions("train", 300, 5)))
    base = replace(demo_chat.BASE_MODEL, n_layer=2, d_model=64, context=256)
    attnlab.train(
        root / "base",
        base,
        tiny_train(max_steps=20, eval_interval=20),
        DataConfig(data=str(corpus), tokenizer="char"),
        progress=False,
    )
    code, _, _ = run_cli(
        [
            "train",
            "sft",
            "--init",
            root / "base",
            "--out",
            root / "sft",
            *flags(max_steps=30, batch_size=8, examples=200, test_examples=8, eval_interval=30, lr="1e-2"),
            *flags(eval_batches=1, device="cpu"),
        ],
        capsys,
    )
    assert code == 0
    return root / "sft"


@has_llamacpp
def test_llamacpp_answers_held_out_instructions_as_attnlab_chat(tmp_path, capsys):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from attnlab.interop.llamacpp import greedy_text

    run = chat_run(tmp_path, capsys)
    assert run_cli(["export", run, "--to", "gguf", tmp_path / "sft.gguf"], capsys)[0] == 0
    carried = gguf.GGUFReader(tmp_path / "sft.gguf").fields["tokenizer.chat_template"].contents()
    template = run_template(run)
    assert carried == template.source
    formatter = Jinja2ChatFormatter(carried, eos_token="", bos_token="")  # llama-cpp-python's own renderer
    model = attnlab.load(run, device="cpu")
    held_out = [c.messages[:-1] for c in instructions("test", 6, 0)]
    ours = answers(model.model, model.tokenizer, template, held_out, temperature=0, max_new_tokens=40, dtype="float32")
    for messages, answer in zip(held_out, ours, strict=True):
        prompt = formatter(messages=[{"role": m.role, "content": m.content} for m in messages]).prompt
        theirs = greedy_text(tmp_path / "sft.gguf", prompt, 40, stop=template.end_of_turn()).strip()
        with capsys.disabled():
            print(f"\n{messages[-1].content!r}: attnlab {answer!r}, llama.cpp {theirs!r}", end="")
        assert theirs == answer
    assert sum(map(len, ours)) > 10
