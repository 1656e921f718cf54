"""The baselines: shapes, padding invariance, learning a toy task; loading word vectors."""

from __future__ import annotations

import gzip

import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.models.baselines import BASELINES, PAD_ID, BagOfWordsConfig, Pooled, PooledConfig, RNNConfig
from attnlab.wordvec.embedding import load_word_vectors

V, CLS, TARGET = 32, 2, 7  # vocabulary, the [CLS] id, the token whose presence is the label
SMALL = {"vocab_size": V, "context": 32}
SIZES = {
    "bow": {"n_words": 20},
    "pooled": {"d_embed": 16},
    "conv1d": {"d_embed": 16, "channels": 16},
    "rnn": {"d_embed": 16, "hidden": 16},
}
RNN_VARIANTS = [
    {"cell": cell, "bidirectional": bi, "pool": pool}
    for cell in ("rnn", "gru", "lstm")
    for bi in (False, True)
    for pool in ("last", "mean")
]
# (name, extra options) for every model worth checking; bow only classifies.
CASES = [(name, {}) for name in ("bow", "pooled", "conv1d")] + [("rnn", v) for v in RNN_VARIANTS]
TASK_CASES = [(n, kw, task) for n, kw in CASES for task in ("classify", "tag") if (n, task) != ("bow", "tag")]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def case_id(case) -> str:
    return "-".join(str(v) for part in case for v in (part.values() if isinstance(part, dict) else [part]))


def build(name: str, task: str = "classify", n_labels: int = 3, **kw):
    cfg_cls, model_cls = BASELINES[name]
    return model_cls(cfg_cls(**{**SMALL, **SIZES[name], "task": task, "n_labels": n_labels, **kw}))


def batch(lengths: list[int], T: int, gen: torch.Generator) -> torch.Tensor:
    """Right-padded ids (B, T): [CLS] then random tokens in [3, V), lengths including [CLS]."""
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, 0] = CLS
        ids[b, 1:n] = torch.randint(3, V, (n - 1,), generator=gen)
    return ids


@pytest.mark.parametrize("name,kw,task", TASK_CASES, ids=[case_id(c) for c in TASK_CASES])
def test_shapes_and_loss(name, kw, task):
    model = build(name, task, **kw).eval()  # eval: the bag of words' dropout would change the logits
    ids = batch([9, 5, 1], 9, torch.Generator().manual_seed(1))
    logits = model(ids)
    assert logits.shape == ((3, 3) if task == "classify" else (3, 9, 3))
    labels = torch.tensor([0, 2, 1]) if task == "classify" else torch.where(ids != PAD_ID, 1, -100)
    out, loss = model(ids, labels)
    assert torch.equal(out, logits)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert model.word_embedding is None if name == "bow" else model.word_embedding.weight.grad is not None


