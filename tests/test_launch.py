"""Launchers without a cluster: launch/train.sh's refusals, a two-"node" run through two
torchrun agents on localhost (train.sh from another folder), and the sweep's dry run. train.sh's
one-node defaults are checked by test_reliability.py's background SIGINT run."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.eval_tasks import write_evaluation
from support.launch import (
    DEBUG_SEQ_LEN,
    DEBUG_TOML,
    REPO,
    SCHEDULE,
    fake_slurm,
    held_by_another_command,
    launch_env,
    paused_reading,
    python_module,
    torchrun,
    torchrun_script,
)
from support.runs import digests, scalars, tiny_run

TRAIN_SH = REPO / "launch" / "train.sh"
STEPS = 2  # compared step for step with the reference run: its first two
COMMON = ("--training.steps", str(STEPS), "--validation.no-enable", "--metrics.log_freq", "1", *DEBUG_SEQ_LEN)
LOSS = "loss_metrics/global_avg_loss"


def train_sh(dump: Path, *overrides: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start launch/train.sh on the debug config (absolute path: cwd is not the repo)."""
    return subprocess.Popen(
        [str(TRAIN_SH), DEBUG_TOML, "--job.dump_folder", str(dump), *COMMON, *overrides],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: int = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-6000:]}"
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_train_sh_bad_input_is_one_line(tmp_path):
    missing = subprocess.run([str(TRAIN_SH), "nope.toml"], cwd=tmp_path, capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.strip() == "train.sh: error: config file not found: nope.toml"
    folder = subprocess.run([str(TRAIN_SH), str(tmp_path)], cwd=tmp_path, capture_output=True, text=True)
    assert folder.returncode == 2  # was "config file not found", of a folder that is there
    assert folder.stderr.strip() == f"train.sh: error: config file {tmp_path} is a folder; give the TOML file itself"
    bad = subprocess.run(
        [str(TRAIN_SH), DEBUG_TOML], cwd=tmp_path, capture_output=True, text=True, env=launch_env({"NPROC": "two"})
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "train.sh: error: NPROC must be a positive integer, got 'two'"


def test_train_sbatch_within_its_warning_of_the_time_limit_is_one_line(tmp_path):
    """train.sbatch submitted with a --time within its USR1 warning (300 s, or the PREEMPT_LEAD given with a later
    --signal; Slurm may send it 60 s sooner): one line naming the limit, exit 2, before srun (was: each attempt
    signalled at its start, checkpointed and requeued, again and again). Here a stand-in scontrol tells the limit."""
    sbatch_script, bin_dir = REPO / "launch" / "slurm" / "train.sbatch", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/sh\ntouch {tmp_path}/trained\n")  # were it to train
    for limit, lead, refused in (
        ("00:05:00", "", True),
        ("00:06:00", "", True),
        ("00:06:01", "", False),
        ("1-00:00:00", "", False),
        ("UNLIMITED", "", False),
        ("00:05:00", "60", False),
    ):
        (bin_dir / "scontrol").write_text(
            f'#!/bin/sh\necho "JobId=7 JobName=t\n   RunTime=00:00:01 TimeLimit={limit} TimeMin=N/A\n'
            f'   Command={sbatch_script} /no/such.toml"\n'  # the script and its arguments, as Slurm shows them
        )
        for tool in ("scontrol", "srun"):
            (bin_dir / tool).chmod(0o755)
        env = launch_env({"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "PREEMPT_LEAD": lead})
        proc = subprocess.run(["bash", str(sbatch_script), "/no/such.toml"], env=env, capture_output=True, text=True)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        if refused:
            assert proc.stderr.strip() == (
                f"train.sbatch: error: time limit {limit} leaves no time to train: this job is signalled 300 s before "
                "it (Slurm may signal 60 s sooner) to checkpoint and requeue; give sbatch --time more than 00:06:00, "
                "or signal later: sbatch --signal=B:USR1@60 --export=ALL,PREEMPT_LEAD=60"
            )
        else:  # checked, then on to the config
            assert proc.stderr.strip() == "train.sbatch: error: config file not found: /no/such.toml", limit
    assert not (tmp_path / "trained").exists()


@pytest.mark.parametrize("exitcode, kept", [(74, False), (-signal.SIGTERM, False), (1, True), (-signal.SIGKILL, True)])
def test_torchruns_first_failure_line_is_dropped_where_the_ranks_or_the_launcher_say_it(exitcode, kept):
    """torchrun's "failed (exitcode: N)" line, of the failure it stamped first (to the second): dropped where a rank
    said why (74) or N is SIGTERM's, a rank torchrun stopped (was printed after the ranks' one line, where the stopped
    rank was stamped in the same second: seen in a CI under load) or one stopped from outside (``ending`` says it);
    kept for the others."""
    from dispersion_titan.trainer import launcher

    line = "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"
    record = logging.LogRecord("torchrun", logging.ERROR, __file__, 1, line, (exitcode, 1, 123, "python"), None)
    assert launcher._quiet_forwarding(record) is kept


def test_a_rank_torchrun_killed_itself_is_not_called_out_of_memory(tmp_path, monkeypatch):
    """Rank 1 fails; rank 0 ignores torchrun's SIGTERM (as a rank blocked in C++, in gloo's rendezvous, does)
    and torchrun SIGKILLs it: the launcher says that, not "out of memory", which stays for a SIGKILL from
    outside where the kernel shows an OOM kill (was: any SIGKILL from outside, a kill -9 too, "most likely out of
    memory"). torchrun's own process context, warning and ChildFailedError."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std, start_processes
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from dispersion_titan.trainer import launcher

    deaf = f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open({str(tmp_path / 'deaf')!r}, 'w')"
    said = "dispersion_titan: error: shard-00003.bin: truncated; prepare the store again"
    ranks = {0: ("-c", deaf + "; time.sleep(60)"), 1: ("-c", f"import sys; sys.exit({said!r})")}  # its line, exit 1
    logs = DefaultLogsSpecs(log_dir=str(tmp_path / "logs"), tee=Std.ERR)  # as train.sh's torchrun --tee 3
    torchrun_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    torchrun_log.addFilter(launcher._quiet_forwarding)
    # torchrun's process context installs its own handlers in this process: put pytest's back after.
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    try:
        job = start_processes("rank", sys.executable, ranks, {0: {}, 1: {}}, logs)
        job.subprocess_handlers[1].proc.wait()
        while not (tmp_path / "deaf").exists():
            time.sleep(0.01)
        job.close(signal.SIGTERM, timeout=0.2)  # what torchrun does (30 s) once rank 1 failed
        failures = job.wait(0).failures
        # rank 1 hidden from the console (LOG_RANK=0): its own line, from torchrun's copy, in the launcher's
        hidden = launcher.ending(ChildFailedError("rank", failures), str(tmp_path / "logs"), {0})
        sigkilled = start_processes("rank", sys.executable, {0: ("-c", "import time; time.sleep(60)")}, {0: {}}, logs)
        os.kill(sigkilled.pids()[0], signal.SIGKILL)  # a kill -9
        oom = sigkilled.wait(10, period=0.05).failures
    finally:
        torchrun_log.removeFilter(launcher._quiet_forwarding)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert [failures[0].exitcode, failures[1].exitcode] == [-signal.SIGKILL, 1]
    assert launcher.ending(ChildFailedError("rank", failures)) == (1, launcher.unstopped_message(0, 1, 1))
    assert hidden == (1, launcher.unstopped_message(0, 1, 1, said)) and "it said: error: shard-00003.bin" in hidden[1]
    assert launcher.ending(ChildFailedError("rank", oom)) == (137, launcher.killed_message(0, oom=False))
    assert "(kill -9, or the OOM killer); if out of memory, lower" in launcher.killed_message(0, oom=False)
    monkeypatch.setattr(launcher, "oom_kills", lambda: 3)  # the cgroup's count of OOM kills went up during the run
    assert launcher.ending(ChildFailedError("rank", oom), kills=2) == (137, launcher.killed_message(0, oom=True))
    # what the job leaves, from its ranks' config: nothing without checkpointing, no checkpoint yet, or the last one
    run = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(tmp_path / "run")]
    off = launcher.ending(ChildFailedError("rank", oom), train_args=[*run, "--checkpoint.no-enable"])[1]
    assert off.endswith("(checkpoint.enable = false), so nothing was saved: a relaunch starts over")
    unsaved = launcher.ending(ChildFailedError("rank", failures), train_args=run)[1]
    assert unsaved.endswith("; no checkpoint was complete yet: a relaunch starts over")


def two_ranks(tmp_path: Path, code: str, *options: str) -> subprocess.CompletedProcess:
    """``code`` as the script (``tmp_path/ranks.py``) of 2 ranks under our torchrun launcher, ``options`` before it."""
    script = tmp_path / "ranks.py"
    script.write_text(code)
    return python_module(  # the launcher forked from the job server (its imports paid); the ranks fresh, as torchrun's
        "dispersion_titan.torchrun",
        *("--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", *options, "--tee", "3"),
        *("--role", "rank", "--monitor_interval", "0.1", str(script)),
        timeout=120,
    )


RANK_SCRIPT = """
import os, signal, sys, time
if os.environ["LOCAL_RANK"] == "1":  # a one-line error of its own, as a rank reading a damaged store shard
    print("dispersion_titan: error: {shard}: truncated; prepare the store again", file=sys.stderr, flush=True)
    sys.exit(2)
def stopped(signum, frame):  # as train.py's handler says when torchrun stops a rank that is starting
    print("dispersion_titan: interrupted before training started; nothing saved", file=sys.stderr, flush=True)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stopped)
time.sleep(60)
"""


@pytest.mark.parametrize("shown", ["0", ""], ids=["LOG_RANK=0", "every-rank"])
def test_the_error_of_a_rank_the_console_does_not_show_is_said_by_the_launcher(tmp_path, shown):
    """Rank 1 fails with its one line; torchrun stops rank 0, which says only "interrupted". With rank 0's output
    alone on the console (train.sh's default) the launcher repeats rank 1's line; with every rank's, it adds none."""
    shown_only = ["--local-ranks-filter", shown] if shown else []
    proc = two_ranks(tmp_path, RANK_SCRIPT.format(shard=tmp_path / "shard-1.bin"), *shown_only)
    error = f"dispersion_titan: error: {tmp_path / 'shard-1.bin'}: truncated; prepare the store again"
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    interrupted = "[rank0]:dispersion_titan: interrupted before training started; nothing saved"
    if shown:  # the launcher's line comes last, once torchrun's copies of the ranks' output are done
        assert lines[-2:] == [interrupted, f"[rank 1] {error}"], lines
    else:
        assert {f"[rank1]:{error}", interrupted} == set(lines[-2:]), lines
    assert sum(error in line for line in lines) == 1, proc.stderr


BOTH_SAY_SCRIPT = """
import os, signal, sys, time
rank = int(os.environ["LOCAL_RANK"])  # each its line, as ranks meeting a full cache: the free space each measured
print(f"dispersion_titan: error: file too large writing CACHE ({51348 + 12 * rank} MB free); raise the file size "
      "limit (ulimit -f) and relaunch the same command to resume", file=sys.stderr, flush=True)
if rank == 0:  # said, then slower to exit than rank 1
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(1)
sys.exit(74)
"""


def test_a_line_the_console_shows_but_for_its_numbers_is_not_repeated(tmp_path):
    """Rank 1 exits first with its line, rank 0 exits with the same line but for the free space it measured (a
    full datasets cache both ranks met): the console shows rank 0's; the launcher repeats none (was rank 1's
    too, prefixed ``[rank 1]``: the out-of-room line twice in 1 of 4 launches)."""
    proc = two_ranks(tmp_path, BOTH_SAY_SCRIPT, "--local-ranks-filter", "0")
    said = [line for line in proc.stderr.splitlines() if "dispersion_titan: error: " in line]
    assert proc.returncode == 74 and said == [
        "[rank0]:dispersion_titan: error: file too large writing CACHE (51348 MB free); raise the file size limit "
        "(ulimit -f) and relaunch the same command to resume"
    ], proc.stderr


PEER_GONE_SCRIPT = """
import os, signal, sys, time
if os.environ["LOCAL_RANK"] == "0":  # its one line, as rank 0 alone meeting a TensorBoard folder removed
    print("dispersion_titan: error: metrics.save_tb_folder: TensorBoard could not write", file=sys.stderr, flush=True)
    sys.exit(2)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 1 in a collective with rank 0 gone: it fails of it, exit 1
time.sleep(1)
sys.exit(1)
"""


def test_a_rank_failing_since_its_peer_said_why_adds_no_summary(tmp_path):
    """Rank 0 alone fails with its one line, exit 2; rank 1 then loses its peer and exits 1
    (``secondary_failure_status``). The launcher exits 2 on rank 0's line (was exit 1 and torchrun's FAILED
    summary, with both ranks' tracebacks: ``rm -rf RUN/tb/*`` under ``NGPU=2 launch/train.sh``)."""
    proc = two_ranks(tmp_path, PEER_GONE_SCRIPT)
    assert proc.returncode == 2, proc.stderr
    assert "FAILED" not in proc.stderr and "exitcode" not in proc.stderr, proc.stderr
    assert "[rank0]:dispersion_titan: error: metrics.save_tb_folder: TensorBoard could not write" in proc.stderr


PREEMPTED_SCRIPT = """
import os, signal, sys, time
print("Stopping at step 5 for a restart; exit status 75", file=sys.stderr, flush=True)
if os.environ["LOCAL_RANK"] == "1":
    sys.exit(75)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # rank 0 still in its interpreter's shutdown: default handlers again
time.sleep(60)
"""


def test_a_rank_stopped_by_torchrun_while_it_exits_after_a_preemption_keeps_status_75(tmp_path):
    """Both ranks saved and stop for a restart; rank 1 exits 75 first and torchrun's SIGTERM kills rank 0 in its
    slower shutdown (seen on launch/local_slurm.sh in 2 of 5 requeued attempts). The launcher exits 75 without
    torchrun's summary (was exit 1 and its 20-line FAILED report: a train.sh run preempted by hand looked failed)."""
    proc = two_ranks(tmp_path, PREEMPTED_SCRIPT)
    assert proc.returncode == 75, proc.stderr
    assert "FAILED" not in proc.stderr and "exitcode" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("Stopping at step 5 for a restart; exit status 75")


TIMER_COLLECTED_IN_ITS_THREAD = """
import gc, sys, threading, weakref
from datetime import timedelta
from torch.distributed.elastic.rendezvous.utils import _PeriodicTimer
from dispersion_titan.trainer import launcher
launcher.quiet_timer_self_join()
class Holder: pass
done, held, h = threading.Event(), [Holder()], Holder()
def tick():
    global h
    if h is not None:
        h = None
        gc.collect()  # the timer's cycle collected here, in the timer's own thread, as under load in a launch
        done.set()
t = _PeriodicTimer(timedelta(seconds=0.01), tick)
h.timer, t.holder = t, h
t.start()
del t
assert done.wait(10)
def other():
    raise RuntimeError("another finalizer's failure")
weakref.finalize(held[0], other)
held.clear()
"""


def test_torchs_rendezvous_timer_collected_in_its_own_thread_adds_no_traceback(tmp_path):
    """torch's keep-alive timer collected by a garbage collection in its own thread joins itself in its finalizer:
    'Exception ignored ... cannot join current thread' after a run's last line (a CI under load, after train.sh's
    'interrupted at step N'). The launcher drops that one; another finalizer's failure is still shown."""
    proc = subprocess.run([sys.executable, "-c", TIMER_COLLECTED_IN_ITS_THREAD], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "cannot join current thread" not in proc.stderr, proc.stderr
    assert "another finalizer's failure" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_two_agents_on_localhost_match_one_node(reference_run, tmp_path, script_python):
    """Two torchrun agents (--nnodes 2, one process each, c10d rendezvous on one port and
    id), the first launch/train.sh started from a folder that is not the repository (its check and our
    launcher forked from the job server, ``script_python``; the rank that launcher starts fresh), the second
    the job server's torchrun, its rank forked (a fresh rank's imports once, not twice), train with FSDP
    across the two "nodes", exactly like one node with 2
    processes: the session's reference run (conftest), whose schedule they share, so no one-node
    run of its own. (train.sh's one-node defaults and its own interpreter, all fresh: the background SIGINT
    test of test_reliability.py.)"""
    one_node = reference_run
    dump = tmp_path / "two_nodes"
    endpoint = f"127.0.0.1:{free_port()}"
    env = {"NNODES": "2", "NPROC": "1", "RDZV_ENDPOINT": endpoint, "RDZV_ID": "two-nodes", "PYTHON": str(script_python)}
    # the reference's schedule; checkpoints at debug.toml's interval, as before (they do not change the losses)
    schedule = (*SCHEDULE, "--checkpoint.interval", "5")
    first = train_sh(dump, *schedule, cwd=tmp_path, env=launch_env(env))
    checked = {"DISPERSION_TITAN_CHECKED": "1"}  # train.sh's check said the launch's notes
    second = torchrun(dump, 1, *COMMON, *schedule, nodes=(2, endpoint, "two-nodes"), env=checked, check=False)
    if second.returncode != 0:
        first.kill()  # not left waiting for its peer
    assert second.returncode == 0, second.stderr[-6000:]
    logs = [finish(first), second.stdout + second.stderr]
    assert all("dp_shard=2," in log for log in logs)
    # no warning to act on nothing, torchrun's default TORCH_NCCL_ASYNC_ERROR_HANDLING=1 overridden by TorchTitan too
    assert not [line for log in logs for line in log.splitlines() if "WARNING" in line or "Warning:" in line]
    assert sorted(p.name for p in (dump / "checkpoint").iterdir()) == ["step-0", f"step-{STEPS}"]
    want, got = scalars(one_node)[LOSS], scalars(dump)[LOSS]
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(want[step], rel=1e-6), step


def sweep(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m dispersion_titan.sweep ARGS`` from the repository, forked from the job server."""
    return python_module("dispersion_titan.sweep", *args, timeout=300, env=env)


def test_sweep_dry_run_prints_the_grid_and_dependencies(tmp_path):
    out = tmp_path / "sweep"
    proc = sweep(
        str(REPO / "launch" / "sweep_example.toml"),
        "--out",
        str(out),
        "--widths",
        "128,256",
        "--seeds",
        "0,1",
        "--partition",
        "p1",
        "--account",
        "a1",
        "--train-time",  # shorter than train.sbatch's warning (USR1@300), with a later one
        "00:05:00",
        "--train-sbatch-arg=--signal=B:USR1@60",
        "--dry-run",
        "--",
        "--training.steps",
        "3",
        "--baseline.forget_every",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    assert not out.exists(), "a dry run creates nothing"
    lines = [line for line in proc.stdout.splitlines() if re.match(r"\w+=\$\(sbatch ", line)]
    jobs = {kind: [line for line in lines if line.startswith(f"{kind}_")] for kind in ("train", "analyze", "evaluate")}
    compare = [line for line in lines if line.startswith("compare=")]
    table = [line for line in lines if line.startswith("table=")]
    variants = {
        "baseline": ("none", "0", "none"),
        "angular_spread-c0.1": ("angular_spread", "0.1", "none"),
        "decorrelation-c0.05": ("decorrelation", "0.05", "none"),
        "noisy_embedding": ("none", "0", "noisy_embedding"),
        "active_forgetting": ("none", "0", "active_forgetting"),
    }
    expected = {f"w{w}-{v}-s{s}": (w, *variants[v], s) for w in (128, 256) for v in variants for s in (0, 1)}
    assert len(expected) == 20 and all(len(found) == 20 for found in jobs.values())
    assert len(compare) == len(table) == 1 and len(lines) == 62
    assert proc.stdout.startswith("# sweep: 20 cells x (train, analyze, evaluate) + compare + table = 62 jobs; out ")

    names = []
    for i, (train, analyze, evaluate) in enumerate(zip(*jobs.values(), strict=True), start=1):
        name = re.search(r"--job\.dump_folder (\S+)\)", train).group(1).rsplit("/", 1)[1]
        names.append(name)
        width, variant, coeff, method, seed = expected[name]
        assert train.startswith(f"train_{i}=$(sbatch --parsable ")
        assert "--dependency" not in train and "--partition=p1" in train and "--account=a1" in train
        assert "--time=00:05:00 " in train and " --signal=B:USR1@60 " in train
        assert " --export=ALL,PREEMPT_LEAD=60 " in train  # train.sbatch's own check of its time limit
        assert str(REPO / "dispersion_titan/launch_scripts/slurm/train.sbatch") in train
        assert (
            f"--training.steps 3 --baseline.forget_every 2 --model.mlp_hidden_dim {width} "
            f"--dispersion.variant {variant} "
            f"--dispersion.coeff {coeff} --baseline.method {method} --debug.seed {seed} "
            f"--job.dump_folder {out / name})"
        ) in train
        assert analyze.startswith(f"analyze_{i}=$(sbatch --parsable --dependency=afterok:$train_{i} ")
        assert f"analyze.sbatch {out / name} --num-sequences 100 --seq-len 128)" in analyze
        assert evaluate.startswith(f"evaluate_{i}=$(sbatch --parsable --dependency=afterok:$train_{i} ")
        assert "--time=02:00:00" in evaluate and f"evaluate.sbatch {out / name} --limit 100)" in evaluate
    assert sorted(names) == sorted(expected)
    runs = " ".join(str(out / n) for n in names)
    trained_and_analyzed = ":".join(f"$train_{i}:$analyze_{i}" for i in range(1, 21))
    assert compare[0].startswith(f"compare=$(sbatch --parsable --dependency=afterok:{trained_and_analyzed} ")
    assert f"analyze.sbatch compare {runs} --out {out / 'compare'})" in compare[0]
    evaluated = ":".join(f"$evaluate_{i}" for i in range(1, 21))
    assert table[0].startswith(f"table=$(sbatch --parsable --dependency=afterok:{evaluated} ")
    assert "--time=02:00:00 --gpus=0 " in table[0], "the table needs no GPU"
    assert f"evaluate.sbatch table {runs} --out {out / 'table'})" in table[0]
    # λ trained as given (was rounded to 6 digits by its name's format: 0.123457), and named so
    toml, cell = str(REPO / "launch" / "sweep_example.toml"), ("--widths", "64", "--seeds", "0", "--dry-run")
    exact = sweep(toml, *cell, "--variants", "l2_repel:0.1234567", "--out", str(out))
    assert exact.returncode == 0 and "--dispersion.coeff 0.1234567 " in exact.stdout, exact.stderr
    assert exact.stdout.startswith("# sweep: 1 cell x (train, analyze, evaluate) + compare + table = 5 jobs; out ")
    assert f"--job.dump_folder {out / 'w64-l2_repel-c0.1234567-s0'})" in exact.stdout


def test_sweep_bad_input_is_one_line(tmp_path):
    toml = str(REPO / "launch" / "sweep_example.toml")
    cases = {
        ("--variants", "baseline,angular_spread"): "variants: 'angular_spread': needs a finite coefficient > 0",
        ("--variants", "nope:1"): "variants: 'nope:1': unknown variant",
        ("--variants", "noisy_embedding:1"): "'noisy_embedding:1': unknown variant (use baseline, noisy_embedding",
        ("--widths", "0"): "widths: '0' is not an integer >= 1",
        ("--train-time", "forever"): "train_time: 'forever' is not an sbatch --time (minutes, H:M:S or D-H:M:S",
        # within train.sbatch's USR1@300 (or the given --signal's lead): every attempt checkpoints and requeues at once
        ("--train-time", "00:05:00"): "train_time: '00:05:00' leaves no time to train: train.sbatch is signalled 300 s",
        ("--train-time", "11", "--train-sbatch-arg=--signal=B:USR1@600"): "signalled 600 s before the limit",
        ("--train-time", "11", "--train-sbatch-arg=--sig=B:USR1@600"): "signalled 600 s before the limit",
        ("--train-sbatch-arg=--ch=/tmp",): "train_sbatch_args: --ch=/tmp: these jobs run in the folder this command",
        # GPUs beside the trainings' --gpus-per-node (was submitted: a --gres's per node, not the layout's checked)
        ("--train-sbatch-arg=--gres=gpu:2",): "train_sbatch_args: --gres=gpu:2: the trainings ask train.sbatch's "
        "--gpus-per-node, which each cell's layout is checked for, and sbatch would read this with it; give their GPUs "
        "per node as --gpus-per-node N",
        ("--train-sbatch-arg=-G2",): "train_sbatch_args: -G2: the trainings ask train.sbatch's --gpus-per-node",
        ("--train-sbatch-arg=--gpus-per-task=1",): "train_sbatch_args: --gpus-per-task=1: the trainings ask train.sb",
        ("--train-sbatch-arg=--gpus-per-socket", "--train-sbatch-arg=2"): (  # were submitted, as a --gres was
            "train_sbatch_args: --gpus-per-socket: the trainings ask train.sbatch's --gpus-per-node"
        ),
        ("--", "--checkpoint.no-enable"): "cell w64-baseline-s0: checkpoint.enable is off: its training would save no",
        ("--", "--training.steps", "0", "--checkpoint.no-save-initial"): (  # its analyze, evaluate jobs' failure
            "cell w64-baseline-s0: training.steps is 0 without checkpoint.save_initial: its training would save no "
            "checkpoint for its analyze and evaluate jobs to read; give it steps, or --checkpoint.save-initial"
        ),
        # sbatch keeps the last --export: one of the user's would drop ours, PREEMPT_LEAD (was submitted)
        ("--train-sbatch-arg=--export=ALL,FOO=1", "--train-sbatch-arg=--signal=B:USR1@60"): (
            "train_sbatch_args: --export=ALL,FOO=1: these jobs read the environment they are submitted with: PYTHON, "
            "the interpreter they run (--export=NONE would drop it), and a training job the lead of a --signal given "
            "here, told with --export=ALL,PREEMPT_LEAD=N"
        ),
        # --export=NONE drops PYTHON, the interpreter the job runs (was submitted)
        ("--analyze-sbatch-arg=--export=NONE",): "analyze_sbatch_args: --export=NONE: these jobs read the environment",
        ("--evaluate-sbatch-arg=--export=NONE",): "evaluate_sbatch_args: --export=NONE: these jobs read the environ",
        ("--analyze-sbatch-arg=--kill=no",): "analyze_sbatch_args: --kill=no: these jobs are submitted with --kill-on-",
        ("--config", str(tmp_path / "missing.toml")): f"config: {tmp_path / 'missing.toml'}: no such file",
        ("--config", str(tmp_path)): f"config: {tmp_path} is a folder; give the TOML file itself",
        ("--", "--debug.seed", "3"): "training overrides: --debug.seed is set by the sweep",
        # CPU training jobs of a GPU config: each job's refusal, hours later (was submitted)
        ("--config", str(REPO / "train_configs" / "gpt2_small_mlp3072.toml"), "--gpus-per-node", "0"): (
            "gpus_per_node: 0 trains on CPUs, and cell w64-baseline-s0's config compiles with inductor"
        ),
        ("--variants", "angular_spread:0.1", "--gpus-per-node", "0", "--", "--dispersion.kernel", "triton"): (
            "gpus_per_node: 0 trains on CPUs, and cell w64-angular_spread-c0.1-s0's config runs the Triton pair kernel"
        ),
        ("--out", str(REPO / "launch")): "exists and is not an empty folder",
        ("--out", str(REPO / "README.md")): f"out: {REPO / 'README.md'} exists and is not an empty folder",
        ("--analyze-args=--nosuch 3",): "analyze_args: unrecognized arguments: --nosuch 3",  # not in failed jobs
        ("--evaluate-args=--limit 0",): "evaluate_args: argument --limit: '0' is not a positive integer",
        ("--analyze-args", "'x"): 'analyze_args: "\'x": no closing quotation',
        # an empty value (an unset shell variable), refused as analyze --texts '' itself is (not in failed jobs)
        ("--analyze-args=--texts ''",): "analyze_args: argument --texts: empty; name a jsonl file",
        ("--evaluate-args=--out=",): "evaluate_args: argument --out: empty; name a folder, or leave the option out",
        # a file its jobs read, checked as each checks it (was: every analysis or evaluation failed after its training)
        ("--analyze-args=--texts nosuch.jsonl",): "analyze_args: --texts: nosuch.jsonl: cannot be read ([Errno 2] No",
        ("--evaluate-args=--include-path nosuch",): "evaluate_args: --include-path: nosuch: no such file or directory",
    }
    wrong_type = tmp_path / "wrong_type.toml"  # a TOML value not a path: named, not a TypeError traceback
    wrong_type.write_text('config = ["debug.toml"]\nwidths = [64]\nvariants = ["baseline"]\nseeds = [0]\n')
    cases[(str(wrong_type),)] = "config: expected a path in quotes, got ['debug.toml']"
    wrong_partition = tmp_path / "wrong_partition.toml"  # was passed on as sbatch --partition=['gpu'], exit 0
    toml_text = wrong_type.read_text().replace('["debug.toml"]', f'"{DEBUG_TOML}"')
    wrong_partition.write_text(toml_text + 'partition = ["gpu"]')
    cases[(str(wrong_partition),)] = "partition: expected a name in quotes, got ['gpu']"
    cases[("--account", " ")] = "account: expected a name in quotes, got ' '"
    not_toml = tmp_path / "conf.json"  # named as the sweep's config, once (was "cell w64-…: --job.config_file: …")
    not_toml.write_text('{"model": {"name": "gpt2"}}\n')
    cases[("--config", str(not_toml))] = f"dispersion_titan: error: config: {not_toml}: invalid TOML: Invalid statement"
    # a training config as the sweep's TOML: was `activation_checkpoint: unknown sweep key`
    cases[(str(DEBUG_TOML),)] = "SWEEP.toml: a training config (its [job] section), not a sweep"
    sectioned = tmp_path / "sectioned.toml"  # a sweep's keys under [slurm]: was called a training config
    sectioned.write_text('[slurm]\npartition = "gpu"\n')
    cases[(str(sectioned),)] = "SWEEP.toml: a TOML with a [slurm] section, which neither a sweep nor a training config"
    loop = tmp_path / "loop"  # a link to itself: was pathlib's "RuntimeError: Symlink loop" traceback
    loop.symlink_to(loop)
    cases[("--out", str(loop / "s"))] = f"out: {loop}/s goes through a symbolic link that loops"
    cases[("--config", str(loop))] = f"config: {loop} goes through a symbolic link that loops"
    one_cell = ("--widths", "64", "--variants", "baseline", "--seeds", "0")  # one cell's config checked, not 20
    for args, message in cases.items():  # a flag given again wins: each case's own widths, variants or seeds
        proc = sweep(*([] if args[0].endswith(".toml") else [toml, *one_cell]), "--dry-run", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, (args, proc.stderr)
    # Submitted where Slurm is not (no sbatch on PATH): one line, exit 2, no sweep folder to block the rerun.
    proc = sweep(toml, *one_cell, "--out", str(tmp_path / "s"), env={"PATH": sys.prefix + "/bin"})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "dispersion_titan: error: sbatch: not found (no Slurm here); submit from a login node, or see --dry-run"
    ]
    assert not (tmp_path / "s").exists()


def test_a_second_sweep_on_the_same_folder_submits_nothing(tmp_path):
    """Two submissions of one sweep started together: the one that holds --out submits, the other is refused
    in one line before its first sbatch (was: both submitted, every cell trained twice into one run folder,
    the manifest naming only one set of jobs). Here the first is a process holding the folder."""
    bin_dir, out = tmp_path / "bin", tmp_path / "sweep"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path}/submitted\necho 1\n")  # Slurm, were it called
    (bin_dir / "sbatch").chmod(0o755)
    one_cell = ("--widths", "64", "--variants", "baseline", "--seeds", "0", "--out", str(out))
    with held_by_another_command(out) as pid:
        proc = sweep(
            str(REPO / "launch" / "sweep_example.toml"), *one_cell, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}
        )
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"dispersion_titan: error: {out}: another command is writing here (PID {pid} on" in proc.stderr
    assert not (tmp_path / "submitted").exists() and not (out / "sweep.json").exists()


def test_a_sweep_submitted_again_with_other_settings_submits_nothing(tmp_path):
    """Into a submitted sweep's folder (here by a stand-in sbatch), other cells (named, added and removed: an arm
    added was "the compare job differs") or other settings: one line, exit 2, no sbatch (test_slurm.py submits the
    same again; a copied or moved folder: the next test)."""
    bin_dir, out, calls = tmp_path / "bin", tmp_path / "sweep", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho >> {calls}\necho $$\n")  # a job id per call
    (bin_dir / "sbatch").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    one_cell = ("--widths", "64", "--variants", "baseline", "--seeds", "0")
    toml = str(REPO / "launch" / "sweep_example.toml")
    assert sweep(toml, *one_cell, "--out", str(out), env=env).returncode == 0
    assert len(calls.read_text().splitlines()) == 5
    dry = sweep(toml, *one_cell, "--out", str(out), "--dry-run", env={"PATH": sys.prefix + "/bin"})  # no squeue
    assert dry.returncode == 2 and dry.stderr.strip().splitlines() == [  # was the whole sweep, as if none were queued
        "dispersion_titan: error: squeue: not found (no Slurm here), so which jobs are still queued is unknown; run "
        "this on a login node"
    ]
    other = sweep(toml, *one_cell, "--out", str(out), "--seeds", "1", env=env)
    assert other.returncode == 2 and other.stderr.strip().splitlines() == [
        f"dispersion_titan: error: out: {out} holds a sweep of other cells (added: w64-baseline-s1; removed: "
        "w64-baseline-s0); give the new grid a new sweep folder, or this one its own widths, variants and seeds to "
        "submit its stopped jobs again"
    ]
    added = sweep(toml, *one_cell, "--out", str(out), "--variants", "baseline,angular_spread:0.1", env=env)
    assert added.returncode == 2 and added.stderr.strip().splitlines() == [  # was "the compare job differs"
        f"dispersion_titan: error: out: {out} holds a sweep of other cells (added: w64-angular_spread-c0.1-s0); give "
        "the new grid a new sweep folder, or this one its own widths, variants and seeds to submit its stopped jobs "
        "again"
    ]
    other = sweep(toml, *one_cell, "--out", str(out), "--train-time", "1:00:00", env=env)
    assert other.returncode == 2 and other.stderr.strip().splitlines() == [
        f"dispersion_titan: error: out: {out} holds a sweep submitted with other settings (the w64-baseline-s0 train "
        "job differs from its sweep.json); give the sweep a new folder, or its own settings to submit its stopped "
        "jobs again"
    ]
    assert len(calls.read_text().splitlines()) == 5


ONE_CELL = (str(REPO / "launch" / "sweep_example.toml"), "--widths", "64", "--variants", "baseline", "--seeds", "0")


def test_a_sweep_copied_or_moved_while_its_jobs_are_queued_is_refused_then_submitted_where_it_is(tmp_path):
    """A sweep folder copied (`cp -a`) or moved (`mv`) while its jobs are queued (they write into the original): one
    line, exit 2, no sbatch: the copy's naming the original to submit it there, the moved one's the jobs to scancel
    or wait for (was: "submit it there again", a folder no longer there). Once its jobs ended, each is submitted again
    where it is, its commands compared with the paths moved: its trained cell kept, the other jobs writing there
    (was refused for good), squeue asked once which of its jobs are queued (was twice)."""
    config, out, calls = tmp_path / "debug.toml", tmp_path / "sweep", tmp_path / "calls"
    config.write_text(Path(DEBUG_TOML).read_text())
    env = fake_slurm(tmp_path, "")

    def submitted_into(name: str) -> subprocess.CompletedProcess:
        args = ("--config", str(config), "--out", str(tmp_path / name), "--", "--training.steps", "1", *DEBUG_SEQ_LEN)
        return sweep(*ONE_CELL, *args, env=env)

    assert submitted_into("sweep").returncode == 0
    train = json.loads((out / "sweep.json").read_text())["commands"]["train_1"]
    torchrun(out / "w64-baseline-s0", 1, *train[train.index(str(config)) + 1 :], config=str(config))  # trained
    shutil.copytree(out, tmp_path / "copy", symlinks=True)

    refused = {
        "copy": "(copied or moved: its sweep.json's jobs write there); submit it there again, or give the sweep a new "
        "folder",
        "moved": "(moved: its jobs 101 102 103 104 105, queued or running, write there); scancel 101 102 103 104 105 "
        "(or wait for them to end), then submit it here again",
    }
    for name, advice in refused.items():
        if name == "moved":
            out.rename(tmp_path / "moved")
        proc = submitted_into(name)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"dispersion_titan: error: out: {tmp_path / name} holds the sweep submitted into {out} {advice}"
        ], proc.stderr
    assert len(calls.read_text().splitlines()) == 5
    (tmp_path / "held").write_text("")  # its jobs ended; the moved one's, queued in turn, are no copy's
    squeue = tmp_path / "held.calls"  # the stand-in squeue's calls
    for name in ("moved", "copy"):
        asked = len(squeue.read_text().splitlines())
        again = submitted_into(name)
        assert again.returncode == 0 and "sweep: 4 jobs submitted (1 kept:" in again.stdout, again.stderr
        # squeue asked once of its sweep.json's jobs (was twice), once of its logs/submitted.json's
        assert len(squeue.read_text().splitlines()) == asked + 2
        submitted = calls.read_text().splitlines()[-4:]
        assert all(f"--job-name={name}-" in line and f" {tmp_path / name}/" in line for line in submitted)
        assert not any(str(out) in line for line in submitted)
        assert json.loads((tmp_path / name / "sweep.json").read_text())["out"] == str(tmp_path / name)


def test_a_sweep_submitted_again_from_another_folder_with_relative_paths_submits_nothing(tmp_path):
    """A sweep whose ``analyze_args`` name ``--texts texts.jsonl`` (its jobs read it from the folder they are submitted
    from), submitted again from another folder holding another ``texts.jsonl``: one line naming the folder to submit it
    from, exit 2, no sbatch (was: the same commands submitted there, their jobs reading the other file); from its own
    folder, or with an older sweep.json that records none, submitted as before."""
    first, other, out = tmp_path / "first", tmp_path / "other", tmp_path / "sweep"
    for folder in (first, other):
        folder.mkdir()
        (folder / "texts.jsonl").write_text(json.dumps({"text": folder.name}) + "\n")
    env = fake_slurm(tmp_path, "")
    args = (*ONE_CELL, "--config", DEBUG_TOML, "--out", str(out), "--analyze-args=--texts texts.jsonl")

    def submitted_from(folder: Path) -> subprocess.CompletedProcess:
        return python_module("dispersion_titan.sweep", *args, timeout=300, env=env, cwd=folder)

    assert submitted_from(first).returncode == 0
    (tmp_path / "held").write_text("")  # its jobs ended (cancelled, say): the same command again submits them
    again = submitted_from(other)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"dispersion_titan: error: analyze_args: texts.jsonl: a path relative to {first}, where {out} was first "
        "submitted from (its jobs read it from the folder they are submitted from, here another file or none); "
        f"submit the sweep again from {first}"
    ]
    assert len((tmp_path / "calls").read_text().splitlines()) == 5
    assert submitted_from(first).returncode == 0 and len((tmp_path / "calls").read_text().splitlines()) == 10
    (tmp_path / "held").write_text("")
    manifest = json.loads((out / "sweep.json").read_text())
    del manifest["work_dir"]  # as an older version wrote it
    (out / "sweep.json").write_text(json.dumps(manifest))
    older = submitted_from(other)
    assert older.returncode == 0 and len((tmp_path / "calls").read_text().splitlines()) == 15, older.stderr


def test_a_sweep_submitted_again_from_another_folder_counts_only_the_values_of_options_naming_paths(tmp_path):
    """``--train-sbatch-arg=--partition=gpu`` and ``--evaluate-args="--tasks piqa"`` submitted again from a folder
    holding folders ``gpu`` and ``piqa``: submitted (was refused, ``train_sbatch_args: --partition=gpu: a path relative
    to FIRST``: any value naming a file there was taken for a path); sbatch's ``-i in.txt`` (``--input``, a path) with
    an ``in.txt`` there, or a data path's glob matching there (``--dataset-path x,shards/*``): one line naming the
    folder to submit it from, exit 2, no sbatch."""
    first, other, out, calls = tmp_path / "first", tmp_path / "other", tmp_path / "sweep", tmp_path / "calls"
    for folder in (first, other):
        for name in ("gpu", "piqa"):
            (folder / name).mkdir(parents=True)
    (first / "in.txt").write_text("")
    env = fake_slurm(tmp_path, "")
    args = (*ONE_CELL, "--config", DEBUG_TOML, "--out", str(out), "--evaluate-args=--tasks piqa")

    def submitted_from(folder: Path, *more: str) -> subprocess.CompletedProcess:
        return python_module("dispersion_titan.sweep", *args, *more, timeout=300, env=env, cwd=folder)

    assert submitted_from(first, "--train-sbatch-arg=--partition=gpu").returncode == 0
    (tmp_path / "held").write_text("")  # its jobs ended: the same command again submits them
    again = submitted_from(other, "--train-sbatch-arg=--partition=gpu")
    assert again.returncode == 0 and len(calls.read_text().splitlines()) == 10, again.stderr
    (tmp_path / "held").write_text("")
    refused = submitted_from(
        first, "--train-sbatch-arg=--partition=gpu", "--evaluate-sbatch-arg=-i", "--evaluate-sbatch-arg=in.txt"
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"dispersion_titan: error: evaluate_sbatch_args: in.txt: a path relative to {other}, where {out} was first "
        "submitted from (its jobs read it from the folder they are submitted from, here another file or none); "
        f"submit the sweep again from {other}"
    ]
    (first / "shards").mkdir()
    (first / "shards" / "a.parquet").write_text("")
    refused = submitted_from(first, "--train-sbatch-arg=--partition=gpu", "--analyze-args=--dataset-path x,shards/*")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [  # a glob, as a data path may be
        f"dispersion_titan: error: analyze_args: shards/*: a path relative to {other}, where {out} was first "
        "submitted from (its jobs read it from the folder they are submitted from, here another file or none); "
        f"submit the sweep again from {other}"
    ]
    assert len(calls.read_text().splitlines()) == 10


@pytest.mark.parametrize(
    ("key", "option", "default"),
    [
        ("evaluate_args", "--out", "RUN/evaluation"),
        ("analyze_args", "--out", "RUN/condensation"),
        ("analyze_args", "--tb-dir", "RUN/tb/condensation"),
    ],
)
def test_a_sweep_whose_job_args_give_its_cells_one_folder_is_refused_at_submission(tmp_path, key, option, default):
    """Two cells' evaluations (analyses) into one ``--out`` (``--tb-dir``) of ``evaluate_args`` (``analyze_args``),
    which holds one run's results: one line, exit 2, nothing submitted, no folder made, by the dry run too (was
    submitted, exit 0: every job after the first refused hours later, `--out: SHARED holds the evaluation of RUN`, the
    table or compare job cancelled; shown on launch/local_slurm.sh)."""
    out, shared, calls = tmp_path / "sweep", tmp_path / "shared", tmp_path / "calls"
    env = fake_slurm(tmp_path, "")
    args = (*ONE_CELL, "--widths", "64,128", "--out", str(out), f"--{key.replace('_', '-')}={option} {shared}")
    for dry_run in ((), ("--dry-run",)):
        proc = sweep(*args, *dry_run, env=env)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"dispersion_titan: error: {key}: {option} {shared} is one folder for the 2 cells' jobs, and it holds one "
            f"run's results (each job after the first would be refused); leave it out: each cell's go into its run "
            f"folder ({default})"
        ], proc.stderr
    assert not calls.exists() and not out.exists() and not shared.exists()


def test_a_sweep_cell_no_gpu_holds_is_refused_at_submission(tmp_path):
    """``--widths 100000000000``, or that width in SWEEP.toml's grid: the cell's fp32 weights and Adam moments alone,
    over its job's 8 GPUs, outgrow the largest GPU a plan knows: one line naming the cell, its width and ``sweep
    --plan``, exit 2, nothing submitted, no folder made, by the dry run too (was submitted, exit 0: its job out of
    memory hours later); a CPU sweep (``--gpus-per-node 0``) is not checked."""
    out, calls, grid = tmp_path / "sweep", tmp_path / "calls", tmp_path / "grid.toml"
    env = fake_slurm(tmp_path, "")
    grid.write_text(f'config = "{DEBUG_TOML}"\nwidths = [64, 100000000000]\nvariants = ["baseline"]\nseeds = [0]\n')
    params = 4 * 2 * 64 * 10**11 + 50257 * 64  # debug.toml: 4 blocks of dim 64, GPT-2's vocabulary
    for args in ((*ONE_CELL, "--widths", "100000000000"), (str(grid),)):
        for dry_run in ((), ("--dry-run",)):
            proc = sweep(*args, "--out", str(out), *dry_run, env=env)
            assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
                f"dispersion_titan: error: cell w100000000000-baseline-s0: {params:,} parameters or more (MLP width "
                "100,000,000,000, dim 64, 4 blocks), whose fp32 weights and Adam moments alone need "
                f"{params * 12 / 8 / 1e9:,.0f} GB on each of its job's 8 GPUs, more than an H200 SXM 141GB holds (the "
                "largest GPU a plan knows); give smaller widths (or a smaller model, or more --nodes); sweep --plan "
                "gives each cell's full plan"
            ], proc.stderr
    assert not calls.exists() and not out.exists()
    cpu = sweep(*ONE_CELL, "--widths", "100000000000", "--gpus-per-node", "0", "--dry-run", "--", "--profile", "cpu")
    assert cpu.returncode == 0, cpu.stderr


def test_a_sweep_reads_the_sbatch_options_of_its_environment_and_train_sbatch_args_as_sbatch_does(tmp_path):
    """sbatch reads SBATCH_* variables as options over train.sbatch's #SBATCH lines (its command line over them):
    ``SBATCH_GPUS_PER_NODE=4`` checks each cell for 4 GPUs, ``--train-sbatch-arg=--gpus-per-node=2`` for 2 (both were
    taken for train.sbatch's 8), ``SBATCH_SIGNAL=B:USR1@60`` tells the trainings its lead (was not: train.sbatch's
    check of its time limit against 300 s); ``--train-sbatch-arg=--nodes=2-4``, a range, and ``SBATCH_ARRAY_INX`` or
    ``SBATCH_EXPORT``, which sbatch reads as the --array and --export refused among the arguments, or ``SBATCH_GPUS``,
    a GPU ``SBATCH_GRES`` or ``SBATCH_GPUS_PER_TASK``, which sbatch reads over the jobs' own GPUs: one line, exit 2,
    nothing submitted or made, by the dry run too (were taken for 1 node, and submitted; sbatch then refused the
    trainings or the analyses)."""
    out, gpus4 = tmp_path / "sweep", {"SBATCH_GPUS_PER_NODE": "4"}
    huge = (*ONE_CELL, "--widths", "100000000000", "--out", str(out), "--dry-run")  # refused naming its GPUs
    for env, args, gpus in ((gpus4, (), 4), (gpus4, ("--train-sbatch-arg=--gpus-per-node=2",), 2)):
        proc = sweep(*huge, *args, env=env)
        assert proc.returncode == 2 and f"on each of its job's {gpus} GPUs, more than" in proc.stderr, proc.stderr
    proc = sweep(*ONE_CELL, "--out", str(out), "--dry-run", env={"SBATCH_SIGNAL": "B:USR1@60"})
    trainings = [line for line in proc.stdout.splitlines() if "train.sbatch" in line]
    assert proc.returncode == 0 and len(trainings) == 1, proc.stderr
    assert " --export=ALL,PREEMPT_LEAD=60 " in trainings[0], proc.stdout
    slurm = fake_slurm(tmp_path, "")
    refused = {
        "--train-sbatch-arg=--nodes=2-4": "train_sbatch_args: --nodes=2-4: not one count, which the training's "
        "layout is checked for; give one, as --nodes=N",
        "SBATCH_ARRAY_INX=0-1": "SBATCH_ARRAY_INX=0-1: sbatch reads it as --array: the tasks of an array job would "
        "each run the same command, into the same folders; leave it out (here: unset SBATCH_ARRAY_INX)",
        # its reason as --export's, but for sbatch reading the trainings' own --export=ALL,PREEMPT_LEAD=N over it
        "SBATCH_EXPORT=NONE": "SBATCH_EXPORT=NONE: sbatch reads it as --export: these jobs read the environment they "
        "are submitted with: PYTHON, the interpreter they run (--export=NONE would drop it), and a training job the "
        "lead of a --signal given here, told with --export=ALL,PREEMPT_LEAD=N (train.sbatch checks its time limit "
        "against it), which sbatch reads over this variable: such a job would not get what it gives the others; "
        "leave it out: the jobs get the environment of the shell you submit from (sbatch's --export=ALL), so export "
        "what they need there (here: unset SBATCH_EXPORT)",
        # sbatch 22.05 refused train.sbatch's --gpus-per-node=8 under the first, the analyses' --gpus=1 under the
        # second ("Failed to ensure --gpus >= --gres=gpu/--gpus-per-node"; launch/local_slurm.sh given Gres=gpu:8)
        "SBATCH_GPUS=1": "SBATCH_GPUS=1: sbatch reads it as --gpus: each job asks for the GPUs it needs (a training "
        "train.sbatch's --gpus-per-node, the others their own --gpus), which sbatch would read this variable with: "
        "it gives its count to every job asking none, and refuses a training asking more on a node (Failed to "
        "ensure --gpus >= --gres=gpu/--gpus-per-node); leave it out (here: unset SBATCH_GPUS)",
        "SBATCH_GRES=gpu:2": "SBATCH_GRES=gpu:2: sbatch reads it as --gres: each job asks for the GPUs it needs (a "
        "training train.sbatch's --gpus-per-node, the others their own --gpus), which sbatch would read this "
        "variable's GPUs with: a training gets these per node, not those its layout was checked for, and a job "
        "asking fewer is refused (Failed to ensure --gpus >= --gres=gpu/--gpus-per-node); leave it out (here: unset "
        "SBATCH_GRES)",
        "SBATCH_GPUS_PER_TASK=1": "SBATCH_GPUS_PER_TASK=1: sbatch reads it as --gpus-per-task: each job asks for the "
        "GPUs it needs (a training train.sbatch's --gpus-per-node, the others their own --gpus), which sbatch would "
        "read this variable with: every job would ask these GPUs too; leave it out (here: unset SBATCH_GPUS_PER_TASK)",
    }
    for given, said in refused.items():
        args, env = ((given,), {}) if given.startswith("--") else ((), dict([given.split("=")]))
        for dry_run in ((), ("--dry-run",)):
            proc = sweep(*ONE_CELL, "--out", str(out), *args, *dry_run, env={**slurm, **env})
            assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert proc.stderr.startswith(f"dispersion_titan: error: {said}"), proc.stderr
    assert not out.exists() and not (tmp_path / "calls").exists()
    proc = sweep(*ONE_CELL, "--out", str(out), "--dry-run", env={"SBATCH_GRES": "nvme:1"})  # no GPUs: kept
    assert proc.returncode == 0, proc.stderr


def test_a_sweep_checks_the_time_limit_sbatch_reads_and_keeps_the_gpus_of_its_other_jobs(tmp_path):
    """The time limit sbatch reads for a training job, its command line's over ``SBATCH_TIMELIMIT``: the variable
    within train.sbatch's warning (300 s, or a --signal's lead, plus 60), or a ``--train-sbatch-arg=--time`` (``-t``,
    after ``train_time``): one line naming it as ``train_time``'s, exit 2, nothing submitted (were submitted: every
    training refused at its start); the variable under a longer ``train_time`` or --time kept. Under
    ``SBATCH_GPUS_PER_NODE=4`` every job but the trainings asks ``--gpus-per-node=0`` before its own options (were
    not: sbatch 22.05 refused their --gpus=1, "Failed to ensure --gpus >= --gres=gpu/--gpus-per-node", and gave the
    table's --gpus=0 4 GPUs; launch/local_slurm.sh's cluster given Gres=gpu:8)."""
    out, short = tmp_path / "sweep", {"SBATCH_TIMELIMIT": "00:05:00"}
    grid = ("--config", DEBUG_TOML, "--widths", "64", "--variants", "baseline", "--seeds", "0", "--out", str(out))
    slurm = fake_slurm(tmp_path, "")
    for args, env, said in (
        ((), short, "SBATCH_TIMELIMIT: '00:05:00' leaves no time to train: train.sbatch is signalled 300 s before"),
        (("--train-sbatch-arg=--signal=B:USR1@600",), {"SBATCH_TIMELIMIT": "11"}, "SBATCH_TIMELIMIT: '11' leaves no "
         "time to train: train.sbatch is signalled 600 s before"),
        (("--train-time", "4:00:00", "--train-sbatch-arg=-t", "--train-sbatch-arg=5"), {}, "train_sbatch_args: '5' "
         "leaves no time to train: train.sbatch is signalled 300 s before"),
    ):  # fmt: skip
        proc = sweep(*grid, *args, env={**slurm, **env})
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"dispersion_titan: error: {said}"), proc.stderr
    assert not out.exists() and not (tmp_path / "calls").exists()
    for args in (("--train-time", "4:00:00"), ("--train-sbatch-arg=--time=4:00:00",)):
        proc = sweep(*grid, *args, "--dry-run", env={**short, "SBATCH_GPUS_PER_NODE": "4"})
        jobs = {line.split("  # ")[-1]: line for line in proc.stdout.splitlines() if "sbatch --parsable" in line}
        assert proc.returncode == 0 and len(jobs) == 5, proc.stderr
        alone = {label: " --kill-on-invalid-dep=yes --gpus-per-node=0 " in line for label, line in jobs.items()}
        assert alone == {label: not label.endswith(" train") for label in jobs}, proc.stdout
    assert "--gpus-per-node=0" not in sweep(*grid, "--dry-run").stdout  # without the variable: as before


def test_a_sweep_into_a_folder_inside_a_run_is_refused_by_its_dry_run_as_by_submitting(reference_run, tmp_path):
    """``--out RUN/sweep`` (a new folder inside a run, which holds only its own results): the dry run refuses it in
    the line submitting does, exit 2 (was exit 0, the script printed, which submitting then refused); nothing
    submitted, the run unchanged."""
    out, calls, before = reference_run / "sweep", tmp_path / "calls", digests(reference_run)
    env = fake_slurm(tmp_path, "")
    for dry_run in (("--dry-run",), ()):
        proc = sweep(*ONE_CELL, "--out", str(out), *dry_run, env=env)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"dispersion_titan: error: --out: {out} is inside run {reference_run}, which holds only its own results; "
            "use another --out"
        ], (dry_run, proc.stdout, proc.stderr)
    assert not calls.exists() and not out.exists() and digests(reference_run) == before


def test_a_sweep_whose_config_was_edited_since_its_run_saved_a_step_is_refused_when_submitted_again(tmp_path):
    """Its training stopped after a saved step (here trained by hand with the cell's own command, its jobs then gone
    from the stand-in squeue, as after a scancel), its config's lr edited, the same sweep again: one line naming the
    cell and the change, exit 2, nothing submitted, the sweep folder unchanged (was submitted, exit 0, and the training
    job refused at its start, `run folder … was started with other settings: optimizer.lr 0.001 -> 0.002`, its
    dependants cancelled; shown on launch/local_slurm.sh); the config put back, its jobs are submitted."""
    config, out, calls = tmp_path / "debug.toml", tmp_path / "sweep", tmp_path / "calls"
    config.write_text(Path(DEBUG_TOML).read_text())
    env = fake_slurm(tmp_path, "")
    args = (*ONE_CELL, "--config", str(config), "--out", str(out), "--", "--training.steps", "4", *DEBUG_SEQ_LEN)
    assert sweep(*args, env=env).returncode == 0
    manifest = json.loads((out / "sweep.json").read_text())
    train = manifest["commands"]["train_1"]
    torchrun(manifest["cells"][0]["run"], 1, *train[train.index(str(config)) + 1 :], "--training.steps", "1",
             config=str(config))  # fmt: skip
    (tmp_path / "held").write_text("")  # its jobs ended
    config.write_text(config.read_text().replace("lr = 1e-3 ", "lr = 2e-3 ", 1))
    before = digests(out)
    again = sweep(*args, env=env)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"dispersion_titan: error: cell w64-baseline-s0: run folder {out / 'w64-baseline-s0'} was started with other "
        "settings: optimizer.lr 0.001 -> 0.002; submit the sweep again with the settings its runs started with (its "
        "config as it was), or give the sweep a new folder"
    ], again.stderr
    assert len(calls.read_text().splitlines()) == 5 and digests(out) == before
    config.write_text(config.read_text().replace("lr = 2e-3 ", "lr = 1e-3 ", 1))
    restored = sweep(*args, env=env)
    assert restored.returncode == 0 and "sweep: 5 jobs submitted;" in restored.stdout, restored.stderr


def test_a_sweep_given_a_dependency_keeps_its_own(tmp_path):
    """``--analyze-sbatch-arg=--dependency=afterany:7`` (or ``evaluate_sbatch_args``): one line, exit 2, nothing
    submitted or made, by the dry run too (was submitted, exit 0: sbatch keeps the last --dependency, so each analysis
    waited for job 7 instead of its training, and could start before it; seen with scontrol on local_slurm.sh). A
    training's own (it waits for none of the sweep's): the same command again keeps the 5 jobs queued (was refused,
    `holds a sweep submitted with other settings (the w64-baseline-s0 train job differs …)`); its table job cancelled,
    that one (`sweep: 1 job submitted`, was `1 jobs`)."""
    out, calls = tmp_path / "sweep", tmp_path / "calls"
    env = fake_slurm(tmp_path, "")
    for key in ("analyze", "evaluate"):
        for dry_run in ((), ("--dry-run",)):
            proc = sweep(*ONE_CELL, "--out", str(out), f"--{key}-sbatch-arg=--dependency=afterany:7", *dry_run, env=env)
            assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
                f"dispersion_titan: error: {key}_sbatch_args: --dependency=afterany:7: these jobs wait for the ones "
                "before them with a --dependency of their own, which sbatch would replace with this one (it keeps "
                "the last given); leave it out (to wait for a job of yours, submit once it ended, or hold them with "
                "--begin)"
            ], proc.stderr
    assert not calls.exists() and not out.exists()
    for _ in range(2):
        proc = sweep(*ONE_CELL, "--out", str(out), "--train-sbatch-arg=--dependency=afterany:7", env=env)
        assert proc.returncode == 0, proc.stderr
    assert "sweep: 0 jobs submitted (5 kept: still queued" in proc.stdout and len(calls.read_text().splitlines()) == 5
    held = tmp_path / "held"  # the table job cancelled: the one job again
    held.write_text("".join(line for line in held.read_text().splitlines(True) if not line.startswith("105 ")))
    proc = sweep(*ONE_CELL, "--out", str(out), "--train-sbatch-arg=--dependency=afterany:7", env=env)
    assert "sweep: 1 job submitted (4 kept: still queued" in proc.stdout, proc.stdout


def test_a_sweeps_table_job_asks_for_the_gpus_given_for_evaluate_once(tmp_path):
    """``--evaluate-sbatch-arg=--gpus=0`` (or ``-G1``): the table job's own ``--gpus=0`` left out (was ``--gpus=0
    --gpus=0``, or ``--gpus=0 -G1``)."""
    for given, gpus in (("--gpus=0", "--gpus=0"), ("-G1", "-G1")):
        proc = sweep(*ONE_CELL, "--out", str(tmp_path / "sweep"), f"--evaluate-sbatch-arg={given}", "--dry-run")
        assert proc.returncode == 0, proc.stderr
        table = next(line for line in proc.stdout.splitlines() if line.startswith("table="))
        assert re.findall(r" (--gpus=\S+|-G\S*) ", table) == [gpus], table


def test_a_sweep_of_array_jobs_or_whose_sbatch_gives_no_id_submits_nothing(tmp_path):
    """``--train-sbatch-arg=--array=0-1`` (any kind's, ``-a``, ``-Wa``: sbatch's -W -a): one line, exit 2, nothing
    submitted or made, by the dry run too (was submitted, exit 0: on launch/local_slurm.sh task 1 trained, task 0
    failed, as the array's `scontrol show job` lists every task, and the jobs after it were cancelled; ``-Wa0-1``
    submitted as well). ``--test-only``, where sbatch
    prints no id (here a stand-in sbatch that prints Slurm's line on stderr): one line naming what it said, exit 2,
    nothing recorded (was `` w64-baseline-s0 train`` taken as submitted with the id "", then `sbatch (… analyze): …
    Job dependency problem`, and a sweep.json whose empty id blocked the command again)."""
    out, calls = tmp_path / "sweep", tmp_path / "calls"
    test_only = 'case "$*" in *--test-only*)\necho "sbatch: Job 7 to start at now" >&2; exit 0;;\nesac\n'
    env = fake_slurm(tmp_path, test_only)
    for option in ("--train-sbatch-arg=--array=0-1", "--evaluate-sbatch-arg=-a0-1", "--analyze-sbatch-arg=-Wa0-1"):
        for dry_run in ((), ("--dry-run",)):
            proc = sweep(*ONE_CELL, "--out", str(out), option, *dry_run, env=env)
            key, given = option.removeprefix("--").split("=", 1)
            assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
                f"dispersion_titan: error: {key.replace('-', '_')}s: {given}: the tasks of an array job would each run "
                "the same command, into the same folders; leave it out"
            ], proc.stderr
    assert not calls.exists() and not out.exists()
    proc = sweep(*ONE_CELL, "--out", str(out), "--train-sbatch-arg=--test-only", env=env)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "dispersion_titan: error: sbatch (w64-baseline-s0 train): submitted no job (it said: sbatch: Job 7 to start at "
        "now); fix the cause and submit the sweep again for the rest"
    ], proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_a_sweep_whose_sbatch_failed_partway_submits_the_rest_when_run_again(tmp_path):
    """The 3rd of a sweep's 5 sbatch calls refused (the evaluation's bad partition, exit 1): one line naming the job
    and those submitted, exit 2, and sweep.json names them; the command again with the partition fixed submits the
    3 missing after the 2 Slurm still holds (was: `out: OUT exists and is not an empty folder or a sweep's`)."""
    out, calls = tmp_path / "sweep", tmp_path / "calls"
    env = fake_slurm(  # a call refused takes an id too
        tmp_path,
        'case "$*" in *--partition=bad*)\necho "sbatch: error: invalid partition specified: bad" >&2; exit 1;;\nesac\n',
    )
    first = sweep(*ONE_CELL, "--out", str(out), "--evaluate-sbatch-arg=--partition=bad", env=env)  # evaluate: 3rd
    assert first.returncode == 2 and first.stderr.strip().splitlines() == [
        "dispersion_titan: error: sbatch (w64-baseline-s0 evaluate): sbatch: error: invalid partition specified: bad; "
        "submitted so far: 101 102 (scancel 101 102); fix the cause and submit the sweep again for the rest"
    ], first.stderr
    recorded = json.loads((out / "sweep.json").read_text())
    assert [recorded["cells"][0][f"{kind}_job"] for kind in ("train", "analyze", "evaluate")] == ["101", "102", None]
    dry = sweep(*ONE_CELL, "--out", str(out), "--dry-run", env=env)  # what the command again submits (was all 5)
    assert dry.returncode == 0 and "# submitted before: 3 of them to submit (2 kept: still queued" in dry.stdout
    assert [line.split(" --job-name")[0] for line in dry.stdout.splitlines() if "=$(sbatch" in line] == [
        "evaluate_1=$(sbatch --parsable --dependency=afterok:101",
        "compare=$(sbatch --parsable --dependency=afterok:101:102",
        "table=$(sbatch --parsable --dependency=afterok:$evaluate_1",
    ]
    assert len(calls.read_text().splitlines()) == 3
    again = sweep(*ONE_CELL, "--out", str(out), env=env)  # the partition fixed: only jobs never submitted changed
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1].startswith("sweep: 3 jobs submitted (2 kept: still queued or running")
    evaluate, compare, table = calls.read_text().splitlines()[3:]
    assert evaluate.startswith("--parsable --dependency=afterok:101 ") and "--partition=bad" not in evaluate
    assert compare.startswith("--parsable --dependency=afterok:101:102 ")
    assert table.startswith("--parsable --dependency=afterok:104 ")
    recorded = json.loads((out / "sweep.json").read_text())
    assert [recorded["cells"][0][f"{kind}_job"] for kind in ("train", "analyze", "evaluate")] == ["101", "102", "104"]
    assert (recorded["compare_job"], recorded["table_job"]) == ("105", "106")


def test_a_sweep_with_force_in_its_job_args_redoes_those_jobs_when_run_again(tmp_path, monkeypatch):
    """``--force`` in ``analyze_args`` or ``evaluate_args`` asks those jobs for their results anew: the sweep again
    submits them, and the compare or table job after them, whatever results it finds (was: kept as finished,
    nothing submitted). In-process: its training's last checkpoint (``tiny_run``), an analysis and an evaluation of
    it as those jobs leave them, compare.csv and table.md written after, and none of its jobs in Slurm's queue."""
    from dispersion_titan.analysis.condensation_schema import RESULT_FILE, Condensation
    from dispersion_titan.analyze import analyze_parser
    from dispersion_titan.evaluate import evaluate_parser
    from dispersion_titan.reproduce import sweep as slurm_sweep
    from dispersion_titan.run_folder.checkpoints import checkpoint_identity
    from dispersion_titan.run_folder.outputs import write_json

    out = tmp_path / "sweep"
    grid = {"config": DEBUG_TOML, "out": str(out), "widths": [64], "variants": ["baseline"], "seeds": [0]}
    planned = slurm_sweep.read_sweep(grid)
    jobs = slurm_sweep.slurm_jobs(planned)
    slurm_sweep.write_manifest(planned, jobs, {job.key: str(101 + i) for i, job in enumerate(jobs)})
    (config,) = slurm_sweep.check_training_configs(planned)
    run, last = Path(config.job.dump_folder), config.training.steps
    step = run / config.checkpoint.folder / f"step-{last}"
    tiny_run(run, steps=(last,))
    analysis = Condensation(
        *(last, 1, 8, [], None, None, [], 1, [-1.0, 1.0], {}, "fp32", "cpu", str(step), str(run)),
        checkpoint_identity=checkpoint_identity(str(step)),  # as analyze records the checkpoint it measured
    )
    write_json(str(run / "condensation" / f"step-{last}" / RESULT_FILE), analysis.to_json())
    write_evaluation(run, last, {"t": {"acc,none": 0.5}}, {"tasks": ["t"]})
    for job, written in (("compare", "compare.csv"), ("table", "table.md")):
        (out / job).mkdir()
        (out / job / written).touch()
    monkeypatch.setenv("PATH", fake_slurm(tmp_path, "")["PATH"])  # an squeue that holds no job

    def submitted(analyze: list[str], evaluate: list[str]) -> list[str]:
        analyzing = analyze_parser().parse_args([str(tmp_path), *analyze])
        evaluating = evaluate_parser().parse_args([str(tmp_path), *evaluate])
        return [job.key for job in slurm_sweep.resubmission(planned, jobs, [config], analyzing, evaluating)[0]]

    assert submitted([], []) == []
    assert submitted(["--force"], []) == ["analyze_1", "compare"]
    assert submitted([], ["--force"]) == ["evaluate_1", "table"]


