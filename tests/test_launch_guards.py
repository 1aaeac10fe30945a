"""What is refused before any process group starts, in one line with exit status 2 and
nothing written: GPUs allocated but unusable (no silent CPU fallback), batch sizes that do
not split over the GPUs, output folders that cannot be created, and bad configurations
under launch/train.sh (checked once, before torchrun)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispersion_titan.config.cli import load_toml, with_config_module
from dispersion_titan.job_config import released
from dispersion_titan.job_config.checks import resolve_batch_sizes
from dispersion_titan.job_config.parse import check_launch, validated_args
from dispersion_titan.run_folder.outputs import FORMAT, FORMAT_KEY
from dispersion_titan.run_folder.settings import run_settings
from dispersion_titan.utils.devices import ALLOW_CPU_ENV, allocated_gpus, check_gpus_usable
from dispersion_titan.utils.errors import ConfigError, DeviceError
from support.cli import assert_one_line_error
from support.launch import DEBUG_SEQ_LEN, DEBUG_TOML, REPO, job_args, launch_env, python_module
from support.runs import digests

CONFIGS = sorted((REPO / "train_configs").rglob("*.toml"))  # ours and paper/
GPU_CONFIGS = [c for c in CONFIGS if c.name.startswith(("gpt2_small_", "fineweb_", "midtrain_", "fig3_"))]
DP_DEGREES = (1, 2, 4, 8, 16, 32, 64)


# What TorchTitan sets in a CPU run's environment, as a shell or job where an earlier run set them would have it
SET_BY_AN_EARLIER_RUN = {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A small single-process CPU run: its folder and its process."""
    dump = tmp_path_factory.mktemp("guards") / "run"
    proc = python_module(
        "dispersion_titan.train",
        "--job.config_file",
        DEBUG_TOML,
        "--job.dump_folder",
        str(dump),
        "--training.steps",
        "2",
        *DEBUG_SEQ_LEN,
        "--validation.no-enable",
        env=SET_BY_AN_EARLIER_RUN,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dump, proc


@pytest.fixture(scope="module")
def finished_run(one_process_run) -> Path:
    """A small run folder that refused commands must leave byte-identical."""
    return one_process_run[0]


def test_a_float32_cpu_run_says_nothing_of_autocast(one_process_run):
    """debug.toml trains in fp32: no autocast, and no torch warning that a CPU autocast to fp32 is off; nor
    TorchTitan's warnings, twice per run, that a CPU has no lspci and no peak FLOPS (the peak used is said), or that
    it overrides a variable an earlier run left in the environment with the value it has; nor any other warning."""
    proc = one_process_run[1]
    said = proc.stdout + proc.stderr
    assert "autocast" not in said.lower(), proc.stderr[-4000:]
    assert "lspci" not in said and "Peak flops undefined" not in said, said[-4000:]
    assert "Peak FLOPS used for computing MFU: " in said, said[-4000:]
    # Nor a library's warning to act on nothing (torchdata's set_vital, DTensor's RNG on a CPU mesh, gloo's timeout
    # setter, TorchTitan's HF index of no HF export): a CPU run prints no warning at all.
    assert "WARNING" not in said and "Warning:" not in said, said[-4000:]


# ---------------------------------------------------------------- no silent CPU fallback


def fake_nvidia_smi(folder: Path) -> str:
    """A PATH whose ``nvidia-smi -L`` lists two GPUs."""
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H100 (UUID: GPU-0)"\necho "GPU 1: NVIDIA H100 (UUID: GPU-1)"\n')
    script.chmod(0o755)
    return f"{folder}:{launch_env()['PATH']}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "signal, count",
    [("slurm", "8 allocated GPUs (SLURM_GPUS_ON_NODE)"), ("nvidia-smi", "2 allocated GPUs (nvidia-smi -L)")],
)
def test_gpus_torch_cannot_use_are_refused_in_one_line(finished_run, tmp_path, signal, count):
    env = (
        {ALLOW_CPU_ENV: "", "SLURM_GPUS_ON_NODE": "8"}
        if signal == "slurm"
        else {ALLOW_CPU_ENV: "", "PATH": fake_nvidia_smi(tmp_path / "bin")}
    )
    before = digests(finished_run)
    proc = python_module(
        "dispersion_titan.train",
        "--job.config_file",
        DEBUG_TOML,
        "--job.dump_folder",
        str(finished_run),
        "--training.steps",
        "4",
        "--validation.no-enable",
        env=env,
    )
    assert_one_line_error(
        proc.returncode,
        proc.stderr,
        "is a CPU-only build on a node with " + count,
        "install a CUDA build of torch",
        f"{ALLOW_CPU_ENV}=1",
    )
    assert digests(finished_run) == before


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"SLURM_GPUS_ON_NODE": "8"}, (8, "SLURM_GPUS_ON_NODE")),
        ({"SLURM_JOB_GPUS": "0-3,6"}, (5, "SLURM_JOB_GPUS")),
        ({"SLURM_STEP_GPUS": "2"}, (1, "SLURM_STEP_GPUS")),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, (2, "CUDA_VISIBLE_DEVICES")),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_GPUS_ON_NODE": "0"}, None),
    ],
)
def test_allocated_gpu_signals(monkeypatch, env, expected):
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi
    assert allocated_gpus(env) == expected