@pytest.mark.parametrize("name,kw,task", TASK_CASES, ids=[case_id(c) for c in TASK_CASES])
def test_padding_changes_nothing(name, kw, task):
    """Each sequence alone (no padding) and in a padded batch gives the same logits."""
    model = build(name, task, **kw).eval()
    lengths = [12, 7, 5, 2, 1]  # odd and even, so max-pooling meets half-padded windows
    ids = batch(lengths, 20, torch.Generator().manual_seed(2))  # 8 or more padding columns everywhere
    with torch.no_grad():
        if model.word_embedding is not None:  # masking, not a zero [PAD] vector, must hide the padding
            model.word_embedding.weight[PAD_ID] = torch.randn(model.word_embedding.embedding_dim)
        padded = model(ids)
        for b, n in enumerate(lengths):
            alone = model(ids[b : b + 1, :n])[0]
            got = padded[b] if task == "classify" else padded[b, :n]
            torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)
    if task == "tag":  # labels of -100 at padding: the loss is the unpadded loss
        labels = torch.where(ids != PAD_ID, ids % 3, -100)
        full, short = model(ids, labels)[1], model(ids[:, :12], labels[:, :12])[1]
        torch.testing.assert_close(full, short, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("pool", ["last", "mean"])
def test_rnn_summary_is_the_documented_state(cell, bidirectional, pool):
    """Against a plain reading of each unpadded sequence: "last" is the forward state at the last
    token (and the backward state at the first), "mean" the average of all outputs."""
    model = build("rnn", cell=cell, bidirectional=bidirectional, pool=pool).eval()
    lengths = [9, 4, 1]
    ids = batch(lengths, 12, torch.Generator().manual_seed(5))
    H = model.cfg.hidden
    with torch.no_grad():
        got = model(ids)
        for b, n in enumerate(lengths):
            out, _ = model.rnn(model.embed(ids[b : b + 1, :n]))  # (1, n, D * H)
            if pool == "mean":
                summary = out[0].mean(0)
            else:
                summary = torch.cat([out[0, -1, :H], out[0, 0, H:]])  # the backward half is empty one way
            torch.testing.assert_close(got[b], model.head(summary), atol=1e-5, rtol=1e-5)


def presence_data(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of 4-16 tokens; the label says whether token 7 occurs (half of them)."""
    lengths = torch.randint(4, 17, (n,), generator=gen).tolist()
    ids = batch(lengths, 16, gen)
    ids[ids == TARGET] = TARGET + 1
    labels = torch.arange(n) % 2
    for b in labels.nonzero().flatten().tolist():
        ids[b, torch.randint(1, lengths[b], (1,), generator=gen)] = TARGET
    return ids, labels


def fit(model, ids, labels, steps: int, lr: float) -> None:
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(ids, labels)[1].backward()
        opt.step()
    model.eval()


def accuracy(model, ids, labels) -> float:
    with torch.no_grad():
        return (model(ids).argmax(-1) == labels).float().mean().item()


# Every cell, read forward to its last state, and both ways then averaged. (A one-way mean
# generalizes poorly here, about 0.8: the states before the 7 cannot know of it.)
LEARN_CASES = [(n, {}) for n in ("bow", "pooled", "conv1d")] + [
    ("rnn", {"cell": c, **kw}) for c in ("rnn", "gru", "lstm") for kw in ({}, {"bidirectional": True, "pool": "mean"})
]


@pytest.mark.parametrize("name,kw", LEARN_CASES, ids=[case_id(c) for c in LEARN_CASES])
def test_learns_whether_a_token_occurs(name, kw):
    gen = torch.Generator().manual_seed(3)
    train, test = presence_data(200, gen), presence_data(200, gen)
    model = build(name, n_labels=2, **kw)
    before = accuracy(model, *test)
    fit(model, *train, steps=150, lr=1e-2)
    after = accuracy(model, *test)
    assert after >= 0.85, f"{name} {kw}: test accuracy {before:.2f} -> {after:.2f}"


@pytest.mark.parametrize("name", ["pooled", "conv1d", "rnn"])
def test_learns_to_tag_tokens(name):
    """Tag each token with whether it follows token 7: needs its left neighbour (pooled cannot)."""
    gen = torch.Generator().manual_seed(4)
    ids, _ = presence_data(300, gen)
    prev = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], 1)
    labels = torch.where(ids != PAD_ID, (prev == TARGET).long(), -100)
    model = build(name, "tag", n_labels=2)
    fit(model, ids[:200], labels[:200], steps=150, lr=1e-2)
    with torch.no_grad():
        pred = model(ids[200:]).argmax(-1)
    real, after_target = labels[200:] != -100, labels[200:] == 1
    # Token-level accuracy is mostly the majority class; recall of the rare positives tells.
    recall = (pred[after_target] == 1).float().mean().item()
    assert (pred[real] == labels[200:][real]).float().mean() > 0.9
    assert (recall > 0.7) if name != "pooled" else (recall < 0.3), f"{name}: recall {recall:.2f}"


@pytest.mark.parametrize("name", list(BASELINES))
def test_longer_than_context_raises(name):
    model = build(name, context=8)
    model(torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="context"):
        model(torch.ones(2, 9, dtype=torch.long))


def test_config_validation():
    with pytest.raises(ValueError, match="classify"):
        BagOfWordsConfig(task="tag")
    with pytest.raises(ValueError, match="cell"):
        RNNConfig(cell="transformer")
    with pytest.raises(ValueError, match="task"):
        PooledConfig(task="generate")
    with pytest.raises(ValueError, match="n_labels"):
        PooledConfig(n_labels=1)


def test_bag_of_words_keeps_only_frequent_words():
    model = build("bow", n_words=10, counts=True)
    ids = torch.tensor([[CLS, 5, 5, 9, 10, 31, 0, 0]])
    x = model.features(ids)
    assert x.shape == (1, 10)
    expected = torch.zeros(1, 10)
    expected[0, [CLS, 5, 9]] = torch.tensor([1.0, 2.0, 1.0])  # 10 and 31 are past n_words; 0 is padding
    assert torch.equal(x, expected)
    multi_hot = build("bow", n_words=10).features(ids)
    assert torch.equal(multi_hot, expected.clamp(max=1))


def test_registry_names_every_family():
    assert set(BASELINES) == {"bow", "pooled", "conv1d", "rnn"}
    for cfg_cls, model_cls in BASELINES.values():
        assert model_cls(cfg_cls(vocab_size=V)).cfg.vocab_size == V


# ---- word vectors -------------------------------------------------------------------------

ITOS = ["[PAD]", "[UNK]", "[CLS]", "the", "Dog", "cat", "APPLE", "Apple", "unseen", "The"]
GLOVE = {  # the file's words and vectors (E = 4)
    "the": [1.0, 2.0, 3.0, 4.0],
    "dog": [0.5, -0.5, 0.25, 1e-3],
    "Cat": [9.0, 8.0, 7.0, 6.0],
    "Apple": [1.0, 1.0, 1.0, 1.0],
    "apple": [2.0, 2.0, 2.0, 2.0],
    "zebra": [3.0, 3.0, 3.0, 3.0],
}


def write_vectors(path, vectors: dict[str, list[float]], header: str | None = None):
    lines = ([header] if header else []) + [f"{w} {' '.join(map(str, v))}" for w, v in vectors.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def embedding(dim: int = 4) -> torch.nn.Embedding:
    return Pooled(PooledConfig(vocab_size=len(ITOS) + 2, d_embed=dim)).word_embedding


@pytest.mark.parametrize("header", [None, "6 4"], ids=["glove", "word2vec"])
def test_word_vectors_fill_the_right_rows(tmp_path, header):
    emb = embedding()
    before = emb.weight.detach().clone()
    found, missing = load_word_vectors(emb, write_vectors(tmp_path / "v.txt", GLOVE, header), ITOS)
    w = emb.weight.detach()
    expect = {  # row -> the file word it must hold: exact, else lowercase, else any casing
        3: "the",
        9: "the",
        4: "dog",
        5: "Cat",
        6: "apple",
        7: "Apple",
    }
    for row, word in expect.items():
        assert torch.equal(w[row], torch.tensor(GLOVE[word])), ITOS[row]
    assert found == len(expect)
    assert missing == ["unseen"]  # specials are never reported
    untouched = [0, 1, 2, 8, 10, 11]
    assert torch.equal(w[untouched], before[untouched])
    assert emb.weight.requires_grad


def test_word_vectors_gzip_and_spaces_in_words(tmp_path):
    path = tmp_path / "v.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("the 1 2 3 4\n. . . 5 6 7 8\ncat 0 0 0 1 \n")  # a word with spaces; a trailing space
    emb = embedding()
    found, missing = load_word_vectors(emb, path, ["[PAD]", "the", "cat", ". . ."])
    assert (found, missing) == (3, [])
    assert torch.equal(emb.weight[3].detach(), torch.tensor([5.0, 6, 7, 8]))


def test_word_vectors_errors(tmp_path):
    with pytest.raises(AttnlabError, match="dimension 4 .* width 3"):
        load_word_vectors(embedding(3), write_vectors(tmp_path / "g.txt", GLOVE), ITOS)
    with pytest.raises(AttnlabError, match="dimension 5"):
        load_word_vectors(embedding(), write_vectors(tmp_path / "w.txt", GLOVE, "6 5"), ITOS)
    with pytest.raises(AttnlabError, match="not found"):
        load_word_vectors(embedding(), tmp_path / "nowhere.txt", ITOS)
    (tmp_path / "prose.txt").write_text("this is not\na vectors file\n")
    with pytest.raises(AttnlabError, match="no word vectors"):
        load_word_vectors(embedding(), tmp_path / "prose.txt", ITOS)
    for bad in (tmp_path / "g.txt", tmp_path / "prose.txt"):  # each message is one line
        with pytest.raises(AttnlabError) as e:
            load_word_vectors(embedding(3), bad, ITOS)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("freeze", [True, False])
def test_word_vectors_freeze(tmp_path, freeze):
    model = Pooled(PooledConfig(vocab_size=len(ITOS), d_embed=4, n_labels=2))
    load_word_vectors(model.word_embedding, write_vectors(tmp_path / "v.txt", GLOVE), ITOS, freeze=freeze)
    before = model.word_embedding.weight.detach().clone()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.tensor([[CLS, 3, 4, 5]]), torch.tensor([1]))[1].backward()
    opt.step()
    assert model.word_embedding.weight.requires_grad is not freeze
    assert torch.equal(model.word_embedding.weight.detach(), before) is freeze
