"""What `attnlab compare` takes (CompareOptions), torch-free: its --help is built without the seconds
torch takes to import. tasks/compare.py, which runs a comparison, imports it from here."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.config import option
from attnlab.engine.config import budget_seconds

# The names of tasks/compare.py's COMPARISONS, in its order (tests/test_startup.py holds them equal):
# that registry's entries build data configs that import torch.
COMPARED = ("sentiment", "tagging", "numbers", "dates", "copy", "reverse", "digits", "caption", "lm")
# The text models from the simplest up, as the lectures climb: counts, averaged embeddings, the
# parameter-free self-attention, one learned head, then convolutions, recurrence and the encoder.
LADDER_MODELS = "bow,pooled,self-attention,qkv-attention,conv1d,rnn,encoder"


@dataclass
class CompareOptions:
    task: str = option(
        "sentiment",
        "generated task: sentiment, tagging, a translation task, the digits images, "
        "caption (digits-strips: the Transformer captioner against Show-Attend-Tell's RNN), or lm: "
        "the language-model recipes, classic gpt-nano against gpt-nano-fast and its ablations",
        COMPARED,
    )
    models: str | None = option(
        None,
        f"comma-separated models (default: {LADDER_MODELS}; translation: "
        "transformer,rnn-attention,rnn; digits: vit,mlp)",
    )
    out: str = option("runs/compare", "folder for the runs, table and chart")
    force: bool = option(False, "replace earlier runs in --out")
    budget: str | None = option(
        None,
        "training time of EACH model (90s, 2m, 1.5h), not of the whole comparison: "
        "a model stops at its budget or its tuned step count, whichever comes first "
        "(default: the tuned steps; lm: 2m for each recipe)",
    )
    data: str = option("stdlib", "lm: the corpus (a file, a folder or stdlib)")
    parts: str | None = option(None, "lm: comma-separated parts of the fast recipe to ablate (default: every one)")
    blocks: bool = option(
        False,
        "lm: compare blocks instead of recipes: the classic (gpt-nano), Llama (llama-nano) "
        "and mixture-of-experts (moe-nano) blocks, trained alike",
    )
    word_vectors: str | None = option(
        None,
        "sentiment, tagging: also train each model with a word embedding from "
        "these vectors (an attnlab train vectors run, or a word2vec/GloVe file), as "
        "the row MODEL+vectors",
        metavar="RUN_OR_FILE",
    )
    freeze_vectors: bool = option(True, "keep the pretrained vectors fixed while training")

    def __post_init__(self):
        if self.budget is not None:
            budget_seconds(self.budget)  # a clear error now, not after the first model