def test_cpu_is_allowed_with_the_opt_in_or_without_any_gpu_signal(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    check_gpus_usable({"CUDA_VISIBLE_DEVICES": "0,1", ALLOW_CPU_ENV: "1"})
    check_gpus_usable({})
    with pytest.raises(DeviceError, match=r"on a node with 2 allocated GPUs \(CUDA_VISIBLE_DEVICES\)"):
        check_gpus_usable({"CUDA_VISIBLE_DEVICES": "0,1"})


# ---------------------------------------------------------------- batch sizes that scale


@pytest.fixture(scope="module")
def parsed_configs() -> dict[str, object]:
    """Every shipped config but the paper's (whose global batch follows the GPU count, [released]) parsed
    once, with its TOML's own local batch sizes (parsing fills in derived ones for 1 process); the DP
    degrees are applied to copies."""
    parsed = {}
    for config in CONFIGS:
        toml = load_toml(["--job.config_file", str(config)])
        if "released" in toml:
            continue
        job = validated_args(job_args(str(config)))
        for section in ("training", "validation"):
            getattr(job, section).local_batch_size = toml[section]["local_batch_size"]
        parsed[config.name] = job
    return parsed


def test_gpu_configs_are_valid_unchanged_from_1_to_64_gpus(parsed_configs):
    """local_batch_size = 0: global / DP, in micro-batches of at most max_local_batch_size. A paper config
    holds the authors' per-GPU batch on every GPU count ([released]: test_shipped_configs.py)."""
    ours = [c for c in GPU_CONFIGS if c.name in parsed_configs]
    assert len(GPU_CONFIGS) == 27 and len(ours) == 12
    for config in ours:
        parsed = parsed_configs[config.name]
        assert parsed.training.global_batch_size >= 64, config.name
        for dp in (dp for dp in DP_DEGREES if dp <= parsed.training.global_batch_size):
            job = copy.deepcopy(parsed)
            resolve_batch_sizes(job, dp)
            t, v = job.training, job.validation
            assert t.local_batch_size <= t.max_local_batch_size, (config.name, dp)
            assert t.global_batch_size % (t.local_batch_size * dp) == 0, (config.name, dp)  # TorchTitan's assertion
            assert v.local_batch_size * dp == v.global_batch_size, (config.name, dp)
        assert parsed.model.vocab_size == 50304, config.name
    for config in (c for c in GPU_CONFIGS if c.name not in parsed_configs):  # 1, 2 and 8: test_shipped_configs.py
        job = validated_args(job_args(str(config)), DP_DEGREES[-1])
        t = job.training
        assert t.global_batch_size == DP_DEGREES[-1] * t.local_batch_size * job.released.gradient_accumulation_steps
        # 0: the loaded GPT-2's 50257; fig3 from scratch: 50257 too, the authors' len(tokenizer), unpadded
        assert job.model.vocab_size == (0 if "midtrain" in config.name else 50257), config.name


@pytest.mark.parametrize("dp", DP_DEGREES)
def test_every_config_either_resolves_or_names_the_batch_in_one_line(parsed_configs, dp):
    for name, parsed in parsed_configs.items():
        job = copy.deepcopy(parsed)
        try:
            resolve_batch_sizes(job, dp)
        except ConfigError as e:
            assert str(e).startswith(
                (
                    "training.global_batch_size: ",
                    "validation.global_batch_size: ",
                    "training.local_batch_size: ",
                    "validation.local_batch_size: ",
                )
            ), (name, dp)
            assert "\n" not in str(e), (name, dp)
            assert name not in [c.name for c in GPU_CONFIGS] or dp > parsed.training.global_batch_size, (name, dp)
            assert f"{dp} data-parallel ranks" in str(e)
        else:
            assert job.training.global_batch_size % (job.training.local_batch_size * dp) == 0, (name, dp)


# A batch, a process count or an output folder refused for a given number of processes: test_config_errors.py's table.


def test_the_checks_of_a_relaunch_read_its_run_json_once(tmp_path, monkeypatch):
    """``check_launch`` reads a relaunch's ``run.json`` once for all its checks (was 3 times: the data here, the
    fork, the settings; 4 for a hub id's revision)."""
    monkeypatch.chdir(tmp_path)
    args = [*job_args(DEBUG_TOML), "--job.dump_folder", "run", "--checkpoint.no-enable", "--validation.no-enable"]
    Path("run").mkdir()
    record = {FORMAT_KEY: FORMAT, "model_args": {}, "settings": run_settings(validated_args(args)), "cwd": "."}
    Path("run/run.json").write_text(json.dumps(record))
    reads, read_text = [], Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda path, *a, **k: (reads.append(path.name), read_text(path, *a, **k))[1])
    check_launch(validated_args(args), take_lock=False)
    assert reads.count("run.json") == 1


