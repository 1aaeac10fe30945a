"""Crash safety, exact resume, non-finite loss and bad input, with real processes.

One uninterrupted 2-process run (``reference``) is the yardstick: a run whose rank is
SIGKILLed mid-training and relaunched must reproduce its losses bit for bit; copies of
it with a corrupted newest checkpoint must resume from the previous complete one; and
bad input pointed at it must fail with one line and leave every byte of it in place.
See docs/reliability.md for the guarantees these tests stand for.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch

from dispersion_titan.analyze import main as analyze_main
from dispersion_titan.config.shipped import shipped_files
from dispersion_titan.convert import main as convert_main
from dispersion_titan.data.packed import CACHE_ENV
from dispersion_titan.init import main as init_main
from dispersion_titan.run_folder.checkpoints import (
    CheckpointError,
    check_complete,
    is_full,
    list_checkpoints,
    select_steps,
)
from dispersion_titan.run_folder.owners import FolderOwner, write_record
from dispersion_titan.run_folder.writer_lock import LOCK_NAME
from dispersion_titan.trainer.launcher import killed_message
from dispersion_titan.utils.errors import ArgumentError, OutputError, command
from support.cli import analyze, assert_one_line_error, run_cli
from support.corpora import texts_jsonl
from support.eval_tasks import LM_EVAL_TASKS
from support.launch import (
    DEBUG_SEQ_LEN,
    DEBUG_TOML,
    REFERENCE_STEPS,
    REPO,
    SCHEDULE,
    held_by_another_command,
    in_mount_namespace,
    launch_env,
    python_module,
    torchrun,
)
from support.runs import digests, load_weights, max_abs_diff, scalars, tiny_hub_model

STEPS = REFERENCE_STEPS
# Every launch below shares the reference run's schedule, so losses compare step for step.
SCHEDULE = (*SCHEDULE, "--validation.no-enable")
TAGS = ("loss_metrics/global_avg_loss", "loss_metrics/ce", "loss_metrics/dispersion", "grad_norm")
ANALYSIS = ("--num-sequences", "4", "--seq-len", "32")


def complete_steps(dump: Path) -> list[int]:
    steps = []
    for ckpt in list_checkpoints(str(dump / "checkpoint")):
        try:
            check_complete(ckpt.path)
            steps.append(ckpt.step)
        except CheckpointError:
            pass
    return steps


def output(proc) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def reference(reference_run) -> Path:
    """The session's uninterrupted run (conftest): checkpoints 0, 2, 4, 6, 8; step 0 analyzed
    here, so it also has results (compare's refusals need one; each step costs about 2 s CPU)."""
    dump = reference_run
    assert complete_steps(dump) == [0, 2, 4, 6, 8]
    with pytest.raises(SystemExit) as done:
        analyze_main([str(dump), *ANALYSIS, "--steps", "0"])
    assert done.value.code == 0
    return dump


# ---------------------------------------------------------------- crash and resume


def worker_pid(dump: Path, rank: int) -> int | None:
    """The training process of ``rank`` in the job writing ``dump`` (not its torchrun agent)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:  # exited meanwhile
            continue
        if (
            str(dump).encode() in cmdline
            and b"dispersion_titan.train" in cmdline
            and b"dispersion_titan.torchrun" not in cmdline
            and f"RANK={rank}".encode() in environ
        ):
            return int(entry)
    return None


def launcher_pid(dump: Path) -> int | None:
    """The launcher (torchrun) of the job writing ``dump``: its rank 0's parent (a launcher forked from
    the job server has the server's command line)."""
    rank0 = worker_pid(dump, 0)
    try:
        return int(Path(f"/proc/{rank0}/stat").read_text().rpartition(")")[2].split()[1]) if rank0 else None
    except OSError:  # exited meanwhile
        return None


def in_the_background_of_a_script(dump: Path) -> subprocess.CompletedProcess:
    """``launch/train.sh`` with its defaults (2 CPU processes, half the CPUs each) as a script's
    background job (job control off: bash starts it with SIGINT ignored, which its first line of
    output shows), started from a folder that is not the repository, with the settings of
    ``torchrun(dump, 2, ...)``, its config given as ``--job.config_file CONFIG`` (as dispersion-titan train takes
    it; ``CONFIG`` alone and ``--job.config_file=CONFIG``: test_launch_guards.py). The interpreter train.sh starts
    torchrun with records the environment it was given in ``threads.txt`` beside ``dump``."""
    argv = [
        "--job.dump_folder",
        str(dump),
        "--metrics.log_freq",
        "1",
        *DEBUG_SEQ_LEN,
        "--training.steps",
        str(STEPS),
        *SCHEDULE,
    ]
    elsewhere = dump.parent
    recorder = elsewhere / "python"
    recorder.write_text(
        f'#!/bin/sh\necho "OMP_NUM_THREADS=${{OMP_NUM_THREADS-unset}}" >> {elsewhere}/threads.txt\n'
        f'exec {sys.executable} "$@"\n'
    )
    recorder.chmod(0o755)
    env = launch_env({"PYTHON": str(recorder)})
    del env["OMP_NUM_THREADS"]  # train.sh sets it: CPUs / processes
    script = '{ grep SigIgn /proc/$BASHPID/status; exec "$0" "$@"; } & wait $!'
    return subprocess.run(
        ["bash", "-c", script, str(REPO / "launch" / "train.sh"), "--job.config_file", DEBUG_TOML, *argv],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def launch_and_signal(dump: Path, after_step: int, signum: int, target, run=None):
    """Start the run (``run(dump)``, default: torchrun on 2 processes), send ``signum`` to
    ``target(dump)`` once ``step-{after_step}`` is complete on disk; the finished process,
    and the digests of the checkpoints complete at that moment."""
    result = {}
    # The command line itself: the workers are found by their command line.
    run = run or (lambda d: torchrun(d, 2, "--training.steps", str(STEPS), *SCHEDULE, check=False, command_line=True))
    job = threading.Thread(target=lambda: result.update(proc=run(dump)))
    job.start()
    marker = dump / "checkpoint" / f"step-{after_step}" / ".metadata"
    deadline = time.monotonic() + 600
    while not marker.exists() and job.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = target(dump) if job.is_alive() else None
    assert pid is not None, f"the run ended before step {after_step} was saved: {result}"
    kept = {
        step: digests(dump / "checkpoint" / f"step-{step}")
        for step in range(after_step + 1)
        if (dump / "checkpoint" / f"step-{step}" / ".metadata").exists()
    }
    os.kill(pid, signum)
    job.join()
    return result["proc"], kept


def last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


def forked_rank_1(dump: Path) -> int:
    """Rank 1 of the job server's 2-process torchrun writing ``dump`` (forked, its command line the server's): the
    other worker of the launcher whose rank 0 holds the run's writer lock."""
    rank_0 = psutil.Process(json.loads((dump / LOCK_NAME).read_text())["pid"])
    (rank_1,) = [worker.pid for worker in rank_0.parent().children() if worker.pid != rank_0.pid]
    return rank_1


def rank_0_said(proc) -> str:
    """What rank 0 of a job server's torchrun job said: its stderr without the launcher's log lines (``E1201
    02:48:27.908000 PID file:line] ...``) and the summary of failed ranks after them."""
    lines = proc.stderr.strip().splitlines()
    lines = lines[: next((i for i, line in enumerate(lines) if re.fullmatch("=+", line)), len(lines))]
    return "\n".join(line for line in lines if not re.match(r"[DIWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ", line))


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict[int, dict[str, str]]]:
    """launch/train.sh's run SIGINTed once step 2 is saved (``launch_and_signal``'s): its folder, the stopped process
    and the checkpoints complete then. test_interrupt_saves_says_one_line_and_resumes_exactly checks how it stopped;
    test_sigkilled_rank_resumes_from_last_complete_checkpoint_bit_for_bit goes on from a copy of it, its relaunch
    this run's (one run fewer: about 10 s of CPU)."""
    dump = tmp_path_factory.mktemp("interrupted") / "interrupted"
    return dump, *launch_and_signal(dump, 2, signal.SIGINT, launcher_pid, in_the_background_of_a_script)


@pytest.mark.slow
def test_sigkilled_rank_resumes_from_last_complete_checkpoint_bit_for_bit(reference, interrupted, tmp_path):
    """A copy of the run SIGINTed at step 3 or so (``interrupted``) relaunched, its rank 1 SIGKILLed once the next
    checkpoint is saved, and relaunched again: the first relaunch starts where the interrupt stopped, touching no
    checkpoint; the last one's losses from step 1 on are the uninterrupted run's, bit for bit: both resumes exact."""
    dump = tmp_path / "crashed"
    shutil.copytree(interrupted[0], dump)
    stopped = max(complete_steps(dump))
    assert stopped < STEPS - 2, f"interrupted at step {stopped}: no checkpoint before the last to kill it after"
    kept = {step: digests(dump / "checkpoint" / f"step-{step}") for step in complete_steps(dump)}
    killed, _ = launch_and_signal(dump, stopped + 2 - stopped % 2, signal.SIGKILL, lambda d: worker_pid(d, 1))
    assert f"Training starts at step {stopped + 1}" in output(killed)
    assert all(digests(dump / "checkpoint" / f"step-{step}") == files for step, files in kept.items())
    # The launcher says it in one line, out of memory only where the kernel shows an OOM kill (here a kill -9).
    resume_from = max(complete_steps(dump))
    stands = f"checkpoint step-{resume_from} stands: relaunch the same command to resume from it"
    assert killed.returncode == 137 and last_line(killed) == killed_message(1, oom=False, stands=stands)
    assert "Traceback" not in output(killed)
    assert 4 <= resume_from < STEPS  # killed mid-run
    kept = {step: digests(dump / "checkpoint" / f"step-{step}") for step in complete_steps(dump)}

    again = torchrun(dump, 2, "--training.steps", str(STEPS), *SCHEDULE)  # the same command
    assert f"Training starts at step {resume_from + 1}" in output(again)
    assert all(digests(dump / "checkpoint" / f"step-{step}") == files for step, files in kept.items())
    want, got = scalars(reference), scalars(dump)
    for tag in TAGS:
        assert [got[tag][s] for s in range(1, STEPS + 1)] == [want[tag][s] for s in range(1, STEPS + 1)], tag
    assert (
        max_abs_diff(
            load_weights(dump / "checkpoint" / f"step-{STEPS}"),
            load_weights(reference / "checkpoint" / f"step-{STEPS}"),
        )
        == 0.0
    )


def runs(pid: int) -> bool:
    """Whether ``pid`` still runs: neither gone nor a zombie (exited, never reaped by its new parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.slow
def test_sigkilled_launcher_takes_its_ranks_down_and_the_relaunch_resumes(tmp_path):
    """SIGKILL to the launcher alone (``python -m dispersion_titan.torchrun``, as launch/train.sh
    runs it): its ranks, in sessions of their own, end within seconds instead of training on as
    orphans; the same command relaunched resumes from the last complete checkpoint, taking over
    the dead rank 0's writer lock."""
    dump = tmp_path / "orphaned"
    ranks: list[int] = []

    def launcher_and_its_ranks(d: Path) -> int | None:
        ranks.extend(pid for pid in (worker_pid(d, 0), worker_pid(d, 1)) if pid is not None)
        return launcher_pid(d)

    killed, kept = launch_and_signal(dump, 2, signal.SIGKILL, launcher_and_its_ranks)
    assert killed.returncode == -signal.SIGKILL and len(ranks) == 2
    deadline = time.monotonic() + 5
    while any(map(runs, ranks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(runs, ranks)), "ranks outlived their launcher"
    resume_from = max(complete_steps(dump))
    assert 2 <= resume_from < STEPS
    again = torchrun(dump, 2, "--training.steps", str(STEPS), *SCHEDULE)  # the same command
    assert f"Training starts at step {resume_from + 1}" in output(again)
    assert complete_steps(dump)[-1] == STEPS
    assert {step: digests(dump / "checkpoint" / f"step-{step}") for step in kept} == kept


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, background",
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["SIGINT-background-train.sh", "SIGTERM-rank-1-alone"],
)
def test_interrupt_saves_says_one_line_and_resumes_exactly(request, tmp_path, signum, background):
    """``kill -INT`` to launch/train.sh (its defaults, from another folder) started in the background
    of a script (which inherits SIGINT as ignored), which forwards it through torchrun to every rank, or
    SIGTERM to rank 1 alone (a ``kill`` of one process): the ranks agree (rank 0, signalled or not, stops
    too: without the agreement it waits at the next collective), save a full checkpoint of the step they
    are at, and say so in one line; the same command again continues exactly like the uninterrupted run,
    touching no checkpoint (checked once, on a copy of the SIGINTed run: ``interrupted``). Rank 1 alone is a rank of
    the job server's torchrun, forked (its signal handler is the trainer's, as a fresh rank's): our launcher's exit
    on the ranks' own status, end to end, is the non-finite loss test's."""
    dump = tmp_path / "interrupted"
    if background:
        dump, stopped, kept = request.getfixturevalue("interrupted")
        said, status = last_line(stopped), stopped.returncode
        assert int(stopped.stdout.split()[1], 16) & 1 << (signal.SIGINT - 1), "started with SIGINT ignored"
        assert "dp_shard=2," in output(stopped), "2 processes by default on CPU"
        threads = max(1, len(os.sched_getaffinity(0)) // 2)
        assert f"OMP_NUM_THREADS={threads}\n" in (dump.parent / "threads.txt").read_text(), "half the CPUs each"
        assert "[rank0]:" in output(stopped) and "[rank1]:" not in output(stopped), "LOG_RANK=0 shows rank 0 only"
        derived = "dispersion_titan: note: derived: training.local_batch_size"
        assert output(stopped).count(derived) == 1, (
            "said by its check, not again by the ranks (DISPERSION_TITAN_CHECKED)"
        )
    else:

        def forked(d: Path) -> subprocess.CompletedProcess:
            return torchrun(d, 2, "--training.steps", str(STEPS), *SCHEDULE, check=False)

        stopped, kept = launch_and_signal(dump, 2, signum, forked_rank_1, forked)
        said = rank_0_said(stopped)
        assert "Traceback" not in said, said
        said, status = said.splitlines()[-1], int(re.findall(r"exitcode\s+: (-?\d+)", stopped.stderr)[-1])
    match = re.fullmatch(
        rf"{re.escape('[rank0]:' if background else '')}dispersion_titan: interrupted at step (\d+); "
        r"checkpoint step-(\d+) saved; relaunch the same command to resume",
        said,
    )
    assert match and match[1] == match[2], stopped.stderr[-3000:]
    step = int(match[1])
    assert status == 128 + signum  # the first rank to leave: its status
    assert not background or "Traceback" not in output(stopped)  # forked: torch's log of its worker's exit has one
    assert 2 < step < STEPS and complete_steps(dump)[-1] == step and is_full(str(dump / "checkpoint" / f"step-{step}"))
    assert {s: digests(dump / "checkpoint" / f"step-{s}") for s in kept} == kept


def holder_pid(folder: Path, job) -> int:
    """The PID of the command (forked from the job server) that holds ``folder``'s writer lock: training's rank 0.
    The lock is created (O_EXCL) before its owner is written into it: read it once it is whole."""
    while not job.done():
        try:
            return json.loads((folder / LOCK_NAME).read_text())["pid"]
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.02)
    raise AssertionError(job.result().stderr[-3000:])


@pytest.mark.slow
def test_interrupt_without_checkpointing_says_so(tmp_path):
    """Ctrl-C of a one-process run without checkpointing: it stops at the next step in one line."""
    dump, log = tmp_path / "nockpt", tmp_path / "stdout"
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--training.steps", "100",
            "--metrics.log_freq", "1", "--checkpoint.no-enable", "--validation.no-enable"]  # fmt: skip
    job = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.train", *argv, timeout=300, stdout=log)
    pid = holder_pid(dump, job)
    while not re.search(r"step:\s+2\s", log.read_text()) and not job.done():
        time.sleep(0.05)
    os.kill(pid, signal.SIGINT)
    done = job.result()
    err = done.stderr
    assert done.returncode == 130 and "Traceback" not in err + done.stdout
    assert re.fullmatch(
        r"dispersion_titan: interrupted at step \d+; checkpointing is off, nothing saved", err.strip().splitlines()[-1]
    ), err[-2000:]
    assert not (dump / "checkpoint").exists()


