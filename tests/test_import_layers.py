"""The package's import graph keeps its floors: every import goes down ``LAYERS`` or
sideways among peers, no folder loop, no file circle. An AST walk of every module, so
imports inside functions and under ``TYPE_CHECKING`` count too."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dispersion_titan"
ROOT = "<root>"  # the modules at the package root: the commands and __init__

LAYERS: tuple[tuple[str, ...], ...] = (
    (ROOT,),  # entry points: the commands, torchrun, and every package's __main__
    ("planning",),  # plan's work: its layout, its step measured on the trainer as rank 0 of N, its tables
    ("trainer",),  # imported only by the training command, its torchrun and planning (which measures its step)
    ("analysis", "evaluation", "reproduce", "job_config"),
    ("run_folder",),  # run-folder I/O: checkpoint discovery, run.json, offline loading, HF export
    ("models",),
    ("components",),  # TorchTitan's extension points, as torchtitan/components
    ("losses", "data", "config"),
    ("tokenizer",),
    ("utils",),
)
"""Top to bottom: a folder imports from its own row or the rows below it, never above. Floors are
numbered from the ground: the last row (``utils``) is floor 1, as ``docs/code_map.md`` numbers them."""

KNOWN_FILE_CIRCLES: set[frozenset[str]] = set()


def module_names(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by its dotted name below the package (``""`` for its
    ``__init__``, ``"models.gpt2"`` for that folder's ``__init__``)."""
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported_modules(name: str, path: Path, modules: Iterable[str], package: str) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports, anywhere in the file."""
    known = set(modules)
    own = name.split(".") if name else []
    here = own if path.name == "__init__.py" else own[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                target = ".".join([package, *base])
            else:
                target = node.module or ""
            children = [f"{target}.{alias.name}" for alias in node.names]
            targets = [c for c in children if _inside(c, package) in known]
            if len(targets) < len(children):
                targets.append(target)
        else:
            continue
        for target in targets:
            inside = _inside(target, package)
            while inside is not None and inside not in known:  # import a.b.c: the deepest module
                inside = inside.rpartition(".")[0] if inside else None
            if inside is not None and inside != name:
                found.add(inside)
    return found


def _inside(dotted: str, package: str) -> str | None:
    if dotted == package:
        return ""
    return dotted[len(package) + 1 :] if dotted.startswith(package + ".") else None


def folder(package: Path, path: Path) -> str:
    """The top-level folder holding the module at ``path``; ``ROOT`` for the package root's and
    for every ``__main__.py``, which is an entry point wherever it lives."""
    parts = path.relative_to(package).parts
    return parts[0] if len(parts) > 1 and path.name != "__main__.py" else ROOT


def import_graph(package: Path) -> dict[str, set[str]]:
    modules = module_names(package)
    return {name: imported_modules(name, path, modules, package.name) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_violations(package: Path, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Every undeclared folder, climbing import, folder loop and file circle, one line each."""
    graph = import_graph(package)
    rank = {name: row for row, names in enumerate(layers) for name in names}
    folders = {name: folder(package, path) for name, path in module_names(package).items()}
    problems = [f"{f}/ is in no layer: add it to LAYERS" for f in sorted(set(folders.values()) - set(rank))]
    folder_graph: dict[str, set[str]] = {}
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = folders[source], folders[target]
            if a == b or a not in rank or b not in rank:
                continue
            folder_graph.setdefault(a, set()).add(b)
            if rank[b] < rank[a]:
                problems.append(f"{source or ROOT} imports {target or ROOT}: {b} is above {a}")
    problems += [f"folder loop: {' <-> '.join(sorted(loop))}" for loop in cycles(folder_graph)]
    problems += [
        f"file circle: {' <-> '.join(sorted(loop))}" for loop in cycles(graph) if loop not in KNOWN_FILE_CIRCLES
    ]
    return problems


def test_the_package_keeps_its_layers():
    assert layer_violations(PACKAGE) == []


def test_only_the_commands_that_build_the_trainer_import_it():
    """Training, its torchrun, and planning, which builds it as rank 0 of the planned world
    (``plan``, ``sweep --plan`` and ``paper --plan``)."""
    graph = import_graph(PACKAGE)
    importers = {
        source.partition(".")[0]
        for source, targets in graph.items()
        if not source.startswith("trainer")
        for target in targets
        if target.startswith("trainer")
    }
    assert importers == {"train", "torchrun", "planning"}


def test_the_torchrun_launcher_imports_no_torchtitan():
    """``launch/train.sh``'s launcher only starts and watches the ranks: importing TorchTitan (about 3 s
    of CPU: its package imports Inductor, datasets, pandas) would delay every launch and relaunch."""
    code = "import sys, dispersion_titan.torchrun; print(sorted(m for m in sys.modules if m.startswith('torchtitan')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_compare_and_table_import_no_torch():
    """``analyze compare`` and ``evaluate table`` read results (``condensation.json``, ``results.json``,
    ``run.json``), no checkpoint: torch with its DCP reader (about 3 s of CPU) was most of each command's time,
    in every sweep's compare and table jobs. So does ``paper``'s drawing (its job after the others) and its
    workflow (a dry run), TorchTitan only where fig3 trains (was 3.4 s of CPU in each)."""
    commands = (
        "dispersion_titan.analysis.compare, dispersion_titan.evaluation.table, dispersion_titan.reproduce.paper.render"
    )
    code = f"import sys, {commands}; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr[-2000:]