@pytest.mark.slow
def test_unwritable_dump_folder_is_one_line_without_traceback():
    proc = python_module(
        "dispersion_titan.train", "--job.config_file", DEBUG_TOML, "--job.dump_folder", "/etc/hostname/run"
    )
    assert_one_line_error(
        proc.returncode,
        proc.stderr,
        "job.dump_folder: /etc/hostname/run cannot be created: /etc/hostname is not a directory",
    )


# ---------------------------------------------------------------- launch/train.sh checks once


@pytest.mark.slow
@pytest.mark.parametrize("given", [["-debug.toml"], ["--job.config_file=-debug.toml"]], ids=["CONFIG", "flag="])
def test_train_sh_checks_the_config_once_before_torchrun(finished_run, tmp_path, given, script_python):
    """A bad override: one line from train.sh's one check, no torchrun, nothing written. The config given as
    ``-debug.toml`` (a path tyro would read as an option after a space): checked as the config (was:
    ``job.config_file: no value given``, train.sh having passed it as ``--job.config_file -debug.toml``). Given as
    ``--job.config_file CONFIG``, as dispersion-titan train takes it: test_reliability.py's background train.sh run.
    Its check forked from the job server (``script_python``), not a fresh interpreter importing TorchTitan."""
    here = tmp_path / "here"  # beside script_python's file
    here.mkdir()
    shutil.copy(DEBUG_TOML, here / "-debug.toml")
    before = digests(finished_run)
    proc = subprocess.run(
        [str(REPO / "launch" / "train.sh"), *given, "--job.dump_folder", str(finished_run), "--dispersion.variant",
         "angular"],
        cwd=here,
        capture_output=True,
        text=True,
        env=launch_env({"PYTHON": str(script_python)}),
        timeout=300,
    )  # fmt: skip
    assert_one_line_error(proc.returncode, proc.stderr, "dispersion.variant: 'angular' is not one of")
    assert "torch.distributed" not in proc.stdout + proc.stderr and not proc.stdout.strip()
    assert digests(finished_run) == before and [p.name for p in here.iterdir()] == ["-debug.toml"]


