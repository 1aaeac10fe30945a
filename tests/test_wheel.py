"""The package as a user installs it: the wheel built from this checkout, installed into a
fresh venv, outside the checkout. Its ``dispersion-titan`` plans a sweep and ``paper fig3
--slurm`` from another folder, and every sbatch script those name is the installed
package's own, run by the installed interpreter. ``dispersion-titan init`` writes the
shipped configs, which then train and sweep there without a clone."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from dispersion_titan.models.gpt2.args import gpt2_flavors
from support.launch import REPO
from support.runs import digests, tiny_run

pytestmark = pytest.mark.slow


def run(argv: list, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def installed_env() -> dict[str, str]:
    """This environment without what points into the checkout or picks an interpreter."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHON", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv holding the wheel and nothing else. Its dependencies come from this interpreter's
    site-packages through a plain path in a ``.pth`` (nothing downloaded), which runs none of
    that folder's own ``.pth`` files: the checkout's editable finder stays out."""
    root = tmp_path_factory.mktemp("wheel")
    # The build writes build/ and *.egg-info into its source tree: build a copy.
    source = root / "source"
    shutil.copytree(
        REPO / "dispersion_titan", source / "dispersion_titan", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    build = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            root / "dist",
            source,
        ],
        cwd=root,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = (root / "dist").glob("dispersion_titan-*.whl")
    venv = root / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root).returncode == 0
    python = venv / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root)
    (Path(purelib.stdout.strip()) / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            "--no-compile",
            "--disable-pip-version-check",
            "-q",
            wheel,
        ],
        cwd=root,
        env=installed_env(),
    )
    assert install.returncode == 0, install.stderr
    return venv


def package_dir(venv: Path, cwd: Path) -> Path:
    proc = run(
        [venv / "bin" / "python", "-c", "import dispersion_titan; print(dispersion_titan.__file__)"],
        cwd=cwd,
        env=installed_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip()).parent


def sbatch_scripts(script: str) -> list[Path]:
    return [Path(word) for word in re.findall(r"\S+\.sbatch\b", script)]


def job_python(script: str) -> str:
    """The interpreter a dry run's ``export PYTHON=...`` line hands to the jobs."""
    (line,) = [line for line in script.splitlines() if line.startswith("export PYTHON=")]
    return shlex.split(line, comments=True)[1].removeprefix("PYTHON=")


def test_the_installed_console_script_plans_paper_jobs_with_its_own_scripts(venv, tmp_path):
    package = package_dir(venv, tmp_path)
    assert package.is_relative_to(venv) and not package.is_relative_to(REPO), package
    command = venv / "bin" / "dispersion-titan"  # pip writes it from the wheel's entry point
    assert command.read_text().startswith(f"#!{venv / 'bin' / 'python'}\n")
    slurm = package / "launch_scripts" / "slurm"

    runs = [
        tiny_run(tmp_path / f"mlp{w}", steps=(0, 5), args=dataclasses.replace(gpt2_flavors["debug"], mlp_hidden_dim=w))
        for w in (64, 128)
    ]  # two widths: fig3 analyses one run per width
    paper = run(
        [command, "paper", "fig3", "--models", *runs, "--out", tmp_path / "paper", "--slurm", "--dry-run"],
        cwd=tmp_path,
        env=installed_env(),
    )
    assert paper.returncode == 0, paper.stderr
    assert job_python(paper.stdout) == str(venv / "bin" / "python")
    scripts = sbatch_scripts(paper.stdout)
    assert [s.name for s in scripts] == ["analyze.sbatch", "analyze.sbatch", "paper.sbatch"]
    assert all(s.parent == slurm and s.is_file() for s in scripts), scripts

    # An installed script finds its common.sh and runs the interpreter the submission names.
    analyze = run(
        ["bash", slurm / "analyze.sbatch", "--help"],
        cwd=tmp_path,
        env={**installed_env(), "PYTHON": str(venv / "bin" / "python")},
    )
    assert analyze.returncode == 0 and "usage: python -m dispersion_titan.analyze" in analyze.stdout, analyze.stderr


def test_init_writes_the_shipped_configs_which_check_and_plan_without_a_clone(venv, tmp_path):
    command, env = venv / "bin" / "dispersion-titan", installed_env()
    init = run([command, "init", "cfg"], cwd=tmp_path, env=env)
    assert init.returncode == 0, init.stderr
    cfg = tmp_path / "cfg"
    written = digests(cfg)
    repo = {f"train_configs/{name}": digest for name, digest in digests(REPO / "train_configs").items()}
    example = {f"launch/{name}": digest for name, digest in digests(REPO / "launch", "sweep_example.toml").items()}
    assert written == {**repo, **example} and len(repo) > 20 and len(example) == 1
    checked = run([command, "train", "--job.config_file", "train_configs/debug.toml", "--check-only"], cwd=cfg, env=env)
    assert checked.returncode == 0, checked.stderr
    # The example's one cell (test_doc_claims.py plans all of it): every sbatch script it names is the installed
    # package's own, run by the installed interpreter.
    one_cell = ["--widths", "64", "--variants", "baseline", "--seeds", "0", "--dry-run"]
    planned = run([command, "sweep", "launch/sweep_example.toml", *one_cell], cwd=cfg, env=env)
    assert planned.returncode == 0 and job_python(planned.stdout) == str(venv / "bin" / "python"), planned.stderr
    scripts = sbatch_scripts(planned.stdout)
    assert len(scripts) == 5  # train, analyze, evaluate, compare, table
    assert {s.name for s in scripts} == {"train.sbatch", "analyze.sbatch", "evaluate.sbatch"}
    slurm = package_dir(venv, tmp_path) / "launch_scripts" / "slurm"
    assert all(s.parent == slurm and s.is_file() for s in scripts), scripts
    # Again into its own folder: nothing overwritten, a user's edit kept.
    (cfg / "train_configs" / "debug.toml").write_text("# mine\n")
    again = run([command, "init", cfg], cwd=tmp_path, env=env)
    assert again.returncode == 0 and f"kept {len(written)} already there" in again.stdout, again.stderr
    assert (cfg / "train_configs" / "debug.toml").read_text() == "# mine\n"
    # A folder holding anything else is refused in one line, left as it was.
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    refused = run([command, "init", "busy"], cwd=tmp_path, env=env)
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        f"dispersion_titan: error: DIR: {tmp_path / 'busy'} holds other files (notes.txt); init writes only into a new "
        "or empty folder, or one it wrote: name another DIR"
    ]
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["notes.txt"]