IN_TYRO = """
import os, signal, sys, threading, time
from dispersion_titan.train import main
from dispersion_titan.utils.errors import run_command
def ctrl_c_in_tyro():  # once TorchTitan's parser (tyro) is on the main thread's stack: Ctrl-C
    while True:
        frame = sys._current_frames().get(threading.main_thread().ident)
        while frame is not None and "/tyro/" not in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is not None:
            return os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.001)
threading.Thread(target=ctrl_c_in_tyro, daemon=True).start()
run_command(main)
"""


@pytest.mark.slow
@pytest.mark.parametrize("moment, signum", [("parsing", signal.SIGINT), ("checked", signal.SIGTERM)])
def test_an_interrupt_before_training_starts_is_one_line(tmp_path, moment, signum):
    """Ctrl-C while TorchTitan parses the options, or SIGTERM once the launch is checked (its writer lock taken), before
    the trainer's handlers: one line saying so, exit 128 + the signal, nothing saved. Train's own handler raised
    SystemExit, which the parse takes for tyro's exit on a bad flag: ``dispersion_titan: error: dispersion_titan:
    interrupted before training started; nothing saved``, exit 2; now the handler of every command."""
    dump, script = tmp_path / "run", tmp_path / "ctrl_c_in_tyro.py"
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--validation.no-enable"]
    if moment == "parsing":
        script.write_text(IN_TYRO)
        job = ThreadPoolExecutor(1).submit(python_module, str(script), *argv, timeout=300)
    else:
        job = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.train", *argv, timeout=300)
        os.kill(holder_pid(dump, job), signum)
    done = job.result()
    assert done.returncode == 128 + signum and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == "dispersion_titan: interrupted before training started; nothing saved", done.stderr[-3000:]
    assert not (dump / "checkpoint").exists()


