"""``dispersion-titan plan``: every shipped config laid out (or refused in one line) at 1, 8 and 64
GPUs and 8 × TP 2; the memory of the configs that bound all others measured at their largest
share (one GPU) and under an 80 GB GPU; the memory model against a real CPU step at 1 and 2
gloo ranks; the dry-run step of a representative set at the largest world they claim; the
sweep's totals; the roofline that calibrates the step time against its measured GPU figure.

Cost: the plans measure under ``FakeTensorMode`` (a few seconds a model, at 2 and 3 blocks
where deeper: memory and time are linear in depth); measurements are shared within the module
(``planning.resource_plan``'s cache)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import math
import os
import re
import signal
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import transformers
from torch import nn
from torchtitan.models.llama3.infra.parallelize import apply_ddp

from dispersion_titan.components.titan_compat import QuickInit, optimizer_step
from dispersion_titan.config.cli import load_toml
from dispersion_titan.job_config.parse import (
    _tyro_message,
    check,
    model_args,
    parse_job_config,
    setup_torchtitan,
    validated_args,
)
from dispersion_titan.losses.dispersion import MAX_BLOCK_BYTES
from dispersion_titan.losses.variants import VARIANTS
from dispersion_titan.models import family
from dispersion_titan.plan import main as plan_main
from dispersion_titan.plan import plan_args
from dispersion_titan.planning import resource_plan
from dispersion_titan.planning.dry_run import dry_run_step
from dispersion_titan.planning.fake_world import rank_zero_trainer
from dispersion_titan.planning.figures import GPT2_SHIPPED, GPUS, MEASURED_STEPS, TERM_STEP, term_seconds
from dispersion_titan.planning.resource_plan import (
    MOMENT_BYTES_PER_PARAM,
    checkpoint_disk,
    nodes_of,
    resolve_layout,
    step_time,
)
from dispersion_titan.planning.step_measure import measure_at
from dispersion_titan.run_folder.checkpoints import complete_checkpoints, is_full
from dispersion_titan.run_folder.writer_lock import LOCK_NAME
from dispersion_titan.utils.errors import ArgumentError, ConfigError
from support.cli import assert_one_line_error, run_cli
from support.launch import DEBUG_TOML, QWEN3_TOML, REPO, python_module, torchrun_script

CONFIGS = sorted((REPO / "train_configs").rglob("*.toml"))
SIZES = ((1, None), (8, None), (64, None), (8, 2))
GB = 1e9


def gpus_claimed(job) -> float:
    """The largest data-parallel world a shipped config claims: its global batch, one sequence
    per GPU (1 to 64 for the GPU configs); a paper config's batch grows with the GPUs ([released])."""
    return math.inf if job.released.per_device_train_batch_size else job.training.global_batch_size


@pytest.fixture(scope="module")
def parsed() -> dict[Path, object]:
    """Each shipped config parsed once, as a launch parses it; layouts are checked on copies."""
    setup_torchtitan()
    return {c: parse_job_config(plan_args(str(c)), load_toml(plan_args(str(c)))) for c in CONFIGS}


def test_every_config_lays_out_or_refuses_in_one_line(parsed):
    assert len(CONFIGS) == 33
    for config, job in parsed.items():
        for gpus, tp in SIZES:
            c = copy.deepcopy(job)
            c.parallelism.tensor_parallel_degree = tp or c.parallelism.tensor_parallel_degree
            if tp and c.parallelism.data_parallel_replicate_degree == -1:  # DDP beside TP is refused (checks)
                with pytest.raises(ConfigError, match="^parallelism.data_parallel_replicate_degree: replicated"):
                    check(copy.deepcopy(c), gpus)
                c.parallelism.data_parallel_replicate_degree, c.parallelism.data_parallel_shard_degree = 1, -1
                if c.released.per_device_train_batch_size:  # the authors' script has DDP only ([released])
                    with pytest.raises(ConfigError, match="^parallelism: the authors' script replicates"):
                        check(c, gpus)
                    continue
            dp = gpus // c.parallelism.tensor_parallel_degree
            try:
                check(c, gpus)
            except ConfigError as e:
                assert "\n" not in str(e) and dp > gpus_claimed(job), (config.name, gpus, tp, str(e))
                assert str(e).startswith(("training.global_batch_size:", "validation.global_batch_size:")), str(e)
                continue
            layout = resolve_layout(c, gpus, nodes_of(gpus, None, GPUS["h100"]))
            t = c.training
            assert layout.micro_batch * layout.accumulation * layout.dp == t.global_batch_size, (config.name, gpus)
            assert layout.micro_batch <= (t.max_local_batch_size or t.global_batch_size), (config.name, gpus)
            assert (layout.dp * layout.tp, layout.tokens_per_step) == (gpus, t.global_batch_size * t.seq_len)
            assert layout.nodes == math.ceil(gpus / 8) and layout.n_layers == model_args(c).n_layers


