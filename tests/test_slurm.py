"""The sbatch scripts and the sweep on a real one-node Slurm cluster (launch/local_slurm.sh):
training with a checkpoint on SIGUSR1 and a requeue that finishes the run, and a two-cell
sweep with its dependency chain (train, analyze every checkpoint, evaluate on offline tasks,
compare, table)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispersion_titan.reproduce.slurm_scripts import queued_jobs
from support.eval_tasks import LM_EVAL_TASKS
from support.launch import DEBUG_SEQ_LEN, DEBUG_TOML, REPO, launch_env, python_module
from support.runs import digests, scalars

pytestmark = pytest.mark.slow

LOCAL_SLURM = REPO / "launch" / "local_slurm.sh"
# The local cluster has no GPUs: the scripts' GPU and CPU requests are overridden (and
# launch_env allows training on CPU).
NO_GPUS = ("--gpus-per-node=0", "--cpus-per-task=1")
TRAIN_SBATCH = REPO / "launch" / "slurm" / "train.sbatch"
TINY_ANALYSIS = ("--num-sequences", "4", "--seq-len", "64")
STEPS = 8


# Under CI, or where the test command installed Slurm itself, a cluster that cannot come up
# is a failure with its cause; elsewhere (no root, no apt) the Slurm tests skip.
MUST_RUN = os.environ.get("CI", "").lower() == "true" or (REPO / ".slurm-installed-by-tests").exists()


def unavailable(reason: str) -> None:
    (pytest.fail if MUST_RUN else pytest.skip)(reason)


def free_ports(count: int) -> list[int]:
    """Distinct ports nothing listens on (held together while chosen)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = ((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A running local cluster for the session (the environment to reach it); always stopped."""
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        subprocess.run(["bash", str(REPO / "scripts" / "ci_system_deps.sh")], capture_output=True, text=True)
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        unavailable(
            "slurm-wlm and munge are not installed and apt-get could not install them "
            "(scripts/ci_system_deps.sh needs root and apt)"
        )
    if os.geteuid() != 0:
        unavailable("the local Slurm cluster needs root (munged, slurmd)")
    # Its own state dir and free ports: another Slurm on the machine (the system's, or a
    # concurrent test session's) is neither used nor clashed with.
    ctld_port, slurmd_port = free_ports(2)
    env = launch_env(
        {
            "LOCAL_SLURM_DIR": str(tmp_path_factory.mktemp("slurm-state")),
            "LOCAL_SLURM_CTLD_PORT": str(ctld_port),
            "LOCAL_SLURM_SLURMD_PORT": str(slurmd_port),
        }
    )
    try:
        start = subprocess.run([str(LOCAL_SLURM), "start"], env=env, capture_output=True, text=True, timeout=120)
        if start.returncode != 0:
            unavailable(f"the local Slurm daemons did not start: {_last_line(start)}")
        env["SLURM_CONF"] = re.search(r"SLURM_CONF=(\S+)", start.stdout).group(1)
        yield env
    finally:
        subprocess.run([str(LOCAL_SLURM), "stop"], env=env, capture_output=True, text=True, timeout=120)


def job_fields(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """What scontrol knows of a queued or running job (finished ones leave it after 16 s)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def job_records(job_id: str, env: dict[str, str]) -> list[dict[str, str]]:
    """The cluster's completion log for a job: one record per attempt, in order (a
    requeued attempt is recorded as PENDING)."""
    path = Path(env["LOCAL_SLURM_DIR"]) / "jobcomp.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines if line.startswith(f"JobId={job_id} ")]


def finished_state(job_id: str, env: dict[str, str]) -> str | None:
    records = job_records(job_id, env)
    return records[-1]["JobState"] if records and records[-1]["JobState"] != "PENDING" else None


def sbatch(*args: str, env: dict[str, str], cwd: Path) -> str:
    """The id of the job ``sbatch ARGS`` submitted."""
    proc = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def ended(job_id: str, env: dict[str, str], timeout: float = 400) -> dict[str, str]:
    """The job's record once it has ended (a requeued attempt is not its end), looked for every 0.5 s
    (``sbatch --wait`` asks every MinJobAge / 2 = 8 s)."""
    deadline = time.monotonic() + timeout
    while finished_state(job_id, env) is None:
        assert time.monotonic() < deadline, f"job {job_id} still not ended after {timeout} s"
        time.sleep(0.5)
    return job_records(job_id, env)[-1]


def wait_for_line(path: Path, pattern: str, timeout: float = 240) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (m := re.search(pattern, path.read_text(errors="replace"))):
            return m
        time.sleep(0.5)
    raise AssertionError(
        f"{pattern!r} not in {path} after {timeout} s:\n{path.read_text()[-4000:] if path.exists() else ''}"
    )


def checkpoint_states(step_dir: Path) -> set[str]:
    """Top-level states in a DCP checkpoint: model FQNs, optimizer, lr_scheduler, ..."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    return {k.split(".")[0] for k in keys}


@pytest.fixture(scope="module")
def preempted_run(slurm, tmp_path_factory) -> dict:
    """train.sbatch on the debug config with one rank (each attempt's fresh ranks cost about 8 CPU-s apiece;
    ranks stopping together: test_reliability.py, test_launch.py), signalled as at its time limit after step 2
    (the batch-shell signal Slurm sends for --signal=B:USR1@T), left to requeue and finish."""
    submit_dir = tmp_path_factory.mktemp("submit")
    overrides = ("--training.steps", str(STEPS), "--validation.no-enable", "--metrics.log_freq", "1", *DEBUG_SEQ_LEN)
    env = {**slurm, "NPROC": "1"}
    job_id = sbatch(*NO_GPUS, str(TRAIN_SBATCH), DEBUG_TOML, *overrides, env=env, cwd=submit_dir)
    log = submit_dir / f"dispersion-train-{job_id}.out"
    try:
        wait_for_line(log, r"step:\s+2\s+loss")
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm, check=True)
        ended(job_id, slurm)
    except BaseException:
        subprocess.run(["scancel", job_id], env=slurm)
        raise
    return {
        "job": job_id,
        "log": log,
        "dump": submit_dir / "outputs" / f"debug-{job_id}",
        "records": job_records(job_id, slurm),
    }


def test_train_sbatch_checkpoints_on_signal_and_requeue_finishes(preempted_run):
    run, text = preempted_run, preempted_run["log"].read_text()
    assert run["records"][-1]["ExitCode"] == "0:0", text[-6000:]
    assert [r["JobState"] for r in run["records"]] == ["PENDING", "COMPLETED"], "requeued once, then done"
    assert text.count(f"run folder {run['dump']}") == 2, "the requeued job keeps its run folder"
    step = int(re.search(r"saving a full checkpoint of step (\d+)", text).group(1))
    assert 2 <= step < STEPS
    # The rank exits 75; the launcher adds no summary of its own to the rank's line.
    assert f"Stopping at step {step} for a restart; exit status 75" in text and "requeueing job" in text
    assert "Traceback" not in text
    assert f"Training starts at step {step + 1}" in text

    ckpt = run["dump"] / "checkpoint"
    assert {"step-0", f"step-{step}", f"step-{STEPS}"} <= {p.name for p in ckpt.iterdir()}
    assert {"optimizer", "lr_scheduler", "dataloader", "train_state"} <= checkpoint_states(ckpt / f"step-{step}")
    # Both attempts logged their steps: 1..step before the signal, the rest after.
    assert sorted(scalars(run["dump"])["loss_metrics/global_avg_loss"]) == list(range(1, STEPS + 1))


def test_two_cell_sweep_runs_to_its_compare_and_table_jobs(slurm, script_python, tmp_path):
    """A plain and a noisy-embedding cell; the analysis jobs (analyze.sbatch) measure every checkpoint, the
    evaluation jobs score an offline test task on CPU (this cluster has no GPU: --gpus=0 overrides
    evaluate.sbatch's --gpus=1; the task's scores and the other kinds of task: test_evaluate.py). The first
    submission's jobs run their python forked from the job server (script_python: no signal is sent to them; the
    training ranks still fresh interpreters, as torchrun starts them), about 10 CPU-s less a job."""
    out = tmp_path / "sweep"
    evaluate_args = (
        f"--tasks wiki_next_word --include-path {LM_EVAL_TASKS} --limit 4 --num-fewshot 1 --device cpu"
        " --steps 3"  # the last checkpoint's, which the table reads (step 0's: the same work again)
    )
    command = [
        "dispersion_titan.sweep",
        *[
            "--config",
            DEBUG_TOML,
            "--out",
            str(out),
            "--widths",
            "128",
            "--variants",
            "baseline,noisy_embedding",
            "--seeds",
            "0",
            "--partition",
            "debug",
            "--train-time",
            "00:10:00",
            "--analyze-time",
            "00:10:00",
            "--gpus-per-node",
            "0",
            "--cpus-per-task",
            "1",
            "--analyze-gpus",
            "0",
            "--evaluate-time",
            "00:10:00",
            "--evaluate-sbatch-arg=--gpus=0",
            f"--analyze-args={' '.join(TINY_ANALYSIS)}",
            f"--evaluate-args={evaluate_args}",
            "--",
            "--training.steps",
            "3",
            "--training.seq_len",
            "64",
            "--validation.no-enable",
        ],
    ]
    # One rank per training (train.sh's NPROC), as in the requeue test.
    env = {**slurm, "NPROC": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = python_module(*command, cwd=tmp_path, env={**env, "PYTHON": str(script_python)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "sweep.json").read_text())
    jobs = [manifest["compare_job"], manifest["table_job"]] + [
        c[k] for c in manifest["cells"] for k in ("train_job", "analyze_job", "evaluate_job")
    ]
    assert len(jobs) == 8 and [c["name"] for c in manifest["cells"]] == ["w128-baseline-s0", "w128-noisy_embedding-s0"]
    for cell in manifest["cells"]:
        for after_training in ("analyze_job", "evaluate_job"):
            assert job_fields(cell[after_training], slurm)["Dependency"] in (
                f"afterok:{cell['train_job']}(unfulfilled)",
                "(null)",
            )
    deadline = time.monotonic() + 600  # 8 jobs, two at a time on a 2-CPU node
    while time.monotonic() < deadline:
        states = {j: finished_state(j, slurm) for j in jobs}
        if None not in states.values():
            break
        time.sleep(0.5)
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted((out / "logs").glob("*.out")))
    assert set(states.values()) == {"COMPLETED"}, f"{states}\n{logs}"
    for cell in manifest["cells"]:
        run = Path(cell["run"])
        steps = sorted(p.name for p in (run / "checkpoint").iterdir())
        assert steps == ["step-0", "step-3"]
        for step in steps:  # analyze.sbatch: every checkpoint
            assert (run / "condensation" / step / "condensation.json").is_file(), (step, logs)
        assert (run / "condensation" / "summary.csv").is_file()
        assert (run / "evaluation" / "step-3" / "results.json").is_file()
    assert (out / "compare" / "compare.csv").is_file() and (out / "compare" / "compare.png").is_file()
    table = (out / "table" / "table.md").read_text()
    assert "method=none" in table and "method=noisy_embedding" in table, table

    # The same command again: finished, nothing submitted (was all 8 again, each finding nothing to do); one
    # evaluation's result removed: that evaluation and the table only.
    again = python_module(*command, cwd=tmp_path, env=env, timeout=300)
    assert again.returncode == 0 and again.stdout.splitlines() == [
        f"sweep: finished (every job's results are in {out}); nothing submitted"
    ], again.stderr
    shutil.rmtree(Path(manifest["cells"][1]["run"]) / "evaluation" / "step-3")
    # fresh interpreters (env: no forking PYTHON): the jobs it submits are cancelled below, which ends only those
    again = python_module(*command, cwd=tmp_path, env=env, timeout=300)
    submitted = json.loads((out / "sweep.json").read_text())
    try:
        assert again.returncode == 0 and "sweep: 2 jobs submitted (6 kept" in again.stdout, again.stderr
        assert {submitted["cells"][1]["evaluate_job"], submitted["table_job"]}.isdisjoint(jobs)
    finally:
        subprocess.run(["scancel", submitted["cells"][1]["evaluate_job"], submitted["table_job"]], env=slurm)


def test_paper_slurm_again_while_its_jobs_are_queued_submits_nothing(preempted_run, slurm, tmp_path):
    """`paper fig2 --slurm` twice into one --out, its jobs held (`--begin`): the second is refused in one line naming
    the queued job, exit 2, nothing submitted (was a second set of jobs, its analysis refused by the first's lock
    and its drawing job cancelled); a third with other settings too, naming the queued job of its name."""
    out = tmp_path / "paper"
    command = ["dispersion_titan.paper", "fig2", "--models", str(preempted_run["dump"]), "--slurm", "--out", str(out)]
    command += ["--sbatch-arg=--gpus=0", "--sbatch-arg=--begin=now+1hour"]
    first = python_module(*command, cwd=tmp_path, env=slurm, timeout=120)
    ids = re.findall(r"^\s*(\d+)  paper-fig2-", first.stdout, re.MULTILINE)
    try:
        assert first.returncode == 0 and len(ids) == 2, first.stderr
        second = python_module(*command, cwd=tmp_path, env=slurm, timeout=120)
        assert second.returncode == 2 and second.stderr.strip().splitlines() == [
            f"dispersion_titan: error: sbatch (paper-fig2-1): the same job is queued or running as {ids[0]}; wait "
            f"for it to end, or scancel {ids[0]}, then submit again"
        ]
        assert sorted(json.loads((out / "logs" / "submitted.json").read_text())) == sorted(ids)
        # other settings into the same --out (was submitted, exit 0: two analyses into one folder, the later refused
        # by the first's settings hours from now, its drawing job cancelled)
        before = digests(out)
        other = python_module(*command, "--num-sequences", "3", cwd=tmp_path, env=slurm, timeout=120)
        assert other.returncode == 2 and other.stderr.strip().splitlines() == [
            f"dispersion_titan: error: sbatch (paper-fig2-1): job {ids[0]} of this name is queued or running with "
            f"other settings, and writes where this one would; wait for it to end, or scancel {ids[0]}, then submit "
            "again"
        ]
        assert digests(out) == before
    finally:
        subprocess.run(["scancel", *ids], env=slurm)


def test_an_array_job_queued_is_known_by_the_id_sbatch_gave(slurm, tmp_path, monkeypatch):
    """An array job (SBATCH_ARRAY_INX in a user's environment makes every job one; --array itself is refused): held,
    it is queued under the id sbatch printed (was missed: squeue's %i lists it as ID_[1-2], so the sweep took it for
    ended and submitted it again, and paper --slurm's check of its logs died with a KeyError traceback)."""
    job_id = sbatch("--hold", "--array=1-2", "--wrap=true", env=slurm, cwd=tmp_path)
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    try:
        assert queued_jobs([job_id, "99999"]) == {job_id: str(tmp_path)}
    finally:
        subprocess.run(["scancel", job_id], env=slurm)


def test_train_sbatch_given_a_folder_for_its_config_names_itself_and_the_folder(slurm, tmp_path):
    """One line naming train.sbatch (was `slurm_script`, Slurm's copy of it) and the folder (was `config file not
    found`, of a folder that is there), exit 2."""
    job_id = sbatch(*NO_GPUS, f"--output={tmp_path}/%j.out", str(TRAIN_SBATCH), str(tmp_path), env=slurm, cwd=tmp_path)
    exit_code = ended(job_id, slurm, timeout=120)["ExitCode"]
    log = (tmp_path / f"{job_id}.out").read_text()
    assert exit_code == "2:0" and log.strip() == (
        f"train.sbatch: error: config file {tmp_path} is a folder; give the TOML file itself"
    ), log


def test_the_sbatch_scripts_find_their_folder_where_its_path_holds_a_space_and_take_a_dashed_config(
    slurm, script_python, tmp_path
):
    """The package installed under a folder with a space (``My Projects/.venv``): each script finds its
    ``common.sh`` (was the path cut at the space, Slurm's ``Command=`` split on spaces: ``/tmp/common.sh: No such
    file or directory``, exit 1, for every job a sweep or ``paper --slurm`` submits). Its config named
    ``-debug.toml`` is checked as the config, its error the check's one line, exit 2 (was ``basename: invalid option
    -- 'd'``, exit 1, naming the run folder after the config). One job for both: a Slurm job costs seconds."""
    scripts = tmp_path / "my scripts" / "launch_scripts"
    shutil.copytree(REPO / "dispersion_titan" / "launch_scripts", scripts)
    shutil.copy(DEBUG_TOML, tmp_path / "-debug.toml")
    args = ("-debug.toml", "--dispersion.variant", "angular")
    # the package's environment active, as where it is installed (outside the checkout no .venv is found): its
    # python first on PATH, the job server's forking one (script_python: the check ends by itself, no signal)
    active = {**slurm, "VIRTUAL_ENV": sys.prefix, "PATH": f"{script_python.parent}{os.pathsep}{slurm['PATH']}"}
    job_id = sbatch(*NO_GPUS, f"--output={tmp_path}/%j.out", str(scripts / "slurm" / "train.sbatch"), *args,
                    env=active, cwd=tmp_path)  # fmt: skip
    exit_code = ended(job_id, slurm, timeout=120)["ExitCode"]
    log = (tmp_path / f"{job_id}.out").read_text()
    assert exit_code == "2:0" and "dispersion_titan: error: dispersion.variant: 'angular' is not one of" in log, log
    assert not (tmp_path / "outputs").exists(), log


def test_a_second_cluster_on_the_same_ports_is_refused_in_one_line(slurm, tmp_path):
    """The running cluster's ports are taken: a second one says so and starts nothing."""
    env = {**slurm, "LOCAL_SLURM_DIR": str(tmp_path / "second")}
    proc = subprocess.run([str(LOCAL_SLURM), "start"], env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:  # it started after all: stopped, not left running past the failure
        subprocess.run([str(LOCAL_SLURM), "stop"], env=env, capture_output=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip() == (
        f"local_slurm: port {slurm['LOCAL_SLURM_CTLD_PORT']} is already in use (another Slurm on this machine?): "
        "set LOCAL_SLURM_CTLD_PORT and LOCAL_SLURM_SLURMD_PORT to free ports"
    )
    assert not (tmp_path / "second" / "slurmctld.pid").exists()


def submit_sweep(out: Path, slurm: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """A one-cell sweep on CPU into ``out``, its evaluation on the offline test task."""
    evaluate_args = f"--tasks wiki_next_word --include-path {LM_EVAL_TASKS} --limit 8 --num-fewshot 1 --device cpu"
    return python_module(
        "dispersion_titan.sweep",
        *["--config", DEBUG_TOML, "--out", str(out)]
        + ["--widths", "64", "--variants", "baseline", "--seeds", "0", "--train-time", "00:10:00"]
        + ["--gpus-per-node", "0", "--cpus-per-task", "1", "--analyze-gpus", "0", "--evaluate-sbatch-arg=--gpus=0"]
        + [f"--analyze-args={' '.join(TINY_ANALYSIS)}", f"--evaluate-args={evaluate_args}", *extra]
        + ["--", "--training.steps", "40", "--validation.no-enable", "--metrics.log_freq", "1"],
        cwd=out.parent,
        env={**slurm, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )


def sweep_jobs(out: Path) -> dict[str, str]:
    manifest = json.loads((out / "sweep.json").read_text())
    cell = manifest["cells"][0]
    return {kind: cell[f"{kind}_job"] for kind in ("train", "analyze", "evaluate")} | {
        kind: manifest[f"{kind}_job"] for kind in ("compare", "table")
    }


def cancelled(jobs: dict[str, str], ids: list[str], slurm: dict[str, str]) -> None:
    """``scancel IDS``, once every one of ``jobs`` ended, cancelled (their dependants with them)."""
    subprocess.run(["scancel", *ids], env=slurm, check=True)
    deadline = time.monotonic() + 120
    while None in {finished_state(j, slurm) for j in jobs.values()} and time.monotonic() < deadline:
        time.sleep(1)
    assert {finished_state(j, slurm) for j in jobs.values()} == {"CANCELLED"}


def test_a_sweep_submitted_again_submits_only_its_stopped_jobs(slurm, tmp_path):
    """Submitted again while its jobs are queued (held by --begin, so nothing trains): nothing, as squeue shows them.
    Its training cancelled (scancel, which cancels the jobs after it): all five again, new ids. Was: `out: ...
    exists and is not an empty folder; give the sweep a new folder`, every cell of a sweep to train again for one
    cancelled job. Moved (mv) while they are queued: refused, naming them to scancel; once they ended, all five
    again where it is (was refused for good). (Going on from a checkpoint after a cancel: the requeue test; other
    settings, a copy, a submission refused partway: test_launch.py with a stand-in sbatch.)"""
    out, held = tmp_path / "sweep", "--train-sbatch-arg=--begin=now+1hour"
    first = submit_sweep(out, slurm, held)
    assert first.returncode == 0, first.stderr
    jobs = sweep_jobs(out)
    try:
        queued = submit_sweep(out, slurm, held)
        assert queued.returncode == 0 and "sweep: 0 jobs submitted (5 kept" in queued.stdout, queued.stderr
        assert sweep_jobs(out) == jobs
        cancelled(jobs, [jobs["train"]], slurm)

        again = submit_sweep(out, slurm, held)
        assert again.returncode == 0 and "sweep: 5 jobs submitted;" in again.stdout, again.stderr
        assert not set(sweep_jobs(out).values()) & set(jobs.values())

        # moved (mv) while those are queued: refused, naming them; once they ended, submitted again where it is
        jobs, first_out = sweep_jobs(out), out
        out = out.rename(tmp_path / "moved")
        moved = submit_sweep(out, slurm, held)
        ids = " ".join(jobs.values())
        assert moved.returncode == 2 and moved.stderr.strip().splitlines() == [
            f"dispersion_titan: error: out: {out} holds the sweep submitted into {first_out} (moved: its jobs {ids}, "
            f"queued or running, write there); scancel {ids} (or wait for them to end), then submit it here again"
        ]
        cancelled(jobs, list(jobs.values()), slurm)
        resumed = submit_sweep(out, slurm, held)
        assert resumed.returncode == 0 and "sweep: 5 jobs submitted;" in resumed.stdout, resumed.stderr
        commands = [" ".join(argv) for argv in json.loads((out / "sweep.json").read_text())["commands"].values()]
        assert all(" --job-name=moved-" in command and f"{first_out}/" not in command for command in commands)
    finally:  # the jobs of the last submission still queued
        subprocess.run(["scancel", *sweep_jobs(out).values()], env=slurm)