ANALYZE_CASE = (
    "dispersion_titan.analyze",
    (*ANALYSIS, "--tb-dir", "{tmp}/tb"),
    "condensation.json",
    "each model state analyzed so far is kept in its folder; the same command analyzes the rest",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, rank, module, options, result, kept",
    [
        (signal.SIGINT, "1", *ANALYZE_CASE),
        (signal.SIGTERM, "0", *ANALYZE_CASE),
        (
            signal.SIGINT,
            "0",
            "dispersion_titan.evaluate",
            ("--include-path", str(LM_EVAL_TASKS), "--tasks", "wiki_next_word_held", "--limit", "2", "--device", "cpu"),
            "results.json",
            "each step evaluated so far is kept in its folder; the same command goes on",
        ),
    ],
    ids=["analyze-RANK=1", "analyze-scancel", "evaluate"],
)
def test_ctrl_c_is_one_line_keeps_what_is_done_and_the_rerun_goes_on(
    reference, tmp_path, signum, rank, module, options, result, kept
):
    """Ctrl-C once step 0's result is written: one line saying what is kept and how to go on, exit 130 (a
    59-62-line KeyboardInterrupt traceback before, exit 1 in analyze); step 0's result unchanged, and the same
    command then does step 2 alone. A SIGTERM to the command's process group (Slurm's scancel, a terminal's
    Ctrl-C reaches the group too) alike, exit 143 (was no line at all). RANK=1 (a command a torchrun-launched script
    runs) says it too: the line was rank 0's alone, as train's, exit 130 and no line. analyze's step 2 waits its turn
    at --tb-dir, held here (as by another analysis), once step 0 is analyzed: the signal lands before step 2 is
    written, however late (it took 0.4 s to write it, a margin a loaded machine missed); evaluate's step 2 waits for
    the signal as it is scored, its task's prompt held (``wiki_next_word_held``; the margin was its 1.5 s)."""
    out = tmp_path / "out"
    argv = [str(reference), "--steps", "0,2", *(o.format(tmp=tmp_path) for o in options), "--out", str(out)]
    # evaluate's step 2 waits for the signal as it is scored (its task's held.py) once step 0's result is written
    started, turn = tmp_path / "held", contextlib.nullcontext()
    env = {"RANK": rank, "HOLD_WHEN": str(out / "step-0" / result), "HOLD_SAYS": str(started)}
    if module == "dispersion_titan.analyze":  # step 0 first; then step 2 measured, its histograms wait their turn
        first = python_module(module, argv[0], "--steps", "0", *argv[3:], timeout=300)
        assert first.returncode == 0, first.stderr[-3000:]
        started, turn = out / "heatmap_step-2.png", held_by_another_command(tmp_path / "tb")
    with turn:
        job = ThreadPoolExecutor(1).submit(python_module, module, *argv, timeout=300, env=env)
        while not started.exists() and not job.done():
            time.sleep(0.005)
        assert not job.done(), job.result().stderr[-3000:]
        os.killpg(json.loads((out / LOCK_NAME).read_text())["pid"], signum)  # each job: a process group of its own
        done = job.result()
    assert done.returncode == 128 + signum, done.stderr[-3000:]
    # the interrupt's one line ends what the command said while it worked (lm-eval's notes, progress bars)
    assert "Traceback" not in done.stderr and done.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: interrupted; {kept}"
    ), done.stderr
    step_0 = digests(out / "step-0")
    assert not (out / "step-2" / result).exists()
    again = python_module(module, *argv, timeout=300)
    assert again.returncode == 0 and (out / "step-2" / result).is_file(), again.stderr[-2000:]
    assert digests(out / "step-0") == step_0


