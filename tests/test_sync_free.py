"""Steps that neither log nor save cost no more synchronisation than TorchTitan's own:
the non-finite-loss and preemption flags travel in one device all-reduce at log and
checkpoint steps only, the accumulators stay on the device, and the dispersion loss's
token subsets are drawn on the device. On CUDA each host read waits for the GPU, which idles
while Python queues the next kernels."""

from __future__ import annotations

import json

import pytest

from support.launch import DEBUG_TOML, torchrun_script

pytestmark = pytest.mark.slow

# Steps 1 (TorchTitan always logs it) and 4 (the last: checked) check; 2 and 3 neither log nor save.
# TorchTitan's own Trainer needs an explicit micro-batch (it does not derive local_batch_size = 0).
ARGS = (
    "--job.config_file",
    DEBUG_TOML,
    "--training.local_batch_size",
    "4",
    "--training.steps",
    "4",
    "--metrics.log_freq",
    "10",
    "--checkpoint.no-enable",
    "--validation.no-enable",
    "--metrics.no-enable-tensorboard",
    "--dispersion.variant",
    "angular_spread",
    "--dispersion.coeff",
    "0.1",
    "--dispersion.max_tokens",
    "64",
)
QUIET_STEPS = ("2", "3")


def test_quiet_steps_sync_no_more_than_torchtitans_trainer(tmp_path):
    kinds = ("stock", "dispersion")
    for kind in kinds:  # each a 2-process count of one trainer class, written to {kind}.json
        proc = torchrun_script(
            "count_syncs.py",
            2,
            kind,
            str(tmp_path / f"{kind}.json"),
            *ARGS,
            "--job.dump_folder",
            str(tmp_path / kind),
            timeout=600,
        )
        assert proc.returncode == 0, (kind, proc.stderr[-6000:])
    stock, ours = (json.loads((tmp_path / f"{kind}.json").read_text()) for kind in kinds)
    for step in QUIET_STEPS:
        (stock_collectives, stock_reads, _), (collectives, reads, _) = stock[step], ours[step]
        assert collectives <= stock_collectives and reads <= stock_reads, (step, stock[step], ours[step])
        assert ours[step][2] == [], step  # where our package read a value back (was: the data's order, per sequence)
    # The check itself: one all-reduce and one read at the steps that log or save; step 1 also logs our metrics.
    assert ours["4"][0] == stock["4"][0] + 1 and ours["4"][1] == stock["4"][1] + 1
    assert len(ours["4"][2]) == 1 and len(ours["1"][2]) == 2, (ours["1"][2], ours["4"][2])
