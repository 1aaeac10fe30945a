"""The docs stay true to the tree: ``docs/code_map.md`` names every module and folder of the
package in its folder's row, names nothing that is not there, and gives each folder the floor
``tests/test_import_layers.py`` declares; every relative link in the docs and the README
points to a file, and an anchor, that exist; every test a page names exists; every table row renders
in its table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_import_layers import LAYERS, ROOT

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dispersion_titan"
CODE_MAP = REPO / "docs" / "code_map.md"

MODULE_NAME = re.compile(r"`(_{0,2}[a-z][a-z0-9_]*/?)`")
"""A module (``name``) or subfolder (``name/``) as a folder's row names it: a lowercase name in backticks."""


class Row:
    def __init__(self, floor: str, folder: str, names: set[str]) -> None:
        self.floor, self.folder, self.names = floor, folder, names


def map_rows(text: str) -> dict[str, Row]:
    """The package's folder rows of the code map by folder (``""`` for the package root),
    each with its floor (carried down from the row above when blank) and the names it mentions."""
    rows: dict[str, Row] = {}
    floor = ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`dispersion_titan/") or cells[0] == "—":
            continue  # not a row, or one of package data (floor —)
        floor = cells[0] or floor
        folder = cells[1].strip("`").removeprefix("dispersion_titan/").rstrip("/")
        assert folder not in rows, f"code_map.md: two rows for dispersion_titan/{folder}/"
        rows[folder] = Row(floor, folder, set(MODULE_NAME.findall(cells[2])))
    return rows


