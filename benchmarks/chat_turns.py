"""How well a chat run holds a conversation: exact greedy answers to held-out built-in instructions asked
alone, as follow-ups, and after 1, 2 and 3 earlier unrelated held-out turns (with their right answers).

    single       the 200 held-out instructions the chain scores (the test split, follow-ups among them)
    follow-ups   those of them that are two-question conversations ("And after that?")
    after k      60 conversations each: k + 1 single held-out questions drawn at random (seed 0), the
                 first k with their right answers, the last one to answer

A run that never saw a new question after an earlier one answers "after k" almost never; what it
takes is in docs/fine-tuning.md ("Turns"). About 10 s for a chat demo's run on 2 cores.

    .venv/bin/python benchmarks/chat_turns.py runs/chat/sft runs/chat/dpo
"""

from __future__ import annotations

import argparse
import json
import random

from attnlab.data.conversations import Conversation
from attnlab.data.finetune import TEST_SEED
from attnlab.data.instructions import instructions
from attnlab.decoding.chat import right_answers
from attnlab.runs.adapted import run_template
from attnlab.runs.run import load

TEST, PER_DEPTH, DEPTHS = 200, 60, (1, 2, 3)


def question_sets(seed: int = 0) -> dict[str, list[Conversation]]:
    """The conversations to answer, by set; each ends with the right answer to its last question."""
    test = instructions("test", TEST, TEST_SEED)
    singles = [c for c in instructions("test", 1000, 5) if len(c.messages) == 2]
    rng = random.Random(seed)
    sets = {"single": test, "follow-ups": [c for c in test if len(c.messages) > 2]}
    for k in DEPTHS:
        chains = [rng.sample(singles, k + 1) for _ in range(PER_DEPTH)]
        sets[f"after {k}"] = [Conversation(tuple(m for c in chain for m in c.messages)) for chain in chains]
    return sets


def scores(path: str) -> dict[str, str]:
    """Right answers over asked, by set, greedy, for the run at `path`."""
    run, template = load(path), run_template(path)
    sets = question_sets()
    right = right_answers(run.model.eval(), run.tokenizer, template, [c for cs in sets.values() for c in cs])
    out, i = {}, 0
    for name, cs in sets.items():
        out[name], i = f"{sum(right[i : i + len(cs)])}/{len(cs)}", i + len(cs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="chat runs (sft, dpo, ...)")
    for path in ap.parse_args().runs:
        print(path, json.dumps(scores(path)), flush=True)


if __name__ == "__main__":
    main()
