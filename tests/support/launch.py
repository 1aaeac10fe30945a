"""Launching real jobs: torchrun training runs and ``python -m`` commands, forked from the
product's job server (``dispersion_titan.reproduce.quickstart.jobs``) or run from the command line."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psutil

from dispersion_titan.run_folder.owners import OWNER_FILE
from dispersion_titan.run_folder.writer_lock import LOCK_NAME
from dispersion_titan.utils.devices import CPU_MALLOC_ENV
from support.cli import assert_one_line_error
from support.jobs import Jobs
from support.runs import digests

REPO = Path(__file__).resolve().parents[2]
DEBUG_TOML = str(REPO / "train_configs" / "debug.toml")
QWEN3_TOML = str(REPO / "train_configs" / "debug_qwen3_angular_spread.toml")


def job_args(config: str = DEBUG_TOML) -> list[str]:
    """The arguments a launch passes ``validated_args`` for ``config``, before any override."""
    return ["--job.config_file", config, "--job.custom_config_module", "dispersion_titan.config"]


# The schedule of the session's 2-process yardstick run (conftest's ``reference_run``) and of
# every run compared with it step for step (reliability, resume).
REFERENCE_STEPS = 8
SCHEDULE = (
    "--lr_scheduler.total_steps",
    "10",
    "--checkpoint.interval",
    "2",
    "--dispersion.variant",
    "angular_spread",
    "--dispersion.coeff",
    "0.3",
    "--dispersion.max_tokens",
    "32",  # of DEBUG_SEQ_LEN's 64: each micro-batch and layer draws a subset, which a resume must draw again
)


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**CPU_MALLOC_ENV, **os.environ}  # the quickstart's allocator settings, for every CPU job
    # The tests train on CPU on purpose: allowed even where GPUs are allocated but unusable.
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "TORCH_CPP_LOG_LEVEL": "ERROR",
            "DISPERSION_TITAN_ALLOW_CPU": "1",
        }
    )
    env.update(extra or {})
    return env


# What the session's job server imports once (GPT-2's BPE built and a config parsed once) before it forks each job;
# the analysis and scipy.stats as the quickstart's server has them (an analyze job: 2.7 s of CPU, 1.1 s so forked).
PRELOAD = [
    "torch",
    "torchtitan.train",
    "torch.distributed.launcher.api",
    "dispersion_titan.train",
    "dispersion_titan.analysis.runner",
    "scipy.stats",
    "dispersion_titan.tokenizer.encoders:gpt2_encoding",
    "dispersion_titan.job_config.parse:warm",
]
_jobs: Jobs | None = None


def _forked(
    target: str,
    argv: list[str],
    env: dict[str, str],
    timeout: float,
    nproc: int | None = None,
    stdout: Path | None = None,
    cwd: Path = REPO,
    file_limit: int | None = None,
    nodes: tuple[int, str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``target`` (a module or a script) forked from the session's job server, the product's
    (``dispersion_titan.reproduce.quickstart.jobs``) as ``support.jobs`` extends it, under torchrun's
    launcher with ``nproc`` processes (on one of ``nodes``) when given; its stdout and stderr apart."""
    global _jobs
    if _jobs is None:
        _jobs = Jobs(launch_env(), PRELOAD)
        atexit.register(_jobs.close)
    return _jobs.run_apart(target, argv, env, str(cwd), timeout, nproc, stdout, file_limit, nodes)


# Debug runs train on 64-token sequences (debug.toml: 128) unless a test says otherwise: a
# step's cost is mostly the 50k-row LM head over every token, and no assertion needs more.
DEBUG_SEQ_LEN = ("--training.seq_len", "64")


