"""Parallel data for translation: number words, dates, copy/reverse, and TSV or aligned files."""

from __future__ import annotations

import random
import re
from datetime import date

import pytest

from attnlab.config import from_dict
from attnlab.data import dates, numbers
from attnlab.data.parallel import (
    GENERATED,
    TEST_SIZE,
    VAL_SIZE,
    ParallelDataConfig,
    generate,
    load_pairs,
    tokenizer_kind,
)
from attnlab.errors import AttnlabError

# ---- numbers ----------------------------------------------------------------------------------

FRENCH = {
    0: "zéro",
    1: "un",
    2: "deux",
    10: "dix",
    11: "onze",
    16: "seize",
    17: "dix-sept",
    18: "dix-huit",
    19: "dix-neuf",
    20: "vingt",
    21: "vingt et un",
    22: "vingt-deux",
    30: "trente",
    31: "trente et un",
    41: "quarante et un",
    51: "cinquante et un",
    60: "soixante",
    61: "soixante et un",
    70: "soixante-dix",
    71: "soixante et onze",
    72: "soixante-douze",
    77: "soixante-dix-sept",
    79: "soixante-dix-neuf",
    80: "quatre-vingts",
    81: "quatre-vingt-un",
    88: "quatre-vingt-huit",
    90: "quatre-vingt-dix",
    91: "quatre-vingt-onze",
    97: "quatre-vingt-dix-sept",
    99: "quatre-vingt-dix-neuf",
    100: "cent",
    101: "cent un",
    111: "cent onze",
    180: "cent quatre-vingts",
    200: "deux cents",
    201: "deux cent un",
    221: "deux cent vingt et un",
    280: "deux cent quatre-vingts",
    300: "trois cents",
    342: "trois cent quarante-deux",
    999: "neuf cent quatre-vingt-dix-neuf",
    1000: "mille",
    1001: "mille un",
    1100: "mille cent",
    1200: "mille deux cents",
    1980: "mille neuf cent quatre-vingts",
    2000: "deux mille",
    12304: "douze mille trois cent quatre",
    21000: "vingt et un mille",
    71000: "soixante et onze mille",
    80000: "quatre-vingt mille",
    80080: "quatre-vingt mille quatre-vingts",
    81000: "quatre-vingt-un mille",
    100000: "cent mille",
    200000: "deux cent mille",
    201000: "deux cent un mille",
    280000: "deux cent quatre-vingt mille",
    300200: "trois cent mille deux cents",
    999999: "neuf cent quatre-vingt-dix-neuf mille neuf cent quatre-vingt-dix-neuf",
}
ENGLISH = {
    0: "zero",
    7: "seven",
    13: "thirteen",
    20: "twenty",
    42: "forty-two",
    90: "ninety",
    100: "one hundred",
    101: "one hundred one",
    342: "three hundred forty-two",
    1000: "one thousand",
    1010: "one thousand ten",
    12304: "twelve thousand three hundred four",
    40014: "forty thousand fourteen",
    100000: "one hundred thousand",
    700000: "seven hundred thousand",
    999999: "nine hundred ninety-nine thousand nine hundred ninety-nine",
}


@pytest.mark.parametrize("n, words", FRENCH.items())
def test_french_known_values(n, words):
    assert numbers.french(n) == words


@pytest.mark.parametrize("n, words", ENGLISH.items())
def test_english_known_values(n, words):
    assert numbers.english(n) == words


def test_number_words_follow_the_rules_everywhere():
    some = list(range(3000)) + list(range(3000, numbers.LIMIT, 331))
    fr, en = [numbers.french(n) for n in some], [numbers.english(n) for n in some]
    assert len(set(fr)) == len(set(en)) == len(some)  # one spelling per number, both sides
    for n, words in zip(some, fr):
        assert not words.startswith("un mille")  # 1000 is "mille"
        assert not re.search(r"(cents|vingts)[ -]", words)  # the plural s only at the very end
        assert words.endswith(("cents", "vingts")) == (n % 100 == 80 or (n % 100 == 0 and n % 1000 >= 200))
        assert "  " not in words
    assert all(" and " not in words for words in en)
    for bad in (-1, numbers.LIMIT):
        with pytest.raises(ValueError):
            numbers.french(bad)


def test_number_sample_mixes_magnitudes():
    rng = random.Random(0)
    lengths = [len(str(numbers.sample(rng))) for _ in range(6000)]
    assert all(700 < lengths.count(k) < 1300 for k in range(1, 7))  # about 1000 of each length


# ---- dates ------------------------------------------------------------------------------------


def test_ordinals():
    cases = {
        1: "1st",
        2: "2nd",
        3: "3rd",
        4: "4th",
        11: "11th",
        12: "12th",
        13: "13th",
        21: "21st",
        22: "22nd",
        23: "23rd",
        24: "24th",
        30: "30th",
        31: "31st",
        101: "101st",
        111: "111th",
    }
    assert {d: dates.ordinal(d) for d in cases} == cases


