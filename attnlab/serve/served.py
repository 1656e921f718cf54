"""The runs a server holds: each loaded once, named by its directory, with what the page shows of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab.data.chat import ChatTemplate
from attnlab.decoding.drafts import use_draft
from attnlab.decoding.engine import Engine, engine_for
from attnlab.errors import AttnlabError, one_line
from attnlab.nn.counting import count_parameters
from attnlab.runs.adapted import run_template
from attnlab.runs.folder import check_run_dir, read_run_config
from attnlab.runs.kind import kind_of
from attnlab.runs.run import Run, load


@dataclass
class Served:
    """A loaded run and what the page shows about it."""

    name: str
    run: Run
    parameters: int
    template: ChatTemplate | None = None  # a run that generates: its chat template (/v1/chat/completions)
    compiled: bool = False  # a lone row's one-token steps compiled (decoding/compiled.py)
    transcoders: list | None = None  # given with --transcoders: the explorer draws attribution graphs

    @property
    def kind(self) -> str:
        return self.run.task.name  # lm, classify, tag, mlm, translate or image

    def summary(self) -> dict:
        family = self.run.config["family"]
        task = self.run.task  # what the page asks of a run: where its inputs go, whether it generates or reads images
        return {
            "name": self.name,
            "path": str(self.run.path),
            "family": family,
            "kind": self.kind,
            "parameters": self.parameters,
            "step": self.run.step,
            "config": self.run.config,
            "endpoint": task.endpoint,
            "generates": task.generates,
            "reads_images": task.reads_images,
            "quantized": self.quantized,
            "graphs": bool(self.transcoders),
        }

    def engine(
        self, max_batch: int | None = None, prefill: int | None = None, prefix_cache_mb: float | None = None
    ) -> Engine:
        """The run's one decoding engine, shared by the explorer and /v1 (compiled steps if asked)."""
        return engine_for(
            self.run.model,
            max_batch=max_batch,
            compiled=self.compiled,
            prefill=prefill,
            prefix_cache_mb=prefix_cache_mb,
        )

    @property
    def quantized(self) -> str | None:
        """How its weights are stored for decoding: as `attnlab quantize` wrote them, or as --quantize asked."""
        stored = self.run.config.get("quantized")
        asked = self.run.quantization
        return asked.kind if asked is not None else stored.get("kind") if isinstance(stored, dict) else None


def attach_draft(served: dict[str, Served], draft: str | None, device: str, compiled: bool) -> None:
    """--draft RUN: the draft model of every language model served (decoding/drafts.py use_draft)."""
    if draft is None:
        return
    drafter = load_runs([draft], device, compiled=compiled)
    (run,) = [s.run for s in drafter.values()]
    if not run.task.generates:
        raise AttnlabError(f"--draft {draft} is not a language model run (it is {run.task.name})")
    for s in served.values():
        if s.run.task.generates:
            use_draft(s.run.model, run.model, compiled=compiled, tokenizers=(s.run.tokenizer, run.tokenizer))


def load_runs(
    paths: list[str | Path], device: str, quantize: str | None = None, compiled: bool = False
) -> dict[str, Served]:
    """Each run by its directory name (a second "lm" becomes "lm-2"); a run that fails to load stops
    the server before it starts, with the run's path in the message. quantize: the language models'
    weights stored that way for decoding (runs/quantized.py); the other runs load as they are. compiled:
    the language models' engines take compiled decode steps."""
    if not paths:
        raise AttnlabError("give at least one run directory to serve")
    served: dict[str, Served] = {}
    seen: set[Path] = set()
    for path in paths:
        resolved = Path(path).resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        try:
            generates = kind_of(read_run_config(check_run_dir(resolved))).generates
            run = load(resolved, device, quantize if generates else None, compiled=compiled and generates)
            template = run_template(resolved) if run.task.generates else None
        except AttnlabError as e:
            raise AttnlabError(f"cannot serve {path}: {e}") from None
        except Exception as e:  # e.g. a weights file cut short: still one line naming the run
            raise AttnlabError(f"cannot serve {path}: {type(e).__name__}: {one_line(e)}") from None
        name, k = resolved.name or "run", 2
        while name in served:
            name, k = f"{resolved.name}-{k}", k + 1
        served[name] = Served(name, run, count_parameters(run.model).logical, template, compiled and run.task.generates)
    return served
