"""Chatting with a run through its own chat template: /v1/chat/completions (the `openai` client against
a live `attnlab serve`), `attnlab sample --chat` and `attnlab chat` (the terminal loop, driven by a
list of lines): the prompt is the template's, the reply ends before its end of turn, the history is
rendered turn by turn and cut from the oldest when it outgrows the context."""

from __future__ import annotations

import io
import shutil

import pytest

import attnlab
from attnlab import load
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Message
from attnlab.data.finetune import ChatData
from attnlab.decoding import chat as chat_module
from attnlab.decoding.chat import answers, stream_answer
from attnlab.decoding.dialogue import PROMPT, Dialogue, talk, trimmed
from attnlab.decoding.sampling import stream_text
from attnlab.io import write_json
from attnlab.runs.adapted import CHAT_TEMPLATE, run_template
from attnlab.runs.marker import record
from attnlab.serve.app import create_app, running
from tests.conftest import TEXT, extra, flags, run_cli, tiny_data, tiny_model, tiny_train

openai = extra("openai", "the openai client is a dev extra: pip install -e .[dev]")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

# Llama 3's layout: a header per turn, every turn closed by <|eot_id|> (ChatML's prompt, or the old
# "User: ... Assistant:" lines, have other lengths and make the model write other text).
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# The same, but an answer closes with eos_token: the test picks it from what the model writes, so
# that the reply must be cut before it (the prompt of one user turn does not contain it).
ENDS = "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}<|eot_id|>{% endif %}"
CUT = LLAMA3.replace("<|eot_id|>{% endfor %}", ENDS + "{% endfor %}")
# A template that checks the conversation, as Mistral's and Llama 2's do.
STRICT = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}[{{ m['role'] }}]{{ m['content'] }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
BOS = "<|begin_of_text|>"
QUESTION = "What is 2 + 3?"
SEED, LENGTH = 5, 24  # the cut run's answers: seed and most tokens
PLAIN = {"temperature": 1.0, "extra_body": {"ignore_eos": True}}  # a plain draw, as the library's


def write_template(run, template: ChatTemplate) -> None:
    record(run, CHAT_TEMPLATE)
    write_json(run / CHAT_TEMPLATE, template.to_dict())


def marker_in(text: str) -> str:
    """Two characters the text has from its 5th on, no space at either end (what strip() keeps)."""
    for k in range(4, len(text) - 1):
        if text[k : k + 2].strip() == text[k : k + 2]:
            return text[k : k + 2]
    raise AssertionError(f"no marker to pick in {text!r}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny trained run in four folders: "llama" (Llama 3's template), "chatml" (none: the built-in
    ChatML), "cut" (an answer ends with two characters the model writes at SEED) and "strict" (roles
    checked); the answer cut before the marker, and the marker."""
    root = tmp_path_factory.mktemp("chat")
    (root / "corpus.txt").write_text(TEXT * 40)
    with pytest.MonkeyPatch.context() as mp:  # module scope runs before conftest's per-test cache
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        attnlab.train(
            root / "llama",
            tiny_model(n_layer=1, context=256),
            tiny_train(max_steps=5, eval_interval=5),
            tiny_data(root / "corpus.txt"),
            progress=False,
        )
    for name in ("chatml", "cut", "strict"):
        shutil.copytree(root / "llama", root / name)
    write_template(root / "llama", ChatTemplate(LLAMA3, BOS, "<|eot_id|>"))
    write_template(root / "strict", ChatTemplate(STRICT))
    with pytest.MonkeyPatch.context() as mp:  # an sft run (LoRA) from "llama": it keeps Llama 3's template
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        data = ChatData(examples=16, test_examples=2)
        attnlab.train(
            root / "sft",
            None,
            tiny_train(max_steps=2, eval_interval=2),
            data,
            init=root / "llama",
            task="sft",
            lora_rank=2,
            progress=False,
        )
    run = load(root / "cut", "cpu")
    raw = "".join(
        stream_text(
            run.model,
            run.tokenizer,
            ChatTemplate(CUT, BOS).prompt([Message("user", QUESTION)]),
            max_new_tokens=LENGTH,
            temperature=1.0,
            seed=SEED,
        )
    )
    marker = marker_in(raw)
    write_template(root / "cut", ChatTemplate(CUT, BOS, marker))
    return root, raw[: raw.index(marker)], marker


@pytest.fixture(scope="module")
def client(runs):
    root = runs[0]
    with running(create_app([root / name for name in ("llama", "chatml", "cut", "strict", "sft")])) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def llama(runs):
    return load(runs[0] / "llama", "cpu")


# ---- /v1/chat/completions ---------------------------------------------------------------------------------


def test_v1_chat_prompts_with_each_run_s_own_template(client, runs):
    turns = [Message("system", "Be terse."), Message("user", QUESTION)]
    asked = [{"role": m.role, "content": m.content} for m in turns]
    counts = {}
    for name in ("llama", "chatml", "sft"):
        run = load(runs[0] / name, "cpu")
        template = run_template(run.path)
        r = client.chat.completions.create(model=name, messages=asked, max_tokens=10, seed=3, **PLAIN)
        counts[name] = len(run.tokenizer.encode(template.prompt(turns)))
        assert r.usage.prompt_tokens == counts[name]
        expected = "".join(
            stream_answer(run.model, run.tokenizer, template, turns, seed=3, temperature=1.0, max_new_tokens=10)
        )
        assert r.choices[0].message.content == expected  # the continuation of exactly that prompt
        developer = [{"role": "developer", "content": "Be terse."}, asked[1]]  # a developer message is a system one
        again = client.chat.completions.create(model=name, messages=developer, max_tokens=10, seed=3, **PLAIN)
        assert again.choices[0].message.content == expected and again.usage.prompt_tokens == counts[name]
    old = len(run.tokenizer.encode(f"System: Be terse.\nUser: {QUESTION}\nAssistant:"))
    assert len({counts["llama"], counts["chatml"], old}) == 3  # a server on another template would fail above
    assert counts["sft"] == counts["llama"]  # the sft run answers in the template it was trained with
    assert counts["llama"] == len("<|begin_of_text|>") + 2 * len(
        "<|start_header_id|><|end_header_id|>\n\n<|eot_id|>"
    ) + len("systemBe terse.user" + QUESTION) + len("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_v1_chat_replies_end_before_the_template_s_end_of_turn(client, runs):
    _, cut, marker = runs
    messages = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model="cut", messages=messages, max_tokens=LENGTH, seed=SEED, **PLAIN)
    (choice,) = r.choices
    assert choice.message.content == cut and marker not in cut and choice.finish_reason == "stop"
    assert r.usage.completion_tokens < LENGTH
    chunks = list(
        client.chat.completions.create(
            model="cut", messages=messages, max_tokens=LENGTH, seed=SEED, stream=True, **PLAIN
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"
    both = client.chat.completions.create(
        model="cut", messages=messages, max_tokens=LENGTH, seed=SEED, stop=cut[2:4], **PLAIN
    )
    assert both.choices[0].message.content == cut[: cut.index(cut[2:4])]  # the request's stops still cut


def test_v1_chat_a_conversation_the_template_refuses_is_a_400_naming_messages(client):
    twice = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="strict", messages=twice, max_tokens=2)
    body = caught.value.body
    assert body["code"] == "invalid_value" and body["param"] == "messages" and "must alternate" in body["message"]
    ok = client.chat.completions.create(model="strict", messages=twice[:1], max_tokens=2, seed=1, **PLAIN)
    assert ok.usage.prompt_tokens == len("[user]hi[assistant]")


# ---- attnlab sample --chat ----------------------------------------------------------------------------------


def test_sample_chat_prints_the_answer_alone(runs, capsys):
    root, cut, _ = runs
    args = [
        "sample",
        root / "cut",
        "--chat",
        QUESTION,
        "--seed",
        SEED,
        "--temperature",
        "1.0",
        "--max-new-tokens",
        LENGTH,
        "--device",
        "cpu",
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert out == cut.strip() + "\n"
    run = load(root / "cut", "cpu")
    texts = answers(
        run.model,
        run.tokenizer,
        run_template(run.path),
        [[Message("user", QUESTION)]] * 3,
        seed=SEED,
        temperature=1.0,
        max_new_tokens=LENGTH,
    )
    code, out, _ = run_cli([*args, "--num-samples", "3"], capsys)
    assert code == 0 and texts[0] == cut.strip() and len(set(texts)) > 1
    assert out == "".join(("\n" + "-" * 40 + "\n" if i else "") + t + "\n" for i, t in enumerate(texts))
    code, _, err = run_cli([*args, "--prompt", "def "], capsys)
    assert code == 2 and "leave out --prompt and --stop" in err and len(err.strip().splitlines()) == 1


def test_sample_chat_without_a_template_of_its_own_uses_chatml_and_says_so(runs, capsys):
    root = runs[0]
    code, out, err = run_cli(
        ["sample", root / "chatml", "--chat", "hi", "--seed", "1", "--max-new-tokens", "8", "--device", "cpu"], capsys
    )
    run = load(root / "chatml", "cpu")
    expected = answers(run.model, run.tokenizer, ChatTemplate(), [[Message("user", "hi")]], seed=1, max_new_tokens=8)
    assert code == 0 and out == expected[0] + "\n" and "built-in ChatML" in err


# ---- attnlab chat ------------------------------------------------------------------------------------------


def lines(*texts: str):
    """A reader like input(): the texts one by one, then EOFError (the end of input)."""
    it = iter(texts)

    def read(prompt: str) -> str:
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    return read


@pytest.fixture
def prompts(monkeypatch):
    """The prompts the model is given, recorded as decoding/chat.py passes them on."""
    seen = []

    def recorded(model, tok, prompt, **kw):
        seen.append(prompt)
        return stream_text(model, tok, prompt, **kw)

    monkeypatch.setattr(chat_module, "stream_text", recorded)
    return seen


def test_chat_keeps_the_conversation_in_the_template_and_resets(llama, prompts):
    template, out = run_template(llama.path), io.StringIO()
    settings = dict(seed=2, max_new_tokens=8, temperature=1.0)
    replay = Dialogue(llama.model, llama.tokenizer, template, **settings)  # what the loop should show
    expected = []
    for text in ("hello", "and then?", None, "again"):
        if text is None:
            replay.reset()
            continue
        assert replay.ask(text) == []
        expected.append("".join(replay.answer()))  # answer k draws with seed + k, reset or not
    first, second, third = expected
    prompts.clear()
    talk(
        Dialogue(llama.model, llama.tokenizer, template, **settings),
        lines("hello", "and then?", "/reset", "again"),
        out,
    )
    assert out.getvalue() == f"{first}\n{second}\n[a new conversation]\n{third}\n\n"  # the end of input: a newline
    assert len(prompts) == 3 and prompts[0] == template.prompt([Message("user", "hello")])
    exchange = [Message("user", "hello"), Message("assistant", first)]
    assert prompts[1] == template.prompt([*exchange, Message("user", "and then?")])
    assert prompts[1].startswith(template.render(exchange))  # the first exchange, as the template renders it
    assert prompts[2] == template.prompt([Message("user", "again")])  # after /reset


def test_chat_drops_the_oldest_turns_and_keeps_the_system_text(llama, prompts):
    template, out = run_template(llama.path), io.StringIO()
    dialogue = Dialogue(llama.model, llama.tokenizer, template, system="Be terse.", seed=1, max_new_tokens=8)
    first, second, third = "a" * 60, "b" * 60, "c" * 60  # with the headers, two turns fill the 248 tokens allowed
    talk(dialogue, lines(first, second, third, "d" * 300), out, out)  # notes (stderr) shown in line
    shown = out.getvalue()
    system = template.render([Message("system", "Be terse.")])
    assert len(prompts) == 3 and all(p.startswith(system) for p in prompts)
    assert first in prompts[0] and first not in prompts[1] and second in prompts[1] and third in prompts[2]
    assert all(len(llama.tokenizer.encode(p)) <= 256 - 8 for p in prompts)
    assert shown.count("outgrew the model's context") == 1  # said once
    assert "this message and the system text take" in shown and "say it shorter" in shown  # refused, and on it goes
    assert dialogue.history[-2] == Message("user", third)


def test_chat_leaves_cleanly_on_quit_ctrl_c_and_end_of_input(llama, runs, capsys, monkeypatch):
    out = io.StringIO()
    talk(Dialogue(llama.model, llama.tokenizer, run_template(llama.path), max_new_tokens=2), lines("/quit", "x"), out)
    assert out.getvalue() == ""

    def interrupted(prompt: str) -> str:
        raise KeyboardInterrupt

    talk(Dialogue(llama.model, llama.tokenizer, run_template(llama.path)), interrupted, out)
    assert out.getvalue() == "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))  # input() reads it, then meets the end of input
    code, stdout, err = run_cli(
        ["chat", runs[0] / "llama", "--seed", "1", "--max-new-tokens", "4", "--device", "cpu"], capsys
    )
    assert code == 0 and "Traceback" not in err and stdout.startswith(PROMPT) and stdout.count(PROMPT) == 2
    monkeypatch.setattr("builtins.input", interrupted)
    code, stdout, err = run_cli(["chat", runs[0] / "llama", "--device", "cpu"], capsys)
    assert code == 0 and stdout == "\n" and "Traceback" not in err


def test_chat_compiles_by_default_and_not_with_no_compile(runs, capsys, monkeypatch, compiled_steps):
    """chat reaches the engine's compiled step by default (conftest's compiled_steps: no compilation),
    --no-compile and ATTNLAB_COMPILE=0 keep the eager step, and the greedy answers are the same."""
    fed = compiled_steps
    args = ["chat", runs[0] / "llama", "--temperature", "0", "--max-new-tokens", "6", "--device", "cpu"]
    answers = []
    for extra_args, env in (([], "1"), (["--no-compile"], "1"), ([], "0")):
        monkeypatch.setenv("ATTNLAB_COMPILE", env)
        monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
        fed.clear()
        code, stdout, err = run_cli(args + extra_args, capsys)
        assert code == 0 and "Traceback" not in err, err
        answers.append(stdout)
        # compiled: each of the answer's 5 tokens after the first (and the engine's calibration steps)
        # went through the compiled step; otherwise none did
        assert (len(fed) >= 5) if (not extra_args and env == "1") else not fed
    assert answers[0] == answers[1] == answers[2]


def test_sample_compiles_by_default(runs, capsys, compiled_steps):
    args = ["sample", runs[0] / "llama", "--prompt", "hi", "--temperature", "0", "--max-new-tokens", "6"]
    code, compiled, err = run_cli([*args, "--device", "cpu"], capsys)
    assert code == 0 and len(compiled_steps) >= 5, err
    compiled_steps.clear()
    code, eager, err = run_cli([*args, "--device", "cpu", "--no-compile"], capsys)
    assert code == 0 and not compiled_steps and eager == compiled


def test_chat_and_sample_chat_refuse_a_run_that_does_not_generate(tmp_path, capsys):
    bow = tmp_path / "bow"
    train = ["train", "classify", "--model", "bow", "--out", bow, *flags(max_steps=3, warmup_steps=1, device="cpu")]
    assert run_cli(train, capsys)[0] == 0
    for args in (["chat", bow], ["sample", bow, "--chat", "hi"]):
        code, _, err = run_cli(args, capsys)
        assert code == 2 and "not a language model run (it is classify)" in err and len(err.strip().splitlines()) == 1


def test_chat_options_are_checked_in_one_line(runs, capsys):
    code, _, err = run_cli(["chat", runs[0] / "llama", "--top-p", "2"], capsys)
    assert code == 2 and "top_p" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("pieces", [["  ", "\n a", "b ", " ", "c", "  \n"], ["x"], [" ", " "], ["a b", " ", ""]])
def test_trimmed_pieces_join_to_the_stripped_text(pieces):
    assert "".join(trimmed(pieces)) == "".join(pieces).strip()
