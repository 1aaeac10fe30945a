"""Weight tying survives FSDP2, tensor parallelism and 2-D (a real torchrun per layout)."""

from __future__ import annotations

import pytest

from support.launch import torchrun_script

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dp, tp", [(2, 1), (1, 2), (2, 2)])
def test_tie_is_one_parameter_with_both_gradients(dp, tp):
    proc = torchrun_script("check_weight_tie.py", dp * tp, str(dp), str(tp))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"weight tie OK under dp={dp} tp={tp}" in proc.stdout