@pytest.mark.slow
def test_failed_checkpoint_write_is_one_line_and_keeps_earlier_checkpoints(tmp_path):
    """A write that fails mid-save (here the file size limit, RLIMIT_FSIZE, lowered on the
    running process once step-2 is on disk: EFBIG, as ENOSPC and EDQUOT would be) ends the run
    in one line naming the cause, the folder, the space needed and the last good checkpoint;
    the half-written step-4 is moved aside and step-0 and step-2 are untouched."""
    dump = tmp_path / "full"
    argv = [
        "--job.config_file",
        DEBUG_TOML,
        "--job.dump_folder",
        str(dump),
        *DEBUG_SEQ_LEN,
        "--training.steps",
        "4",
        "--checkpoint.interval",
        "2",
        "--validation.no-enable",
    ]
    # Python ignores SIGXFSZ (whose default is to die): the write fails.
    job = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.train", *argv)
    pid = holder_pid(dump, job)
    marker = dump / "checkpoint" / "step-2" / ".metadata"
    while not marker.exists() and not job.done():
        time.sleep(0.02)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
    kept = {step: digests(dump / "checkpoint" / f"step-{step}") for step in (0, 2)}
    done = job.result()
    out, err = done.stdout, done.stderr

    step_2 = sum(p.stat().st_size for p in (dump / "checkpoint" / "step-2").iterdir())
    match = re.fullmatch(
        rf"dispersion_titan: error: file size limit exceeded \(ulimit -f: 1.0 MB\) saving step-4 to "
        rf"{dump / 'checkpoint' / 'step-4'} \(needs about (\d+) MB, the size of step-2; \d+ MB free\); "
        r"the last good checkpoint is step-2; raise the file size limit \(ulimit -f\) and relaunch "
        r"the same command to resume",
        err.strip().splitlines()[-1],
    )
    assert match and int(match[1]) == round(step_2 / 1e6), err[-3000:]
    assert done.returncode == 74 and "Traceback" not in out + err
    assert {step: digests(dump / "checkpoint" / f"step-{step}") for step in (0, 2)} == kept
    assert sorted(os.listdir(dump / "checkpoint")) == ["incomplete", "step-0", "step-2"]
    (moved,) = (dump / "checkpoint" / "incomplete").iterdir()
    assert moved.name.startswith("step-4.")


@pytest.mark.slow
def test_a_full_disk_before_any_checkpoint_is_one_line(tmp_path):
    """The file size limit (as a full disk or a quota would) met by TorchTitan's first write, its config
    dump, before any checkpoint: one line naming the cause and the run, exit 74, not a traceback."""
    dump = tmp_path / "full"
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--checkpoint.no-enable"]
    proc = python_module("dispersion_titan.train", *argv, timeout=300, file_limit=2048)  # ulimit -f 2
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.fullmatch(
        rf"dispersion_titan: error: file too large writing the run's files in {dump} \(\d+ MB free\); no checkpoint "
        r"was saved yet; raise the file size limit \(ulimit -f\) and relaunch the same command to resume",
        proc.stderr.strip().splitlines()[-1],
    ), proc.stderr[-3000:]


@pytest.mark.slow
def test_a_datasets_cache_out_of_room_as_ranks_read_a_local_corpus_is_one_line(tmp_path):
    """A relaunch on 2 ranks whose local corpus's Arrow copy in datasets' cache meets the file size limit (as a full
    disk would): one line naming the cache and the checkpoint that stands, exit 74, the run's checkpoints and
    run.json untouched (was ``training.dataset_path: FILE: not readable as json ([Errno 27] File too large); fix
    the file``, exit 2, the corpus blamed)."""
    corpus, dump, cache = texts_jsonl(tmp_path / "docs.jsonl", 200, 300), tmp_path / "run", tmp_path / "hf_cache"
    data = ["--training.dataset", "local", "--training.dataset_path", str(corpus), "--validation.no-enable"]
    data += ["--checkpoint.interval", "2", "--checkpoint.no-last_save_model_only"]  # step-2 resumable
    torchrun(dump, 1, *data, "--training.steps", "2", env={CACHE_ENV: "off"})  # no tokens cached: read again below
    kept = digests(dump / "checkpoint"), (dump / "run.json").read_bytes()
    env = {"HF_DATASETS_CACHE": str(cache), CACHE_ENV: str(tmp_path / "tokens")}
    limit = 128 * 1024  # ulimit -f 128: the run's own files fit; the corpus's Arrow copy (~340 KB) does not
    proc = torchrun(dump, 2, *data, "--training.steps", "4", check=False, command_line=True, env=env, file_limit=limit)
    said = [line for line in proc.stderr.splitlines() if "dispersion_titan: error: " in line]
    assert proc.returncode == 74 and len(said) == 1 and said[0] == proc.stderr.strip().splitlines()[-1], proc.stderr
    assert re.fullmatch(
        rf"(\[rank0\]:|\[rank 1\] )dispersion_titan: error: file too large writing {cache} \(\d+ MB free\); the last "
        r"good checkpoint is step-2; raise the file size limit \(ulimit -f\) and relaunch the same command to resume",
        said[0],
    ), proc.stderr[-3000:]
    assert (digests(dump / "checkpoint"), (dump / "run.json").read_bytes()) == kept


@pytest.mark.slow
def test_a_full_disk_while_logging_to_tensorboard_is_one_line(tmp_path):
    """The file size limit met by TensorBoard's writer thread mid-run (16 KiB: its events file meets it first,
    near step 12): one line naming the TensorBoard folder, exit 74 (was the thread's traceback, and "the run's
    files in RUN"; a last write's failure, which TensorBoard drops at close, is raised there)."""
    dump = tmp_path / "tb_full"
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--checkpoint.no-enable"]
    proc = python_module("dispersion_titan.train", *argv, "--training.steps", "30", file_limit=16384)
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.fullmatch(
        rf"dispersion_titan: error: file too large writing {dump}/tb \(\d+ MB free\); no checkpoint was saved yet; "
        r"raise the file size limit \(ulimit -f\) and relaunch the same command to resume",
        proc.stderr.strip().splitlines()[-1],
    ), proc.stderr[-3000:]


def test_a_full_disk_as_tensorboard_opens_its_events_file_is_one_line(tmp_path):
    """``metrics.save_tb_folder`` on a file system with a page free (a tmpfs filled, mounted in a namespace of the
    test's own), which the folder's ``.owner.json`` takes: TensorBoard's first write, in TorchTitan's build of the
    trainer, fails: one line naming the TensorBoard folder and its free space, exit 74, the run folder's free space
    not said (was the writer thread's 50-line traceback around `… writing the run's files in RUN (60170 MB free)`)."""
    full, dump = tmp_path / "full", tmp_path / "run"
    full.mkdir()
    fill = f"mount -t tmpfs -o size=64k tmpfs {full} && head -c 60k /dev/zero > {full}/fill"  # a page for .owner.json
    if subprocess.run(["unshare", "-rm", "sh", "-c", fill], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -rm)")
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--checkpoint.no-enable",
            "--training.steps", "2", "--metrics.save_tb_folder", str(full / "tb")]  # fmt: skip
    proc = in_mount_namespace(fill, "dispersion_titan.train", *argv, tmp=tmp_path)
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: error: no space left on device writing {full / 'tb'} (0.0 MB free); no checkpoint was "
        "saved yet; free space and relaunch the same command to resume"
    ), proc.stderr[-3000:]


