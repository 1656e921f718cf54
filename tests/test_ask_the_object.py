"""Ask the object, never the name: no comparison against a task's, family's, model's, head's, view's or
position scheme's name outside the registries that hold them, and no hasattr/getattr probe of a model.
A tool asks a run's task (runs/kind.py), a model's protocols (models/protocols.py) or a registry."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from attnlab.interpret.plots import PLOTS
from attnlab.interpret.report import INSPECTIONS
from attnlab.interpret.views import VIEW_NAMES
from attnlab.models import FAMILIES
from attnlab.models.encoder import HEADS
from attnlab.nn.position import POSITIONS
from attnlab.tasks import TASKS
from attnlab.tasks.compare import COMPARISONS

PACKAGE = Path(__file__).resolve().parent.parent / "attnlab"
# What names a thing the registries own ("none" and the metrics' "loss" and "lr" are also plain words).
NAMES = (
    {*TASKS, *FAMILIES, *HEADS, *INSPECTIONS, *PLOTS, *VIEW_NAMES, *POSITIONS, *COMPARISONS}
    | {name for task in TASKS.values() for name in task.models}
) - {"none", "loss", "lr"}


def strings(node: ast.AST) -> list[str]:
    """The string constants a comparison's operand is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


@functools.cache  # both tests read the one walk
def calls_and_compares() -> tuple[list[str], list[str]]:
    named, probes = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Compare):
                if any(s in NAMES for side in (node.left, *node.comparators) for s in strings(side)):
                    named.append(f"{where} {ast.unparse(node)}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                if node.func.id in ("hasattr", "getattr") and "model" in ast.unparse(node.args[0]):
                    probes.append(f"{where} {ast.unparse(node)}")
    return named, probes


def test_the_names_registries_hold_are_never_compared():
    assert len(NAMES) > 40  # tasks, families, models, heads, views, inspections, plots, positions, comparisons
    named, _ = calls_and_compares()
    assert named == []


def test_no_model_is_probed_for_what_it_has():
    _, probes = calls_and_compares()
    assert probes == []
