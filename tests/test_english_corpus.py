"""The built-in English corpus (data/english.py): docstrings and comments of Python sources, read
with tokenize, code-like paragraphs dropped."""

from __future__ import annotations

from attnlab.data.english import english_text, prose, source_paragraphs

SOURCE = '''"""A module docstring that says what the module is for.

Its second paragraph explains a little more about it."""

import os  # the operating system module, imported for paths

# A comment of two lines that together
# make one paragraph of plain English.

# x = compute(y)


def f(a):
    """Return the argument unchanged, as a teaching example."""
    s = "a string in an expression is not a docstring"
    "but a bare string statement is one, as Python reads it"
    return a  # noqa


class C:
    """
    >>> C().g()
    3
    """
'''


def test_docstrings_and_comment_runs_are_the_paragraphs():
    found = list(source_paragraphs(SOURCE))
    assert found[:2] == [
        "A module docstring that says what the module is for.",
        "Its second paragraph explains a little more about it.",
    ]
    assert "the operating system module, imported for paths" in found
    assert "A comment of two lines that together\nmake one paragraph of plain English." in found
    assert "Return the argument unchanged, as a teaching example." in found
    assert "but a bare string statement is one, as Python reads it" in found
    assert not any("in an expression" in p for p in found)


def test_code_and_short_fragments_are_not_prose():
    assert prose("x = compute(y)") is None
    assert prose("noqa") is None
    assert prose(">>> C().g()\n3") is None
    assert prose("A comment of two lines that together\nmake one paragraph.") == (
        "A comment of two lines that together make one paragraph."
    )


def test_english_text_of_files_one_paragraph_per_line(tmp_path):
    (tmp_path / "m.py").write_text(SOURCE)
    (tmp_path / "broken.py").write_text('"""unterminated\n')  # does not tokenize: skipped
    text = english_text([tmp_path / "broken.py", tmp_path / "m.py"])
    lines = text.splitlines()
    assert lines[0] == "A module docstring that says what the module is for."
    assert "A comment of two lines that together make one paragraph of plain English." in lines
    assert not any(">>>" in line or "compute(" in line for line in lines)
    assert english_text([tmp_path / "m.py"], max_chars=60) == lines[0]
