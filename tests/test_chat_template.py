"""Chat templates: rendered as HuggingFace's apply_chat_template renders them, in a sandbox, and the
assistant's spans of a multi-turn conversation found exactly."""

from __future__ import annotations

import json

import pytest

from attnlab.data.chat import BUILTIN, ChatTemplate, hf_template
from attnlab.data.conversations import Message
from attnlab.errors import AttnlabError
from tests.conftest import extra

transformers = extra("transformers", "the reference renderer (apply_chat_template) is a dev extra")

# Three layouts written for these tests in the styles checkpoints use (ChatML; Llama 3's headers; a
# system prompt folded into the first user turn, with a role check that raises).
CHATML = BUILTIN
HEADERS = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SYSTEM_IN_FIRST = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set turns = messages[1:] %}{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}{% endif %}"
    "{% if m['role'] == 'user' %}{{ bos_token }}[INST] {% if loop.first and system %}<<SYS>>\n{{ system }}\n<</SYS>>"
    "\n\n{% endif %}{{ m['content'] }} [/INST]{% else %} {{ m['content'] }} {{ eos_token }}{% endif %}"
    "{% endfor %}"
)
TEMPLATES = {"chatml": CHATML, "headers": HEADERS, "system_in_first": SYSTEM_IN_FIRST}

THREE_TURNS = [
    Message("system", "You are terse."),
    Message("user", "What is 2 + 2?"),
    Message("assistant", "4"),
    Message("user", "And times 3?"),
    Message("assistant", "12"),
    Message("user", "Thanks!"),
    Message("assistant", "You're welcome."),
]


def reference(template: str, messages, add_generation_prompt: bool) -> str:
    """transformers' apply_chat_template on a tokenizer made here (nothing downloaded)."""
    from tokenizers import Tokenizer, models

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")), bos_token="<s>", eos_token="</s>"
    )
    tok.chat_template = template
    rows = [{"role": m.role, "content": m.content} for m in messages]
    return tok.apply_chat_template(rows, tokenize=False, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("generation", [False, True])
def test_rendering_equals_transformers(name, generation):
    ours = ChatTemplate(TEMPLATES[name], "<s>", "</s>").render(THREE_TURNS, add_generation_prompt=generation)
    assert ours == reference(TEMPLATES[name], THREE_TURNS, generation)


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_assistant_spans_are_exactly_the_assistant_turns(name):
    text, spans = ChatTemplate(TEMPLATES[name], "<s>", "</s>").assistant_spans(THREE_TURNS)
    assert len(spans) == 3
    answers = [m.content for m in THREE_TURNS if m.role == "assistant"]
    for (start, end), answer in zip(spans, answers):
        assert answer in text[start:end]  # the answer and its end-of-turn marker, nothing of the user's
        assert "What is" not in text[start:end] and "Thanks" not in text[start:end]
    outside = "".join(text[a:b] for a, b in zip([0] + [e for _, e in spans], [s for s, _ in spans] + [len(text)]))
    assert all(answer not in outside for answer in answers[1:])  # "4" is also in "2 + 2": checked by position


def test_the_builtin_template_marks_each_turn():
    text, spans = ChatTemplate().assistant_spans(THREE_TURNS[1:3])
    assert text == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    assert [text[a:b] for a, b in spans] == ["4<|im_end|>\n"]


@pytest.mark.parametrize(
    "source, says",
    [
        ("{{ messages.__class__.__mro__ }}", "failed on this conversation"),  # the sandbox refuses Python's internals
        ("{% set x = messages.append(1) %}", "failed on this conversation"),  # and changing what it was given
        ("{{ raise_exception('no system role') }}", "no system role"),
        ("{% for %}", "does not compile"),
    ],
)
def test_an_untrusted_template_is_contained_and_one_line(source, says):
    with pytest.raises(AttnlabError, match=says):
        ChatTemplate(source).render(THREE_TURNS)


def test_a_huggingface_folders_template_is_read(tmp_path):
    config = {"chat_template": HEADERS, "bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|eot_id|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = hf_template(tmp_path)
    assert template.render(THREE_TURNS[1:2]).startswith("<|begin_of_text|><|start_header_id|>user")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": [{"name": "default", "template": CHATML}]})
    )
    assert hf_template(tmp_path).source == CHATML
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert hf_template(tmp_path) is None


def test_only_the_assistant_turns_are_trained_by_default():
    from attnlab.data.conversations import Conversation
    from attnlab.data.supervised import encode, show
    from attnlab.data.tokenizers import CharTokenizer

    template = ChatTemplate()
    conv = Conversation(tuple(THREE_TURNS))
    text, spans = template.assistant_spans(conv.messages)
    tok = CharTokenizer(sorted(set(text)))
    ex = encode(conv, template, tok)
    assert tok.decode(ex.ids.tolist()) == text and len(ex.ids) == len(ex.trained) == len(text)
    trained_chars = {i for a, b in spans for i in range(a, b)}
    assert {i for i, t in enumerate(ex.trained) if t} == trained_chars  # exactly the three assistant turns
    assert encode(conv, template, tok, train_on="all").trained.all()
    assert show(ex, tok, ("[", "]")).count("[") == 3 and "[You're welcome.<|im_end|>\n]" in show(ex, tok, ("[", "]"))
    plain = Conversation((Message("assistant", "def f(): pass"),), plain=True)
    assert encode(plain, template, CharTokenizer("def(): pas")).trained.all()  # a {"text"} row: every token


def test_a_bpe_token_never_straddles_what_is_trained_and_what_is_not():
    from attnlab.data.conversations import Conversation
    from attnlab.data.supervised import encode
    from attnlab.data.tokenizers import BPETokenizer

    template = ChatTemplate()
    conv = Conversation(tuple(THREE_TURNS))
    text, spans = template.assistant_spans(conv.messages)
    tok = BPETokenizer.train([text * 20], 300)
    ex = encode(conv, template, tok)
    assert tok.decode(ex.ids.tolist()) == text
    trained = tok.decode(ex.ids[ex.trained].tolist())
    assert trained == "".join(text[a:b] for a, b in spans)  # the trained tokens decode to the spans exactly
