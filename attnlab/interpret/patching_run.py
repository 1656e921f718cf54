"""Patching a trained run from texts (or image files): `attnlab.interpret.patching_run.patch`.

    result = patch(run, "When Mary and John went, John gave it to", "When Mary and John went, Anna gave it to")
    result.as_json()["effects"]          # every site: component, stack, layer, head, position, effect
    draw_patching(result, "patch.png")   # layer x position heatmaps, the tokens along the x axis

`method`: "activation" (each site patched, interpret/patching.py) or "attribution" (AtP's gradient
estimate of all of them at once, interpret/attribution.py). patch_path: one sender's effect through
named receivers (patching_paths.py); patch_edges: EAP and EAP-IG over the residual graph. The
inputs and the metric come from patching_inputs.py, by what the run's model is.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnlab.errors import AttnlabError
from attnlab.interpret.attribution import attribution_patching, edge_attribution
from attnlab.interpret.patching import GRANULARITIES, Patching, activation_patching
from attnlab.interpret.patching_inputs import METRICS, AnswerMetric, Pair, metric_of, pair
from attnlab.interpret.patching_paths import path_patching
from attnlab.runs.run import Run

METHODS = {"activation": activation_patching, "attribution": attribution_patching}


def measured(
    run: Run, clean: str, corrupted: str, metric: str, target: str | None, wrong: str | None
) -> tuple[Pair, AnswerMetric, dict]:
    """The two inputs, the metric (target and wrong answer named or read from the runs) and the
    answer's description every result carries."""
    if metric not in METRICS:
        raise AttnlabError(f"--metric {metric!r}: one of {', '.join(METRICS)}")
    p = pair(run, clean, corrupted)
    fn = metric_of(run, p, metric, target, wrong)
    answer = {
        "metric": metric,
        "target": p.names[fn.target],
        "position": p.position,
        "wrong": None if fn.wrong is None else p.names[fn.wrong],
    }
    return p, fn, answer


def patch(
    run: Run,
    clean: str,
    corrupted: str,
    metric: str = "logit-diff",
    target: str | None = None,
    wrong: str | None = None,
    method: str = "activation",
    granularities: Sequence[str] = tuple(GRANULARITIES),
) -> Patching:
    """Patch `run` (attnlab.load) from `clean` into `corrupted` (texts, or image files for an image run)
    and measure `metric` (one of METRICS) of `target` (default: the clean run's top answer) against
    `wrong` (default: the corrupted run's)."""
    if method not in METHODS:
        raise AttnlabError(f"--method {method!r}: one of {', '.join(METHODS)}")
    p, fn, answer = measured(run, clean, corrupted, metric, target, wrong)
    result = METHODS[method](run.model, p.clean, p.corrupted, fn, granularities)
    result.labels, result.answer = p.labels, answer
    return result


def patch_path(
    run: Run,
    clean: str,
    corrupted: str,
    sender: str,
    receivers: str,
    metric: str = "logit-diff",
    target: str | None = None,
    wrong: str | None = None,
) -> dict:
    """Path patching (interpret/patching_paths.py) of `run`: the `sender` heads' effect through the
    `receivers` heads alone ("1.2", "2", "cross:1.2" as --remove names heads), as a JSON-ready dict."""
    p, fn, answer = measured(run, clean, corrupted, metric, target, wrong)
    return {"method": "path", **answer, **path_patching(run.model, p.clean, p.corrupted, fn, sender, receivers)}


def patch_edges(
    run: Run,
    clean: str,
    corrupted: str,
    metric: str = "logit-diff",
    target: str | None = None,
    wrong: str | None = None,
    steps: int = 0,
) -> dict:
    """EAP (steps 0) or EAP-IG (steps k) of `run` over its residual graph (interpret/attribution.py)."""
    p, fn, answer = measured(run, clean, corrupted, metric, target, wrong)
    return {**edge_attribution(run.model, p.clean, p.corrupted, fn, steps), **answer}


def edge_lines(result: dict, top: int = 10) -> list[str]:
    lines = [
        f"{result['method']} over {len(result['edges'])} edges, metric {result['metric']} of "
        f"{result['target']!r}"
        + (f" vs {result['wrong']!r}" if result["wrong"] is not None else "")
        + f": clean {result['m_clean']:.4f}, corrupted {result['m_corrupt']:.4f}"
    ]
    for e in sorted(result["edges"], key=lambda e: -abs(e["score"]))[:top]:
        effect = "n/a" if e["effect"] is None else f"{e['effect']:+.3f}"
        lines.append(f"  {e['from']} -> {e['to']}: effect {effect}")
    return lines


def path_lines(result: dict) -> list[str]:
    effect = "n/a" if result["effect"] is None else f"{result['effect']:+.4f}"
    heads = lambda d: ", ".join(f"{p} heads {[h + 1 for h in hs]}" for p, hs in d.items())  # noqa: E731
    against = f" vs {result['wrong']!r}" if result["wrong"] is not None else ""
    return [
        f"path patching, metric {result['metric']} of {result['target']!r}{against}: clean "
        f"{result['m_clean']:.4f}, corrupted {result['m_corrupt']:.4f}, patched {result['m_patched']:.4f}",
        f"  from {heads(result['sender'])}",
        f"  through {heads(result['receivers'])}: effect {effect}",
    ]


def summary(result: Patching, top: int = 8) -> list[str]:
    """The terminal's lines: the baselines, then the sites of largest effect."""
    answer = result.answer
    lines = [
        f"{result.method} patching, metric {answer.get('metric', '')} of {answer.get('target')!r}"
        + (f" vs {answer['wrong']!r}" if answer.get("wrong") is not None else "")
        + f": clean {result.clean:.4f}, corrupted {result.corrupted:.4f}"
    ]
    ranked = sorted(zip(result.sites, result.effects()), key=lambda se: -abs(se[1] or 0.0))[:top]
    for s, e in ranked:
        label = result.labels.get(s.stack, [])
        if s.head is not None:  # "head 3", "cross_head 3"
            where = f"{s.component} {s.head + 1}"
        elif s.position is not None:
            where = f"{s.component} position {s.position}" + (
                f" {label[s.position]!r}" if s.position < len(label) else ""
            )
        else:
            where = f"{s.component} (all positions)"
        lines.append(f"  {s.stack} layer {s.layer + 1} {where}: effect " + ("n/a" if e is None else f"{e:+.3f}"))
    return lines
