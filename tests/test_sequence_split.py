"""The dispersion loss split over tensor-parallel ranks equals the whole loss (a real
3-process torchrun: batches smaller than, equal to and not a multiple of the TP degree)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, launch_env

pytestmark = pytest.mark.slow


def test_split_loss_has_the_whole_loss_value_and_gradient():
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3", "--rdzv_backend=c10d",
         "--rdzv_endpoint=localhost:0", str(REPO / "tests" / "dist_scripts" / "check_sequence_split.py")],
        cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sequence split OK on 3 ranks" in proc.stdout