def test_a_sweep_killed_while_it_submits_submits_the_rest_when_run_again(tmp_path):
    """kill -9 of the sweep as its 3rd sbatch call starts (the terminal closed, an OOM kill): sweep.json names the 2
    jobs queued, and the same command again submits the 3 others after them (was: no sweep.json, the folder taken
    for an empty one, all 5 submitted again, two trainings queued into one run folder)."""
    out, calls = tmp_path / "sweep", tmp_path / "calls"
    env = fake_slurm(tmp_path, "if [ $n = 3 ]; then kill -9 $PPID; sleep 5; exit 1; fi\n")  # the 3rd call, once
    assert sweep(*ONE_CELL, "--out", str(out), env=env).returncode == -signal.SIGKILL
    recorded = json.loads((out / "sweep.json").read_text())
    assert [recorded["cells"][0][f"{kind}_job"] for kind in ("train", "analyze", "evaluate")] == ["101", "102", None]
    again = sweep(*ONE_CELL, "--out", str(out), env=env)
    assert again.returncode == 0 and "sweep: 3 jobs submitted (2 kept" in again.stdout, again.stderr
    assert calls.read_text().splitlines()[3].startswith("--parsable --dependency=afterok:101 ")  # its evaluation


def test_ctrl_c_in_a_sweeps_dry_run_says_nothing_was_submitted(tmp_path):
    """Ctrl-C while a sweep --dry-run (or the checks before submitting) reads the training config: `interrupted;
    nothing was submitted`, exit 130 (was `the jobs submitted so far stay queued (their ids are above): …`, of a dry
    run that submits none)."""
    out = tmp_path / "sweep"
    pid, job = paused_reading(
        "dispersion_titan.sweep", *ONE_CELL, "--dry-run", "--out", str(out), reading="debug.toml", tmp=tmp_path
    )
    os.kill(pid, signal.SIGINT)
    os.kill(pid, signal.SIGCONT)
    done = job.result()
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == ["dispersion_titan: interrupted; nothing was submitted"], done.stderr
    assert not out.exists()


