"""Activation checkpointing, torch.compile and mixed precision, as configured in TOML,
train the same model: AC is exact, bf16 compute stays close to fp32. The authors' loss scale
(``training.loss_scale = "as_released"``) multiplies the gradient by the accumulation count."""

from __future__ import annotations

import pytest

from support.launch import torchrun
from support.runs import scalars

pytestmark = pytest.mark.slow

COMMON = (
    "--training.steps",
    "2",
    "--validation.no-enable",
    "--checkpoint.no-enable",
    "--dispersion.variant",
    "angular_spread",
    "--dispersion.coeff",
    "0.1",
)
LOSS = "loss_metrics/global_avg_loss"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    dump = tmp_path_factory.mktemp("plain")
    torchrun(dump, 2, *COMMON)
    return scalars(dump)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_is_exact(tmp_path, reference, mode):
    torchrun(tmp_path, 2, *COMMON, "--activation_checkpoint.mode", mode)
    assert scalars(tmp_path)[LOSS] == reference[LOSS]


def test_compile_with_bf16_mixed_precision_trains_close_to_fp32(tmp_path, reference):
    # aot_eager: on a CPU inductor is refused (it compiles for GPUs; docs/training.md#cpu)
    torchrun(
        tmp_path,
        2,
        *COMMON,
        "--compile.enable",
        "--compile.backend",
        "aot_eager",
        "--training.mixed_precision_param",
        "bfloat16",
    )
    got = scalars(tmp_path)[LOSS]
    assert reference[LOSS] and got != reference[LOSS]  # bf16 compute really changed the numbers...
    for step, want in reference[LOSS].items():
        assert abs(got[step] - want) < 1e-2 * abs(want)  # ...but not the training


def test_as_released_loss_scale_multiplies_the_gradient_by_the_accumulation_count(tmp_path, reference):
    """Two micro-batches per rank: each one's own mean, summed, then averaged over the 2 ranks (the authors'
    Trainer): the first step's gradient norm before clipping is twice the mean's, its logged loss the same."""
    torchrun(tmp_path, 2, *COMMON, "--training.local_batch_size", "2", "--training.loss_scale", "as_released")
    got = scalars(tmp_path)
    assert got["grad_norm"][1] == pytest.approx(2 * reference["grad_norm"][1], rel=1e-5)
    assert got[LOSS][1] == pytest.approx(reference[LOSS][1], rel=1e-6)