def test_check_only_says_the_layout_a_paper_config_launches(tmp_path):
    """``train --check-only`` on a paper config says the ``[released]`` layout (and the values derived) the launch
    derives for WORLD_SIZE ranks, as the launch says them (was: nothing, exit 0), and writes nothing."""
    config = str(REPO / "train_configs" / "paper" / "fig3_gpt2_small.toml")
    args = [*job_args(config), "--profile", "cpu", "--job.dump_folder", str(tmp_path / "run")]
    proc = python_module("dispersion_titan.train", "--check-only", *args, env={"WORLD_SIZE": "8"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = validated_args(with_config_module(args, load_toml(args)), 8)
    assert f"dispersion_titan: note: {released.summary(job)}\n" in proc.stderr and "[released] on 8 GPUs" in proc.stderr
    assert "dispersion_titan: note: derived: " in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, value", [("WORLD_SIZE", "2"), ("RANK", "1")])
def test_a_world_of_several_ranks_left_in_the_environment_is_one_line(tmp_path, name, value):
    """``train`` without torchrun where ``WORLD_SIZE`` or ``RANK`` of a job of several processes is set (exported
    for another tool): one line naming it, exit 2, at once, nothing made (was: the process group waited 5 minutes
    for ranks no one started, then exit 1 with no word)."""
    args = [*job_args(DEBUG_TOML), "--profile", "cpu", "--job.dump_folder", str(tmp_path / "run")]
    proc = python_module("dispersion_titan.train", *args, env={name: value}, timeout=120)
    assert_one_line_error(
        proc.returncode, proc.stderr,
        f"{name}={value} is set, but no torchrun started this process (LOCAL_RANK is unset), so no other rank will "
        f"join it; unset {name} to train in one process, or start several with launch/train.sh (NPROC=N)",
    )  # fmt: skip
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "env, says",
    [
        (
            {"PYTHON": "/no/python"},
            "train.sh: error: PYTHON: '/no/python' is no interpreter to run; unset it, or name one",
        ),
        (  # was: training with no line shown, exit 0
            {"LOG_RANK": "0,2", "NPROC": "2"},
            "train.sh: error: LOG_RANK 2 names no local rank of this node, which starts NPROC=2 processes (0..1); name "
            "one of them (empty: all)",
        ),
        (
            {"LOG_RANK": "rank0"},
            "train.sh: error: LOG_RANK must be local ranks, e.g. 0 or 0,1 (empty: all), got 'rank0'",
        ),
        (
            {"OMP_NUM_THREADS": "abc"},
            "train.sh: error: OMP_NUM_THREADS must be a positive whole number of threads, e.g. 4, or unset; got 'abc'",
        ),
        ({"RDZV_ENDPOINT": "node1:port"}, "train.sh: error: RDZV_ENDPOINT must be HOST or HOST:PORT, got 'node1:port'"),
        ({"PREEMPT_SIGNAL": "USR9"}, "train.sh: error: PREEMPT_SIGNAL must be a signal name, e.g. USR1, got 'USR9'"),
    ],
    ids=["PYTHON", "LOG_RANK-absent", "LOG_RANK", "OMP_NUM_THREADS", "RDZV_ENDPOINT", "PREEMPT_SIGNAL"],
)
def test_train_sh_names_a_bad_environment_variable_before_starting_anything(tmp_path, env, says):
    """Was bash's own line naming neither variable (PYTHON, exit 127), torchrun's 24-line traceback
    (LOG_RANK; RDZV_ENDPOINT: 36 lines), libgomp's own line above the run's (OMP_NUM_THREADS), or bash's trap
    error after the config check (PREEMPT_SIGNAL, exit 1)."""
    proc = subprocess.run(
        [str(REPO / "launch" / "train.sh"), DEBUG_TOML, "--job.dump_folder", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=launch_env({"PYTHON": sys.executable, **env}),
        timeout=60,
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, says + "\n", "")
    assert not list(tmp_path.iterdir())


def test_train_sh_help_prints_its_usage():
    proc = subprocess.run(
        [str(REPO / "launch" / "train.sh"), "--help"],
        capture_output=True,
        text=True,
        env=launch_env({"PYTHON": sys.executable}),
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Train on this node:  launch/train.sh CONFIG [--section.key value ...]"
    assert any(line.startswith("NPROC") for line in (line.strip() for line in lines)) and "#" not in proc.stdout
