"""The generated tasks: sentiment reviews that need word order, and part-of-speech tags that need context."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from attnlab.data import sentiment, tagging


@pytest.fixture(scope="module")
def reviews():
    return sentiment.splits(seed=0)


@pytest.fixture(scope="module")
def tagged():
    return tagging.splits(seed=0)


def _disjoint(split: dict[str, list], key) -> bool:
    sets = {name: {key(x) for x in data} for name, data in split.items()}
    return not (sets["train"] & sets["val"] or sets["train"] & sets["test"] or sets["val"] & sets["test"])


# ---- sentiment ---------------------------------------------------------------------------------


def test_sentiment_is_deterministic_by_seed():
    assert sentiment.generate(500, seed=0) == sentiment.generate(500, seed=0)
    assert sentiment.generate(500, seed=0) != sentiment.generate(500, seed=1)
    assert len(sentiment.generate(500, seed=3)) == 500


def test_sentiment_is_drawn_once_a_process_and_a_caller_cannot_change_it():
    sentiment._generated.cache_clear()
    first = sentiment.generate(400, seed=2)
    kept = list(first)
    first.clear()  # a caller's list is its own
    sentiment.splits(seed=2, sizes=(300, 50, 50))["train"].append(("the plot was good", "pos"))
    assert sentiment.generate(400, seed=2) == kept
    assert sentiment._generated.cache_info().misses == 1  # drawn once: the rest came from the cache


def test_sentiment_splits_have_their_sizes_and_share_no_text(reviews):
    assert {k: len(v) for k, v in reviews.items()} == {"train": 20000, "val": 2000, "test": 2000}
    assert _disjoint(reviews, key=lambda ex: ex[0])
    assert len({text for text, _ in reviews["train"]}) == 20000  # no duplicates inside a split either
    small = sentiment.splits(seed=5, sizes=(300, 50, 50))
    assert small == sentiment.splits(seed=5, sizes=(300, 50, 50))


def test_generated_labels_agree_with_the_rule(reviews):
    for data in reviews.values():
        for text, label in data:
            assert label in sentiment.LABELS
            assert sentiment.label_of(text) == label, text
            assert text == " ".join(text.split()) and text.replace(" ", "").isalpha() and text.islower()


@pytest.mark.parametrize(
    "text, label",
    [
        ("the restaurant is not too terrible", "positive"),
        ("the food was good but the service was not", "negative"),
        ("the food was not good but the service was", "positive"),
        ("the food was good but not great", "negative"),
        ("the food was not good but great", "positive"),
        ("the food was good but the service was terrible", "negative"),
        ("the food was terrible but the service was good", "positive"),
        ("the staff is hardly friendly", "negative"),
        ("the price was never high", "positive"),
        ("the wine was not very good", "negative"),
        ("the music is lovely and the view is stunning", "positive"),
        ("the food was tasty but cold", "negative"),
    ],
)
def test_label_of_known_sentences(text, label):
    assert sentiment.label_of(text) == label


@pytest.mark.parametrize(
    "text",
    [
        "the food was good but the service was great",  # "but" must contrast
        "the food was good and the service was bad",  # "and" must agree
        "the view was rude",  # adjective does not suit the aspect
        "the food was good but the food was bad",  # two clauses on one aspect
        "the food was",
        "The food was good",
        "the food was good.",
        "the food was  good",
        "",
    ],
)
def test_label_of_rejects_text_outside_the_grammar(text):
    with pytest.raises(ValueError, match="not in the sentiment grammar"):
        sentiment.label_of(text)


def test_every_adjective_has_one_polarity():
    polarity: dict[str, set[int]] = defaultdict(set)
    for aspect in sentiment.ASPECTS:
        for adj, p in sentiment.adjectives(aspect).items():
            polarity[adj].add(p)
    assert all(len(p) == 1 for p in polarity.values()), {a: p for a, p in polarity.items() if len(p) > 1}


def test_a_bag_of_words_cannot_decide_many_reviews(reviews):
    train = reviews["train"]
    labels_of_bag: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for text, label in train:
        labels_of_bag[tuple(sorted(text.split()))].add(label)
    # Share of training reviews whose exact word multiset also occurs with the other label.
    ambiguous = sum(len(labels_of_bag[tuple(sorted(text.split()))]) == 2 for text, _ in train) / len(train)
    assert ambiguous >= 0.2, ambiguous
    a, b = "the food was good but the service was terrible", "the food was terrible but the service was good"
    assert sorted(a.split()) == sorted(b.split()) and sentiment.label_of(a) != sentiment.label_of(b)
    # Test reviews are also confusable with training reviews of the other label.
    test_hits = sum(
        bool(labels_of_bag.get(tuple(sorted(text.split())), set()) - {label}) for text, label in reviews["test"]
    )
    assert test_hits / len(reviews["test"]) > 0.1


def test_sentiment_classes_are_balanced(reviews):
    for data in reviews.values():
        share = Counter(label for _, label in data)["positive"] / len(data)
        assert 0.35 <= share <= 0.65, share


def test_sentiment_uses_every_pattern(reviews):
    texts = [text for text, _ in reviews["train"]]
    assert any(" and " in t for t in texts)
    assert any(t.endswith(" not") for t in texts)  # elided, negated
    assert any(" but not " in t for t in texts)  # one aspect: "good but not great"
    assert any(" not too " in t for t in texts)
    assert any(" but " not in t and " and " not in t for t in texts)  # a single clause


# ---- tagging -----------------------------------------------------------------------------------


def test_tagging_is_deterministic_by_seed():
    assert tagging.generate(300, seed=0) == tagging.generate(300, seed=0)
    assert tagging.generate(300, seed=0) != tagging.generate(300, seed=1)


def test_tagging_splits_are_disjoint_and_well_formed(tagged):
    assert {k: len(v) for k, v in tagged.items()} == {"train": 8000, "val": 1000, "test": 1000}
    assert _disjoint(tagged, key=lambda ex: tuple(ex[0]))
    for data in tagged.values():
        for words, tags in data:
            assert len(words) == len(tags) > 0
            assert set(tags) <= set(tagging.TAGS)
            assert all(w.isalpha() and w.islower() for w in words)


def test_ambiguous_words_take_several_tags_and_others_one(tagged):
    tags_of: dict[str, Counter] = defaultdict(Counter)
    for words, tags in tagged["train"]:
        for w, t in zip(words, tags):
            tags_of[w][t] += 1
    assert {w for w, c in tags_of.items() if len(c) > 1} == set(tagging.AMBIGUOUS)
    with_ambiguous = sum(any(w in tagging.AMBIGUOUS for w in words) for words, _ in tagged["train"])
    assert with_ambiguous / len(tagged["train"]) > 0.6


def test_most_frequent_tag_fails_on_ambiguous_words(tagged):
    counts: dict[str, Counter] = defaultdict(Counter)
    for words, tags in tagged["train"]:
        for w, t in zip(words, tags):
            counts[w][t] += 1
    majority = {w: c.most_common(1)[0][0] for w, c in counts.items()}
    hits = [
        majority.get(w) == t for words, tags in tagged["test"] for w, t in zip(words, tags) if w in tagging.AMBIGUOUS
    ]
    assert len(hits) > 500 and sum(hits) / len(hits) < 0.9, sum(hits) / len(hits)


def test_neighbours_always_decide_the_tag(tagged):
    # Two words to the left and one to the right map to a single tag everywhere in the data.
    seen: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for data in tagged.values():
        for words, tags in data:
            padded = ["<s>", "<s>"] + words + ["</s>"]
            for i, tag in enumerate(tags):
                seen[tuple(padded[i : i + 4])].add(tag)
    conflicts = [w for w, t in seen.items() if len(t) > 1]
    assert not conflicts, conflicts[:5]
