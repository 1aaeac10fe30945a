"""bench/train_step.py times the trainer's own step (DispersionTrainer from a checked job config)
and bench/profile_step.py groups its profile: both run here on the debug model on a CPU, a
few steps each, through the same code a GPU run takes. bench/h100_model.py's memory estimate,
which sized the GPU configs' micro-batches, is checked against what autograd saves."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from torchtitan.tools.utils import get_peak_flops

from dispersion_titan.models.gpt2.args import flops_per_token, gpt2_flavors
from support.launch import DEBUG_TOML, REPO

SMALL_STEP = ["--training.global_batch_size", "4", "--training.seq_len", "64"]


@pytest.fixture
def single_process(monkeypatch):
    """The torchrun variables of a 1-process job, undone after the test with every variable TorchTitan's
    init sets in this process (TORCH_FR_BUFFER_SIZE, ...): the session's later jobs get this environment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    torchrun = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    # The trainer installs its stop handlers (trainer/preemption.py) in this process: put the
    # old ones back, or a later multiprocessing.Pool's SIGTERM would no longer end its workers.
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    with mock.patch.dict(os.environ, {**torchrun, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}):
        yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    for name in ("train_step", "profile_step"):
        sys.modules.pop(name, None)


def test_train_step_reports_every_variant_against_ce_with_titans_mfu(single_process, capsys):
    import train_step

    results = train_step.main(
        [DEBUG_TOML, "--steps", "2", "--warmup", "0", "--variants", "angular_spread", "l2_repel", *SMALL_STEP,
         "--sdpa-backend", "math"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert " sdpa_backend=math" in out
    assert f"| {' | '.join(train_step.COLUMNS)} |" in out
    assert list(results) == ["ce", "angular_spread", "l2_repel"]
    assert "trainer steps run: 6" in out  # 2 optimizer steps per objective, interleaved on one trainer
    for key, r in results.items():
        assert r["steps"] == 2 and all(math.isfinite(v) and v > 0 for v in r.values()), (key, r)
        assert re.search(rf"^\| {key} \| {r['step_ms']:.1f} \| {r['ratio']:.3f} \|", out, re.MULTILINE), key
    assert results["ce"]["ratio"] == 1.0
    # MFU: the debug model's FLOP count (tests/test_flops.py checks the formula) over TorchTitan's peak
    args = gpt2_flavors["debug"]
    peak = get_peak_flops(re.search(r" device=(.*) model=", out).group(1))
    assert f"RESULT train_step.debug.flops_per_token={flops_per_token(args, 64)}" in out
    for r in results.values():
        assert r["mfu"] == pytest.approx(flops_per_token(args, 64) * r["tokens_per_s"] / peak, rel=1e-9)


def test_train_step_refuses_a_bad_override_in_one_line(single_process, capsys):
    """A bad config or override ends as a launch ends: its one line and status, no traceback, nothing timed."""
    import train_step

    with pytest.raises(SystemExit) as exit_info:
        train_step.main([DEBUG_TOML, *SMALL_STEP, "--optimizer.lr", "-1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "dispersion_titan: error: optimizer.lr: must be >= 0, got -1.0"
    ]


def test_train_step_pins_the_attention_kernel_it_is_given(single_process):
    """--sdpa-backend reaches the model's attention: cuDNN's kernel does not exist on a CPU."""
    import train_step

    with pytest.raises(RuntimeError, match="No viable backend for scaled_dot_product_attention"):
        train_step.main(
            [DEBUG_TOML, "--steps", "1", "--warmup", "0", "--variants", *SMALL_STEP, "--sdpa-backend", "cudnn"]
        )


def test_profile_step_counts_each_op_once_and_sums_to_the_measured_step(single_process, capsys):
    """On a CPU each op's self time once: the groups take what the ops ran, never more than the measured step
    (one thread), and with idle they sum to it; the top table lists the debug model's linear layers."""
    import profile_step

    ms = profile_step.main(
        [DEBUG_TOML, "--steps", "1", "--warmup", "0", "--dispersion.variant", "angular_spread", "--dispersion.coeff",
         "0.1", *SMALL_STEP]
    )  # fmt: skip
    out = capsys.readouterr().out
    step, idle = ms.pop("step"), ms[profile_step.IDLE]
    assert list(ms) == list(profile_step.ROWS) and sum(ms.values()) == pytest.approx(step)
    assert 0 <= idle < step and ms[profile_step.UNATTRIBUTED] == 0.0  # a CPU's ops are all attributed
    assert all(ms[group] > 0 for group in ("dispersion", "optimizer", "loss", "attention", "matmul")), ms
    assert re.search(r"^\| `aten::(add)?mm` \| matmul \| [\d.]+ \| \d+ \|", out, re.MULTILINE), out
    assert f"profile_step.counted_over_step={1 - idle / step:.3f}" in out


def test_profile_counts_a_device_kernel_once_under_the_op_that_launched_it():
    """A GPU profile lists a kernel twice: as a device event and in its launching op's device time. Counted
    once, by its duration, in the group of its op and the ranges around it; device work no op launched is
    unattributed."""
    sys.path.insert(0, str(REPO / "bench"))
    import profile_step
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(id_, name, start, end, device=DeviceType.CPU, annotation=False):
        return FunctionEvent(id_, name, thread=0, start_us=start, end_us=end, device_type=device, use_device="cuda",
                             is_user_annotation=annotation)  # fmt: skip

    ranged = event(1, "dispersion_titan.dispersion", 0, 100, annotation=True)
    bmm, mm = event(2, "aten::bmm", 10, 20), event(3, "aten::mm", 200, 210)
    bmm.set_cpu_parent(ranged)
    bmm.append_kernel("cutlass_80_gemm", 0, 300)
    mm.append_kernel("sm90_xmma_gemm", 0, 1000)
    cuda = DeviceType.CUDA
    kernels = [event(4, "cutlass_80_gemm", 30, 330, cuda), event(5, "sm90_xmma_gemm", 400, 1400, cuda),
               event(6, "Memcpy HtoD", 1500, 1550, cuda)]  # fmt: skip
    events = [ranged, bmm, mm, *kernels]
    assert mm.self_device_time_total == kernels[1].self_device_time_total == 1000  # the double count
    assert list(profile_step.counted(events, on_device=True)) == [
        ("cutlass_80_gemm", "dispersion", 300e-6), ("sm90_xmma_gemm", "matmul", 1000e-6)
    ]  # fmt: skip
    ms, top = profile_step.table(events, True, step_seconds=2e-3, steps=1)
    assert ms["dispersion"] == pytest.approx(0.3) and ms["matmul"] == pytest.approx(1.0)
    assert ms["unattributed"] == pytest.approx(0.05) and ms["idle"] == pytest.approx(0.65)
    assert top[0] == ("sm90_xmma_gemm", "matmul", 1.0, 1)
    sys.modules.pop("profile_step", None)


def test_memory_estimate_is_above_what_autograd_saves(monkeypatch):
    """bench/h100_model.py's saved activations (which sized the configs' micro-batches) against
    the tensors autograd saves in GPT-2 small's bf16-autocast forward, counted by storage: the
    estimate may be conservative, never short; the bf16 weight copies it adds are exact."""
    import torch

    from dispersion_titan.models.gpt2.model import GPT2

    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import h100_model

    shape = next(c for c in h100_model.SHIPPED if c.name == "gpt2_small_mlp3072")
    args = gpt2_flavors["small"]
    args.vocab_size = shape.vocab
    model = GPT2(args)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {s for p in model.parameters() if p.dim() == 2 for s in (tuple(p.shape), tuple(p.t().shape))}
    weight_shapes |= {(3 * args.dim, args.dim), (args.dim, 3 * args.dim)}  # q, k, v's rows as one GEMM's weight
    activations, weight_copies = {}, {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            (weight_copies if tuple(t.shape) in weight_shapes else activations)[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = 128
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.zeros(1, tokens, dtype=torch.long))
    saved = sum(activations.values()) / tokens
    estimate = shape.layers * h100_model.saved_bytes_per_token(shape) + 2 * shape.vocab  # blocks + bf16 logits
    assert saved <= estimate <= 1.5 * saved, (saved, estimate)
    assert sum(weight_copies.values()) == 2 * h100_model.weights(shape)
    sys.modules.pop("h100_model", None)


PLANT = """\
import sys
if sys.argv and sys.argv[0].endswith("train_step.py"):  # planted failures, in bench/train_step.py only
    from dispersion_titan.losses.dispersion import KernelUnavailable
    from dispersion_titan.trainer.objective import DispersionObjective
    check, call = DispersionObjective.check_kernel, DispersionObjective.__call__

    def check_kernel(self, device):
        if self.cfg.variant == "l2_repel":
            raise KernelUnavailable("planted: the probe disagrees")
        return check(self, device)

    def failing_call(self, *args, **kwargs):
        if self.cfg.variant == "decorrelation":
            raise RuntimeError("planted: the step fails")
        return call(self, *args, **kwargs)

    DispersionObjective.check_kernel, DispersionObjective.__call__ = check_kernel, failing_call
"""


def test_gpu_acceptance_reports_every_figure_past_failing_variants_with_python3(tmp_path, script_python):
    """bench/gpu_acceptance.sh --part 2 on a CPU (ACCEPTANCE_DEVICE=cpu: the debug configs), from a checkout
    without .venv where only ``python3`` is on PATH: one variant's kernel check and another's step fail
    (planted), a step fails outright (the kernel bench wants CUDA); every other figure is still in the one
    table, on stdout and in the file, and the exit status says something failed."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "outputs", "__pycache__", "*.egg-info", "build", ".pytest_cache"))  # fmt: skip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{script_python}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    (tmp_path / "plant").mkdir()
    (tmp_path / "plant" / "sitecustomize.py").write_text(PLANT)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"PATH": f"{bin_dir}:/usr/bin:/bin", "ACCEPTANCE_DEVICE": "cpu", "OUT_DIR": str(out),
            "PYTHONPATH": str(tmp_path / "plant")}  # fmt: skip
    assert not any((Path(d) / "python").exists() for d in env["PATH"].split(":")), "a python on PATH"
    proc = subprocess.run(["bash", repo / "bench" / "gpu_acceptance.sh", "--part", "2"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "gpu_acceptance.md").read_text()
    assert table in proc.stdout
    rows = dict([c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()[2:])
    assert rows["python"] == str(bin_dir / "python3"), rows
    for key in ("ce", "angular_spread", "orthogonalization", "perplexity_entropy"):
        for figure in ("step_ms", "ratio", "tokens_per_s", "mfu", "peak_gib"):
            assert float(rows[f"train_step.gpt2_small.{key}.{figure}"]) > 0, (key, figure)
    assert rows["train_step.gpt2_small.l2_repel.failed"] == rows["train_step.gpt2_small.decorrelation.failed"] == "1"
    assert "l2_repel | failed: KernelUnavailable: planted: the probe disagrees" in proc.stdout
    assert "decorrelation | failed: RuntimeError: planted: the step fails" in proc.stdout
    assert rows["train_step_gpt2.exit"] == "1"
    groups = ("dispersion", "optimizer", "loss", "attention", "matmul", "elementwise", "unattributed", "idle")
    step = float(rows["profile_step.step_ms"])
    assert sum(float(rows[f"profile_step.{g}.ms_per_step"]) for g in groups) == pytest.approx(step, rel=0.01)
    assert rows["profile_gpt2.exit"] == rows["train_step_qwen3_ce.exit"] == "0"
    assert float(rows["train_step.qwen3_0.6b.ce.tokens_per_s"]) > 0
    assert rows["kernel_rate_qwen3_1.7b.exit"] != "0"  # no CUDA here: its row says so, and the table goes on
    assert rows["all steps passed"] == "no"


def test_numerics_compare_the_fast_path_within_the_bf16_yardstick():
    """bench/acceptance_table.py's numerics: the largest per-step loss gap of the fast path against the eager
    one, beside bf16 against fp32 training's; only steps all three logged count."""
    sys.path.insert(0, str(REPO / "bench"))
    import acceptance_table as at

    line = "[rank0]:[titan] - step: {}  loss: {}  grad_norm:  0.9  memory:  0.54GiB(0.68%)  tps: 24,751  mfu: 0.05%"
    fast, eager, fp32 = ({s: v for s, v in enumerate(values, 1)} for values in
                         ((10.0, 9.50, 9.0), (10.0, 9.49, 9.2), (10.01, 9.52, 8.9)))  # fmt: skip
    logs = ["\n".join(line.format(s, v) for s, v in run.items()) for run in (fast, eager, fp32)]
    assert at.step_losses(logs[0]) == fast
    lines, within = at.numerics(*map(at.step_losses, logs))
    assert within and lines == ["numerics.steps=3 numerics.max_gap_fast_vs_eager=0.2 numerics.max_gap_bf16_vs_fp32=0.3 "
                                "numerics.within_yardstick=yes"]  # fmt: skip
    lines, within = at.numerics({1: 10.0, 2: 9.0}, {1: 10.0, 2: 9.5}, {1: 10.0, 2: 9.4})
    assert not within and "numerics.within_yardstick=no" in lines[0]
    assert at.numerics({1: 1.0}, {2: 1.0}, {1: 1.0}) == (["numerics.steps=0"], False)
    sys.modules.pop("acceptance_table", None)


def test_gpu_acceptance_quick_stops_each_part_at_its_limit_and_still_writes_the_table(tmp_path):
    """--quick runs parts 1 and 2 each under PART_LIMIT_S: a part that overruns is ended with the step it
    runs (its process group), marked in the table, and the next part starts."""
    env = {**os.environ, "PYTHON": sys.executable, "ACCEPTANCE_DEVICE": "cpu", "OUT_DIR": str(tmp_path),
           "PART_LIMIT_S": "3"}  # fmt: skip
    proc = subprocess.run(["bash", REPO / "bench" / "gpu_acceptance.sh", "--quick"], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    table = (tmp_path / "gpu_acceptance.md").read_text()
    assert "| part1.timed_out | 1 |" in table and "| part2.timed_out | 1 |" in table, table
    assert table in proc.stdout and table.count("| device |") == 1
    marker = f"OUT_DIR={tmp_path}".encode()
    left = []  # nothing of the run left running (the steps inherit its OUT_DIR)
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if marker in environ.read_bytes().split(b"\0"):
                left.append(environ.parent.name)
    assert not left, left


def test_gpu_levers_writes_freeze_logs_and_one_table_under_out_and_stops_at_its_limit(tmp_path, script_python):
    """bench/gpu_levers.sh on a CPU (LEVERS_DEVICE=cpu: tiny shapes): the node's pip freeze, the install log, one
    log, the results and the table, all in OUT and no more files than the device tool brings back; the autocast
    baseline against the whole-model compile of the bf16-parameter path, the q/k/v and SDPA-pin checks. Run
    again with its time spent, every step is marked skipped and the table still written."""
    env = {**os.environ, "PYTHON": str(script_python), "LEVERS_DEVICE": "cpu", "OUT": str(tmp_path / "out"),
           "ONLY": "baseline,whole_model,qkv,sdpa_pin",  # the node's python3 is this venv's, as on the device
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    proc = subprocess.run(["bash", REPO / "bench" / "gpu_levers.sh"], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["caches.tar.gz", "freeze.txt", "install.log", "levers.log", "levers.md", "results.txt"], files
    assert "torch==" in (tmp_path / "out" / "freeze.txt").read_text()
    table = (tmp_path / "out" / "levers.md").read_text()
    assert table in proc.stdout
    rows = dict([c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()[2:])
    for name in ("baseline", "whole_model"):
        assert float(rows[f"train_step.{name}.ce.step_ms"]) > 0 and rows[f"{name}.exit"] == "0", name
    log = (tmp_path / "out" / "levers.log").read_text()
    assert "mixed_precision=bfloat16 (autocast)" in log and "(parameters)" in log and "whole_model=True" in log
    assert float(rows["qkv.one_gemm_ms"]) > 0 and float(rows["sdpa.math.dq_err"]) < 0.05
    assert "liger.exit" not in rows and rows["all steps passed"] == "yes"

    env |= {"OUT": str(tmp_path / "late"), "LEVERS_LIMIT_S": "10", "ONLY": ""}
    proc = subprocess.run(["bash", REPO / "bench" / "gpu_levers.sh"], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    rows = (tmp_path / "late" / "levers.md").read_text()
    steps = re.findall(r"^run_step (\w+)", (REPO / "bench" / "gpu_levers.sh").read_text(), re.M)
    assert len(steps) > 10 and all(f"| {s}.skipped | time |" in rows for s in steps), rows
    assert proc.returncode == 0 and rows.count("| time |") == len(steps), rows