def test_impossible_layouts_are_refused_before_anything_is_built(capsys, tmp_path, monkeypatch):
    config = str(REPO / "train_configs" / "gpt2_small_mlp3072.toml")
    monkeypatch.chdir(tmp_path)  # no train_configs/ here
    for args, message in (
        (
            ("train_configs/debug.toml",),
            f"CONFIG: train_configs/debug.toml: no such file here ({tmp_path}); dispersion-titan init "
            "DIR writes the shipped configs, then run in DIR",
        ),
        (
            (config, "--gpus", "64", "--tp", "8"),
            "model.n_heads: 12 is not divisible by parallelism.tensor_parallel_degree=8; use one of [1, 2, 4] on 64 "
            "processes",
        ),
        (  # was the bare refusal, no degree that works
            (config, "--tp", "3"),
            "model.max_seq_len: 1024 is not divisible by parallelism.tensor_parallel_degree=3; use one of [1] on 1 "
            "process (the model alone: [1, 2, 4])",
        ),
        (
            (config, "--gpus", "64", "--nodes", "3"),
            "--nodes: 64 GPUs do not split evenly over 3 nodes; use one of [1, 2, 4, 8, 16, 32, 64]",
        ),
        (
            (config, "--nodes", "2"),
            "--nodes: 1 GPU does not split evenly over 2 nodes; use one of [1]",
        ),  # was 1 GPUs do
        ((config, "--gpus", "0"), "argument --gpus: '0' is not a positive integer"),  # was "plan: error: ..."
        ((config, "--gpus", "128"), "training.global_batch_size: 64 sequences cannot be split over 128 data-parall"),
        (
            ("--training.steps", "100", config),
            "CONFIG: '100' was read as the config file, as --training.steps comes before it; give the config first: "
            "plan CONFIG --training.steps 100 ...",
        ),  # an override before the config: once "--job.config_file: 100: no such file"
        ((config, "--dispersion.coef", "1"), "--dispersion.coef: unknown option; did you mean --dispersion.coeff?"),
        (
            (config, "--training.local_batch_size", "1000000000", "--training.global_batch_size", "1000000000"),
            "training.local_batch_size: 1,000,000,000 sequences of 1,024 tokens per GPU: one block's output alone "
            "(1,572,864 GB in bf16) exceeds the memory of an H100 SXM 80GB; lower it",
        ),  # was: the measurement drew a micro-batch of 10^9 sequences from the data, growing until killed
        (
            (QWEN3_TOML, "--training.seq_len", "1000000000", "--training.local_batch_size", "1"),
            "training.seq_len: 1 sequence of 1,000,000,000 tokens per GPU: one block's output alone (512 GB in "
            "bf16) exceeds the memory of an H100 SXM 80GB; lower it",
        ),  # was: "training.local_batch_size: …; lower it (or training.global_batch_size)", already 1
    ):  # the last but one: tyro's "Unrecognized options: --dispersion.coef, 1"
        with pytest.raises(SystemExit) as done:
            plan_main(list(args))
        out, err = capsys.readouterr()
        assert_one_line_error(done.value.code, err, message)
        assert out == "", out


def test_ctrl_c_while_plan_measures_the_step_is_the_interrupted_line(tmp_path):
    """The step is measured by the trainer, whose handlers only flag a signal for a training loop plan never runs:
    Ctrl-C while it measured printed the plan, exit 0. Sent once the trainer is built (its temporary run folder,
    in TMPDIR, holds ``run.json``): the command's one line, exit 130, the temporary folder gone."""
    env = {"TMPDIR": str(tmp_path)}
    plan = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.plan", DEBUG_TOML, env=env)
    while not any(tmp_path.glob("plan_*/run.json")) and not plan.done():
        time.sleep(0.005)
    assert not plan.done(), plan.result().stderr[-3000:]
    (lock,) = tmp_path.glob(f"plan_*/{LOCK_NAME}")
    os.kill(json.loads(lock.read_text())["pid"], signal.SIGINT)
    done = plan.result()
    assert (done.returncode, done.stdout) == (130, ""), done.stderr[-3000:]
    assert done.stderr == "dispersion_titan: interrupted; nothing was written\n"
    assert not any(tmp_path.glob("plan_*"))


def test_an_unknown_option_like_no_key_says_where_the_keys_are():
    """tyro's line for a flag close to no key (the one above has a close key: a tyro parse each, 0.27 s)."""
    setup_torchtitan()
    assert _tyro_message("Unrecognized options: --foo.bar, 1", []) == (
        "--foo.bar: unknown option; dispersion-titan train --help-all lists every key"
    )


