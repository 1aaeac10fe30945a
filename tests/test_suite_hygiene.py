"""The suite's own comparisons cannot pass vacuously: every ``zip`` is ``strict=True`` (a
short or empty side fails instead of shortening the comparison), and no check is a tuple
``assert_close(a, b), msg`` (which builds a tuple and never uses ``msg``) or ``assert (x, msg)``
(always true). Scanned from the source, so a new test file is covered as soon as it exists. And no tracked
file keeps a merge conflict's markers."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def is_check_call(node: ast.expr) -> bool:
    """A call of ``assert_close``, ``torch.testing.assert_close``, ``np.testing.assert_allclose``..."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    return name.startswith("assert")


def vacuous_checks(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: what`` for each loose ``zip`` and each tuple that stands where a check should."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "zip":
            strict = [k.value for k in node.keywords if k.arg == "strict"]
            if not (len(strict) == 1 and isinstance(strict[0], ast.Constant) and strict[0].value is True):
                found.append(f"{where}: zip without strict=True")
        elif (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Tuple)
            and node.value.elts
            and is_check_call(node.value.elts[0])
        ):
            found.append(f"{where}: a tuple whose first element is a check; its message is never used")
        elif isinstance(node, ast.Assert) and isinstance(node.test, ast.Tuple) and node.test.elts:
            found.append(f"{where}: assert of a non-empty tuple is always true")
    return found


def test_the_scan_finds_each_planted_violation():
    planted = """
for a, b in zip(xs, ys):
    assert a == b
pairs = list(zip(xs, ys, strict=False))
torch.testing.assert_close(got, want), "case"
assert_close(got, want), case
assert (got == want, "message")
"""
    found = vacuous_checks(planted)
    assert [line.split(": ", 1)[1] for line in found].count("zip without strict=True") == 2
    assert sorted(int(line.split(":")[1]) for line in found) == [2, 4, 5, 6, 7], found
    clean = """
for a, b in zip(xs, ys, strict=True):
    assert a == b, (a, b)
torch.testing.assert_close(got, want, msg="case")
point = (assert_close, 1)
"""
    assert vacuous_checks(clean) == []


def test_no_comparison_in_the_suite_can_pass_vacuously():
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 40 and Path(__file__) in files  # the scan sees the suite, this file included
    found = [line for path in files for line in vacuous_checks(path.read_text(), str(path.relative_to(TESTS)))]
    assert found == []


def test_no_tracked_file_holds_a_merge_conflict_marker():
    """A conflict resolved by hand and committed half-done (docs/reliability.md once kept both sides and the
    markers): no tracked text file has a line that is a conflict marker."""
    repo = TESTS.parent
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    marker = re.compile(rb"^(?:<{7} |={7}$|>{7} )", re.MULTILINE)
    found = [
        name.decode()
        for name in tracked.split(b"\0")
        if name and (repo / name.decode()).is_file() and marker.search((repo / name.decode()).read_bytes())
    ]
    assert len(tracked.split(b"\0")) > 100  # the scan sees the checkout
    assert found == []