def test_every_format_of_a_known_date():
    written = [dates.write(date(2026, 11, 21), fmt) for fmt in dates.FORMATS]
    assert written == [
        "21 Nov 2026",
        "21 November 2026",
        "21st November 2026",
        "the 21st of November 2026",
        "November 21st, 2026",
        "Nov 21, 2026",
        "Saturday, November 21, 2026",
        "Sat, 21 Nov 2026",
        "Sat 21 November 2026",
        "Saturday 21st November 2026",
        "Saturday 21/11/2026",
        "21/11/2026",
        "21.11.2026",
        "21-11-2026",
        "2026/11/21",
    ]


@pytest.mark.parametrize(
    "day, fmt, text",
    [
        (date(1987, 3, 3), "the {th} of {Month} {yyyy}", "the 3rd of March 1987"),
        (date(1987, 3, 3), "{Weekday} {dd}/{mm}/{yyyy}", "Tuesday 03/03/1987"),
        (date(1969, 7, 20), "{Wkd}, {d} {Mon} {yyyy}", "Sun, 20 Jul 1969"),
        (date(2000, 1, 1), "{Weekday}, {Month} {d}, {yyyy}", "Saturday, January 1, 2000"),
        (date(2024, 2, 29), "{Weekday} {th} {Month} {yyyy}", "Thursday 29th February 2024"),
        (date(2099, 12, 31), "{Wkd} {d} {Month} {yyyy}", "Thu 31 December 2099"),
        (date(1950, 1, 2), "{d}/{m}/{yyyy}", "2/1/1950"),  # day first
        (date(2012, 5, 22), "{Month} {th}, {yyyy}", "May 22nd, 2012"),
    ],
)
def test_known_dates(day, fmt, text):
    assert dates.write(day, fmt) == text


def test_generated_dates_have_real_weekdays_and_one_reading():
    split = generate("dates", seed=1, sizes=(3000, 200, 200))
    pairs = [p for data in split.values() for p in data]
    assert len({source for source, _ in pairs}) == len(pairs)  # no source stands for two dates
    for source, target in pairs:
        day = date.fromisoformat(target)
        assert dates.FIRST <= day <= dates.LAST and str(day.year) in source
        named = [w for w in dates.WEEKDAYS if w[:3].lower() in source.lower()]
        assert named in ([], [dates.WEEKDAYS[day.weekday()]]), source
    lower = sum(s == s.lower() and not s.isupper() and any(c.isalpha() for c in s) for s, _ in pairs)
    assert lower > 300 and sum(s.isupper() for s, _ in pairs) > 100  # both variants are drawn


# ---- built-in tasks ---------------------------------------------------------------------------


@pytest.mark.parametrize("task", GENERATED)
def test_generation_is_deterministic_and_seeded(task):
    sizes = (500, 100, 100)
    first = generate(task, 0, sizes)
    assert first == generate(task, 0, sizes)
    assert first != generate(task, 1, sizes)
    assert {k: len(v) for k, v in first.items()} == {"train": 500, "val": 100, "test": 100}


@pytest.mark.parametrize("task", GENERATED)
def test_builtin_splits_are_disjoint(task):
    split = load_pairs(ParallelDataConfig(data=task, n_train=5000))
    assert {k: len(v) for k, v in split.items()} == {"train": 5000, "val": VAL_SIZE, "test": TEST_SIZE}
    # For dates the target is the date itself; for the others the source identifies the key.
    key = (lambda p: p[1]) if task == "dates" else (lambda p: p[0])
    keys = {name: {key(p) for p in data} for name, data in split.items()}
    assert sum(map(len, keys.values())) == 5000 + VAL_SIZE + TEST_SIZE  # distinct inside splits too
    assert not (keys["train"] & keys["val"] or keys["train"] & keys["test"] or keys["val"] & keys["test"])


def test_copy_and_reverse_targets():
    for source, target in generate("reverse", 3, (300, 10, 10))["train"]:
        assert target == source[::-1] and re.fullmatch(r"[a-z]{3,20}", source)
    assert all(s == t for s, t in generate("copy", 3, (300, 10, 10))["train"])


def test_default_builtin_sizes():
    split = load_pairs(ParallelDataConfig(data="copy"))
    assert [len(split[k]) for k in ("train", "val", "test")] == [30000, 1000, 2000]


def _parse_english(text: str) -> int:
    """English number words back to the number, to check pairs against (a reference of its own)."""
    value = {w: i for i, w in enumerate(numbers.ONES)} | {w: 10 * i for i, w in enumerate(numbers.TENS) if w}
    total = current = 0
    for word in text.replace("-", " ").split():
        if word == "thousand":
            total, current = total + current * 1000, 0
        elif word == "hundred":
            current *= 100
        else:
            current += value[word]
    return total + current


def test_numbers_pairs_translate_the_same_number():
    for source, target in generate("numbers", 2, (300, 100, 100))["test"]:
        n = _parse_english(source)
        assert numbers.english(n) == source and numbers.french(n) == target