def test_a_config_from_a_pipe_is_refused_in_one_line(capsys, tmp_path):
    """``plan <(cat CONFIG)``: the config is read more than once, a pipe gives its text to the first read only
    (was ``model.name: no model named (/dev/fd/63)``, a TOML that names one); a named pipe likewise, not opened."""
    read, write = os.pipe()
    os.write(write, (REPO / "train_configs" / "debug.toml").read_bytes())
    os.close(write)
    try:
        with pytest.raises(SystemExit) as done:
            plan_main([f"/dev/fd/{read}"])
    finally:
        os.close(read)
    out, err = capsys.readouterr()
    said = f"CONFIG: /dev/fd/{read} is no file but a pipe or device, read once; save it to a file"
    assert (done.value.code, out, err) == (2, "", f"dispersion_titan: error: {said}\n")
    fifo = tmp_path / "config.toml"  # a named pipe no one writes to: refused before it is opened (was a hang)
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as done:
        plan_main([str(fifo)])
    said = f"CONFIG: {fifo} is no file but a pipe or device, read once; save it to a file"
    assert (done.value.code, capsys.readouterr().err) == (2, f"dispersion_titan: error: {said}\n")


STRIP_MARGIN = 4 * MAX_BLOCK_BYTES
"""What one dispersion variant may need beyond another: every variant runs through the same
strips (``losses.dispersion.TorchStrips``), saving only its input, with temporaries of at most
``MAX_BLOCK_BYTES`` each; the bounding plans keep this much room."""


def _dominates(big, small) -> bool:
    """Whether ``small``'s step needs at most ``big``'s memory on one GPU (within ``STRIP_MARGIN``):
    the same family and precision, every size at most ``big``'s, its dispersion term (if any) on
    as many blocks and at most as many tokens, no more dropout, no less activation checkpointing."""
    a, b = copy.copy(model_args(big)), copy.copy(model_args(small))  # a flavor's instance is shared
    sizes = ("dim", "n_layers", "n_heads", "hidden_dim", "vocab_size")
    same = (
        big.model.name == small.model.name
        and big.training.mixed_precision_param == small.training.mixed_precision_param
        and big.activation_checkpoint.mode in ("none", small.activation_checkpoint.mode)
    )
    dropout = all(getattr(b, k, 0) <= getattr(a, k, 0) for k in ("attn_dropout", "resid_dropout", "embd_dropout"))
    bt, st = big.training, small.training
    batch = (st.max_local_batch_size or st.global_batch_size) <= (bt.max_local_batch_size or bt.global_batch_size)
    d, e = big.dispersion, small.dispersion
    term = e.variant == "none" or (
        d.variant != "none"
        and e.layers == d.layers  # either points: n of [B, N, d]
        and (d.max_tokens == 0 or 0 < e.max_tokens <= d.max_tokens)
    )
    return (
        same
        and dropout
        and batch
        and term
        and st.seq_len <= bt.seq_len
        and all(getattr(b, k) <= getattr(a, k) for k in sizes)
    )


BOUNDS = {
    "GPT-2 small": (
        "gpt2_small_mlp6144_angular_spread.toml",  # the widest MLP, with the paper's dropout
        ("--model.attn_dropout", "0.1", "--model.resid_dropout", "0.1", "--model.embd_dropout", "0.1"),
    ),
    "GPT2-medium": ("paper/midtrain_gpt2-medium_wikitext103_dispersion.toml", ()),
    "Qwen3": ("paper/midtrain_qwen3_1.7b_angular_spread.toml", ()),
    "debug GPT-2": ("debug_angular_spread.toml", ()),
    "debug Qwen3": ("debug_qwen3_angular_spread.toml", ()),
}
"""Steps that bound every shipped config's, each a shipped config (with the largest dropout any
of its family has)."""


@pytest.fixture(scope="module")
def bounds(parsed) -> dict[str, tuple[object, object]]:
    """Each bound's job config and its plan on one GPU: the largest share of any layout (the
    largest micro-batch, nothing sharded)."""
    out = {}
    for name, (config, overrides) in BOUNDS.items():
        args = plan_args(str(REPO / "train_configs" / config), None, overrides)
        out[name] = (validated_args(args, 1), resource_plan.planned(name, args, 1, None, "h100"))
    return out


def test_every_shipped_config_fits_an_80_gb_gpu_at_every_size_it_claims(parsed, bounds):
    """One GPU holds the largest share of every layout (a micro-batch at least as large, every
    state unsharded), and every shipped config's step is bounded by one of ``BOUNDS``: their
    measured peaks under 80 GB, with room to spare, bound them all."""
    for name, (_, plan) in bounds.items():
        assert plan.step.peak + STRIP_MARGIN < 0.9 * 80 * GB, (name, plan.step.peak / GB)
        assert plan.memory_share == pytest.approx(plan.step.peak / (80 * GB)) and plan.layout.gpus == 1
    for c in CONFIGS:
        assert any(_dominates(job, parsed[c]) for job, _ in bounds.values()), c.name
    qwen = bounds["Qwen3"][1]
    assert qwen.layout.micro_batch == 1 and qwen.layout.accumulation == 32
    assert 1.7e9 < qwen.step.params_total < 2.1e9 and qwen.step.params_local == qwen.step.params_total


