"""A torchrun rank ends with its launcher: killed by SIGKILL, torchrun cannot stop its ranks (their own
sessions), which would train on as orphans; so each asks Linux for SIGKILL when its parent dies.
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
