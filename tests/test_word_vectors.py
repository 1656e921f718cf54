"""Word vectors: Word2Vec (skip-gram, CBOW), FastText and GloVe trained, queried, evaluated, exported."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.wordvec import evaluate, load_vectors, train_vectors
from attnlab.wordvec.config import VectorsConfig
from attnlab.wordvec.corpus import Corpus, Vocab, keep_probability, noise_table, sentences
from attnlab.wordvec.keyed import WordVectors
from attnlab.wordvec.subwords import fnv1a, ngrams
from tests.conftest import flags, run_cli

TOPICS = {
    "animals": "cat dog horse cow sheep goat pig duck".split(),
    "tools": "hammer saw drill wrench chisel pliers file level".split(),
    "food": "bread cheese apple soup rice pasta salad cake".split(),
}


def topic_text(sentences_per_topic: int = 300, seed: int = 0) -> str:
    """Sentences each drawn from one topic's words: words of a topic share their contexts."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(sentences_per_topic):
        for words in TOPICS.values():
            lines.append(" ".join(rng.choice(words, size=12)))
    rng.shuffle(lines)
    return "\n".join(lines)


def topic_accuracy(wv: WordVectors) -> float:
    """Share of words whose 3 nearest neighbours are all from their own topic."""
    right = total = 0
    for words in TOPICS.values():
        for w in words:
            right += all(n in words for n, _ in wv.neighbors(w, 3))
            total += 1
    return right / total


SMALL = dict(dim=16, window=3, min_count=1, epochs=3, tokens="split", threads=1)


@pytest.fixture(scope="module")
def text():
    return topic_text()


