"""The generated parts of the documentation site, written into build/docs/ (git ignores build/).

- The command reference: one page per command (and per `train` task) from the parser that
  `attnlab.cli.main.build_parser()` builds, so every flag appears with its help, choices and default.
- The lessons: each lessons/NN_name.py as its executed notebook. build/lessons/NN_name.ipynb (what
  `python lessons/execute.py lessons/[0-9]*.py --out build/lessons` writes) is used while the source hash
  recorded in it matches the lesson; otherwise the lesson is executed again, and the notebook kept
  there. tests/test_docs_site.py points $ATTNLAB_LESSONS_BUILD at its own quick notebooks instead.

docs/hooks.py calls `generate` while mkdocs builds;  `python docs/gen.py` writes the pages alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Pages made here are added to the site by docs/hooks.py ($ATTNLAB_DOCS_GEN moves them: the tests use a temporary one).
OUT = Path(os.environ.get("ATTNLAB_DOCS_GEN") or ROOT / "build" / "docs")
LESSONS = ROOT / "lessons"
# Where lessons/execute.py writes notebooks ($ATTNLAB_LESSONS_BUILD: elsewhere, e.g. the test's quick ones).
EXECUTED = Path(os.environ.get("ATTNLAB_LESSONS_BUILD") or ROOT / "build" / "lessons")
CLI = "reference/cli"  # the command pages, relative to the site's root


# --- the command reference ---------------------------------------------------------------------


Command = tuple[tuple[str, ...], argparse.ArgumentParser, str]  # (words after `attnlab`, parser, one-line help)


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[Command]:
    """Every command under `parser`, depth first: (its words after `attnlab`, its parser, its one-line help)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append(((*path, name), sub, helps.get(name, "")))
                found.extend(commands(sub, (*path, name)))
    return found


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's own arguments (flags and positionals), without --help and the sub-command slot."""
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def page_name(path: tuple[str, ...]) -> str:
    return "-".join(path) + ".md"