@pytest.mark.slow
def test_a_tensorboard_folder_removed_while_training_is_one_line(tmp_path):
    """``rm -rf RUN/tb/*`` once the run is built (its run.json written): one line naming the events file, exit 2,
    no traceback (was the writer thread's traceback, then the training's, exit 1)."""
    dump = tmp_path / "tb_gone"
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--checkpoint.no-enable"]
    job = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.train", *argv, "--training.steps", "20")
    while not (dump / "run.json").exists() and not job.done():
        time.sleep(0.02)
    (events,) = (dump / "tb").glob("*/events.out.tfevents.*")
    shutil.rmtree(events.parent)
    proc = job.result()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (  # was "the checkpoints saved so far are intact; … to resume"
        f"dispersion_titan: error: metrics.save_tb_folder: TensorBoard could not write {events} (no such file or "
        "directory); checkpointing is off (checkpoint.enable = false), so nothing was saved; fix the folder and "
        "relaunch the same command to start over"
    ), proc.stderr[-3000:]


@pytest.mark.slow
def test_a_run_folder_moved_while_training_names_its_relaunch(tmp_path):
    """``mv RUN ELSEWHERE`` while it trains: one line, exit 2, saying the run folder moved and to relaunch naming
    where it is now (was `TensorBoard could not write … fix the folder and relaunch the same command`, which
    started a new run where the old one had been)."""
    dump, moved = tmp_path / "here" / "run", tmp_path / "there"
    dump.parent.mkdir()
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--checkpoint.no-enable"]
    job = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.train", *argv, "--training.steps", "20")
    while not (dump / "run.json").exists() and not job.done():
        time.sleep(0.02)
    dump.rename(moved)
    proc = job.result()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.fullmatch(
        rf"dispersion_titan: error: job.dump_folder: {dump} was moved or removed while training \(TensorBoard could "
        r"not write \S+\); relaunch with --job.dump_folder naming where it is now to start over",
        proc.stderr.strip().splitlines()[-1],
    ), proc.stderr[-3000:]
    assert not dump.exists()


def truncate_shard(step_dir: Path) -> None:
    shard = step_dir / "__1_0.distcp"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)


def drop_metadata(step_dir: Path) -> None:
    (step_dir / ".metadata").unlink()


@pytest.mark.slow
def test_half_written_checkpoint_is_never_loaded(reference, tmp_path, capsys):
    """Two saves that died midway in one copy of the run: step 8 with a shard cut short, step 6 without its
    .metadata."""
    dump = tmp_path / "run"
    shutil.copytree(reference, dump)
    halves = {STEPS: (truncate_shard, "__1_0.distcp: truncated"), STEPS - 2: (drop_metadata, "missing .metadata")}
    for step, (corrupt, _) in halves.items():
        corrupt(dump / "checkpoint" / f"step-{step}")
    earlier = {step: digests(dump / "checkpoint" / f"step-{step}") for step in (0, 2, 4)}
    broken = {step: digests(dump / "checkpoint" / f"step-{step}") for step in halves}

    # The analysis reports each by path, analyses the rest, exits non-zero, and moves nothing.
    code, _, err = analyze(dump, *ANALYSIS, "--out", tmp_path / "analysis", capsys=capsys)
    assert code == 1
    for step, (_, problem) in halves.items():
        assert any(f"{dump / 'checkpoint' / f'step-{step}'}" in line and problem in line for line in err.splitlines())
    assert sorted(p.name for p in (tmp_path / "analysis").glob("step-*")) == ["step-0", "step-2", "step-4"]
    assert {step: digests(dump / "checkpoint" / f"step-{step}") for step in halves} == broken

    # Training moves them aside, resumes from the newest complete checkpoint, and redoes them.
    resumed = torchrun(dump, 2, "--training.steps", str(STEPS), *SCHEDULE)
    assert "Training starts at step 5" in output(resumed)
    moved = {int(p.name.split(".")[0].removeprefix("step-")): p for p in (dump / "checkpoint" / "incomplete").iterdir()}
    assert {step: digests(path) for step, path in moved.items()} == broken
    assert all(f"Incomplete checkpoint moved aside, not loaded: {path}" in output(resumed) for path in moved.values())
    assert {step: digests(dump / "checkpoint" / f"step-{step}") for step in (0, 2, 4)} == earlier
    assert complete_steps(dump) == [0, 2, 4, 6, 8]
    want, got = scalars(reference), scalars(dump)
    assert [got["loss_metrics/global_avg_loss"][s] for s in range(5, STEPS + 1)] == [
        want["loss_metrics/global_avg_loss"][s] for s in range(5, STEPS + 1)
    ]


# ---------------------------------------------------------------- non-finite loss


@pytest.mark.slow
def test_non_finite_loss_ends_the_same_way_every_time_and_keeps_the_last_good_checkpoint(tmp_path):
    """A loss that turns NaN at step 2 on 2 processes, launched twice. The ranks agree on it at step 3 (steps 1
    and 3 log, step 3 saves): the line names step 2, the first bad one. Through launch/train.sh's
    launcher (the first launch): exit status 3 and the ranks' one line, never torchrun's report
    (which a rank killed by torchrun's closing SIGTERM, exit -15, brought back). Through the job
    server's torchrun (the relaunch, cheaper): the same step, the first rank to leave exits 3.
    The relaunch resumes from step 0 and changes no checkpoint."""
    dump = tmp_path / "diverged"
    args = ("--training.steps", "4", "--checkpoint.interval", "3", "--metrics.log_freq", "3", "--validation.no-enable")
    args += ("--optimizer.lr", "1e30")
    message = (
        f"dispersion_titan: error: loss is not finite at step 2; training stopped before saving step 3, "
        f"earlier checkpoints in {dump / 'checkpoint'} are intact"
    )
    good = None
    for through_launcher in (True, False):
        proc = torchrun(dump, 2, *args, check=False, command_line=through_launcher)
        if through_launcher:
            assert proc.returncode == 3 and last_line(proc) == f"[rank0]:{message}", output(proc)[-3000:]
            assert "Traceback" not in output(proc) and "exitcode" not in output(proc)
        else:
            assert message in proc.stderr.splitlines()
            assert re.findall(r"exitcode\s+: (\S+)", output(proc)) == ["3"], output(proc)[-3000:]
        if good is None:
            assert complete_steps(dump) == [0] and sorted(os.listdir(dump / "checkpoint")) == ["step-0"]
            weights = load_weights(dump / "checkpoint" / "step-0")
            assert weights and all(torch.isfinite(w).all() for w in weights.values())
            good = digests(dump / "checkpoint")
        else:
            assert "Training starts at step 1" in output(proc)
            assert digests(dump / "checkpoint") == good


