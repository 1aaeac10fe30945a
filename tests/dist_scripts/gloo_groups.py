"""The dist scripts' gloo process groups, with a timeout far below torch's 30 minutes: a rank that never
joins a collective (or the rendezvous) makes the others fail within a minute, naming what they waited
for, instead of the job hanging until its test's timeout (``torchrun_script``: 300 s) kills it mute."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

TIMEOUT = timedelta(seconds=60)
"""A collective here waits for milliseconds of work on the other ranks (forked, imports paid; a fresh
torchrun's ranks import side by side before the rendezvous); 60 s leaves a wide margin for a loaded
2-core machine (2 xdist workers, each with up to 4 ranks)."""


def init() -> None:
    dist.init_process_group("gloo", timeout=TIMEOUT)
    # and each group made after it without a timeout (a device mesh's: ``ParallelDims``), which ``new_group``
    # would give torch's default, never the world's
    dist.distributed_c10d.default_pg_timeout = TIMEOUT
