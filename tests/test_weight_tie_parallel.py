"""Weight tying survives FSDP2, tensor parallelism and 2-D (a real torchrun per layout)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, launch_env

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dp, tp", [(2, 1), (1, 2), (2, 2)])
def test_tie_is_one_parameter_with_both_gradients(dp, tp):
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={dp * tp}",
         "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
         str(REPO / "tests" / "dist_scripts" / "check_weight_tie.py"), str(dp), str(tp)],
        cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"weight tie OK under dp={dp} tp={tp}" in proc.stdout