def test_an_infinite_term_is_caught_at_its_own_step(tmp_path):
    """λ·term beyond float32 (λ = 1e39: finite as a setting) makes step 1's loss -inf: the run
    stops at step 1, the step TorchTitan logs as -inf, before its update is saved. Without checkpointing the line
    says that nothing is kept (was "earlier checkpoints are intact", of a run that saves none)."""
    kept = {
        "enable": "training stopped before saving step 1, earlier checkpoints in {} are intact",
        "no-enable": "training stopped at step 1; checkpointing is off (checkpoint.enable = false), so nothing was "
        "saved: a relaunch starts over",
    }
    for enable, says in kept.items():
        dump = tmp_path / enable
        proc = python_module(
            "dispersion_titan.train",
            "--job.config_file",
            DEBUG_TOML,
            "--job.dump_folder",
            str(dump),
            *DEBUG_SEQ_LEN,
            "--training.steps",
            "3",
            "--checkpoint.interval",
            "1",
            f"--checkpoint.{enable}",
            "--validation.no-enable",
            "--dispersion.variant",
            "angular_spread",
            "--dispersion.coeff",
            "1e39",
        )
        assert proc.returncode == 3
        assert proc.stderr.strip().splitlines()[-1] == (
            f"dispersion_titan: error: loss is not finite at step 1; {says.format(dump / 'checkpoint')}"
        )
    assert complete_steps(tmp_path / "enable") == [0] and not (tmp_path / "no-enable" / "checkpoint").exists()


# ---------------------------------------------------------------- bad input


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# Refusals of a configuration alone, with no run folder to keep: test_config_errors.py's table.


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--job.config_file", "{bad_toml}"], "--job.config_file: {bad_toml}: invalid TOML"),
        (
            ["--job.config_file", DEBUG_TOML, "--training.dataset", "local", "--training.dataset_path", "{empty}"],
            "training.dataset_path: '{empty}' is empty",
        ),
        (
            ["--job.config_file", DEBUG_TOML, "--dispersion.lambda_norm", "-1"],
            "dispersion.lambda_norm: must be >= 0, got -1.0",
        ),
        (["--job.config_file", DEBUG_TOML, "--training.steps", "many"], "training.steps: 'many' is not an integer"),
    ],
    ids=["malformed-toml", "empty-dataset", "negative-lambda-norm", "cli-wrong-type"],
)
def test_bad_input_against_an_existing_run_changes_nothing(reference, tmp_path, args, expected):
    paths = {
        "bad_toml": write(tmp_path / "bad.toml", "[training\nsteps = 3\n"),
        "empty": write(tmp_path / "empty.jsonl", ""),
    }
    before = digests(reference)
    proc = python_module(
        "dispersion_titan.train", "--job.dump_folder", str(reference), *(a.format(**paths) for a in args), timeout=120
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"dispersion_titan: error: {expected.format(**paths)}")
    assert digests(reference) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--texts", "{missing}"], ["--texts: {missing}: cannot be read"]),
        (["--texts", "{not_json}"], ["--texts: {not_json}:2: invalid JSON"]),
        (["--texts", "{no_text}"], ['--texts: {no_text}:1: needs a "text" string field']),
        (["--texts", "{no_text}", "--dataset-path", "{missing}"], ["--dataset-path: not used with --texts"]),
        (["--dataset-path", "{file}"], ["--dataset-path: 'enwiki_sample' is embedded and takes no path"]),  # was: used
        (["--seed", "-1"], ["argument --seed: '-1' is not a non-negative integer"]),  # was: numpy's traceback
        (["--dataset", "nope"], ["--dataset", "nope"]),
        (["--dataset", "local", "--dataset-path", "{empty}"], ["{empty}", "empty"]),
        (["--num-sequences", "100000"], ["--num-sequences 100000 needs more"]),
        (["--steps", "2-x"], ["--steps", "2-x"]),
        (["--steps", ""], ["--steps: '' is not a step"]),
        (["--steps", "7"], ["--steps", "[0, 2, 4, 6, 8]"]),
        (["--tb-dir", "{file}/tb"], ["--tb-dir: {file}/tb: not writable"]),
        (["--batch-size", "0"], ["--batch-size", "'0' is not a positive integer"]),
        (["--dtype", "fp8"], ["--dtype", "fp8"]),
    ],
)
def test_bad_analysis_input_fails_with_one_line_and_changes_nothing(reference, tmp_path, capsys, args, fragments):
    paths = {
        "missing": str(tmp_path / "missing.jsonl"),
        "file": write(tmp_path / "file", ""),
        "not_json": write(tmp_path / "not_json.jsonl", '{"text": "ok"}\n{"text": \n'),
        "no_text": write(tmp_path / "no_text.jsonl", '{"body": "x"}\n'),
        "empty": write(tmp_path / "empty.jsonl", ""),
    }
    before = digests(reference)
    result = analyze(reference, *ANALYSIS, *(a.format(**paths) for a in args), capsys=capsys)
    assert_one_line_error(*result[::2], *(f.format(**paths) for f in fragments))
    assert digests(reference) == before


@pytest.mark.slow
def test_a_run_named_the_wrong_way_is_told_the_right_one(reference, tmp_path, capsys):
    """A step folder for RUN, or a run as hf:RUN: one line with what to type; ``last`` is the newest complete step."""
    step = reference / "checkpoint" / "step-4"
    assert_one_line_error(
        *analyze(step, *ANALYSIS, capsys=capsys)[::2],
        f"{step}: one checkpoint's folder, not a run's; give the run folder {reference} with --steps 4",
    )
    assert_one_line_error(
        *analyze(f"hf:{reference}", "--out", tmp_path / "out", capsys=capsys)[::2],
        f"hf:{reference}: {reference} is a training run's folder (run.json); give it without hf:",
    )
    assert not (tmp_path / "out").exists()
    steps = list_checkpoints(reference / "checkpoint")
    (tmp_path / "step-9").mkdir()  # a save that stopped before its .metadata
    (tmp_path / "step-10").mkdir()  # a copy under way (rsync's order): its .metadata, no shard yet
    shutil.copy(reference / "checkpoint" / "step-8" / ".metadata", tmp_path / "step-10")
    unfinished = [*steps, *(type(steps[0])(s, str(tmp_path / f"step-{s}")) for s in (9, 10))]
    assert [c.step for c in select_steps("first,last", unfinished)] == [0, 8]  # was 10: a .metadata was enough
    assert [c.step for c in select_steps("9", unfinished)] == [9]  # named: analysed, and reported broken
    for spec, says in (("6-2", "--steps: empty range '6-2'"), ("10-20", "--steps: '10-20' selects no checkpoint")):
        with pytest.raises(ArgumentError, match=f"^{re.escape(says)}"):
            select_steps(spec, steps)