def test_tokenizer_kind_and_config_checks():
    assert tokenizer_kind(ParallelDataConfig(data="numbers")) == "bpe"
    assert tokenizer_kind(ParallelDataConfig(data="reverse")) == "char"
    assert tokenizer_kind(ParallelDataConfig(data="corpus.tsv")) == "bpe"
    assert tokenizer_kind(ParallelDataConfig(data="numbers", tokenizer="char")) == "char"
    assert from_dict(ParallelDataConfig, {"tokenizer": "none"}).tokenizer is None
    with pytest.raises(AttnlabError, match="tokenizer"):
        from_dict(ParallelDataConfig, {"tokenizer": "word"})
    with pytest.raises(ValueError, match="n_train"):
        ParallelDataConfig(n_train=0)
    with pytest.raises(AttnlabError, match="--target"):
        load_pairs(ParallelDataConfig(data="copy", target="fr.txt"))
    with pytest.raises(AttnlabError, match="at most"):
        generate("dates", 0, (dates.N_DAYS, 1, 1))


# ---- files ------------------------------------------------------------------------------------


def _write(path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


PAIRS = [(f"source {i}", f"cible {i}") for i in range(40)]


def test_tsv_is_read_and_cut_deterministically(tmp_path):
    lines = [f"{s}\t{t}" for s, t in PAIRS[:20]] + ["", "   "] + [f"{s}\t{t}\r" for s, t in PAIRS[20:]]
    cfg = ParallelDataConfig(data=_write(tmp_path / "pairs.tsv", lines), split_fraction=0.1)
    split = load_pairs(cfg)
    assert {k: len(v) for k, v in split.items()} == {"train": 32, "val": 4, "test": 4}
    assert sorted(p for data in split.values() for p in data) == sorted(PAIRS)  # nothing lost, CR stripped
    assert split == load_pairs(cfg)
    assert split != load_pairs(ParallelDataConfig(data=cfg.data, split_fraction=0.1, data_seed=1))


@pytest.mark.parametrize(
    "bad, message", [("no tab here", "found 0 tabs"), ("a\tb\tc", "found 2 tabs"), ("\tcible", "source side is empty")]
)
def test_malformed_tsv_names_file_and_line(tmp_path, bad, message):
    path = _write(tmp_path / "bad.tsv", ["a\tb", "", bad])
    with pytest.raises(AttnlabError, match=re.escape(f"{path}:3: ") + ".*" + message):
        load_pairs(ParallelDataConfig(data=path))


def test_aligned_files(tmp_path):
    src = _write(tmp_path / "train.en", [s for s, _ in PAIRS])
    tgt = _write(tmp_path / "train.fr", [t for _, t in PAIRS])
    split = load_pairs(ParallelDataConfig(data=src, target=tgt, split_fraction=0.1))
    assert sorted(p for data in split.values() for p in data) == sorted(PAIRS)
    short = _write(tmp_path / "short.fr", [t for _, t in PAIRS[:-2]])
    with pytest.raises(AttnlabError, match=f"{re.escape(src)} has 40 lines but {re.escape(short)} has 38"):
        load_pairs(ParallelDataConfig(data=src, target=short))
    holes = _write(tmp_path / "holes.fr", [t for _, t in PAIRS[:5]] + [""] + [t for _, t in PAIRS[6:]])
    with pytest.raises(AttnlabError, match=r"train\.en:6 .*target side is empty"):
        load_pairs(ParallelDataConfig(data=src, target=holes))


def test_given_val_and_test_files(tmp_path):
    data = _write(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in PAIRS])
    val = _write(tmp_path / "val.tsv", ["un\tone"])
    test_src, test_tgt = _write(tmp_path / "t.en", ["deux", "trois"]), _write(tmp_path / "t.fr", ["two", "three"])
    split = load_pairs(ParallelDataConfig(data=data, val=val, test=f"{test_src},{test_tgt}"))
    assert split["val"] == [("un", "one")] and split["test"] == [("deux", "two"), ("trois", "three")]
    assert sorted(split["train"]) == sorted(PAIRS)  # nothing cut when both are given
    builtin = load_pairs(ParallelDataConfig(data="copy", n_train=100, test=val))
    assert builtin["test"] == [("un", "one")] and len(builtin["val"]) == VAL_SIZE


def test_missing_file_and_empty_split(tmp_path):
    missing = str(tmp_path / "nope.tsv")
    with pytest.raises(AttnlabError, match=f"data file not found: {re.escape(missing)}"):
        load_pairs(ParallelDataConfig(data=missing))
    tiny = _write(tmp_path / "tiny.tsv", ["a\tb", "c\td", "e\tf"])
    with pytest.raises(AttnlabError, match="the val split of .* is empty"):
        load_pairs(ParallelDataConfig(data=tiny))
    empty = _write(tmp_path / "empty.tsv", [""])
    with pytest.raises(AttnlabError, match="the train split of .* is empty"):
        load_pairs(ParallelDataConfig(data=empty, val=tiny, test=tiny))
