"""The sbatch scripts the sweep and ``paper --slurm`` submit. They ship inside the package
(``dispersion_titan/launch_scripts/``; a checkout's ``launch/`` links there), so an installed
package finds them as a checkout does, and their jobs run this very interpreter."""

from __future__ import annotations

import os
import shlex
import sys
from importlib.resources import files
from pathlib import Path

SLURM_SCRIPTS = Path(str(files("dispersion_titan") / "launch_scripts" / "slurm"))  # package data


def sbatch_script(name: str) -> Path:
    """``launch_scripts/slurm/NAME.sbatch`` of the installed package."""
    return SLURM_SCRIPTS / f"{name}.sbatch"


def job_python() -> str:
    """The interpreter the jobs run (``common.sh``'s ``PYTHON``): the user's ``PYTHON``, else the
    one submitting, which has this package installed (a checkout's .venv or a wheel's environment)."""
    return os.environ.get("PYTHON") or sys.executable


def submission_env() -> dict[str, str]:
    """sbatch's environment, which it hands to the jobs: this one with ``PYTHON`` set."""
    return {**os.environ, "PYTHON": job_python()}


def python_line() -> str:
    """A dry run's first command: ``PYTHON`` as the submission sets it."""
    return f"export PYTHON={shlex.quote(job_python())}  # the jobs' interpreter (launch_scripts/common.sh)"