@pytest.mark.slow
def test_an_analysis_or_a_hugging_face_folder_given_as_a_run_is_named(reference, tmp_path, capsys):
    """A run's analysis (its step-N folders hold results) or a Hugging Face model's folder where a run is
    expected: one line saying what the folder is and what to give (were its step-N taken for damaged
    checkpoints, `missing .metadata`, exit 1; and `no checkpoints`), nothing written."""
    analysis = tmp_path / "analysis"
    assert (
        analyze(reference, *ANALYSIS, "--steps", "0", "--out", analysis, "--tb-dir", tmp_path / "tb", capsys=capsys)[0]
        == 0
    )
    hub = tiny_hub_model(tmp_path / "hub")
    before = digests(tmp_path)
    assert_one_line_error(
        *analyze(analysis, *ANALYSIS, "--force", capsys=capsys)[::2],
        f"{analysis}: the analysis of {reference}, not a run's checkpoints; give the run's folder {reference}",
    )
    assert_one_line_error(
        *run_cli(convert_main, "to-hf", analysis, tmp_path / "hf", capsys=capsys)[::2],
        f"{analysis}: the analysis of {reference}, not a run's checkpoints",
    )
    assert_one_line_error(
        *analyze(hub, *ANALYSIS, capsys=capsys)[::2],
        f"{hub}: a Hugging Face model's folder, not a run; give it as hf:{hub}",
    )
    assert digests(tmp_path) == before


@pytest.mark.slow
def test_a_checkpoint_or_an_analysis_given_as_a_hugging_face_model_is_named(reference, tmp_path, capsys):
    """``hf:RUN/checkpoint/step-N`` or ``hf:`` of an analysis: one line saying what the folder is, exit 2, before
    ``--out`` is made (was transformers' `Unrecognized model … Should have a model_type key in its config.json`)."""
    analysis = tmp_path / "analysis"
    assert (
        analyze(reference, *ANALYSIS, "--steps", "0", "--out", analysis, "--tb-dir", tmp_path / "tb", capsys=capsys)[0]
        == 0
    )
    step = reference / "checkpoint" / "step-4"
    assert_one_line_error(
        *analyze(f"hf:{step}", *ANALYSIS, "--out", tmp_path / "out", capsys=capsys)[::2],
        f"hf:{step}: {step} is a training run's checkpoint (DCP), not a Hugging Face model; give its run's folder",
    )
    assert_one_line_error(
        *analyze(f"hf:{analysis}", *ANALYSIS, "--out", tmp_path / "out", capsys=capsys)[::2],
        f"hf:{analysis}: {analysis} holds no config.json: not a Hugging Face model's folder",
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_command_out_of_room_is_one_line(reference, tmp_path):
    """Any command whose writes meet a full disk, a quota or the file size limit (here set from the start, as
    ``ulimit -f`` sets it): one line with what to do, exit 74, not the writer's traceback; the run unchanged."""
    before = digests(reference)
    out = tmp_path / "out"
    argv = [str(reference), *ANALYSIS, "--steps", "0", "--out", str(out)]
    proc = python_module("dispersion_titan.analyze", *argv, timeout=300, file_limit=1024)  # ulimit -f 1
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.fullmatch(
        rf"dispersion_titan: error: file too large writing {out}/\S+; raise the file size limit \(ulimit -f\); each "
        r"model state analyzed .*",
        proc.stderr.strip().splitlines()[-1],
    ), proc.stderr[-3000:]
    assert digests(reference) == before


def test_an_os_error_no_environment_explains_keeps_its_traceback(tmp_path):
    """A command says in one line only a failure of a file the environment took away or refuses (``file_failure``):
    an OSError naming no file, one of an errno that is a bug's (EINVAL), and an error raised while handling a missing
    file (caught to go on without it) keep their traceback."""

    @command("nothing was done")
    def main(error: Exception | None) -> None:
        if error is not None:
            raise error
        try:
            (tmp_path / "missing").read_text()
        except FileNotFoundError:
            raise TypeError("a bug in what goes on without it")  # noqa: B904 - its context: the missing file

    for error in (OSError(errno.ENOENT, "No such file or directory"), OSError(errno.EINVAL, "Invalid argument", "f")):
        with pytest.raises(OSError) as raised:
            main(error)
        assert raised.value is error
    with pytest.raises(TypeError):
        main(None)


def test_init_out_of_room_is_one_line_and_leaves_no_half_file(tmp_path):
    """``init`` meeting the file size limit (as a full disk would): the commands' out-of-room line naming
    the file, exit 74, and no truncated config that a rerun would keep; the rerun then writes them all."""
    out = tmp_path / "cfg"
    limited = 'trap "" XFSZ; ulimit -f 1; exec "$0" -m dispersion_titan.init "$@"'
    proc = subprocess.run(
        ["bash", "-c", limited, sys.executable, str(out)], env=launch_env(), capture_output=True, text=True
    )
    assert proc.returncode == 74, proc.stderr
    assert re.fullmatch(
        rf"dispersion_titan: error: file too large writing {out}/\S+\.toml; raise the file size limit \(ulimit -f\); "
        r"the configs written so far are kept; run it again to write the others\n",
        proc.stderr,
    ), proc.stderr
    kept = {p: p.read_bytes() for p in out.rglob("*.toml")}
    assert all(len(b) <= 1024 for b in kept.values())  # only whole files the limit let through
    shipped = shipped_files()
    kept = [str(p.relative_to(out)) for p in out.rglob("*.toml")]
    assert all((out / rel).read_bytes() == Path(shipped[rel]).read_bytes() for rel in kept)  # whole files only
    again = subprocess.run(
        [sys.executable, "-m", "dispersion_titan.init", str(out)], env=launch_env(), capture_output=True, text=True
    )
    assert again.returncode == 0 and f"wrote {len(shipped) - len(kept)} configs" in again.stdout, again.stdout


def test_atomic_writes_give_the_mode_open_gives_and_leave_the_umask_alone(tmp_path, monkeypatch):
    """A file written through its temporary file has the mode a plain ``open`` gives it under the umask (``mkstemp``
    makes it private), and no write sets the process's umask (was set to 0 and back at each write: another thread's
    file made meanwhile, a checkpoint's or a TensorBoard event file, was world-writable)."""
    from dispersion_titan.utils import records

    with open(tmp_path / "plain", "w"):
        pass
    monkeypatch.setattr(os, "umask", lambda mask: pytest.fail(f"os.umask({mask:#o}) while writing"))
    records.atomic_write(str(tmp_path / "atomic"), lambda f: f.write("x"))
    assert (tmp_path / "atomic").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_init_with_no_inode_left_names_the_config_not_its_temporary_file(tmp_path):
    """A full file system whose last inode is taken (a tmpfs of 4, mounted in a namespace of the test's own) fails
    ``atomic_write``'s temporary file as it is made: the line names the config (was its hidden
    ``.NAME.toml.XXXX.tmp``, a file the user never sees)."""
    full = tmp_path / "full"
    full.mkdir()
    fill = f'mount -t tmpfs -o size=1m,nr_inodes=4 tmpfs {full} && exec "$0" -m dispersion_titan.init "$@"'
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -rm)")
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", fill, sys.executable, str(full / "cfg")],
        env=launch_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 74, proc.stderr
    assert re.fullmatch(
        rf"dispersion_titan: error: no space left on device writing {full}/cfg/\w+/\w+\.toml; free space; "
        r"the configs written so far are kept; run it again to write the others\n",
        proc.stderr,
    ), proc.stderr


