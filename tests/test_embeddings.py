"""attnlab.embed: each family's pooled, unit-length text vectors equal the states its own head reads
(taken by a torch hook on a lone, unpadded text), padding changes no text's vector (alone against
batched with longer texts, within 1e-6), a run frames texts as its task does, and what has no
embedding, or asks for one the family does not offer, is refused in one line."""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from attnlab import load
from attnlab.data.tokenizers import CharTokenizer, WordTokenizer
from attnlab.errors import AttnlabError
from attnlab.models.baselines import BagOfWords, BagOfWordsConfig
from attnlab.models.encoder import Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnlab.runs.embed import TooLong, embed, embedding_families, model_ids
from attnlab.runs.quantized import quantize_for_inference
from attnlab.runs.run import Run
from tests.conftest import make_run, perturb, run_cli, tiny_captioner, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

SIZE = dict(n_layer=2, n_head=2, d_model=32, context=24)
WORDS = ["the", "cat", "sat", "on", "a", "mat", ".", "dog", "ran"]
# Texts of 1 to 20 ids, so that batching pads every one but the longest.
TEXTS = [[7], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], [9, 10, 11], [12] * 8]


def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    built = {
        "gpt": GPT(GPTConfig(**SIZE, vocab_size=30)),
        # the modern block: rotary positions, a bigram table, a mixture of experts (routing is per token)
        "gpt-modern": GPT(
            GPTConfig(
                **SIZE,
                vocab_size=30,
                positions="rope",
                bigram_vocab=64,
                feedforward="moe",
                n_experts=4,
                experts_per_token=2,
                norm_kind="rmsnorm",
            )
        ),
        "classify-cls": Encoder(EncoderConfig(**SIZE, vocab_size=30, head="classify", pooling="cls")),
        "classify-mean": Encoder(EncoderConfig(**SIZE, vocab_size=30, head="classify", pooling="mean")),
        "bert": Encoder(EncoderConfig(**SIZE, vocab_size=30, head="mlm", norm="post")),
        "seq2seq": Seq2Seq(Seq2SeqConfig(**SIZE, d_ff=64, src_vocab=30, tgt_vocab=30, dropout=0.0)),
    }
    return {name: perturb(m, 0.3).eval() for name, m in built.items()}


MODELS = models()


def reference(name: str, ids: list[int], how: str) -> torch.Tensor:
    """A lone text's vector from the final states the model's own head reads, caught by a torch hook:
    the LM head's input (GPT), the [MASK] transform's (BERT), the final norm's output that a classifier
    pools, the encoder's final norm's output that the decoder attends to (seq2seq)."""
    model, seen = MODELS[name], []
    catch_in = lambda m, args: seen.append(args[0])  # noqa: E731
    catch_out = lambda m, args, out: seen.append(out)  # noqa: E731
    if name.startswith("gpt"):
        handle = model.head.register_forward_pre_hook(catch_in)
    elif name == "bert":
        handle = model.transform.register_forward_pre_hook(catch_in)
    else:
        handle = (model.enc_norm if name == "seq2seq" else model.norm).register_forward_hook(catch_out)
    with torch.no_grad():
        model(torch.tensor([ids]), *([torch.tensor([[1]])] if name == "seq2seq" else []))
    handle.remove()
    states = seen[0][0]  # (T, C)
    return F.normalize({"last": states[-1], "cls": states[0], "mean": states.mean(0)}[how], dim=-1)


@pytest.mark.parametrize("name", list(MODELS))
def test_each_pooling_is_the_head_s_states_and_padding_changes_nothing(name):
    model = MODELS[name]
    for how in model.poolings:
        batched = embed(model, TEXTS, pooling=how, batch_size=3)  # two batches, sorted by length
        for i, ids in enumerate(TEXTS):
            alone = embed(model, ids, pooling=how)[0]
            assert (batched[i] - alone).abs().max() < 1e-6, (name, how, i)
            assert (alone - reference(name, ids, how)).abs().max() < 1e-6, (name, how, i)
        assert torch.allclose(batched.norm(dim=-1), torch.ones(len(TEXTS)))


@pytest.mark.parametrize("kind", ["int8", "int4", "bf16"])
def test_quantized_weights_give_a_text_its_vector_alone_or_batched(kind):
    """A short text alone is few rows, which quantized layers multiply by attnlab's row operators, and
    batched it is many, which take matrix kernels that round otherwise: embed pads every pass past them."""
    torch.manual_seed(0)
    model = perturb(GPT(GPTConfig(**{**SIZE, "d_model": 64}, vocab_size=30)), 0.3)
    float_vectors = embed(model, TEXTS)
    quantize_for_inference(model, kind, every_layer=True)
    batched = embed(model, TEXTS)
    for i, ids in enumerate(TEXTS):
        assert (batched[i] - embed(model, ids)[0]).abs().max() < 1e-6, i
    cosines = (batched * float_vectors).sum(-1)  # quantized, and near the float model's vectors
    assert (batched - float_vectors).abs().max() > 1e-4 and cosines.min() > 0.9


def test_each_family_says_its_default_pooling():
    defaults = {name: m.poolings[0] for name, m in MODELS.items()}
    assert defaults == {
        "gpt": "last",  # the only position that has seen the whole text
        "gpt-modern": "last",
        "classify-cls": "cls",  # the position its head was trained to read
        "classify-mean": "mean",
        "bert": "mean",
        "seq2seq": "mean",
    }
    assert torch.equal(embed(MODELS["gpt"], TEXTS), embed(MODELS["gpt"], TEXTS, pooling="last"))
    assert embedding_families() == ["gpt", "reward", "encoder", "seq2seq"]