def tree_names(folder: Path) -> set[str]:
    """What a folder's row must name: its modules but ``__init__``, and its subfolders holding Python."""
    modules = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    subfolders = {f"{p.name}/" for p in folder.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    return modules | subfolders


def _where(folder: str) -> str:
    return f"dispersion_titan/{folder}/" if folder else "dispersion_titan/"


def map_problems(text: str, package: Path) -> list[str]:
    """Every way the code map ``text`` disagrees with ``package``'s tree and ``LAYERS``."""
    rows = map_rows(text)
    problems = []
    folders = {p.parent.relative_to(package).as_posix().removeprefix(".") for p in package.rglob("*.py")}
    for folder in sorted(folders):
        expected = tree_names(package / folder)
        if folder not in rows:  # a folder of only an __init__ may be named in its parent's row instead
            parent, _, name = folder.rpartition("/")
            if expected or f"{name}/" not in (rows[parent].names if parent in rows else set()):
                problems.append(f"{_where(folder)} has no row")
            continue
        if folder == "":  # the root's subfolders have rows of their own
            expected = {name for name in expected if not name.endswith("/")}
        named = rows[folder].names
        problems += [f"{_where(folder)}: `{n}` is missing" for n in sorted(expected - named)]
        problems += [f"{_where(folder)}: `{n}` does not exist" for n in sorted(named - tree_names(package / folder))]
    problems += [f"{_where(f)}: a row for a folder that holds no module" for f in sorted(set(rows) - folders)]
    floors = {
        ROOT if not folder else folder: str(len(LAYERS) - i)  # floor 1: the ground, LAYERS' last row
        for i, row in enumerate(LAYERS)
        for folder in row
    }
    for folder, row in rows.items():
        top = folder.split("/")[0] or ROOT
        if floors.get(top) != row.floor:
            problems.append(f"{_where(folder)}: floor {row.floor}, LAYERS says {floors.get(top)}")
    return problems


def test_code_map_names_every_module_and_nothing_else() -> None:
    problems = map_problems(CODE_MAP.read_text(), PACKAGE)
    assert problems == [], "docs/code_map.md:\n" + "\n".join(problems)


def test_code_map_check_finds_a_missing_a_misnamed_and_a_misplaced_module() -> None:
    """The check itself: the real map with one module dropped, one misnamed and one folder on the
    wrong floor gives exactly those problems more than the real map does."""
    text = CODE_MAP.read_text()
    planted = text.replace("`writer_lock` (", "(", 1).replace("`encoders` (", "`encoderss` (", 1)
    planted = planted.replace("| 2 | `dispersion_titan/tokenizer/`", "| 3 | `dispersion_titan/tokenizer/`", 1)
    assert planted.count("`encoderss`") == 1 and "`writer_lock`" not in planted
    found, already = map_problems(planted, PACKAGE), map_problems(text, PACKAGE)
    assert sorted(p for p in found if p not in already) == [
        "dispersion_titan/run_folder/: `writer_lock` is missing",
        "dispersion_titan/tokenizer/: `encoders` is missing",
        "dispersion_titan/tokenizer/: `encoderss` does not exist",
        "dispersion_titan/tokenizer/: floor 3, LAYERS says 2",
    ]


# ----------------------------------------------------------------------------- links

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page (code spans unwrapped, punctuation dropped)."""
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            title = line.lstrip("#").strip().replace("`", "").lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def link_problems(page: Path) -> list[str]:
    problems = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{page.name}: {target}: no such heading")
    return problems


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    assert link_problems(page) == []


def test_link_check_finds_a_broken_file_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# One `thing`, here\n\n[ok](#one-thing-here) [bad](#two) [gone](b.md) [web](https://example.org)\n"
    )
    assert link_problems(tmp_path / "a.md") == ["a.md: #two: no such heading", "a.md: b.md: no such file"]


# ----------------------------------------------------------------------------- tests named

TEST_NAME = re.compile(r"`(?:tests/)?(test_\w+\.py)?(?:::(\w+)(?:\[[^`]*\])?)?`")


def named_test_problems(text: str, tests: Path = REPO / "tests") -> list[str]:
    """Tests a page names (``test_x.py``, ``test_x.py::name[params]``, ``::name`` of the line's last module)
    that do not exist."""
    problems = []
    for line in text.splitlines():
        module = None
        for match in TEST_NAME.finditer(line):
            named, function = match.groups()
            module = named or module
            if not (named or function):
                continue
            if module is None or not (tests / module).is_file():
                problems.append(f"{match.group(0)}: no such test module")
            elif function and not re.search(rf"^def {function}\(", (tests / module).read_text(), flags=re.M):
                problems.append(f"{module}::{function}: no such test")
    return problems


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_the_tests_a_page_names_exist(page: Path) -> None:
    assert named_test_problems(page.read_text()) == []


def test_test_name_check_finds_a_missing_module_and_test() -> None:
    text = "| x | `test_code_map.py::test_relative_links_resolve[README.md]`, `::test_gone` |\n`test_nothing.py`"
    assert named_test_problems(text) == [
        "test_code_map.py::test_gone: no such test",
        "`test_nothing.py`: no such test module",
    ]


# ----------------------------------------------------------------------------- tables

SEPARATOR = re.compile(r"\|(\s*:?-+:?\s*\|)+")


def table_problems(text: str) -> list[str]:
    """Table lines Markdown renders as text (outside code blocks): a row right after a line of text, or
    a table whose second line is not its ``|---|`` separator."""
    lines = re.sub(r"```.*?```", lambda block: "\n" * block.group(0).count("\n"), text, flags=re.S).splitlines()
    problems = []
    for i, line in enumerate(lines):
        before = lines[i - 1] if i else ""
        if not line.startswith("|") or before.startswith("|"):
            continue
        if before.strip():
            problems.append(f"line {i + 1}: a table row after text")
        elif i + 1 == len(lines) or not SEPARATOR.fullmatch(lines[i + 1].strip()):
            problems.append(f"line {i + 1}: a table without its |---| line")
    return problems


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_table_row_is_in_a_table(page: Path) -> None:
    assert table_problems(page.read_text()) == []


def test_table_check_finds_a_row_after_text_and_a_table_without_separator() -> None:
    text = "| a | b |\n|---|---|\n| 1 | 2 |\n\nSome text.\n| 3 | 4 |\n\n| c | d |\n| 5 | 6 |\n```\n| code |\n```\n"
    assert table_problems(text) == ["line 6: a table row after text", "line 8: a table without its |---| line"]