def test_inits_next_command_runs_as_printed(tmp_path, capsys, monkeypatch, script_python):
    """``init "my runs"`` ends naming the next command; pasted into a shell as printed it runs (was ``cd my runs``,
    unquoted: ``cd: too many arguments``; and ``--profile cpu``, which debug.toml does not need). Its
    ``dispersion-titan`` is ``python -m dispersion_titan`` forked from the job server (``script_python``): the console
    script itself is test_console_script.py's and test_wheel.py's."""
    monkeypatch.chdir(tmp_path)
    init_main(["my runs"])
    (hint,) = re.findall(r"; next: (.*)", capsys.readouterr().out)
    assert hint.startswith("cd 'my runs' && dispersion-titan train ") and "--profile" not in hint, hint
    command = tmp_path / "bin" / "dispersion-titan"
    command.parent.mkdir()
    command.write_text(f'#!/bin/sh\nexec "{script_python}" -m dispersion_titan "$@"\n')
    command.chmod(0o755)
    env = launch_env({"PATH": f"{command.parent}:{os.environ['PATH']}"})
    proc = subprocess.run(["bash", "-c", f"{hint} --check-only"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_an_init_meeting_another_writing_its_folder_writes_what_is_missing(tmp_path, capsys):
    """Two ``init DIR`` at once: the second met the first's temporary file (``atomic_write``'s) and was refused,
    ``holds other files (train_configs/.debug.toml.k3j9_x2a.tmp)``, exit 2 (seen by hand, 3 of 10 pairs); it is
    the configs' own, so the second writes what is not there yet as a rerun does. One named after no config of
    init's is still another's file."""
    pending = tmp_path / "mine" / "train_configs" / ".debug.toml.k3j9_x2a.tmp"
    pending.parent.mkdir(parents=True)
    pending.write_text("[job]\n")  # half-written
    init_main([str(tmp_path / "mine")])
    for dest, source in shipped_files().items():
        assert (tmp_path / "mine" / dest).read_bytes() == Path(source).read_bytes()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / ".notes.txt.k3j9_x2a.tmp").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        init_main([str(tmp_path / "other")])
    assert exit_.value.code == 2 and "holds other files (.notes.txt.k3j9_x2a.tmp)" in capsys.readouterr().err


def test_init_refuses_a_folder_shaped_unlike_its_own(tmp_path, capsys):
    """A file where init writes a folder (DIR itself, above it, or in it), a folder where it writes a config, an
    empty DIR: one line, exit 2, nothing written (were 'not writable (File exists)', a folder counted as a kept
    config, and the cwd); a run's folder, or its analysis's, named as such (was 'holds other files (.owner.json)')."""
    run, analysis = tmp_path / "run", tmp_path / "analysis"
    for folder, owner in ((run, FolderOwner("run", str(run))), (analysis, FolderOwner("analysis", str(run)))):
        folder.mkdir()
        write_record(str(folder), owner)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "train_configs").write_text("x")
    (tmp_path / "b" / "train_configs" / "debug.toml").mkdir(parents=True)
    (tmp_path / "c").write_text("x")
    for folder, says in (
        (tmp_path / "c", f"DIR: {tmp_path / 'c'} is a file; name a new or empty folder"),
        (tmp_path / "c" / "d", f"DIR: {tmp_path / 'c' / 'd'}: not writable (Not a directory)"),
        (tmp_path / "a", f"DIR: {tmp_path / 'a'} holds other files (train_configs); init writes only into "),
        (tmp_path / "b", f"DIR: {tmp_path / 'b'} holds other files (train_configs/debug.toml); init writes "),
        ("", "DIR: empty; name a new or empty folder"),
        (run, f"DIR: {run} is the folder of run {run}; init writes only into a new or empty folder: name another DIR"),
        (analysis, f"DIR: {analysis} is the folder of the analysis of {run}; init writes only into "),
    ):
        with pytest.raises(SystemExit) as exit_:
            init_main([str(folder)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(f"dispersion_titan: error: {says}") and err.count("\n") == 1
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "a",
        "a/train_configs",
        "analysis",
        "analysis/.owner.json",
        "b",
        "b/train_configs",
        "b/train_configs/debug.toml",
        "c",
        "run",
        "run/.owner.json",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.slow
def test_analysis_on_a_missing_device_fails_with_one_line(reference, capsys):
    assert_one_line_error(
        *analyze(reference, *ANALYSIS, "--device", "cuda", capsys=capsys)[::2],
        "--device: cuda: CUDA is not available here",
    )


@pytest.mark.slow
def test_analysis_needs_the_recorded_model_shape(reference, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(reference / "checkpoint", bare / "checkpoint")
    assert_one_line_error(*analyze(bare, *ANALYSIS, capsys=capsys)[::2], f"{bare / 'run.json'}: missing")
    assert not (bare / "condensation").exists()


@pytest.mark.slow
def test_bad_compare_input_fails_with_one_line_and_writes_nothing(reference, tmp_path, capsys):
    out = tmp_path / "cmp"
    before = digests(reference)
    assert_one_line_error(
        *analyze("compare", reference, "--out", out, "--step", "7", capsys=capsys)[::2],
        "--step",
        "no analysis of step 7",
    )
    empty = tmp_path / "unanalysed"
    empty.mkdir()
    assert_one_line_error(
        *analyze("compare", reference, empty, "--out", out, capsys=capsys)[::2], f"{empty}: no condensation analyses"
    )
    (empty / "config.json").write_text("{}")  # a Hugging Face model's folder: analysed as hf:, into an --out
    assert_one_line_error(
        *analyze("compare", reference, empty, "--out", out, capsys=capsys)[::2],
        f"{empty}: a Hugging Face model's folder, which holds no condensation analyses; make them with "
        f"python -m dispersion_titan.analyze hf:{empty} --out DIR, then give DIR",
    )
    assert not out.exists() and digests(reference) == before


@pytest.mark.parametrize("blocked", ["tensorboard", "wandb"])
def test_metrics_processor_failing_to_build_puts_back_the_thread_excepthook(tmp_path, monkeypatch, blocked):
    """TorchTitan's ``MetricsProcessor.__init__`` failing (TensorBoard's folder a file) after ours set
    ``threading.excepthook``, or ours after it (W&B's run, offline, not recorded: a folder where ``wandb_run.json``
    goes): the hook it found is back (was ours, left for good with the processor never built, whose ``close`` puts
    it back)."""
    from torchtitan.distributed import ParallelDims

    from dispersion_titan.components.metrics import DispersionMetricsProcessor
    from dispersion_titan.components.wandb_run import WANDB_RUN_FILE
    from dispersion_titan.job_config.parse import validated_args

    run = tmp_path / "run"
    wandb = ["--metrics.enable_wandb"] if blocked == "wandb" else []
    job_config = validated_args(["--job.config_file", DEBUG_TOML, "--job.custom_config_module",
                                 "dispersion_titan.config", "--job.dump_folder", str(run), *DEBUG_SEQ_LEN, *wandb],
                                world_size=1)  # fmt: skip
    if wandb:
        for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "dispersion-test"}.items():
            monkeypatch.setenv(key, value)
        (run / WANDB_RUN_FILE).mkdir(parents=True)
    else:
        run.mkdir()
        (run / job_config.metrics.save_tb_folder).write_text("not a folder")
    before = threading.excepthook
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with pytest.raises(OutputError if wandb else OSError):
            DispersionMetricsProcessor(job_config, ParallelDims(1, 1, 1, 1, 1, 1, 1, 1))
    finally:
        torch.distributed.destroy_process_group()
        if wandb:
            sys.modules["wandb"].finish()  # the run TorchTitan's logger started, which no close() ends
    assert threading.excepthook is before