def test_the_sweeps_floor_of_a_step_is_below_its_plan(bounds):
    """What ``sweep`` refuses a cell by at submission (``reproduce.sweep.refuse_beyond_memory``) is a floor of its
    plan: the parameters counted from the shape alone, and their fp32 weights and Adam moments, are at most the
    measured step's (GPT-2 and Qwen3 blocks, tied and untied heads)."""
    for name, (job, plan) in bounds.items():
        least = model_args(job).least_parameters()
        assert 0.5 * plan.step.params_total < least <= plan.step.params_total, name
        assert least * (4 + MOMENT_BYTES_PER_PARAM) <= plan.step.peak, name


def test_a_micro_batch_that_does_not_fit_is_refused_in_one_line():
    plan = resource_plan.planned(
        "big",
        plan_args(
            str(REPO / "train_configs" / "gpt2_small_mlp3072.toml"),
            None,
            ("--training.max_local_batch_size", "512", "--training.global_batch_size", "512"),
        ),
        1,
        None,
        "a100",
    )
    assert plan.layout.micro_batch == 512 and plan.memory_share > 1
    with pytest.raises(
        ConfigError,
        match=r"^training\.max_local_batch_size: big's micro-batch of 512 sequences "
        r"needs [\d.]+ GB per GPU at its peak, more than the A100 SXM 80GB's 80 GB",
    ):
        resource_plan.refuse_if_too_big(plan)


def test_a_model_too_large_for_the_gpu_at_any_micro_batch_is_named_not_the_micro_batch(capsys):
    """``plan CONFIG --model.mlp_hidden_dim 400000000`` (206 B parameters) and ``sweep --plan`` of that width: one line
    naming the model's weights, gradients and optimizer state and what to do, exit 2 (was
    `training.max_local_batch_size: … micro-batch of 4 sequences needs 10777.7 GB …; lower it`, which no micro-batch
    fixes)."""
    from dispersion_titan.sweep import main as sweep_main

    params = "206,403,300,800 parameters (MLP width 400,000,000, dim 64, 4 blocks) need "
    said = (
        "GB per GPU for their weights, gradients and optimizer state alone (on one GPU), more than the H200 SXM "
        "141GB's 141 GB at any micro-batch; shard them over more GPUs (FSDP) or use larger ones, or give a smaller "
        "MLP width (model.mlp_hidden_dim, a sweep's widths) or model"
    )
    code, _, err = run_cli(plan_main, DEBUG_TOML, "--model.mlp_hidden_dim", "400000000", "--gpu", "h200", capsys=capsys)
    assert_one_line_error(code, err, f"error: model: {DEBUG_TOML}'s {params}", said)
    grid = (str(REPO / "launch" / "sweep_example.toml"), "--widths", "400000000", "--variants", "baseline")
    code, _, err = run_cli(sweep_main, *grid, "--seeds", "0", "--gpus-per-node", "1", "--plan", "h200", capsys=capsys)
    assert_one_line_error(code, err, f"error: model: w400000000-baseline-s0's {params}", said)


def test_checkpoint_disk_is_counted_from_the_config():
    """gpt2_small_mlp3072: steps 0, 500, ..., 4500 full (weights and AdamW's two moments, fp32),
    5000 weights only: the ~17 GB its comment states."""
    args = plan_args(str(REPO / "train_configs" / "gpt2_small_mlp3072.toml"))
    job = validated_args(args, 64)
    params = 124_475_904  # GPT-2 small with MLP 3072 and 50,304 rows, the tie counted once
    saved = params + 50_304 * 768  # its state dict, as DCP saves it: the tied embedding also as the head
    disk = checkpoint_disk(job, params, saved)
    assert (disk.full, disk.model_only) == (10, 1)
    assert disk.bytes == 11 * 4 * saved + 10 * MOMENT_BYTES_PER_PARAM * params and 16e9 < disk.bytes < 18e9