def _text(text: str) -> str:
    """argparse help as Markdown text: nothing read as markup or as an HTML tag."""
    text = text.replace("\\", "\\\\").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([*_`\[\]|])", r"\\\1", text)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.help in (None, argparse.SUPPRESS):
        return ""
    return parser._get_formatter()._expand_help(action)  # fills %(default)s and the like, as --help does


def _argument(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.option_strings:
        metavar = "" if action.nargs == 0 else " " + parser._get_formatter()._format_args(action, action.dest.upper())
        names = ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)
    else:
        names = f"`{action.metavar or action.dest}`"
    notes = []
    if not action.option_strings and action.nargs in ("?", "*", "+"):
        notes.append({"?": "optional", "*": "any number", "+": "one or more"}[action.nargs])
    if action.choices is not None and not isinstance(action.choices, dict) and "{" not in names:
        notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    default, help = action.default, _help(parser, action)
    if action.option_strings and action.nargs != 0 and default not in (None, argparse.SUPPRESS, "", [], ()):
        if "default" not in help:  # most helps say their default already
            notes.append(f"default `{default}`")
    extra = f" ({'; '.join(notes)})" if notes else ""
    return f"- {names}{extra}\n\n    {_text(help)}".rstrip() + "\n"


def usage(parser: argparse.ArgumentParser) -> str:
    """argparse's usage without its "usage: " prefix, the wrapped lines moved left by as much."""
    first, *rest = parser.format_usage().strip().splitlines()
    cut = len("usage: ")
    return "\n".join([first[cut:], *(line[cut:] if line[:cut].isspace() else line for line in rest)])


def command_page(path: tuple[str, ...], parser: argparse.ArgumentParser, summary: str, children) -> str:
    title = " ".join(("attnlab", *path))
    lines = [f"# {title}", ""]
    about = parser.description or summary
    if about:
        lines += [_text(about), ""]
    lines += ["```text", usage(parser), "```", ""]
    if children:
        lines += ["| command | what it does |", "|---|---|"]
        for child, _, help in children:
            lines.append(f"| [`{' '.join(child)}`]({page_name(child)}) | {_text(help)} |")
        lines.append("")
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a in options(parser)]
        if not actions:
            continue
        heading = {"options": "Options", "optional arguments": "Options", "positional arguments": "Arguments"}
        lines += [f"## {heading.get(group.title, (group.title or 'Options').capitalize())}", ""]
        if group.description:
            lines += [_text(group.description), ""]
        lines += [_argument(parser, a) for a in actions]
    return "\n".join(lines).rstrip() + "\n"


def write_cli(out: Path = OUT) -> list[tuple[str, str]]:
    """Write the command pages under out/reference/cli/; return the navigation: (title, page) per command."""
    from attnlab.cli.main import build_parser  # imports torch: only when the reference is built

    folder = out / CLI
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    parser = build_parser()
    found = commands(parser)
    index = [
        "# Command reference",
        "",
        "Every `attnlab` command with every flag, generated from the parser itself (`attnlab COMMAND "
        "--help` prints the same). `attnlab train TASK` has one page per task.",
        "",
        "```text",
        usage(parser),
        "```",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    nav = [("Overview", f"{CLI}/index.md")]
    for path, sub, summary in found:
        children = [c for c in found if len(c[0]) == len(path) + 1 and c[0][: len(path)] == path]
        (folder / page_name(path)).write_text(command_page(path, sub, summary, children))
        index.append(f"| [`attnlab {' '.join(path)}`]({page_name(path)}) | {_text(summary)} |")
        nav.append((" ".join(path), f"{CLI}/{page_name(path)}"))
    (folder / "index.md").write_text("\n".join(index) + "\n")
    return nav


# --- the lessons ---------------------------------------------------------------------------------


def _executor():
    """lessons/execute.py, imported by its path (lessons/ is not a package)."""
    spec = importlib.util.spec_from_file_location("attnlab_lessons_execute", LESSONS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lesson_files() -> list[Path]:
    return sorted(LESSONS.glob("[0-9][0-9]_*.py"))


def _title(notebook: Path, fallback: str) -> str:
    import nbformat  # the notebook extra: only when lessons are rendered

    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
            break
    return fallback


def executed_notebook(lesson: Path, log=print) -> Path:
    """build/lessons/<lesson>.ipynb, executed again first if it is missing or older than the lesson."""
    import nbformat  # the notebook extra: only when lessons are rendered

    executor = _executor()
    notebook = EXECUTED / (lesson.stem + ".ipynb")
    try:
        if executor.is_current(notebook, lesson):
            return notebook
    except (OSError, ValueError):  # missing, or half-written by lessons/execute.py in another process
        pass
    log(f"executing lessons/{lesson.name} (no current notebook in {EXECUTED})")
    executed, _ = executor.execute(lesson)
    EXECUTED.mkdir(parents=True, exist_ok=True)
    partial = notebook.with_suffix(f".{os.getpid()}.part")  # renamed into place: a reader never sees half of it
    nbformat.write(executed, partial)
    os.replace(partial, notebook)
    return notebook


def write_lessons(out: Path = OUT, log=print) -> list[tuple[str, str]]:
    """Copy each lesson's executed notebook to out/lessons/ and write their index; return the navigation."""
    folder = out / "lessons"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    nav = [("Overview", "lessons/index.md")]
    index = [
        "# Lessons",
        "",
        "Each lesson is a Python file in `lessons/` that runs as a script, opens as a notebook and is "
        "executed top to bottom by `make test`; here each is shown executed, with its pictures. How to run "
        "them and their conventions: `lessons/README.md`.",
        "",
    ]
    lessons = lesson_files()
    if not lessons:
        index.append("No lessons yet.")
    for lesson in lessons:
        notebook = executed_notebook(lesson, log)
        shutil.copyfile(notebook, folder / notebook.name)
        title = _title(notebook, lesson.stem)
        index.append(f"- [{title}]({notebook.name}) (`lessons/{lesson.name}`)")
        nav.append((title, f"lessons/{notebook.name}"))
    (folder / "index.md").write_text("\n".join(index) + "\n")
    return nav


def generate(out: Path = OUT, log=print) -> dict[str, list[tuple[str, str]]]:
    """Write every generated page; return the navigation of each generated section, by its index page."""
    return {f"{CLI}/index.md": write_cli(out), "lessons/index.md": write_lessons(out, log)}


if __name__ == "__main__":
    for section, pages in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT).items():
        print(f"{section}: {len(pages)} pages")
