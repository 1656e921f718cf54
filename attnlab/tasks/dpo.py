"""dpo: Direct Preference Optimization of a fine-tuned GPT on pairs of answers, one preferred.

attnlab train dpo --init runs/sft --data preferences --out runs/dpo [--beta 0.1 --lora-rank 8]

The reference is the --init model: each answer's log-probability under it is computed once, before
training (the base with adapters off computes the same). The loop logs DPO's reward accuracy and
margin beside the loss; eval.json holds the held-out exact answers and preference accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.config import option
from attnlab.data.finetune import PreferenceData, held_out
from attnlab.data.supervised import Example, Pairs, shifted
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest
from attnlab.nn.lora import adapters_off, has_lora
from attnlab.nn.objective import inner
from attnlab.nn.preference import DPOObjective, answer_logprobs
from attnlab.progress import tqdm
from attnlab.runs.adapted import as_run, build_base
from attnlab.runtime.distributed import Dist
from attnlab.tasks.adapt import Adapting, AdaptOptions
from attnlab.tasks.sft import EXACT

REF_BATCH = 32  # pairs per forward when the reference's log-probabilities are computed


@dataclass
class DPOOptions(AdaptOptions):
    beta: float = option(0.1, "DPO's beta: how far the policy may move from the reference (larger: less far)")


Pair = tuple[Example, Example]


@torch.no_grad()
def logprobs(model: nn.Module, pairs: list[Pair], progress: str | None = None) -> np.ndarray:
    """Each pair's (chosen, rejected) answer log-probabilities under `model`: (N, 2)."""
    model.eval()
    device = next(model.parameters()).device
    out = np.zeros((len(pairs), 2), dtype=np.float64)
    for i in tqdm(range(0, len(pairs), REF_BATCH), desc=progress, disable=progress is None, leave=False):
        part = pairs[i : i + REF_BATCH]
        x, y = shifted([c for c, _ in part] + [r for _, r in part])  # (2B, T)
        lp = answer_logprobs(model, x.to(device), y.to(device)).cpu().double().numpy()  # (2B,) chosen then rejected
        out[i : i + len(part)] = lp.reshape(2, -1).T
    return out


def preference_scores(policy: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Held-out pairs: how often DPO's implicit reward ranks the chosen answer first, and how often the
    policy itself gives it the higher probability."""
    margin = (policy[:, 0] - reference[:, 0]) - (policy[:, 1] - reference[:, 1])
    prefers = float((policy[:, 0] > policy[:, 1]).mean())
    return {"preference_accuracy": float((margin > 0).mean()), "prefers_chosen": prefers, "pairs": len(policy)}


class DirectPreference(Adapting):
    name = "dpo"
    help = "preference tuning (DPO) of a fine-tuned GPT on chosen/rejected answers (every weight, or LoRA)"
    description = (
        "Tune a GPT run (usually an sft run, --init) to prefer the chosen answer of each pair: the "
        "built-in preference pairs or a JSON/JSONL file of {prompt, chosen, rejected} rows."
    )
    noun = "a preference-tuned (dpo)"
    data_config = PreferenceData
    options = DPOOptions

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        e = self.encoded(req)
        tok, template, pairs = e.tok, e.template, e.parts
        build = self.builder(req, e.model)
        reference = build()  # the --init model: adapters start at zero
        show = "reference log-probabilities" if req.progress and d.main else None
        refs = {k: logprobs(reference, v, show) for k, v in pairs.items() if v}
        beta = req.options.beta  # a resumed run's own under the flags (tasks/request.py)
        config = self.run_config(req, e.model)
        config["task"]["beta"] = beta
        state = (tok, template, pairs["test"], refs.get("test"), req.data)
        batches = Pairs(pairs, refs, req.train.batch_size)
        return Prepared(batches, lambda: DPOObjective(build(), beta), config, state=state)

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any] | None:
        tok, template, pairs, refs, data = prepared.state
        if not pairs:
            return None
        model, shown = inner(s.raw).eval(), req.progress and s.dist.main
        scores = preference_scores(logprobs(model, pairs, "held-out log-probabilities" if shown else None), refs)
        if data.data == "preferences":  # the pairs' questions, answered
            scores.update(self.exact(model, tok, template, held_out(data)[0], EXACT if shown else None))
        return scores

    def more_scores(self, run, data: str | None) -> dict[str, Any]:
        pairs, _, _ = self.held_out_pairs(run, data)
        policy = logprobs(run.model, pairs)
        if has_lora(run.model):
            with adapters_off(run.model):
                reference = logprobs(run.model, pairs)
        else:
            base = build_base(as_run(run.config["init"]), run.config["family"], run.config["model"]).to(run.device)
            reference = logprobs(base, pairs)
        return preference_scores(policy, reference)

    def test_line(self, test: dict[str, Any]) -> str:
        exact = f"exact answers {test['exact']:.1%} ({test['examples']}), " if "exact" in test else ""
        return f"{exact}preference accuracy {test['preference_accuracy']:.1%} ({test['pairs']} held-out pairs)"

    def show_evaluation(self, r: dict[str, Any]) -> str:
        return (
            f"{super().show_evaluation(r)}\n  preference accuracy {r['preference_accuracy']:.1%} "
            f"(policy prefers chosen {r['prefers_chosen']:.1%}) on {r['pairs']} held-out pairs"
        )
