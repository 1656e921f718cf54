"""`attnlab report OUT`: the report card of a chat demo's chain (`attnlab demo --chat --out OUT`), one
page as markdown (OUT/report.md, its picture beside it) and as self-contained HTML (OUT/report.html,
the picture inside): every stage's held-out numbers, its time, size and dtype, the machine and the
commit, and a picture of the exact answers by stage and by kind of instruction.

Each stage that answers (its model generates text) answers the 200 held-out instructions the chain
scores, greedy, grouped by kind (`data/instructions.PHRASINGS`); the figures a stage wrote itself
(eval.json) and the ones the chain measured (chain.json: the base's answers, best-of-8) are read back.
"""

from __future__ import annotations

import base64
import html
import os
import platform
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from attnlab.data.conversations import Conversation
from attnlab.data.finetune import TEST_SEED
from attnlab.data.instructions import PHRASINGS, instructions
from attnlab.decoding.chat import right_answers
from attnlab.errors import AttnlabError
from attnlab.io import atomic_write, read_json
from attnlab.models.protocols import CausalLM
from attnlab.nn.counting import count_parameters
from attnlab.runs.adapted import run_template
from attnlab.runs.folder import is_run
from attnlab.runs.run import load
from attnlab.runtime.precision import cpu_model
from attnlab.version import __version__
from attnlab.viz.figures import pyplot, save_figure

STAGES = ("base", "sft", "dpo", "reward", "grpo", "ppo")  # the chain's order; the ones there are shown
TEST = 200  # the held-out instructions the chain scores


def _pattern(asks: tuple[str, ...]) -> re.Pattern:
    """A phrasing's user turns as a pattern: its quoted word and its numbers stand for any."""
    parts = [re.sub(r'"[^"]*"', '"[^"]*"', re.escape(a)) for a in asks]
    return re.compile("\n".join(re.sub(r"\d+", r"\\d+", p) for p in parts))


KIND_PATTERNS = [(p.kind, _pattern(p.asks)) for p in PHRASINGS]


def kind_of(conversation: Conversation) -> str:
    """The kind of a built-in instruction conversation, from its user turns (`other` for none)."""
    asked = "\n".join(m.content for m in conversation.messages if m.role == "user")
    return next((kind for kind, pattern in KIND_PATTERNS if pattern.fullmatch(asked)), "other")


def by_kind(run, convs: list[Conversation]) -> dict[str, float]:
    """The share of exact greedy answers of each kind."""
    right = right_answers(run.model.eval(), run.tokenizer, run_template(run.path), convs)
    asked, hits = Counter(), Counter()
    for c, ok in zip(convs, right, strict=True):
        asked[kind_of(c)] += 1
        hits[kind_of(c)] += ok
    return {kind: hits[kind] / asked[kind] for kind in asked}


def stage_row(path: Path, seconds: float | None, test: list[Conversation]) -> dict[str, Any]:
    run = load(path)
    weights = next(run.model.parameters())
    row = {
        "stage": path.name,
        "task": run.task.name,
        "parameters": count_parameters(run.model).logical,
        "dtype": str(weights.dtype).removeprefix("torch."),
        "seconds": seconds,
        **{k: v for k, v in _eval(path).items() if k != "split"},
    }
    if answers(run, row):
        row["by_kind"] = by_kind(run, test)
    return row


def answers(run, row: dict[str, Any]) -> bool:
    """A stage whose model answers instructions: its own scores are exact answers, or it has none and
    is a language model (the base); a reward model scores pairs and answers nothing."""
    scored = {k for k in row if k in ("exact", "pair_accuracy", "preference_accuracy")}
    return "exact" in scored or (not scored and isinstance(run.model, CausalLM))


def _eval(path: Path) -> dict:
    return read_json(path / "eval.json") if (path / "eval.json").is_file() else {}


def chain_report(root: str | Path) -> dict[str, Any]:
    """The numbers of the report card of the chain in `root`."""
    root = Path(root)
    if not (root / "chain.json").is_file():
        raise AttnlabError(
            f"{root} is not a chat demo's folder (no chain.json): give the --out of `attnlab demo --chat`"
        )
    record = read_json(root / "chain.json")
    test = instructions("test", TEST, TEST_SEED)
    stages = [root / s for s in STAGES if is_run(root / s)]
    rows = [stage_row(p, record.get("seconds", {}).get(p.name), test) for p in stages]
    return {
        "rows": rows,
        "numbers": record.get("numbers", {}),
        "seconds": record.get("seconds", {}),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()}",
        "commit": commit(),
        "attnlab": __version__,
        "written": time.strftime("%Y-%m-%d %H:%M"),
    }