def test_a_sweep_whose_manifest_cannot_be_written_says_the_job_it_queued_and_goes_on_when_run_again(tmp_path):
    """sweep.json unwritable once the 1st sbatch queued its job (``ulimit -f 2``: logs/submitted.json fits, sweep.json
    not; a disk filling up the same): the id printed above the out-of-room line, exit 74, and the same command again
    refuses to queue that job twice, naming it (was: the id never said, and the folder refused as `not an empty folder
    or a sweep's; give the sweep a new folder`, which the line had told to run again)."""
    out, env = tmp_path / "sweep", fake_slurm(tmp_path, "")
    full = python_module("dispersion_titan.sweep", *ONE_CELL, "--out", str(out), env=env, file_limit=2048)
    assert full.returncode == 74 and f"writing {out / 'sweep.json'}" in full.stderr, full.stderr
    assert re.findall(r"^\s*(\d+)  ", full.stdout, re.MULTILINE) == ["101"]
    again = sweep(*ONE_CELL, "--out", str(out), env=env)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        "dispersion_titan: error: sbatch (w64-baseline-s0 train): the same job is queued or running as 101; wait for "
        "it to end, or scancel 101, then submit again"
    ], again.stderr
    assert len((tmp_path / "calls").read_text().splitlines()) == 1


