"""What a trained run does, asked of the run itself: `run.task` is the RunKind of its config.json.

Every task (tasks/) is the RunKind of the runs it trains and registers itself in KINDS, so a run
predicts, evaluates and shows its attention through its task without any caller asking which task
it is. `kind_of(config)` is the one place that reads a run's kind from its config.json.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.errors import AttnlabError
from attnlab.lazy import fill_registries

if TYPE_CHECKING:  # named in signatures only: `attnlab runs` reads kinds without numpy and torch
    import numpy as np
    from torch import Tensor

    from attnlab.runs.run import Run


class RunKind:
    """What a trained run of one task does with an input; the answers most tasks give."""

    name: str = ""  # the kind stored in config.json (and `attnlab train NAME`)
    noun: str = "a run"  # "a classifier": for messages
    tokenized: bool = True  # False: the run reads pixels and has no tokenizer.json
    reads_images: bool = False  # its input is an image file (image classification, captioning)
    generates: bool = False  # attnlab sample continues its text
    endpoint: str = "/api/predict"  # where the explorer sends its inputs

    def predict(self, run: Run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        raise AttnlabError(f"{run.path} is {self.noun} run: attnlab predict does not apply to it")

    def evaluate(self, run: Run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        raise AttnlabError(f"{run.path} is {self.noun} run: attnlab eval does not apply to it")

    def views(self, run: Run, text: str) -> list:
        """Every attention of the run on `text`, as viz.html.AttentionView objects."""
        raise AttnlabError(f"{run.path} is {self.noun} run: it has no attention to show")

    def lens_input(self, run: Run, text: str) -> tuple[Tensor, Tensor | None, Callable[[int], str]]:
        """What the logit lens reads of `text`: the decoder's token ids (1, T), the source ids (1, S)
        of an encoder-decoder (None for a decoder alone), and each id's text."""
        raise AttnlabError(
            "lens, heads and ablate read a language-model run (attnlab train lm); rollout and flow read any run"
        )

    def image(self, run: Run, path: str | Path) -> np.ndarray:
        """An image file as the run's model reads it: (C, H, W) in [0, 1]."""
        raise AttnlabError(f"{run.path} is {self.noun} run: it reads text, not images")

    def answer_image(self, run: Run, pixels: np.ndarray, name: str | None) -> dict[str, Any]:
        """The explorer's answer for an uploaded image (C, H, W): its label and attention."""
        raise AttnlabError(f"{run.path} is {self.noun} run: it does not label images")

    def stream_image(self, run: Run, pixels: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
        """Words written about an image (C, H, W) one at a time, each with where it looked (L, H, N)."""
        raise AttnlabError(f"{run.path} is {self.noun} run: it does not caption images")

    def picture(self, run: Run, source: str, out: Path) -> str | None:
        """A task whose input is not text draws its own attention PNG (returns a summary line);
        None: draw the views."""
        return None


# Every kind of run, by the name its config.json records; tasks/ registers one per task.
KINDS: dict[str, RunKind] = {}
# Runs written before config.json recorded their kind: by family (an encoder's head names its kind).
LEGACY_KINDS = {"gpt": "lm"}
# Run folders `load` does not read, by family, with the command that does (registered by wordvec/).
READ_ELSEWHERE: dict[str, str] = {}


def kind_of(config: dict[str, Any]) -> RunKind:
    """The kind of a run's config.json."""
    family = config.get("family", "gpt")
    if family not in READ_ELSEWHERE and config.get("task", {}).get("kind") not in KINDS:
        fill_registries()  # the tasks and wordvec fill KINDS and READ_ELSEWHERE when imported
    if family in READ_ELSEWHERE:
        raise AttnlabError(READ_ELSEWHERE[family])
    kind = config.get("task", {}).get("kind") or LEGACY_KINDS.get(family) or config["model"].get("head", "mlm")
    if kind not in KINDS:
        raise AttnlabError(f"unknown task {kind!r} in config.json (known: {', '.join(KINDS)})")
    return KINDS[kind]