def torchrun(
    dump: Path | str,
    nproc: int,
    *overrides: str,
    config: str = DEBUG_TOML,
    check: bool = True,
    timeout: int = 600,
    env: dict[str, str] | None = None,
    command_line: bool = False,
    nodes: tuple[int, str, str] | None = None,
    file_limit: int | None = None,
) -> subprocess.CompletedProcess:
    """Train with ``nproc`` processes under torchrun's launcher; return the completed process.
    ``nodes``: the job's node count, rendezvous endpoint and id, its ``nproc`` processes one node's of them;
    ``file_limit``: the job's file size limit in bytes, its ranks' too, as ``ulimit -f`` sets one.

    By default the job is forked from the session's job server (``support.jobs``:
    torchrun's own ``elastic_launch``, imports paid once). ``command_line=True`` runs torchrun
    as ``launch/train.sh`` does (``python -m dispersion_titan.torchrun -m
    dispersion_titan.train``: torchrun with a one-line ending), for tests that look at its
    processes, signal them or read its prefixed output: the launcher forked from the job server
    (its imports paid: about 1 s of CPU a launch), its ranks fresh interpreters as torchrun
    starts them (their command lines name the run; the launcher is their parent)."""
    argv = [
        "--job.config_file",
        config,
        "--job.dump_folder",
        str(dump),
        "--metrics.log_freq",
        "1",
        *(DEBUG_SEQ_LEN if config == DEBUG_TOML else ()),
        *overrides,
    ]
    if command_line:
        launcher = [
            f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d",
            "--rdzv_endpoint=localhost:0",
            "--local-ranks-filter=0",
            "--role=rank",
            "--tee=3",
            "-m",
            "dispersion_titan.train",
            *argv,
        ]
        proc = _forked("dispersion_titan.torchrun", launcher, launch_env(env), timeout, file_limit=file_limit)
    else:
        proc = _forked(
            "dispersion_titan.train", argv, launch_env(env), timeout, nproc, nodes=nodes, file_limit=file_limit
        )
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return proc


def torchrun_script(script: str, nproc: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node NPROC tests/dist_scripts/SCRIPT ARGS``, forked from the
    job server like ``torchrun``'s jobs (rank 0's output); never raises on failure."""
    return _forked(str(REPO / "tests" / "dist_scripts" / script), list(args), launch_env(), timeout, nproc)


def python_module(
    module: str,
    *args: str,
    timeout: int = 600,
    env: dict[str, str] | None = None,
    command_line: bool = False,
    stdout: Path | None = None,
    cwd: Path = REPO,
    file_limit: int | None = None,
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in ``cwd`` (default: the repository): forked from the job server (its
    imports already paid; its stdout also in the file ``stdout`` when given, which a test can
    watch while it runs; ``file_limit``: its file size limit in bytes, as ``ulimit -f`` sets one,
    without a fresh interpreter), or with ``command_line=True`` a fresh interpreter, for commands
    that read the environment at import time or start processes of their own."""
    if not command_line:
        return _forked(module, list(args), launch_env(env), timeout, stdout=stdout, cwd=cwd, file_limit=file_limit)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=launch_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