def test_ctrl_c_while_sbatch_submits_records_the_job_it_queued(tmp_path):
    """Ctrl-C to the terminal's process group once the 2nd of a sweep's sbatch calls has queued its job, before it
    said the id: that sbatch ends, then the sweep's interrupted line, exit 130, and sweep.json names both jobs (was:
    sbatch killed with its job queued, the id never recorded, a job nobody knew of). A stand-in sbatch here."""
    bin_dir, out, queued, parent = tmp_path / "bin", tmp_path / "sweep", tmp_path / "queued", tmp_path / "parent"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(  # job ids 101, 102, ...: the 2nd queued, then 2 s before its id is said
        f"#!/bin/sh\nn=$((101 + $(cat {queued} 2>/dev/null | wc -l)))\necho $n >> {queued}\n"
        f"if [ $n = 102 ]; then echo $PPID > {parent}.tmp; mv {parent}.tmp {parent}; sleep 2; fi\necho $n\n"
    )
    (bin_dir / "sbatch").chmod(0o755)
    args = (str(REPO / "launch" / "sweep_example.toml"), "--widths", "64", "--variants", "baseline", "--seeds", "0")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    job = ThreadPoolExecutor(1).submit(sweep, *args, "--out", str(out), env=env)
    while not parent.exists() and not job.done():
        time.sleep(0.01)
    assert not job.done(), job.result().stderr
    os.killpg(os.getpgid(int(parent.read_text())), signal.SIGINT)  # the sweep's process group, as a terminal's
    done = job.result()
    assert done.returncode == 130 and done.stderr.strip().splitlines() == [
        "dispersion_titan: interrupted; the jobs submitted so far stay queued (their ids are above): the same command "
        "again submits the rest, or scancel them to start over"
    ], done.stderr
    assert re.findall(r"^\s*(\d+)  ", done.stdout, re.MULTILINE) == ["101", "102"]
    recorded = json.loads((out / "sweep.json").read_text())
    assert [recorded["cells"][0][f"{kind}_job"] for kind in ("train", "analyze", "evaluate")] == ["101", "102", None]
    assert sorted(json.loads((out / "logs" / "submitted.json").read_text())) == ["101", "102"]


