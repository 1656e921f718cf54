"""Generated part-of-speech task: sentences whose ambiguous words only their neighbours can tag.

Many English words are both a noun and a verb ("i watch the watch", "the fish fish in the park"),
"light" is also an adjective ("they light the light box") and "fast" an adverb ("a fast train",
"we run fast") and "like" a preposition ("we like the park", "they swim like ducks"). The grammar
below places every word so that its neighbours decide its tag:

    sentence    = clause [CONJ clause]
    clause      = subject [ADV_BEFORE] verb_phrase [PP] [ADV_AFTER]
    subject     = PRON_SUBJ | DET_PLURAL [ADJ] NOUN_PLURAL | NUM NOUN_PLURAL
    verb_phrase = VERB_T object | VERB_I ["and" VERB_I] ["like" DET [ADJ] NOUN]
    object      = DET [ADJ] NOUN | NUM NOUN_PLURAL | PRON_OBJ
    PP          = PREP DET [ADJ] NOUN

A word straight after a determiner, number or adjective is a noun unless a noun follows it
(then an adjective); a word straight after a subject, a pre-verb adverb or a verb-joining
"and" is a verb; after an intransitive verb "like" is a preposition and "fast" an adverb.
The two words before and the one after always decide the tag (tests check this on the data),
while a word's most frequent tag is right only about 64% of the time on the ambiguous words.
Verbs take the plain form, so subjects are plural ("the cooks", "we"): no agreement to learn.
"""

from __future__ import annotations

import random

TAGS = ("DET", "NOUN", "VERB", "ADJ", "ADV", "PRON", "PREP", "CONJ", "NUM")

# Words that are also something else: most of the task's difficulty lives here.
NOUN_VERBS = (
    "fish",
    "watch",
    "run",
    "book",
    "duck",
    "saw",
    "light",
    "play",
    "park",
    "cook",
    "drink",
    "walk",
    "paint",
    "plant",
    "train",
    "ring",
    "water",
    "dance",
)
# Unambiguous vocabulary.
NOUNS = ("dog", "car", "house", "river", "box", "garden", "bell", "game", "room", "tree", "song", "letter")
PLURALS = ("cooks", "children", "dogs", "birds", "players", "students", "people", "fish", "ducks", "friends")
TRANSITIVE = (
    "watch",
    "book",
    "cook",
    "drink",
    "light",
    "paint",
    "plant",
    "train",
    "ring",
    "water",
    "saw",
    "see",
    "like",
    "want",
    "find",
    "carry",
    "play",
    "park",
)
INTRANSITIVE = ("fish", "run", "duck", "play", "walk", "dance", "cook", "sleep", "swim", "sing", "wait")
ADJECTIVES = ("old", "new", "big", "small", "red", "quiet", "little", "light", "fast")
DETERMINERS = ("the", "a", "this", "that", "my", "every")  # before a singular noun
PLURAL_DETERMINERS = ("the", "some", "these", "those", "my", "many")
NUMBERS = ("two", "three", "four", "five")
SUBJECT_PRONOUNS = ("i", "you", "we", "they")
OBJECT_PRONOUNS = ("me", "you", "us", "them", "it")
ADVERBS_BEFORE = ("often", "never", "always", "sometimes")
ADVERBS_AFTER = ("today", "quickly", "slowly", "again")
ADVERBS_AFTER_INTRANSITIVE = ADVERBS_AFTER + ("fast",)  # "we run fast"; never "we watch the light fast"
PREPOSITIONS = ("in", "on", "near", "with", "under", "by")  # and "like", only after an intransitive verb
CONJUNCTIONS = ("and", "but", "or")

AMBIGUOUS: frozenset[str] = frozenset(NOUN_VERBS + ("like", "fast"))
AMBIGUOUS_RATE = 0.7  # chance that a noun or verb slot takes an ambiguous word, when it has one

Tagged = list[tuple[str, str]]  # (word, tag) pairs


