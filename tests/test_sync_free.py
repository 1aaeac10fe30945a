"""Steps that neither log nor save cost no more synchronisation than TorchTitan's own:
the non-finite-loss and preemption flags travel in one device all-reduce at log and
checkpoint steps only, the accumulators stay on the device, and the dispersion loss's
token subsets are drawn on the device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import DEBUG_TOML, REPO, launch_env

pytestmark = pytest.mark.slow

# Steps 1 (TorchTitan always logs it) and 4 (the last: checked) check; 2 and 3 neither log nor save.
# TorchTitan's own Trainer needs an explicit micro-batch (it does not derive local_batch_size = 0).
ARGS = ("--job.config_file", DEBUG_TOML, "--training.local_batch_size", "4", "--training.steps", "4",
        "--metrics.log_freq", "10",
        "--checkpoint.no-enable", "--validation.no-enable", "--metrics.no-enable-tensorboard",
        "--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.1", "--dispersion.max_tokens", "64")
QUIET_STEPS = ("2", "3")


def count(kind: str, tmp_path) -> subprocess.Popen:
    """Start the 2-process count of one trainer class; it writes ``{kind}.json``."""
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv_backend=c10d",
         "--rdzv_endpoint=localhost:0", str(REPO / "tests" / "dist_scripts" / "count_syncs.py"), kind,
         str(tmp_path / f"{kind}.json"), *ARGS, "--job.dump_folder", str(tmp_path / kind)],
        cwd=REPO, env=launch_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_quiet_steps_sync_no_more_than_torchtitans_trainer(tmp_path):
    jobs = {kind: count(kind, tmp_path) for kind in ("stock", "dispersion")}
    for kind, job in jobs.items():
        _, err = job.communicate(timeout=600)
        assert job.returncode == 0, (kind, err[-6000:])
    stock, ours = (json.loads((tmp_path / f"{kind}.json").read_text()) for kind in jobs)
    for step in QUIET_STEPS:
        (stock_collectives, stock_reads), (collectives, reads) = stock[step], ours[step]
        assert collectives <= stock_collectives and reads <= stock_reads, (step, stock[step], ours[step])
    # The check itself: one all-reduce and one read at the steps that log or save.
    assert ours["4"][0] == stock["4"][0] + 1 and ours["4"][1] == stock["4"][1] + 1