def commit() -> str:
    """The git commit attnlab's code is at (an editable install), or `unknown`."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _percent(v: Any) -> str:
    return f"{v:.1%}" if isinstance(v, (int, float)) else ""


def table(report: dict[str, Any]) -> list[list[str]]:
    """The card's table: a header row, then a row a stage."""
    rows = [["stage", "task", "exact (held-out)", "pairs ranked right", "seconds", "parameters", "dtype"]]
    for r in report["rows"]:
        exact = r.get("exact", report["numbers"].get("exact_before") if r["stage"] == "base" else None)
        pairs = r.get("preference_accuracy", r.get("pair_accuracy"))
        seconds = f"{r['seconds']:.0f}" if r.get("seconds") is not None else ""
        rows.append(
            [r["stage"], str(r["task"]), _percent(exact), _percent(pairs), seconds, f"{r['parameters']:,}", r["dtype"]]
        )
    return rows


def draw(report: dict[str, Any], path: Path):
    """Exact answers by kind, a bar per answering stage."""
    plt = pyplot()
    answering = [r for r in report["rows"] if "by_kind" in r]
    kinds = sorted({k for r in answering for k in r["by_kind"]})
    fig, ax = plt.subplots(figsize=(max(6, len(kinds) * 0.9), 3.6))
    width = 0.8 / max(1, len(answering))
    for i, r in enumerate(answering):
        xs = [k + i * width for k in range(len(kinds))]
        ax.bar(xs, [100 * r["by_kind"].get(k, 0.0) for k in kinds], width, label=r["stage"])
    ax.set_xticks([k + width * (len(answering) - 1) / 2 for k in range(len(kinds))], kinds, rotation=30, ha="right")
    ax.set_ylabel("exact answers (%)")
    ax.set_ylim(0, 105)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title("held-out instructions by kind, greedy")
    fig.tight_layout()
    return save_figure(fig, path)


def markdown(report: dict[str, Any], picture: str) -> str:
    rows = table(report)
    cells = ["| " + " | ".join(r) + " |" for r in rows]
    lines = [
        "# The chain's report card",
        "",
        *_meta(report),
        "",
        cells[0],
        "|" + "---|" * len(rows[0]),
        *cells[1:],
        "",
        f"![exact answers by kind]({picture})",
        "",
    ]
    return "\n".join(lines)


def _meta(report: dict[str, Any]) -> list[str]:
    plain, best = report["numbers"].get("sampled_vs_best", [None, None])
    minutes = sum(report["seconds"].values()) / 60
    lines = [
        f"- machine: {report['machine']}",
        f"- attnlab {report['attnlab']}, commit {report['commit']}",
        f"- written {report['written']}; the chain took {minutes:.1f} minutes",
    ]
    if plain is not None:
        lines.append(
            f"- sampling at temperature 1: one sample {plain:.1%} exact, best-of-8 picked by the reward "
            f"model {best:.1%}"
        )
    return lines


def page(report: dict[str, Any], png: bytes) -> str:
    rows = table(report)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    meta = "".join(f"<li>{html.escape(m[2:])}</li>" for m in _meta(report))
    image = base64.b64encode(png).decode()
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>attnlab report</title><style>{STYLE}</style>"
        f"</head><body><h1>The chain's report card</h1><ul>{meta}</ul><table><tr>{head}</tr>{body}</table>"
        f"<img alt='exact answers by kind' src='data:image/png;base64,{image}'></body></html>"
    )


STYLE = (
    "body{font:14px system-ui,sans-serif;margin:1em 2em;color:#222}table{border-collapse:collapse}"
    "th,td{border-bottom:1px solid #ddd;padding:3px 10px;text-align:right}img{max-width:100%}"
)


def write_report(root: str | Path) -> dict[str, Any]:
    """OUT/report.md, OUT/report.png and OUT/report.html; the numbers and the paths written."""
    root = Path(root)
    report = chain_report(root)
    picture = draw(report, root / "report.png")
    atomic_write(root / "report.md", lambda tmp: tmp.write_text(markdown(report, "report.png"), encoding="utf-8"))
    atomic_write(root / "report.html", lambda tmp: tmp.write_text(page(report, picture.data), encoding="utf-8"))
    return {**report, "files": [str(root / f) for f in ("report.md", "report.png", "report.html")]}
