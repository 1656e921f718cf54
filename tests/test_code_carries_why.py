"""The code carries the why, the docs carry the history: few measurement lines under attnlab/.

A comment may give the reason for a choice in a short clause and point at the page that holds the
figures ("measured faster at up to 32 rows here: docs/cpu.md#batched-rows"). The figures themselves
(tokens/s, GB/s, speed-ups, seconds on so many cores), the machines they came from, and their dates
live in docs/log.md, docs/cpu.md and docs/interop.md, where the next measurement can be set beside
them. This test reads every docstring and comment under attnlab/, sentence by sentence, and counts
the lines of sentences that carry a measurement:
  - a throughput (`12 tokens/s`, `16 GB/s`), a machine by name (EPYC, Xeon, Zen 4, H100) or a time
    stamp (`2026-11-27 03:48`), or a speed-up (`2.4x faster`);
  - or a figure (`40 ms`, `2.3 s`, `20x`, `464 MB`) beside where or how it was measured
    ("measured", "on 2 cores", "a CPU", "took", "ran", "faster", "slower", "here").
A cost named without a figure ("torch is slow to import"), or a figure without a measurement (a
default's size, an example's output), is not one. Run this file with python to list the lines.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The most measurement lines allowed under attnlab/: the ones left in packages whose docstrings were
# being rewritten while the others' moved to the docs (issue 52). Lower it as they move; never raise it.
CEILING = 0

STRONG = re.compile(
    r"\d(?:[\d,.]*\d)? ?(?:tokens|tok|steps)/s\b|\d ?[KMG]i?B/s\b"  # a throughput
    r"|\bEPYC\b|\bXeon\b|\bZen ?\d|Sapphire Rapids|\bRyzen\b|\bGraviton\b|\b[AHL]\d00\b|\bH200\b"  # a machine
    r"|\b20\d\d-\d\d-\d\d \d\d:\d\d"  # a time stamp
    r"|\d(?:\.\d+)?x (?:faster|slower|as long|as fast)"  # a speed-up
)
FIGURE = re.compile(r"\d ?(?:ms|us|µs)\b|\d s\b|\d(?:\.\d+)?x(?![\w])|\d ?[KMG]i?B\b|\d%")
CONTEXT = re.compile(  # where or how a figure was measured
    r"\b(?:[Mm]easured|took|ran|faster|slower|here)\b|\b(?:on|of) (?:a |one |the )?CPU\b|\d[- ]cores?\b"
)
SENTENCE_END = re.compile(r"[.;!?](?=\s)|\n\s*\n")  # a full stop, or a blank line


def prose_blocks(src: str) -> list[list[tuple[int, str]]]:
    """The docstrings (every bare string statement) and runs of comment lines of one file, each as
    (line number, text) lines."""
    lines = src.splitlines()
    blocks = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            blocks.append([(n, lines[n - 1]) for n in range(node.lineno, node.end_lineno + 1)])
    run: list[tuple[int, str]] = []  # comment lines one under the other; a trailing one stands alone
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type != tokenize.COMMENT:
            continue
        alone = tok.line.lstrip().startswith("#")
        if run and not (alone and tok.start[0] == run[-1][0] + 1):
            blocks.append(run)
            run = []
        run.append((tok.start[0], tok.string.lstrip("#")))
        if not alone:
            blocks.append(run)
            run = []
    return blocks + ([run] if run else [])


def is_measurement(sentence: str) -> bool:
    """Whether one sentence carries a measurement (see the module docstring)."""
    return bool(STRONG.search(sentence) or (FIGURE.search(sentence) and CONTEXT.search(sentence)))


def measurement_lines(src: str) -> list[int]:
    """The line numbers of one file's docstring and comment lines that hold a figure (or a machine's
    name) of a sentence that carries a measurement."""
    found = set()
    for block in prose_blocks(src):
        text = "\n".join(t for _, t in block)
        begin = 0
        for end in [m.end() for m in SENTENCE_END.finditer(text)] + [len(text)]:
            sentence = text[begin:end]
            if is_measurement(sentence):
                for m in [*STRONG.finditer(sentence), *FIGURE.finditer(sentence)]:
                    found.add(block[text.count("\n", 0, begin + m.start())][0])
            begin = end
    return sorted(found)


def all_measurement_lines() -> list[tuple[str, int, str]]:
    """(file, line, text) for every measurement line under attnlab/."""
    out = []
    for py in sorted((ROOT / "attnlab").rglob("*.py")):
        src = py.read_text(encoding="utf-8")
        lines = src.splitlines()
        out += [(str(py.relative_to(ROOT)), n, lines[n - 1].strip()) for n in measurement_lines(src)]
    return out


SECTION = re.compile(r'docs/([\w-]+\.md)(?:#([\w-]+)|,\s+"([^"]+)")')  # docs/cpu.md#a-b, docs/log.md, "Data"


def slug(heading: str) -> str:
    """A heading's anchor as the docs site makes it (Python-Markdown's toc)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