def test_evaluation_and_analysis_share_only_what_sits_below_them():
    """Siblings: the output I/O, ``--steps``, ``--device`` and ``run.json`` readers both use live
    in ``run_folder/`` and ``utils/``, so neither imports the other."""
    graph = import_graph(PACKAGE)
    crossing = {
        f"{source} imports {target}"
        for source, targets in graph.items()
        for target in targets
        if {source.partition(".")[0], target.partition(".")[0]} == {"analysis", "evaluation"}
    }
    assert crossing == set()


def test_every_layer_names_a_folder_that_exists():
    folders = {folder(PACKAGE, path) for path in module_names(PACKAGE).values()}
    declared = {name for row in LAYERS for name in row}
    assert declared == folders


# ---------------------------------------------------------------- the checker itself, on planted packages


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    return package


TWO_FLOORS = ((ROOT,), ("high",), ("low",))


def test_a_clean_package_passes(tmp_path):
    package = plant(
        tmp_path, {"cmd.py": "from pkg.high import a", "high/a.py": "from ..low import b", "low/b.py": "import os"}
    )
    assert layer_violations(package, TWO_FLOORS) == []


@pytest.mark.parametrize(
    "files, problem",
    [
        ({"low/b.py": "from ..high.a import x"}, "low.b imports high.a: high is above low"),
        ({"low/b.py": "def f():\n    from pkg.high import a"}, "low.b imports high.a: high is above low"),
        (
            {"low/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.high.a"},
            "low.b imports high.a: high is above low",
        ),
        ({"low/b.py": "from pkg import cmd"}, "low.b imports cmd: <root> is above low"),
        ({"high/a.py": "from . import c", "high/c.py": "from .a import x"}, "file circle: high.a <-> high.c"),
        ({"other/x.py": ""}, "other/ is in no layer: add it to LAYERS"),
    ],
)
def test_a_planted_violation_fails(tmp_path, files, problem):
    package = plant(tmp_path, {"cmd.py": "", "high/a.py": "", "low/b.py": "", **files})
    assert problem in layer_violations(package, TWO_FLOORS)


def test_a_folder_loop_among_peers_fails(tmp_path):
    package = plant(
        tmp_path, {"left/a.py": "from ..right import b", "right/b.py": "from ..left import c", "left/c.py": ""}
    )
    assert layer_violations(package, ((ROOT,), ("left", "right"))) == ["folder loop: left <-> right"]


# ---------------------------------------------------------------- imports in the header


def local_imports(package: Path) -> list[tuple[Path, int, bool]]:
    """Every import of the package's own modules inside a function: (file, line, whether a
    comment says why: on a line of its block of imports, or on the line above that block)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                own = (
                    isinstance(node, ast.ImportFrom)
                    and (node.level or (node.module or "").startswith(package.name))
                    or isinstance(node, ast.Import)
                    and any(a.name.startswith(package.name) for a in node.names)
                )
                if not own:
                    continue
                first, last = node.lineno - 1, node.end_lineno  # the block of import lines it is in
                while first > 0 and lines[first - 1].lstrip().startswith(("from ", "import ")):
                    first -= 1
                while last < len(lines) and lines[last].lstrip().startswith(("from ", "import ")):
                    last += 1
                said = any("#" in line for line in lines[first:last]) or (
                    first > 0 and lines[first - 1].lstrip().startswith("#")
                )
                found.append((path, node.lineno, said))
    return found


def test_function_local_imports_are_few_and_each_says_why():
    """A module's header says what it needs: an import of our own modules stays inside a
    function only where it buys something (``--help`` without torch, an optional package),
    and a comment says what. 76 such imports were 19 when this was written."""
    found = local_imports(PACKAGE)
    assert [f"{path.relative_to(PACKAGE)}:{line}" for path, line, said in found if not said] == []
    assert 0 < len(found) <= 25


def test_the_reason_check_catches_a_silent_local_import(tmp_path):
    package = plant(
        tmp_path,
        {
            "a.py": "def f():\n    from pkg import b\n",
            "b.py": "",
            "c.py": "def g():\n    # optional: slow to import\n    from pkg import b\n",
        },
    )
    assert [(p.name, line, said) for p, line, said in local_imports(package)] == [("a.py", 2, False), ("c.py", 3, True)]


ROOT_MODULE_LINES = 200
"""A command at the package root parses its arguments and dispatches; its work lives a floor down."""


def test_the_root_modules_are_parsing_and_dispatch():
    long = {p.name: n for p in PACKAGE.glob("*.py") if (n := len(p.read_text().splitlines())) >= ROOT_MODULE_LINES}
    assert not long, f"root modules of {ROOT_MODULE_LINES}+ lines (move their work into a subpackage): {long}"


def test_every_name_the_benchmarks_import_from_the_package_exists():
    """bench/ scripts run by hand, on a GPU, where no test runs them whole: a name the package renamed or folded
    away (``LayerSums``, ``fail_with``) broke one at its start. Every ``from dispersion_titan... import`` of theirs
    resolves, its module imported here."""
    import importlib

    missing = []
    for script in sorted((PACKAGE.parent / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(), str(script))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dispersion_titan"):
                module = importlib.import_module(node.module)
                missing += [f"{script.name}: {node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
    assert missing == []
