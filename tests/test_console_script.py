"""``dispersion-titan COMMAND`` runs the same ``main`` as ``python -m dispersion_titan.COMMAND``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispersion_titan.__main__ import COMMANDS, LAUNCHER_ENTRY_POINTS

REPO = Path(__file__).resolve().parents[1]


def test_every_command_at_the_package_root_is_a_subcommand():
    commands = {p.stem for p in (REPO / "dispersion_titan").glob("*.py")} - {"__init__", "__main__"}
    assert set(COMMANDS) | set(LAUNCHER_ENTRY_POINTS) == commands | {"data"}


@pytest.mark.parametrize("command, module", [("data", "dispersion_titan.data"), ("sweep", "dispersion_titan.sweep")])
def test_a_subcommand_answers_as_python_m(command, module):
    script = shutil.which("dispersion-titan", path=str(Path(sys.executable).parent))
    assert script is not None, "pip install -e . installs the dispersion-titan console script"
    ours = subprocess.run([script, command, "--help"], capture_output=True, text=True, timeout=120)
    theirs = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert ours.returncode == theirs.returncode == 0
    assert ours.stdout == theirs.stdout


def test_an_unknown_command_is_refused_with_the_list():
    proc = subprocess.run([sys.executable, "-m", "dispersion_titan", "nope"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "train|analyze|evaluate|convert|sweep|quickstart|data" in proc.stderr
    assert proc.stderr.startswith("dispersion-titan: error: unknown command 'nope'; usage:")
    assert len(proc.stderr.strip().splitlines()) == 1