def headings(page: Path) -> list[str]:
    return [
        line.lstrip("#").strip() for line in page.read_text(encoding="utf-8").splitlines() if re.match(r"#+ ", line)
    ]


def section_pointers() -> list[tuple[str, str, str | None, str | None]]:
    """(file, page, anchor, title) for every docs section a docstring or comment under attnlab/ names."""
    out = []
    for py in sorted((ROOT / "attnlab").rglob("*.py")):
        for block in prose_blocks(py.read_text(encoding="utf-8")):
            text = re.sub(r"\s+", " ", " ".join(t for _, t in block))
            out += [(str(py.relative_to(ROOT)), *m.groups()) for m in SECTION.finditer(text)]
    return out


def test_the_docs_sections_the_code_points_at_exist():
    pointers = section_pointers()
    assert len(pointers) > 20  # the pointers left where the figures moved out
    missing = []
    for where, page, anchor, title in pointers:
        path = ROOT / "docs" / page
        found = headings(path) if path.exists() else []
        if anchor and anchor not in map(slug, found):
            missing.append(f"{where}: docs/{page}#{anchor}")
        if title and not any(h == title or h.startswith(title + ":") for h in found):
            missing.append(f'{where}: docs/{page}, "{title}"')
    assert missing == [], "pointers to docs sections that are not there:\n" + "\n".join(missing)


def test_measurements_live_in_the_docs():
    found = all_measurement_lines()
    listing = "\n".join(f"{f}:{n}: {t}" for f, n, t in found)
    assert len(found) <= CEILING, (
        f"{len(found)} docstring or comment lines under attnlab/ carry measurements (at most {CEILING}): "
        "move the figures, their machine and command to docs/log.md or docs/cpu.md and keep the why "
        "in a clause that points there\n" + listing
    )


def test_the_finder_tells_a_measurement_from_a_why():
    src = '''"""The kernel reads 16 GB/s. It is the fast path on AVX-512 CPUs.

Packed layers ran 2.4x faster
at 3072 x 768 on 2 cores. A 500 KB file can hold a 13000x13000 PNG."""
# matplotlib: 1 s to import, paid only by what draws
y = 2
# measured faster at up to 32 rows here: docs/cpu.md#batched-rows
x = 1  # on an AMD EPYC with AVX512-BF16
# a loaded machine took
# 10-29 s for three rounds; see docs/log.md
'''
    assert measurement_lines(src) == [1, 3, 8, 10]
    assert slug("Sharing the machine: threads") == "sharing-the-machine-threads"
    pointer = 'see docs/cpu.md#how-fast and docs/log.md, "Packed layers"'
    assert [m.groups() for m in SECTION.finditer(pointer)] == [
        ("cpu.md", "how-fast", None),
        ("log.md", None, "Packed layers"),
    ]


if __name__ == "__main__":  # list the lines and their count per package
    found = all_measurement_lines()
    for f, n, t in found:
        print(f"{f}:{n}: {t}")
    per = Counter(f.split("/")[1].removesuffix(".py") for f, _, _ in found)
    print(dict(sorted(per.items())), "total", len(found), file=sys.stderr)
