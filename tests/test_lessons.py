"""The lessons' exercises: each check accepts its worked answer and rejects a wrong one with a message
(lessons/README.md). The lessons themselves are executed as notebooks by tests/test_docs_site.py, in
the same module as the site that renders them."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbclient", reason="the lessons run as notebooks: pip install -e '.[notebook]'")
pytest.importorskip("jupytext", reason="the lessons run as notebooks: pip install -e '.[notebook]'")

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
SOLUTION_FILES = sorted((LESSONS / "solutions").glob("[0-9][0-9]_*.py"))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lessons_on_path():
    """lessons/ importable as the lessons see it (`from checks.attention import ...`)."""
    sys.path.insert(0, str(LESSONS))
    yield
    sys.path.remove(str(LESSONS))


def _answers():
    for path in SOLUTION_FILES:
        module = _load(path, f"lesson_solutions_{path.stem}")
        for key, answer in module.ANSWERS.items():
            yield pytest.param(key, answer, id=f"{path.stem}:{key}")


@pytest.mark.parametrize("key, answer", list(_answers()))
def test_check_accepts_solution_rejects_wrong(key, answer, lessons_on_path, capsys):
    from checks._common import WrongAnswer

    theme, name = key.rsplit(".", 1)
    check = getattr(importlib.import_module(f"checks.{theme}"), name)
    good, bad, *word = answer
    check(good)
    assert "Correct" in capsys.readouterr().out, f"{key} printed no success line for the worked answer"
    with pytest.raises(WrongAnswer) as wrong:
        check(bad)
    message = str(wrong.value)
    assert message, f"{key} rejected the wrong answer without a message"
    if word:
        assert word[0].lower() in message.lower(), f"{key}: {message!r} does not mention {word[0]!r}"


def test_unfilled_stub_does_not_fail(lessons_on_path, capsys):
    from checks._common import exercise

    @exercise
    def check_something(answer):
        answer()

    def stub():
        raise NotImplementedError

    check_something(stub)
    assert "not done yet" in capsys.readouterr().out


def test_stale_notebook_is_told(tmp_path):
    execute = _load(LESSONS / "execute.py", "lessons_execute")
    import nbformat

    lesson = tmp_path / "00_tiny.py"
    lesson.write_text("# %%\nx = 1\n")
    nb = nbformat.v4.new_notebook(metadata={"attnlab": {"source_sha256": execute.source_hash(lesson)}})
    nbformat.write(nb, tmp_path / "00_tiny.ipynb")
    assert execute.is_current(tmp_path / "00_tiny.ipynb", lesson)
    lesson.write_text("# %%\nx = 2\n")
    assert not execute.is_current(tmp_path / "00_tiny.ipynb", lesson)


def test_settings_replace_the_first_cells_values_in_a_cell_of_their_own():
    """The quick run of tests/test_docs_site.py: its values come after the lesson's settings cell, so they
    win; a name that cell does not set is refused (a renamed setting would leave a run at full size)."""
    execute = _load(LESSONS / "execute.py", "lessons_execute")
    import jupytext

    nb = jupytext.reads(
        "# %% [markdown]\n# Lesson\n\n# %%\nSCALE = 1\nSTEPS = 150 * SCALE\n\n# %%\nx = STEPS\n", "py:percent"
    )
    execute.with_settings(nb, {"STEPS": 30}, "00_tiny.py")
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code", "code"]
    assert nb.cells[2].source.endswith("\nSTEPS = 30") and nb.cells[2].metadata["tags"] == ["injected-settings"]
    namespace: dict = {}
    for cell in nb.cells[1:]:
        exec(cell.source, namespace)
    assert namespace["x"] == 30
    with pytest.raises(ValueError, match="00_tiny.py's first code cell sets no EPOCHS"):
        execute.with_settings(nb, {"EPOCHS": 1}, "00_tiny.py")
