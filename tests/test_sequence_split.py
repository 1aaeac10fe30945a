"""The dispersion loss split over tensor-parallel ranks equals the whole loss (a real
3-process torchrun: batches smaller than, equal to and not a multiple of the TP degree)."""

from __future__ import annotations

import pytest

from support.launch import torchrun_script

pytestmark = pytest.mark.slow


def test_split_loss_has_the_whole_loss_value_and_gradient():
    proc = torchrun_script("check_sequence_split.py", 3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sequence split OK on 3 ranks" in proc.stdout
