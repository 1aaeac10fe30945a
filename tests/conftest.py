"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import resource
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import datasets
import pytest
from filelock import FileLock

from dispersion_titan.data.packed import CACHE_ENV
from support.forked_python import forking_python
from support.jobs import CPU_LOG, cpu_seconds, log_cpu
from support.launch import REFERENCE_STEPS, SCHEDULE, torchrun

# Under pytest-xdist (``scripts/run_tests.sh``: ``-n 3 --dist loadfile --no-loadscope-reorder``) each module's
# tests stay on one worker, so module fixtures run once. The longest modules start first, so
# none is left running alone at the end.
LONGEST_FIRST = (
    "test_reliability",
    "test_slurm",
    "test_dispersion_kernel",
    "test_parallel_equivalence",
    "test_plan",
    "test_evaluate",
    "test_paper",
    "test_quickstart",
    "test_baselines",
    "test_resume",
    "test_hf_interop",
    "test_decoders",
    "test_hf_analysis",
    "test_launch",
    "test_wheelhouse",
    "test_wheel",
    "test_config_errors",
    "test_analysis",
    "test_token_store",
    "test_training_features",
    "test_run_ledger",
    "test_wandb",
    "test_sync_free",
    "test_console_script",
    "test_bench_step",
)  # by their summed CPU in one run of the suite (bench/suite_cpu.py); test_slurm also waits on Slurm


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__, len(rank)))  # stable: file order otherwise


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``SUITE_CPU_LOG`` set: each test's CPU in this worker and in the fresh processes it waited for (its
    forked jobs log their own; Slurm's jobs are not counted)."""
    if not os.environ.get(CPU_LOG):
        yield
        return
    before = cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN)
    yield
    log_cpu(item.nodeid, "worker", cpu_seconds(resource.RUSAGE_SELF) - before[0])
    log_cpu(item.nodeid, "processes", cpu_seconds(resource.RUSAGE_CHILDREN) - before[1])


def session_folder(tmp_path_factory) -> Path:
    """The session's base folder, common to all xdist workers (each has its own below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def session_token_cache(tmp_path_factory):
    """One token cache for the session's jobs, never the user's: the embedded corpus is
    tokenised once (under the cache's own file lock), not by every worker, rank and
    launch. Tests of the cache itself use ``private_caches``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(session_folder(tmp_path_factory) / "token_cache"))
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's in-process analyses and evaluations, as launch_env gives
    subprocesses: on a shared 2-core machine two threads per process oversubscribe it (5x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def script_python(tmp_path) -> Iterator[Path]:
    """A ``python`` for a shell script under test whose steps fork from the job server
    (``support.forked_python``): for tests of a script's plumbing, not of a fresh start."""
    with forking_python(tmp_path) as python:
        yield python


@pytest.fixture
def private_caches(tmp_path, monkeypatch):
    """Keep datasets' Arrow cache and our token cache inside the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "token_cache"))


def made_once(tmp_path_factory, name: str, make: Callable[[Path], object]) -> Path:
    """``make(folder)`` once per session, also when xdist runs its users on several workers
    (the first makes it under a lock; the others wait, then reuse it); the folder."""
    shared = session_folder(tmp_path_factory)
    dump = shared / name / "run"
    with FileLock(str(shared / f"{name}.lock")):
        if not (dump.parent / "done").exists():
            shutil.rmtree(dump, ignore_errors=True)
            make(dump)
            (dump.parent / "done").touch()
    return dump


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """The uninterrupted 2-process run (checkpoints 0, 2, 4, 6 and the final weights-only 8) that the crash,
    corruption and resume tests reproduce step for step."""
    return made_once(
        tmp_path_factory,
        "reference",
        lambda dump: torchrun(dump, 2, "--training.steps", str(REFERENCE_STEPS), *SCHEDULE, "--validation.no-enable"),
    )


@pytest.fixture(scope="session")
def debug_seed_checkpoint(tmp_path_factory) -> Path:
    """debug.toml's seed checkpoint (TorchTitan's ``create_seed_checkpoint``, 1 process), the
    common start of the layout-equivalence and baseline runs: its step-0 folder."""
    run = made_once(
        tmp_path_factory,
        "debug_seed",
        lambda dump: torchrun(dump, 1, "--checkpoint.create_seed_checkpoint", "--training.steps", "0"),
    )
    return run / "checkpoint" / "step-0"