def test_dimensions_keep_the_first_ones_normalised_again():
    model = MODELS["bert"]
    whole = embed(model, TEXTS, pooling="mean")
    raw = torch.stack([reference("bert", ids, "mean") for ids in TEXTS])  # unit vectors: the direction is kept
    short = embed(model, TEXTS, dimensions=8)
    assert short.shape == (len(TEXTS), 8)
    assert (short - F.normalize(raw[:, :8], dim=-1)).abs().max() < 1e-6
    assert (short - F.normalize(whole[:, :8], dim=-1)).abs().max() < 1e-6
    with pytest.raises(AttnlabError, match=r"dimensions must be 1\.\.32"):
        embed(model, TEXTS, dimensions=33)


def word_run(model: torch.nn.Module, tmp_path, kind: str) -> Run:
    tok = WordTokenizer(WORDS)
    return Run(tmp_path, model, tok, {"family": "encoder", "model": asdict(model.cfg), "task": {"kind": kind}}, 0)


def test_a_run_frames_texts_as_its_task_reads_them(tmp_path):
    tok = WordTokenizer(WORDS)
    cat = tok.encode("the cat sat .")
    classify = word_run(MODELS["classify-cls"], tmp_path, "classify")
    assert model_ids(classify, "the cat sat .") == [[tok.cls_id, *cat]]  # [CLS], which its head pools from
    mlm = word_run(MODELS["bert"], tmp_path, "mlm")
    assert model_ids(mlm, ["the cat sat .", cat]) == [cat, cat]  # a text or its ids: the same input
    wordpiece = SimpleNamespace(wraps=True, cls_id=2, sep_id=3)  # a converted BERT frames every input
    assert MODELS["bert"].embedding_ids([7, 8], wordpiece) == [2, 7, 8, 3]
    assert MODELS["seq2seq"].embedding_ids([7, 8], tok) == [10, 11]  # above PAD, BOS and EOS
    assert torch.equal(embed(classify, "the cat sat ."), embed(MODELS["classify-cls"], [[tok.cls_id, *cat]]))


def test_over_the_context_is_an_error_unless_truncated(tmp_path):
    run = word_run(MODELS["classify-cls"], tmp_path, "classify")
    long = " ".join(["cat"] * 30)  # 30 words + [CLS] in a context of 24
    with pytest.raises(TooLong, match=r"input 1 \(from 0\) takes 31 tokens, over this model's context of 24"):
        embed(run, ["the cat", long])
    kept = model_ids(run, long, truncate=True)[0]
    assert len(kept) == 24 and kept[0] == run.tokenizer.cls_id
    assert torch.equal(embed(run, long, truncate=True), embed(run.model, [kept]))


def test_what_has_no_embedding_is_refused_in_one_line(tmp_path):
    gpt = MODELS["gpt"]
    cases = [
        (lambda: embed(BagOfWords(BagOfWordsConfig(vocab_size=20)), [[1, 2]]), "a BagOfWords model: it has no text"),
        (lambda: embed(tiny_captioner(), [[1, 2]]), "a Captioner model: it has no text embedding"),
        (lambda: embed(gpt, [[1, 2]], pooling="cls"), "pooling 'cls' does not apply to a GPT like this one: it offers"),
        (lambda: embed(gpt, [[1, 2]], pooling="max"), "unknown pooling 'max'"),
        (lambda: embed(gpt, []), "no input to embed"),
        (lambda: embed(gpt, "a text"), "a model alone has no tokenizer"),
        (lambda: embed(word_run(MODELS["bert"], tmp_path, "mlm"), ["the", ""]), r"input 1 \(from 0\) has no tokens"),
        (lambda: embed(word_run(MODELS["bert"], tmp_path, "mlm"), [[1, 99]]), r"input 0 \(from 0\): token ids must"),
    ]
    for call, message in cases:
        with pytest.raises(AttnlabError, match=message) as e:
            call()
        assert "\n" not in str(e.value)


def test_attnlab_embed_prints_the_library_s_vectors_and_their_similarities(tmp_path, capsys):
    run = make_run(tmp_path / "lm", tiny_model(), CharTokenizer("abc "))
    texts = ["abc", "a b c", "cab"]
    expected = embed(load(run, "cpu"), texts)
    code, out, _ = run_cli(["embed", run, *texts, "--json"], capsys)
    answer = json.loads(out)
    assert code == 0 and answer["pooling"] == "last" and answer["texts"] == texts
    assert (torch.tensor(answer["embeddings"]) - expected).abs().max() < 1e-6
    code, out, _ = run_cli(["embed", run, *texts, "--pooling", "mean", "--dimensions", "4"], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "mean pooling, 4 dimensions, unit length" and lines[4] == "cosine similarity:"
    similarity = [[float(x) for x in line.split()[1:]] for line in lines[5:]]
    short = embed(load(run, "cpu"), texts, pooling="mean", dimensions=4)
    assert torch.allclose(torch.tensor(similarity), short @ short.T, atol=1e-3)
    code, _, err = run_cli(["embed", run, "abc", "--pooling", "cls"], capsys)
    assert code == 2 and "pooling 'cls' does not apply to a GPT" in err and len(err.strip().splitlines()) == 1
