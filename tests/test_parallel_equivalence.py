"""Every parallel layout trains the same model on the same global batch.

From one seed checkpoint, the total loss, CE, dispersion term and the weights after 3
steps agree within 1e-4 (relative) across: 1 process (no accumulation), 1 process
with gradient accumulation 2, FSDP=2, TP=2 (sequence parallel, loss parallel) and
FSDP2×TP2. The dispersion loss is on, with a token subset, so its gathering over
sequence shards and its global-batch scaling are exercised too.
"""

from __future__ import annotations

import pytest

from helpers import load_weights, max_abs_diff, scalars, torchrun, update_rel_diff

pytestmark = pytest.mark.slow

STEPS = 3
COMMON = (
    "--training.steps", str(STEPS), "--training.global_batch_size", "8",
    "--validation.no-enable", "--checkpoint.interval", "100",
    "--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.5",
    "--dispersion.max_tokens", "96", "--lr_scheduler.warmup_steps", "1",
)
LAYOUTS = {
    "single": (1, ("--training.local_batch_size", "8")),
    "single_accum2": (1, ("--training.local_batch_size", "4")),
    "fsdp2": (2, ("--training.local_batch_size", "4")),
    "tp2": (2, ("--training.local_batch_size", "4", "--parallelism.tensor_parallel_degree", "2")),
    "fsdp2_tp2": (4, ("--training.local_batch_size", "4", "--parallelism.tensor_parallel_degree", "2")),
}
TAGS = ("loss_metrics/global_avg_loss", "loss_metrics/ce", "loss_metrics/dispersion")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    seed = root / "seed"
    torchrun(seed, 1, "--checkpoint.create_seed_checkpoint", "--training.steps", "0")
    seed_step = seed / "checkpoint" / "step-0"
    out = {"seed": seed_step}
    for name, (nproc, extra) in LAYOUTS.items():
        torchrun(root / name, nproc, *COMMON, *extra, "--checkpoint.initial_load_path", str(seed_step))
        out[name] = root / name
    # A fresh 2-D run with no seed checkpoint: its step 0 must equal the 1-process init.
    torchrun(root / "fresh_2d", 4, "--training.steps", "1", "--validation.no-enable",
             "--parallelism.tensor_parallel_degree", "2")
    out["fresh_2d"] = root / "fresh_2d"
    return out


def test_losses_agree_across_layouts(runs):
    reference = scalars(runs["single"])
    for tag in TAGS:
        assert sorted(reference[tag]) == list(range(1, STEPS + 1))
    assert reference["loss_metrics/dispersion"][1] != 0.0
    for name in LAYOUTS:
        got = scalars(runs[name])
        for tag in TAGS:
            for step in range(1, STEPS + 1):
                want, have = reference[tag][step], got[tag][step]
                assert abs(have - want) <= 1e-4 * abs(want), (name, tag, step, have, want)


def test_total_is_ce_plus_weighted_dispersion(runs):
    s = scalars(runs["fsdp2_tp2"])
    for step in range(1, STEPS + 1):
        total = s["loss_metrics/ce"][step] + 0.5 * s["loss_metrics/dispersion"][step]
        assert abs(s["loss_metrics/global_avg_loss"][step] - total) < 1e-5


def test_weights_after_training_agree_across_layouts(runs):
    reference = load_weights(runs["single"] / "checkpoint" / f"step-{STEPS}")
    initial = load_weights(runs["seed"])
    assert max_abs_diff(reference, initial) > 1e-3  # training moved the weights
    for name in LAYOUTS:
        got = load_weights(runs[name] / "checkpoint" / f"step-{STEPS}")
        assert update_rel_diff(got, reference, initial) <= 1e-4, name


def test_step0_is_the_initialisation_under_every_layout(runs):
    initial = load_weights(runs["seed"])
    for name in (*LAYOUTS, "fresh_2d"):
        step0 = load_weights(runs[name] / "checkpoint" / "step-0")
        assert max_abs_diff(step0, initial) == 0.0, name
