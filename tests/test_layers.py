"""One floor at a time: every import of every module goes down the floor table of docs/architecture.md.

The table is read from the document itself, so the picture a reader sees is the rule the test holds.
Every import counts: at the top, inside functions, under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnlab"
DOC = ROOT / "docs" / "architecture.md"
MOST_INSIDE_FUNCTIONS = 15  # imports kept inside functions: heavy libraries a command may never need
# Packages that may not import one another although their floors would allow it: the server asks a
# run's task (run.task) and never imports a task module.
NEVER = {("serve", "tasks")}


def floor_table() -> dict[str, int]:
    """{package: floor} from the table between the floor markers of docs/architecture.md."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("<!-- floors") : text.index("<!-- end floors -->")]
    floors = {}
    for line in table.splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|([^|]+)\|", line)
        if row:
            for name in re.findall(r"`([\w.]+)`", row.group(2)):
                floors[name] = int(row.group(1))
    return floors


@dataclass
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (attnlab.x.y, or a library's name)
    line: int
    in_function: bool
    text: str  # the source line, with its comment


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(module: str, node: ast.ImportFrom | ast.Import, is_package: bool) -> list[str]:
    """The modules an import statement reads (a `from x import y` names x.y when y is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module.split(".") if is_package else module.split(".")[:-1]
    prefix = ".".join(base[: len(base) - node.level + 1] + [node.module or ""]) if node.level else node.module
    out = []
    for alias in node.names:
        candidate = f"{prefix}.{alias.name}"
        exists = (ROOT / Path(*candidate.split("."))).with_suffix(".py").is_file()
        out.append(candidate if exists or (ROOT / Path(*candidate.split("."))).is_dir() else prefix)
    return out


@functools.cache
def imports() -> list[Import]:
    """Every import statement of the package, each with the modules it reads."""
    found: list[Import] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        module = module_name(path)
        collect(ast.parse(source), module, path.name == "__init__.py", source.splitlines(), False, found)
    return found


def collect(node: ast.AST, module: str, is_package: bool, lines: list[str], inside: bool, found: list) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            for target in resolve(module, child, is_package):
                found.append(Import(module, target, child.lineno, inside, lines[child.lineno - 1]))
        in_function = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
        collect(child, module, is_package, lines, in_function, found)


def package_of(module: str) -> str:
    """attnlab.tasks.lm -> tasks; attnlab.io -> io; attnlab and attnlab.__main__ -> attnlab."""
    parts = module.split(".")
    return "attnlab" if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def internal() -> list[Import]:
    """attnlab's imports of attnlab."""
    return [i for i in imports() if i.target.split(".")[0] == "attnlab"]


def test_the_table_names_every_package_once():
    floors = floor_table()
    on_disk = {package_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert on_disk - set(floors) == set(), "a package without a floor: add it to docs/architecture.md"
    assert set(floors) - on_disk == set(), "the table names a package that is not there"


def test_every_import_goes_down_a_floor():
    floors = floor_table()
    wrong = []
    for i in internal():
        a, b = package_of(i.source), package_of(i.target)
        if a != b and (floors[b] >= floors[a] or (a, b) in NEVER):
            wrong.append(f"{i.source}:{i.line} imports {i.target} ({a} is floor {floors[a]}, {b} floor {floors[b]})")
    assert wrong == []


def test_the_packages_form_no_cycle():
    """Implied by the floors, and checked on its own: the package graph, every import counted, is a DAG."""
    graph: dict[str, set[str]] = {}
    for i in internal():
        a, b = package_of(i.source), package_of(i.target)
        if a != b:
            graph.setdefault(a, set()).add(b)
    done, path = set(), []

    def visit(node: str) -> None:
        assert node not in path, f"cycle: {' -> '.join(path[path.index(node) :] + [node])}"
        if node in done:
            return
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_imports_inside_functions_are_few_and_say_why():
    inside = [i for i in imports() if i.in_function]
    statements = {(i.source, i.line): i for i in inside}
    assert len(statements) <= MOST_INSIDE_FUNCTIONS, sorted(statements)
    unmarked = [f"{i.source}:{i.line}" for i in statements.values() if "#" not in i.text]
    assert unmarked == [], "an import inside a function says on its line which heavy library it defers"
    ours = [
        f"{i.source}:{i.line}" for i in inside if i.target.startswith("attnlab.") and package_of(i.target) != "serve"
    ]
    assert ours == [], "attnlab's own modules are imported at the top (only the web stack is deferred)"


HEAVY = (
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "matplotlib",
    "numba",
    "fastapi",
    "sklearn",
    "scipy.sparse.csgraph",
    "onnx",
    "torch.utils.tensorboard",
    "IPython.display",
)


def test_the_command_line_starts_without_the_heavy_libraries():
    """What the imports inside functions are for: building `attnlab`'s parser loads none of them."""
    code = f"import sys, attnlab.cli.main as m; m.build_parser(); print([n for n in {HEAVY!r} if n in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_git_keeps_every_file_of_the_package():
    """A package whose name an ignore rule matches (`runs/`, the users' run folders) would be missing
    from every clone: no file under attnlab/ may be ignored."""
    files = "\n".join(
        str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    try:
        found = subprocess.run(
            ["git", "check-ignore", "--no-index", "--stdin"], input=files, capture_output=True, text=True, cwd=ROOT
        )
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if found.returncode == 128:  # not a git checkout (an unpacked sdist): nothing to check
        pytest.skip(found.stderr.strip())
    assert found.stdout.split() == [], "ignored by .gitignore"
