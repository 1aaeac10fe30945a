"""A torchrun rank ends with the process that started it.

torchrun starts its ranks in sessions of their own, so when the launcher dies by SIGKILL
(``kill -9``, the OOM killer) neither its process group nor torchrun's shutdown reaches
them: they would train on as orphans, writing into a run folder its user believes free.
Each rank therefore asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) for SIGKILL when
its parent, torchrun's agent, dies. The last complete checkpoint stands, as after any
crash; the rank's writer lock is then stale (``run_folder.writer_lock``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_launcher() -> None:
    """In a torchrun rank on Linux: be killed when the launcher is; elsewhere nothing."""
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # not allowed here (a sandbox): the rank still stops when its collectives fail
    if os.getppid() == 1:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