AS_SOMEONE_ELSE = """
import ctypes, runpy, sys
libc = ctypes.CDLL(None, use_errno=True)
header, caps = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()  # capget's v3: 2 x (eff, perm, inh)
assert libc.capget(header, caps) == 0, ctypes.get_errno()
for i in range(3):
    caps[i] &= ~(1 << 1 | 1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
assert libc.capset(header, caps) == 0, ctypes.get_errno()
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def as_someone_else(tmp_path: Path) -> str:
    """A script, ``python SCRIPT MODULE ARGS``: ``python -m MODULE ARGS`` as a user other than the files' owner would
    run it (``python_module(SCRIPT, MODULE, ...)``): root (the CI's user) ignores file modes unless it gives up
    ``CAP_DAC_OVERRIDE`` (what ``setpriv --bounding-set -dac_override,-dac_read_search`` gives a fresh interpreter;
    here a forked job's own)."""
    script = tmp_path / "as_someone_else.py"
    script.write_text(AS_SOMEONE_ELSE)
    return str(script)


def paused_writer(
    module: str, *args: str, folder: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[int, Future]:
    """``python -m MODULE ARGS`` started in the background (forked from the job server, as
    ``python_module``) and paused (SIGSTOP) the moment it holds ``folder``'s writer lock, so that
    a second writer provably meets it inside. Returns its PID (SIGCONT resumes it) and the
    future of its completed process."""
    job = ThreadPoolExecutor(1).submit(python_module, module, *args, env=env, timeout=timeout)
    deadline = time.monotonic() + timeout
    while not job.done() and time.monotonic() < deadline:
        try:
            owner = json.loads((folder / LOCK_NAME).read_text())
        except (OSError, ValueError):  # not yet there, or being written
            owner = None
        if owner is not None and f"-m {module} " in owner["command"]:
            os.kill(owner["pid"], signal.SIGSTOP)
            return owner["pid"], job
        time.sleep(0.005)
    raise AssertionError(f"{module} never held {folder}'s lock: {job.result().stderr[-3000:] if job.done() else ''}")


_PAUSE_AT_READ = """\
import os, runpy, signal, sys
marker, reading, module, *args = sys.argv[1:]
def pause(event, hook_args):
    if event == "open" and str(hook_args[0]).endswith(reading) and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
sys.addaudithook(pause)
sys.argv, sys.orig_argv = [module, *args], [sys.executable, "-m", module, *args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def paused_reading(module: str, *args: str, reading: str, tmp: Path, timeout: float = 300) -> tuple[int, Future]:
    """``python -m MODULE ARGS`` started in the background (forked, as ``paused_writer``) and paused (SIGSTOP) as
    it opens the first file whose path ends with ``reading`` (an input): a second command provably starts while
    it runs, whatever it holds then. Returns its PID (SIGCONT resumes it) and the future of its completed process."""
    script, marker = tmp / "pause_at_read.py", tmp / "paused.pid"
    script.write_text(_PAUSE_AT_READ)
    job = ThreadPoolExecutor(1).submit(python_module, str(script), str(marker), reading, module, *args, timeout=timeout)
    deadline = time.monotonic() + timeout
    while not job.done() and time.monotonic() < deadline:
        pid = int(marker.read_text() or 0) if marker.exists() else 0
        if pid and psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            return pid, job
        time.sleep(0.005)
    raise AssertionError(f"{module} never read {reading}: {job.result().stderr[-3000:] if job.done() else ''}")


def out_gone_while_reading(
    module: str,
    *args: str,
    reading: str,
    out: Path,
    replaced: bool,
    tmp: Path,
    by_folder: bool = False,
    keeps: str = OWNER_FILE,
) -> tuple[subprocess.CompletedProcess, str]:
    """``python -m MODULE ARGS`` paused as it opens ``reading`` (``paused_reading``) while ``out`` is removed
    (``rm -rf``), or moved aside to ``tmp/moved`` and a file (``by_folder``: a new empty folder) put in its place; the
    completed process, checked to have ended with exit 74 and no traceback, nothing made anew where ``out`` was (the
    new folder left empty, or removed with what the command made), the folder moved aside keeping ``keeps`` (its
    record); and the start of ``file_failure``'s line for it, without the file (``CAUSE: `` ... ``; ADVICE``: ``{}``
    stands for the file)."""
    pid, job = paused_reading(module, *args, reading=reading, tmp=tmp)
    try:
        if replaced:
            out.rename(tmp / "moved")
            if by_folder:
                out.mkdir()
            else:
                out.write_text("a file\n")
        else:
            shutil.rmtree(out)
    finally:
        os.kill(pid, signal.SIGCONT)
    done = job.result()
    assert done.returncode == 74 and "Traceback" not in done.stderr, done.stderr[-3000:]
    if replaced:
        assert (not out.exists() or os.listdir(out) == []) if by_folder else out.read_text() == "a file\n"
        assert keeps in os.listdir(tmp / "moved")
    else:
        assert not out.exists()
    said = (
        "not a directory: {}; move aside the file that stands where a folder on its path should be"
        if replaced and not by_folder
        else "no such file or directory: {}; put back what was removed or moved (it, or a folder on its path)"
    )
    return done, said


_IN_MOUNT_NAMESPACE = """\
import ctypes, os, runpy, subprocess, sys
uid, gid = os.getuid(), os.getgid()
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x00020000):  # CLONE_NEWUSER | CLONE_NEWNS
    sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
    with open(f"/proc/self/{name}", "w") as f:
        f.write(text)
mount, after = sys.argv[1:3]
subprocess.run(["sh", "-c", "mount --make-rprivate / && " + mount], check=True)
sys.argv, sys.orig_argv = sys.argv[3:], [sys.executable, "-m", *sys.argv[3:]]
try:  # a module, or a script (_PAUSE_AT_READ's)
    if sys.argv[0].endswith(".py"):
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
finally:
    sys.stdout.flush()
    subprocess.run(["sh", "-c", after])
"""


def in_mount_namespace(
    mount: str, module: str, *args: str, tmp: Path, after: str = ":", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` (MODULE: or a script) in a user and mount namespace of its own, as ``unshare -rm sh
    -c 'MOUNT && python -m MODULE ARGS; AFTER'`` runs it (AFTER: a shell command whose output follows the command's,
    while its mounts stand; in MOUNT, ``$PPID`` is the command's PID), but forked from the job server: its imports
    paid (3 to 5 s of CPU a command)."""
    script = tmp / "in_mount_namespace.py"
    script.write_text(_IN_MOUNT_NAMESPACE)
    return python_module(str(script), mount, after, module, *args, env=env)


def read_only_from_reading(
    folder: Path, module: str, *args: str, reading: str, tmp: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in a mount namespace of its own (``unshare -rm``) whose ``folder`` is remounted
    read-only as the command opens the first file whose path ends with ``reading`` (paused meanwhile, as
    ``paused_reading``): what ext4's ``errors=remount-ro`` does to a command writing there."""
    script, marker = tmp / "pause_at_read.py", tmp / "paused.pid"
    script.write_text(_PAUSE_AT_READ)
    remount = (  # in the background: once the command (the shell's parent) is paused
        f"mount --bind {folder} {folder} && (until grep -qs '^State:.T' /proc/$PPID/status; do "
        f"kill -0 $PPID 2>/dev/null || exit; sleep 0.01; done; mount -o remount,bind,ro {folder} && kill -CONT $PPID) &"
    )
    return in_mount_namespace(remount, str(script), str(marker), reading, module, *args, tmp=tmp, env=env)


def second_writer_is_refused(
    module: str, first: list[str], second: list[str], folder: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m MODULE FIRST`` paused while it holds ``folder`` (``paused_writer``), then
    ``python -m MODULE SECOND`` into the same folder: refused in one line naming the first's PID,
    host and command, with nothing in ``folder`` changed. The first then ends, exit 0, releasing
    the lock; its completed process is returned."""
    pid, job = paused_writer(module, *first, folder=folder, env=env)
    try:
        before = digests(folder)
        refused = python_module(module, *second, env=env, timeout=300)
        assert_one_line_error(
            refused.returncode,
            refused.stderr,
            f"{folder}: another command is writing here (PID {pid} on {socket.gethostname()}, python -m {module} ",
            "use another --out",
        )  # its command, maybe cut
        assert digests(folder) == before
    finally:
        os.kill(pid, signal.SIGCONT)
    done = job.result()
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (folder / LOCK_NAME).exists()
    return done


@contextmanager
def held_by_another_command(folder: Path) -> Iterator[int]:
    """``folder``'s writer lock held, for the block, by a live process of this host that takes it
    as every command does (``sole_writer``); yields its PID."""
    code = (
        "import sys, time\nfrom dispersion_titan.run_folder.writer_lock import sole_writer\n"
        "with sole_writer(sys.argv[1]):\n    print(flush=True)\n    time.sleep(300)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)], cwd=REPO, env=launch_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        holder.stdout.readline()  # it holds the lock
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


SQUEUE = """#!/bin/sh
ids=${3#--jobs=}
[ "$*" = "--noheader --format=%F %Z --jobs=$ids" ] || { echo "squeue (stand-in): unexpected arguments: $*" >&2; exit 2; }
touch HELD
echo "$ids" >> HELD.calls
awk -v ids="$ids" 'BEGIN { split(ids, a, ","); for (i in a) want[a[i]] } $1 in want' HELD
case $ids in *,*) ;; *) grep -q "^$ids " HELD || { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; } ;; esac
"""  # noqa: E501


def fake_slurm(tmp_path: Path, before_id: str) -> dict[str, str]:
    """PATH with an sbatch that logs its arguments to ``tmp_path/calls`` and prints job ids 101, 102, ... (its call
    count; ``before_id``: shell run first, ``$n`` the count) and an squeue holding every job submitted, with the
    working directory it was submitted from, as Slurm 22.05's answers ``--format=%F %Z --jobs=IDS``: those of IDS
    it holds (one unknown id alone: its error, exit 1), each call's IDS a line of ``tmp_path/held.calls``."""
    bin_dir, calls, held = tmp_path / "bin", tmp_path / "calls", tmp_path / "held"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\nn=$(wc -l < {calls})\n{before_id}'
        f'echo "$((100 + n)) $PWD" >> {held}\necho $((100 + n))\n'
    )
    (bin_dir / "squeue").write_text(SQUEUE.replace("HELD", str(held)))
    for tool in ("sbatch", "squeue"):
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