SMALL_DECODER = ("--model.dim", "32", "--model.n_layers", "2", "--model.n_heads", "2", "--model.n_kv_heads", "1")


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        (DEBUG_TOML, ()),
        (DEBUG_TOML, ("--checkpoint.no-save_initial",)),
        (QWEN3_TOML, SMALL_DECODER),  # a tied head, as gpt2's
        (QWEN3_TOML, ("--model.name", "llama3_dispersion", *SMALL_DECODER)),  # an untied head
    ],
    ids=["gpt2", "gpt2-no-initial", "qwen3", "llama3"],
)
def test_a_run_of_0_steps_is_planned_with_the_checkpoints_it_saves(tmp_path, config, overrides):
    """``--training.steps 0``: the plan counts what train saves, a full step 0 or nothing (was
    '0 full + 1 weights-only', a final save that never happens), and its size within 5% of the files
    (was 26% under them: the tied embedding, which DCP saves again as the head, counted once); Qwen3
    (tied) and Llama 3 (untied) alike."""
    args = ("--training.steps", "0", *overrides)
    dump = ["--job.config_file", config, "--job.dump_folder", str(tmp_path)]
    proc = python_module("dispersion_titan.train", *dump, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    saved = [is_full(c.path) for c in complete_checkpoints(str(tmp_path / "checkpoint"))]
    disk = resource_plan.planned("debug", plan_args(config, None, args), 1, None, "h100").disk
    assert (disk.full, disk.model_only) == (saved.count(True), saved.count(False))
    files = sum(f.stat().st_size for f in (tmp_path / "checkpoint").rglob("*") if f.is_file())
    assert abs(disk.bytes - files) <= 0.05 * files, (disk.bytes, files)


def test_a_run_of_very_many_steps_is_planned_without_listing_its_saves():
    """``plan debug.toml --training.steps 10000000000000``: the checkpoints counted, not listed (was
    a set of every save step, the plan killed out of memory, exit 137, after a minute)."""
    keep_all = ("--checkpoint.keep_latest_k", "0", "--checkpoint.save_initial", "--checkpoint.interval", "1")
    many = validated_args(plan_args(DEBUG_TOML, None, ("--training.steps", "1000000", *keep_all)), 1)
    tracemalloc.start()
    disk = checkpoint_disk(many, 1.0, 1.0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100_000, peak
    assert (disk.full, disk.model_only) == (1_000_000, 1)  # step 0, 1 … 999,999 full; the last weights-only
    huge = validated_args(plan_args(DEBUG_TOML, None, ("--training.steps", str(10**13))), 1)
    assert checkpoint_disk(huge, 1.0, 1.0).full + checkpoint_disk(huge, 1.0, 1.0).model_only == 10**13 // 5 + 1


def test_one_ranks_parameters_are_printed_as_all_of_them():
    """``plan debug.toml`` on 1 GPU: ``3.43 M of 3.43 M`` (was ``3.43 M of 3.4 M``, the rank's share
    printed as more than the whole)."""
    table = resource_plan.plan_table(resource_plan.planned("debug", plan_args(DEBUG_TOML, None, ()), 1, None, "h100"))
    row = next(line for line in table.splitlines() if "parameters per rank" in line)
    share, whole = re.fullmatch(r"\| parameters per rank \| (\S+) M of (\S+) M \|", row).groups()
    assert share == whole, row
    layout = next(line for line in table.splitlines() if line.startswith("| layout |"))
    assert " on 1 GPU (1 node)" in layout, layout  # was "on 1 GPUs"


def test_gpu_hours_price_validation_or_say_they_leave_it_out():
    """debug.toml validates at steps 1, 5 and 10, each 2 batches of 8 sequences: 12 forwards of its micro-batch of 4,
    a third of a forward and backward each, so 4 micro-batches' roofline; with ``validation.steps -1`` (the whole
    held-out split, which a plan does not read) the plan says it leaves validation out (was: left out silently)."""
    plans = {
        steps: resource_plan.planned(
            "debug", plan_args(DEBUG_TOML, None, ("--validation.steps", steps)), 1, None, "h100"
        )
        for steps in ("2", "-1")
    }
    priced, unpriced = plans["2"], plans["-1"]
    assert priced.validation.runs == unpriced.validation.runs == 3
    v = priced.validation.seconds
    assert v == pytest.approx(4 * priced.step.micro_batch_s * priced.time.calibration.factor, rel=1e-9)
    assert priced.gpu_hours == pytest.approx(unpriced.gpu_hours + v / 3600, rel=1e-9)
    row = {k: next(r for r in resource_plan.plan_table(p).splitlines() if "GPU-hours" in r) for k, p in plans.items()}
    assert f"; validation included: 3 validations, {v / 3600:,.3g} h a GPU (a validation batch priced" in row["2"]
    assert "; validation not included (3 validations of the whole held-out split" in row["-1"]
    assert "GPU-hours of debug: validation not included" in resource_plan.runs_table([unpriced, priced])
    assert "GPU-hours of every run: validation not included" in resource_plan.runs_table([unpriced, unpriced])


def test_a_dispersion_term_is_priced_at_its_kernels_measured_rate():
    """GPT-2 small as shipped with angular_spread (λ 0.1, every block) on an H200, as
    bench/train_step.py measured it (147.4 ms, docs/benchmarks.md): the plan's step within 10%,
    its term 4·rows·N²·d at the rate the kernels reached (rows: 32 sequences × 12 blocks a
    micro-batch), not the torch path's roofline (1.8-2.1× the measured step)."""
    overrides = ("--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.1")
    config = str(REPO / "train_configs" / "gpt2_small_mlp3072.toml")
    plan = resource_plan.planned("term", plan_args(config, None, overrides), 1, None, "h200")
    assert plan.layout.accumulation == 2
    assert plan.step.term_s == pytest.approx(term_seconds("angular_spread", 32 * 12, 1024, 768, 989e12), rel=1e-6)
    assert plan.time.compute_s == pytest.approx(147.4e-3, rel=0.10)


def test_every_variant_has_its_measured_term_rate():
    """A variant added as docs/extending.md says needs its measured step in figures.TERM_STEPS_H200: without
    it, plan on a config of that variant ended in a KeyError traceback; here it fails in the suite."""
    for variant in VARIANTS:
        assert term_seconds(variant, *TERM_STEP, GPUS["h200"].bf16_flops) > 0, variant


DEBUG_ACCUMULATING = ("--training.max_local_batch_size", "2")


@pytest.mark.parametrize("ranks", [1, 2])
def test_memory_plan_holds_a_real_cpu_step_within_10_percent(ranks):
    """The plan under FakeTensorMode against the real step (TorchTitan's train_step, gloo, real
    tensors) counted by the same PyTorch tracker, accumulation included (4 micro-batches on 1
    rank, 2 on 2)."""
    config = str(REPO / "train_configs" / "debug_angular_spread.toml")
    plan = resource_plan.planned("debug", plan_args(config, None, DEBUG_ACCUMULATING), ranks, None, "h100")
    assert plan.layout.accumulation == 4 // ranks
    proc = torchrun_script("step_memory.py", ranks, "--job.config_file", config, *DEBUG_ACCUMULATING)
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = float(re.search(r"^PEAK (\d+)", proc.stdout, re.M).group(1))
    assert abs(plan.step.peak - real) <= 0.10 * real, (plan.step.peak, real)


def test_depth_extrapolation_is_the_measured_step():
    """Memory and time are linear in depth: the step measured at 2 and 3 blocks and taken to 6
    is the step measured at 6."""
    args = plan_args(str(REPO / "train_configs" / "debug_angular_spread.toml"), None, ("--model.n_layers", "6"))
    planned = resource_plan.planned("debug6", args, 1, None, "h100")
    assert planned.step.depth_note.startswith("measured at 2 and 3 blocks")
    measured = measure_at(validated_args(args, 1), 1, GPUS["h100"], 6)
    assert planned.step.params_local == measured.params_local
    for key, value in measured.memory.items():
        assert planned.step.memory[key] == pytest.approx(value, rel=0.01, abs=2e4), key
    assert planned.step.micro_batch_s == pytest.approx(measured.micro_batch_s, rel=5e-3)


DRY_RUNS = [
    ("gpt2_small_mlp3072_angular_spread.toml", 64, None, (), "mesh: fsdp 64 of 64 ranks"),
    ("gpt2_small_mlp3072_angular_spread.toml", 8, 4, (), "mesh: fsdp 2 × tp 4 of 8 ranks"),
    (  # DDP; GPT-2's vocabulary and a width of 256 (2 heads): Qwen's 151,936 rows of 1,024 cost seconds of CPU a
        # dry run and no check reads them
        "paper/midtrain_qwen3_0.6b_angular_spread.toml",
        8,
        None,
        ("--model.vocab_size", "50304", "--model.dim", "256", "--model.n_heads", "2", "--model.n_kv_heads", "1"),
        "mesh: dp_replicate 8 of 8 ranks",
    ),
    # with the user's own --profile cpu, which the dry run's must not repeat
    (
        "debug_angular_spread.toml",
        64,
        2,
        ("--training.global_batch_size", "32", "--profile", "cpu"),
        "mesh: fsdp 32 × tp 2 of 64 ranks",
    ),
    (  # DDP's all-reduce in the one micro-batch (was: its hook read the fake future's value, a traceback)
        "debug_angular_spread.toml",
        2,
        None,
        ("--parallelism.data_parallel_replicate_degree", "2", "--parallelism.data_parallel_shard_degree", "1")
        + ("--training.global_batch_size", "-1", "--training.local_batch_size", "4"),
        "mesh: dp_replicate 2 of 2 ranks",
    ),
]


@pytest.mark.parametrize(
    "config, gpus, tp, overrides, mesh", DRY_RUNS, ids=[f"{c}-{g}-tp{t}" for c, g, t, *_ in DRY_RUNS]
)
def test_dry_run_step_at_the_largest_world_claimed(config, gpus, tp, overrides, mesh):
    """The real trainer as rank 0 of the world (fake collectives), 2 blocks and 128 tokens (the
    mesh, the parallelize plan and the accounting do not depend on depth or length): its checks
    pass and say what they found."""
    args = plan_args(str(REPO / "train_configs" / config), tp, overrides)
    full = resolve_layout(validated_args(args, gpus), gpus, nodes_of(gpus, None, GPUS["h100"]))
    lines = dry_run_step(args, full)
    text = "\n".join(lines)
    assert lines[0].startswith(f"dry-run step: rank 0 of {gpus} (fake_backend), --profile cpu, 2 of ")
    assert lines[1].startswith(mesh) and ": as planned" in lines[1], text
    assert (
        "replicated by DDP" if "dp_replicate" in mesh else "each holding rank 0's shard of its placements"
    ) in lines[2], text
    assert ("sharded over tp" in lines[2]) == bool(tp), text
    assert re.search(r": the sum over ranks is the global-batch mean$", lines[3]), text
    if not tp:  # the term checked against rank 0's own mean on random hidden states
        assert re.search(r"its term is \d+/\d+ × its own mean", lines[3]), text
    assert lines[4].startswith("step: one micro-batch's forward and backward (angular_spread)"), text


def test_a_plan_with_fsdp_and_tp_says_only_the_plan():
    """``plan CONFIG --gpus 4 --tp 2`` (FSDP × TP): the plan, nothing on stderr (was DTensor's
    `[rank0]:W… While redistributing from (_NormPartial(2.0), _NormPartial(2.0)) … flatten mesh dimensions
    ["fsdp", "tp"] …` before it, PyTorch's advice to itself)."""
    proc = python_module("dispersion_titan.plan", DEBUG_TOML, "--gpus", "4", "--tp", "2", timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith(f"plan: {DEBUG_TOML}\n"), proc.stderr
    assert proc.stderr == "" and "redistributing" not in proc.stdout, proc.stderr


def test_a_planned_step_of_global_batch_size_minus_1_trains_on_the_mean_ce():
    """``optimizer_step`` (plan's measurement, the dry run) divides the CE sum by the global batch's tokens
    with ``training.global_batch_size = -1`` resolved as TorchTitan does (local batch × DP ranks): the CE it
    backpropagates is the batch's mean (was the sum over -1 × seq_len tokens: a negated loss)."""
    overrides = ("--training.global_batch_size", "-1", "--training.local_batch_size", "2")
    with rank_zero_trainer(validated_args(plan_args(DEBUG_TOML, None, overrides), 1), 1) as trainer:
        inputs, labels = next(trainer.batch_generator(trainer.dataloader))
        (model,) = trainer.model_parts
        with torch.no_grad():
            mean = nn.functional.cross_entropy(model(inputs["input"]).flatten(0, 1), labels.flatten())
        optimizer_step(trainer, [(inputs, labels)])
        assert trainer.step_metrics.ce.item() == pytest.approx(mean.item(), rel=1e-5)


def test_a_dry_runs_init_keeps_the_scale_and_never_resamples():
    """The dry run's weights (``QuickInit``): ``normal_`` drawn uniform with its mean and std,
    so a ``trunc_normal_`` at ±3 std (TorchTitan's LM head) keeps every first draw."""
    std, weights = 0.03, torch.empty(4096, 64)
    with QuickInit():
        nn.init.trunc_normal_(weights, mean=0.0, std=std, a=-3 * std, b=3 * std)
    assert weights.abs().max().item() <= 3**0.5 * std
    assert weights.std().item() == pytest.approx(std, rel=0.02) and abs(weights.mean().item()) < std / 100


def test_sweep_plan_sums_the_sweep(capsys):
    from dispersion_titan.sweep import main

    main(  # on one GPU: no floor of one GPU's step to measure beside each cell's
        [
            str(REPO / "launch" / "sweep_example.toml"),
            "--widths",
            "256",
            "--variants",
            "baseline,angular_spread:0.1",
            "--gpus-per-node",
            "1",
            "--plan",
        ]
    )
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| w256-")]
    assert [r[0] for r in rows] == [
        "| w256-baseline-s0",
        "| w256-baseline-s1",
        "| w256-angular_spread-c0.1-s0",
        "| w256-angular_spread-c0.1-s1",
    ]
    assert rows[0][1:] == rows[1][1:] and rows[2][1:] == rows[3][1:]  # seeds: the same step
    total = next(line for line in out.splitlines() if line.startswith("| **total (4 runs)**")).split(" | ")
    hours, disk = (float(x.strip("* |")) for x in total[-2:])
    assert hours == pytest.approx(sum(float(r[-2]) for r in rows), rel=0.01)
    assert disk == pytest.approx(sum(float(r[-1].strip(" |")) for r in rows), abs=0.006 * len(rows))  # rounded


def test_paper_plans_only_the_artifacts_that_train(capsys):
    from dispersion_titan.paper import main as paper_main
    from dispersion_titan.paper import run_paper

    with pytest.raises(ArgumentError, match="^--plan: fig2 analyses released models and trains nothing"):
        run_paper(["fig2", "--plan"])
    assert_one_line_error(  # the GPUs the user chose, not a key of a config paper takes as it is
        *run_cli(paper_main, "fig3", "--plan", "--plan-gpus", "3", capsys=capsys)[::2],
        "error: --plan-gpus: fig3_gpt2_small_",
        " cannot be laid out on 3 GPUs (",
        "sequences cannot be split over 3 data-parallel ranks); give a --plan-gpus that fits it",
    )


def test_paper_fig3_plans_the_preset_it_trains():
    """``paper fig3 --slurm --plan`` plans the runs ``--slurm`` trains: the paper preset by default."""
    from dispersion_titan.reproduce.paper.workflow import training_runs

    runs = training_runs("fig3", "paper")
    assert len(runs) == 8 and {c for _, c, _ in runs} == {
        "train_configs/paper/fig3_gpt2_small.toml",
        "train_configs/paper/fig3_gpt2_small_angular_spread.toml",
    }
    assert (
        "fig3_gpt2_small_mlp4096_angular_spread",
        "train_configs/paper/fig3_gpt2_small_angular_spread.toml",
        ("--model.mlp_hidden_dim", "4096"),
    ) in runs
    assert {c for _, c, _ in training_runs("fig3", "ours")} >= {"train_configs/gpt2_small_mlp768.toml"}
    # The models of the authors' figure (assets/controlled_experiment.png: "69 M" ... "143 M params"), as ours
    # and as transformers' GPT-2 with that n_inner count them: the same model, to the parameter (their
    # pretrain_toy_gpt2.py sets vocab_size = len(tokenizer), no padded rows)
    for (name, config, overrides), paper_m in zip(runs[::2], (69, 73, 87, 143), strict=True):
        args = plan_args(config, overrides=overrides)
        job = parse_job_config(args, load_toml(args))
        with torch.device("meta"):
            ours = family("gpt2").get_train_spec().model_cls(model_args(job))
            hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_inner=int(overrides[-1])))
        counts = [sum(p.numel() for p in m.parameters()) for m in (ours, hf)]
        assert counts[0] == counts[1] and round(counts[0] / 1e6) == paper_m, (name, counts)


def test_the_calibrating_roofline_is_the_plans_own():
    """The roofline stored with the measured H100 step is what plan computes for that step now
    (bench/plan_accuracy.py prints both GPUs'), and docs/benchmarks.md has the measured figure."""
    figure = MEASURED_STEPS["h100"]
    plan = resource_plan.planned("figure", plan_args(GPT2_SHIPPED[0], None, GPT2_SHIPPED[1:]), 1, None, "h100")
    assert plan.layout.accumulation == 2  # the shipped 64 sequences in micro-batches of 32
    roofline = plan.layout.accumulation * plan.step.micro_batch_s + plan.step.optimizer_s
    assert roofline == pytest.approx(figure.roofline_s, rel=2e-3)
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text()
    for f in MEASURED_STEPS.values():
        assert f"{f.measured_s * 1e3:.1f}" in benchmarks, f.measured_on


def test_a_step_knows_its_floors():
    """GPT-2 small as shipped on 8 H100s does a token in no fewer GPU-seconds than one H100 (issue 49:
    it planned 8 × 15.5 ms for the 65,536 tokens one GPU does in 139 ms); the data-parallel collectives'
    latency grows with the ranks, by NCCL's ring model (FSDP over 4,096 GPUs planned as over 64 before);
    a DDP layout's collectives are one bucketed all-reduce a step, and named so."""
    args = plan_args(GPT2_SHIPPED[0])  # as shipped: sharded over the GPUs
    one, eight = (resource_plan.planned("gpt2", args, gpus, None, "h100") for gpus in (1, 8))
    assert 8 * eight.time.step_s >= one.time.step_s * (1 - 1e-9)  # bounded by it, or above it on its own
    assert eight.tokens_per_s / 8 <= one.tokens_per_s * (1 + 1e-9)
    assert eight.time.one_gpu_s == pytest.approx(one.time.step_s / 8, rel=1e-9)  # the floor: one GPU's step / 8
    job, m, gpu, calibration = validated_args(args, 8), eight.step, GPUS["h100"], eight.time.calibration

    def at(**layout):
        return step_time(job, dataclasses.replace(eight.layout, **layout), m, gpu, calibration)

    t64, t4096 = at(gpus=64, nodes=8, dp_shard=64), at(gpus=4096, nodes=512, dp_shard=4096)
    assert t4096.latency_s == pytest.approx(3 * 13 * (8.4e-6 + 3584 * 3.4e-6 + 511 * 14e-6))  # 13 FSDP units
    assert t4096.latency_s > 60 * t64.latency_s and t4096.data_parallel_s > t64.data_parallel_s
    assert (t64.data_parallel, t4096.data_parallel) == ("FSDP collectives", "FSDP collectives")
    ddp = [at(dp_shard=1, dp_replicate=8, accumulation=k) for k in (1, 4)]
    assert [t.data_parallel for t in ddp] == ["DDP all-reduce"] * 2
    assert ddp[0].data_parallel_s == ddp[1].data_parallel_s  # once a step, whatever the accumulation
    (bucket_mib,) = re.findall(r"bucket_cap_mb=(\d+)", inspect.getsource(apply_ddp))  # the DDP our families run
    buckets = math.ceil(m.params_total * 4 / (int(bucket_mib) * 2**20))
    assert ddp[0].latency_s == pytest.approx(buckets * (8.4e-6 + 14 * 3.4e-6))