@pytest.mark.parametrize("method", ["skipgram", "cbow", "fasttext", "glove"])
def test_each_method_groups_words_that_share_contexts(tmp_path, text, method):
    extra = {"epochs": 15, "x_max": 10.0} if method == "glove" else {}  # GloVe needs more passes on little text
    cfg = VectorsConfig(method=method, **{**SMALL, **extra})
    summary = train_vectors(tmp_path / method, cfg, text=text, progress=False)
    wv = load_vectors(tmp_path / method)
    assert summary["vocabulary"] == len(wv) == 24 and wv.vectors.shape == (24, 16)
    assert topic_accuracy(wv) >= 0.9, [wv.neighbors(w, 3) for w in TOPICS["animals"]]
    rows = [json.loads(line) for line in (tmp_path / method / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == cfg.epochs and losses[-1] < losses[0]


def test_one_thread_repeats_exactly_and_the_seed_matters(tmp_path, text):
    cfg = VectorsConfig(method="skipgram", **SMALL)
    for name in ("a", "b"):
        train_vectors(tmp_path / name, cfg, text=text, progress=False)
    train_vectors(tmp_path / "c", VectorsConfig(method="skipgram", seed=1, **SMALL), text=text, progress=False)
    a, b, c = (load_vectors(tmp_path / n).vectors for n in "abc")
    assert np.array_equal(a, b) and not np.allclose(a, c)


def test_fasttext_gives_vectors_to_unseen_words_from_their_ngrams(tmp_path):
    rng = np.random.default_rng(0)
    stems = {"walk": "run jump climb swim".split(), "house": "home tower castle hut".split()}
    lines = [
        " ".join(rng.choice([w + s for w in words for s in ("", "ing", "ed")], size=10))
        for words in stems.values()
        for _ in range(200)
    ]
    train_vectors(tmp_path / "ft", VectorsConfig(method="fasttext", **SMALL), text="\n".join(lines), progress=False)
    wv = load_vectors(tmp_path / "ft")
    assert "climbs" not in wv.index and "climbs" in wv  # never seen, but its n-grams were
    assert wv.similarity("climbs", "climbing") > wv.similarity("climbs", "castle")
    with pytest.raises(Exception, match="not in the vocabulary"):
        wv["qqqq"]  # no trained n-gram at all


def test_subsampling_and_noise_follow_the_formulas():
    counts = np.array([5000, 1000, 100, 10, 1])
    share = counts / counts.sum()
    keep = keep_probability(counts, 1e-2)
    assert np.allclose(keep, np.minimum(1, (np.sqrt(share / 1e-2) + 1) * 1e-2 / share), rtol=1e-6)
    assert np.all(keep_probability(counts, 0) == 1)
    k, alias = noise_table(counts)  # each column i: i with probability k[i], else alias[i]
    drawn = np.zeros(len(counts))
    for i in range(len(counts)):
        drawn[i] += k[i] / len(counts)
        drawn[alias[i]] += (1 - k[i]) / len(counts)
    assert np.allclose(drawn, counts**0.75 / (counts**0.75).sum(), atol=1e-7)


def test_corpus_drops_rare_words_and_keeps_sentences_apart():
    sents = sentences("a b c a\n\nb a rare\n", "split")
    vocab = Vocab.build(sents, min_count=2)
    corpus = Corpus.of(sents, vocab)
    assert vocab.words == ["a", "b"] and vocab.counts.tolist() == [3, 2]
    assert corpus.ids.tolist() == [0, 1, 0, 1, 0] and corpus.starts.tolist() == [0, 3, 5]
    assert corpus.raw_words == 7
    assert sentences("Don't STOP, now!", "words") == [["don't", "stop", "now"]]


def test_fnv1a_and_ngrams_match_the_definitions():
    assert fnv1a("") == 2166136261 and fnv1a("a") == 0xE40C292C and fnv1a("foobar") == 0xBF9CF968
    assert ngrams("cat", 3, 4) == ["<ca", "cat", "at>", "<cat", "cat>"]


def _vectors_with_known_analogies() -> WordVectors:
    """Countries and capitals as vectors, capital = country + one shared offset (plus noise)."""
    rng = np.random.default_rng(0)
    names = ["france", "germany", "italy", "spain", "japan"]
    capitals = ["paris", "berlin", "rome", "madrid", "tokyo"]
    base = rng.normal(size=(5, 20))
    offset = rng.normal(size=20) * 2
    words = names + capitals + [f"w{i}" for i in range(30)]
    vectors = np.concatenate([base, base + offset, rng.normal(size=(30, 20))]).astype(np.float32)
    return WordVectors(words, vectors)


def test_analogies_and_similarity_agree_with_gensim(tmp_path):
    gensim = pytest.importorskip("gensim")
    from gensim.models import KeyedVectors

    wv = _vectors_with_known_analogies()
    questions = tmp_path / "q.txt"
    lines = [": capital-common-countries"]
    lines += [
        f"{a} {ca} {b} {cb}"
        for a, ca, b, cb in [
            ("France", "Paris", "Germany", "Berlin"),
            ("italy", "rome", "spain", "madrid"),
            ("japan", "tokyo", "france", "paris"),
            ("italy", "rome", "atlantis", "x"),
        ]
    ]
    lines += [": gram1-adjective-to-adverb", "w1 w2 w3 w4", "w5 w6 w7 w8"]
    questions.write_text("\n".join(lines) + "\n")
    result = evaluate.analogies(wv, questions)
    assert result["questions"] == 6 and result["answerable"] == 5 and result["correct"] >= 3
    assert result["sections"][0]["correct"] == 3 and result["semantic"] == 1.0
    kv = KeyedVectors(20)
    kv.add_vectors(wv.words, wv.vectors)
    theirs, _ = kv.evaluate_word_analogies(str(questions))
    assert result["accuracy"] == pytest.approx(theirs)
    pairs = tmp_path / "ws.tsv"
    rated = [
        ("france", "germany", 7),
        ("paris", "berlin", 8.5),
        ("rome", "w1", 1),
        ("japan", "tokyo", 6),
        ("w2", "w3", 2),
        ("spain", "nowhere", 5),
    ]
    pairs.write_text("# Word 1\tWord 2\tHuman (mean)\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rated))
    sim = evaluate.similarity(wv, pairs)
    (_, spearman_theirs, oov) = kv.evaluate_word_pairs(str(pairs))
    assert sim["known"] == 5 and sim["pairs"] == 6
    assert sim["spearman"] == pytest.approx(spearman_theirs.statistic, abs=1e-9)
    assert sim["oov"] * 100 == pytest.approx(oov)
    assert gensim is not None


def test_spearman_handles_ties_like_scipy():
    stats = pytest.importorskip("scipy.stats")
    x, y = np.array([1, 2, 2, 3, 5, 5, 5, 0.5]), np.array([3, 1, 4, 1, 5, 9, 2, 6])
    assert evaluate.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


def test_word2vec_text_export_reads_back_in_gensim_and_in_attnlab(tmp_path):
    pytest.importorskip("gensim")
    from gensim.models import KeyedVectors

    wv = _vectors_with_known_analogies()
    wv.save_word2vec(tmp_path / "v.txt")
    kv = KeyedVectors.load_word2vec_format(str(tmp_path / "v.txt"))
    assert list(kv.index_to_key) == wv.words
    assert np.allclose(kv.vectors, wv.vectors, atol=1e-5)
    again = WordVectors.load(tmp_path / "v.txt")
    assert again.words == wv.words and np.allclose(again.vectors, wv.vectors, atol=1e-5)
    wv.save(tmp_path / "v.safetensors")
    assert np.array_equal(WordVectors.load(tmp_path / "v.safetensors").vectors, wv.vectors)


def test_cli_trains_queries_evaluates_draws_and_exports(tmp_path, capsys, text):
    corpus = tmp_path / "topics.txt"
    corpus.write_text(text)
    run = tmp_path / "run"
    code, out, err = run_cli(
        ["train", "vectors", "--data", str(corpus), "--out", str(run), *flags(dim=16, epochs=3, min_count=1, window=3)],
        capsys,
    )
    assert code == 0, err
    assert "vectors for 24 words" in out and "words/s" in out
    picture, export = str(tmp_path / "map.png"), str(tmp_path / "v.txt")
    code, out, err = run_cli(
        [
            "vectors",
            str(run),
            "--neighbors",
            "cat",
            "--similarity",
            "cat",
            "dog",
            "--analogy",
            "cat",
            "dog",
            "hammer",
            "--plot",
            picture,
            "--arrows",
            "cat:dog",
            "--export",
            export,
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    report = json.loads(out)
    assert {w for w, _ in report["neighbors"]["cat"][:3]} <= set(TOPICS["animals"])
    assert report["similarity"] > 0.5 and len(report["analogy"]["answers"]) == 10
    assert (tmp_path / "map.png").stat().st_size > 10_000
    assert (tmp_path / "v.txt").read_text().splitlines()[0] == "24 16"
    code, out, err = run_cli(["vectors", str(tmp_path / "v.txt"), "--neighbors", "soup"], capsys)
    assert code == 0 and "nearest to soup:" in out


def test_bad_requests_are_one_line_errors(tmp_path, capsys, corpus):
    code, _, err = run_cli(
        ["train", "vectors", "--data", str(corpus), "--out", str(tmp_path / "r"), "--method", "lsa"], capsys
    )
    assert code == 2 and "lsa" in err and "Traceback" not in err
    code, _, err = run_cli(
        ["train", "vectors", "--data", str(corpus), "--out", str(tmp_path / "r"), "--min-count", "100000"], capsys
    )
    assert code == 2 and "--min-count" in err and not (tmp_path / "r").exists()
    code, _, err = run_cli(["vectors", str(tmp_path), "--neighbors", "x"], capsys)
    assert code == 2 and "not a word-vectors run" in err
    train_vectors(tmp_path / "v", VectorsConfig(**SMALL), text="a b c a b c", progress=False)
    code, _, err = run_cli(["sample", str(tmp_path / "v")], capsys)
    assert code == 2 and "attnlab vectors RUN" in err


def test_word_vectors_load_into_a_classifier(tmp_path, text):
    from torch import nn

    from attnlab.wordvec.embedding import load_word_vectors

    train_vectors(tmp_path / "run", VectorsConfig(method="skipgram", **SMALL), text=text, progress=False)
    wv = load_vectors(tmp_path / "run")
    emb = nn.Embedding(4, 16)
    found, missing = load_word_vectors(emb, tmp_path / "run", ["[PAD]", "cat", "Dog", "unicorn"], freeze=True)
    assert found == 2 and missing == ["unicorn"] and not emb.weight.requires_grad
    rows = emb.weight.detach().numpy()
    assert np.allclose(rows[1], wv["cat"]) and np.allclose(rows[2], wv["dog"])