def test_a_sweep_folder_whose_manifest_is_unreadable_submits_nothing(tmp_path):
    """A sweep submitted again into its folder reads its sweep.json (cut short, or edited by hand): one line naming
    it, exit 2, before any sbatch (a traceback without the check)."""
    from dispersion_titan.run_folder.owners import FolderOwner, record_owner

    bin_dir, out = tmp_path / "bin", tmp_path / "sweep"
    bin_dir.mkdir()
    out.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path}/submitted\necho 1\n")  # Slurm, were it called
    (bin_dir / "sbatch").chmod(0o755)
    record_owner(str(out), FolderOwner("sweep"))
    (out / "sweep.json").write_text('{"config": "')
    one_cell = ("--widths", "64", "--variants", "baseline", "--seeds", "0", "--out", str(out))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = sweep(str(REPO / "launch" / "sweep_example.toml"), *one_cell, env=env)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"dispersion_titan: error: out: {out / 'sweep.json'}: unreadable (JSONDecodeError: Unterminated string "
        "starting at: line 1 column 12 (char 11)); give the sweep a new folder"
    ], proc.stderr
    assert not (tmp_path / "submitted").exists() and (out / "sweep.json").read_text() == '{"config": "'


def test_the_job_config_is_parsed_and_checked_once_on_its_way_to_the_trainer(tmp_path):
    """A real launch reads its TOML, parses and checks the config once, and hands that very object to the
    trainer (debug.toml derives ``local_batch_size = 0``, which only the checks fill in),
    without rewriting ``sys.argv`` or ``parse_args``'s default argument."""
    out = tmp_path / "counts.json"
    proc = torchrun_script(
        "count_parses.py",
        1,
        str(out),
        "--job.config_file",
        DEBUG_TOML,
        "--job.dump_folder",
        str(tmp_path / "run"),
        "--training.steps",
        "1",
        "--validation.no-enable",
        "--checkpoint.no-enable",
        *DEBUG_SEQ_LEN,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(out.read_text()) == {
        "parses": 1,
        "checks": 1,
        "trainers": 1,
        "toml_reads": 1,
        "trainer_got_the_checked_config": True,
        "argv_kept": True,
        "default_kept": True,
    }


def test_a_sweep_submitted_again_with_or_without_sbatch_gpus_per_node_is_the_same_sweep(tmp_path):
    """``SBATCH_GPUS_PER_NODE`` set for one submission and not the other (its GPUs per node those the trainings ask
    without it, train.sbatch's 8): the same sweep, its ended jobs submitted again each as the environment now asks,
    both ways (was refused, `holds a sweep submitted with other settings (the w64-baseline-s0 analyze job differs
    ...)`: the --gpus-per-node=0 its other jobs ask under the variable, which asks what they ask without it)."""
    out, calls, held = tmp_path / "sweep", tmp_path / "calls", tmp_path / "held"
    env = fake_slurm(tmp_path, "")
    for variable, count in (({"SBATCH_GPUS_PER_NODE": "8"}, 5), ({}, 10), ({"SBATCH_GPUS_PER_NODE": "8"}, 15)):
        held.write_text("")  # the jobs before ended (cancelled): each submitted again
        proc = sweep(*ONE_CELL, "--out", str(out), env={**env, **variable})
        assert proc.returncode == 0, proc.stderr
        submitted = calls.read_text().splitlines()
        alone = [" --kill-on-invalid-dep=yes --gpus-per-node=0 " in line for line in submitted[count - 5 : count]]
        assert len(submitted) == count and alone == [False] + [bool(variable)] * 4, submitted


def test_a_sweep_submitted_again_under_another_sbatch_gpus_per_node_is_refused(tmp_path):
    """``SBATCH_GPUS_PER_NODE`` changed since the trainings were submitted (``sweep.json``'s ``environment``), the
    sweep giving no --gpus-per-node of its own: one line naming the variable and its earlier value, exit 2, nothing
    submitted (was submitted: each training went on on another number of GPUs per node than it started with, which
    the sweep's own --gpus-per-node refuses as other settings); under the earlier value, its ended jobs again."""
    out, calls, held = tmp_path / "sweep", tmp_path / "calls", tmp_path / "held"
    env = fake_slurm(tmp_path, "")
    assert sweep(*ONE_CELL, "--out", str(out), env={**env, "SBATCH_GPUS_PER_NODE": "4"}).returncode == 0
    held.write_text("")  # its jobs ended (cancelled), the training unfinished
    for variable, said in (
        ({"SBATCH_GPUS_PER_NODE": "8"}, "SBATCH_GPUS_PER_NODE=8: "),
        ({}, "SBATCH_GPUS_PER_NODE unset: "),
    ):
        for dry_run in ((), ("--dry-run",)):
            proc = sweep(*ONE_CELL, "--out", str(out), *dry_run, env={**env, **variable})
            assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert proc.stderr.startswith(
                f"dispersion_titan: error: {said}{out} holds a sweep submitted with SBATCH_GPUS_PER_NODE=4: its "
                "trainings would go on on 8 GPUs per node, not the 4 they were submitted for; submit it again with "
                "SBATCH_GPUS_PER_NODE=4"
            ), proc.stderr
    assert len(calls.read_text().splitlines()) == 5
    proc = sweep(*ONE_CELL, "--out", str(out), env={**env, "SBATCH_GPUS_PER_NODE": "gpu:4"})  # the same count
    assert proc.returncode == 0 and len(calls.read_text().splitlines()) == 10, proc.stderr