def _pick(rng: random.Random, words: tuple[str, ...], rate: float = AMBIGUOUS_RATE) -> str:
    """A word from `words`, an ambiguous one with probability `rate`: most sentences get some."""
    ambiguous = [w for w in words if w in AMBIGUOUS]
    plain = [w for w in words if w not in AMBIGUOUS]
    return rng.choice(ambiguous if ambiguous and (rng.random() < rate or not plain) else plain)


def _noun_phrase(rng: random.Random, plural: bool = False, numbers: bool = True) -> Tagged:
    """DET [ADJ] NOUN, or NUM NOUN_PLURAL. Plural phrases are subjects, where "fish" is the one ambiguous noun."""
    if numbers and rng.random() < 0.15:
        return [(rng.choice(NUMBERS), "NUM"), (_pick(rng, PLURALS, 0.3), "NOUN")]
    det = rng.choice(PLURAL_DETERMINERS if plural else DETERMINERS)
    adj = [(rng.choice(ADJECTIVES), "ADJ")] if rng.random() < 0.3 else []
    noun = _pick(rng, PLURALS, 0.3) if plural else _pick(rng, NOUN_VERBS + NOUNS)
    if det == "a" and (adj[0][0] if adj else noun)[0] in "aeiou":
        det = "an"  # "an old dog"
    return [(det, "DET")] + adj + [(noun, "NOUN")]


def _clause(rng: random.Random) -> Tagged:
    """subject [ADV] verb phrase [PP] [ADV], tagged."""
    if rng.random() < 0.45:
        words = [(rng.choice(SUBJECT_PRONOUNS), "PRON")]
    else:
        words = _noun_phrase(rng, plural=True)  # "the fish fish", "two fish fish"
    if rng.random() < 0.25:
        words.append((rng.choice(ADVERBS_BEFORE), "ADV"))
    if rng.random() < 0.55:  # transitive: a verb and its object
        words.append((_pick(rng, TRANSITIVE), "VERB"))
        words += [(rng.choice(OBJECT_PRONOUNS), "PRON")] if rng.random() < 0.2 else _noun_phrase(rng)
        after = ADVERBS_AFTER
    else:  # intransitive, maybe two verbs joined ("we fish and swim"), maybe "like" + PP ("run like a dog")
        words.append((_pick(rng, INTRANSITIVE), "VERB"))
        if rng.random() < 0.2:
            words += [("and", "CONJ"), (_pick(rng, INTRANSITIVE), "VERB")]
        if rng.random() < 0.15:
            words += [("like", "PREP")] + _noun_phrase(rng, numbers=False)
        after = ADVERBS_AFTER_INTRANSITIVE
    if rng.random() < 0.35:
        words += [(rng.choice(PREPOSITIONS), "PREP")] + _noun_phrase(rng, numbers=False)
        after = ADVERBS_AFTER  # after a noun, "fast" could read as an adjective: "the light fast"
    if rng.random() < 0.2:
        words.append((rng.choice(after), "ADV"))
    return words


def generate(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """`n` distinct tagged sentences (words, tags), in random order; the same seed gives the same list."""
    rng = random.Random(seed)
    out: list[tuple[list[str], list[str]]] = []
    seen: set[tuple[str, ...]] = set()
    for _ in range(50 * n + 1000):  # the grammar has far more sentences than any n asked; this guards a huge n
        if len(out) >= n:
            break
        tagged = _clause(rng)
        if rng.random() < 0.3:  # two clauses: "i watch the watch but they fish"
            tagged += [(rng.choice(CONJUNCTIONS), "CONJ")] + _clause(rng)
        words, tags = (list(t) for t in zip(*tagged))
        if tuple(words) not in seen:
            seen.add(tuple(words))
            out.append((words, tags))
    if len(out) < n:
        raise ValueError(f"could not draw {n} distinct sentences; ask for fewer")
    return out


def splits(
    seed: int = 0, sizes: tuple[int, int, int] = (8000, 1000, 1000)
) -> dict[str, list[tuple[list[str], list[str]]]]:
    """Train, val and test sets with no sentence in two of them."""
    data = generate(sum(sizes), seed)  # distinct sentences, so slicing keeps the splits disjoint
    n_train, n_val, _ = sizes
    return {"train": data[:n_train], "val": data[n_train : n_train + n_val], "test": data[n_train + n_val :]}
