"""A checkpoint as lm-eval's own HFLM sees it: exported by ``convert to-hf`` into a
temporary folder. Scoring that folder is by construction what a user gets from
``lm_eval --model hf --model_args pretrained=<convert to-hf output>``."""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from ..run_folder.hf_export import export_checkpoint
from ..run_folder.writer_lock import pid_runs

# ``.hf-step-N.pidPID@HOST.RANDOM``: the owner is named, so a later run knows an abandoned one.
_EXPORT = re.compile(r"^\.hf-.+\.pid(\d+)@(.+)\.[^.]+$")


def remove_abandoned_exports(parent: str) -> None:
    """Remove the exports in ``parent`` whose evaluation died before removing them (SIGKILL, the
    OOM killer): made on this host by a process that no longer runs."""
    host = socket.gethostname()
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        match = _EXPORT.match(name)
        if match and match[2] == host and not pid_runs(int(match[1])):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


@contextmanager
def hf_export(step_dir: str, parent: str) -> Iterator[str]:
    """The Hugging Face folder of ``step_dir``, inside ``parent`` (the output folder, so
    no small /tmp has to hold GPT-2 xl), removed afterwards, as are those a killed
    evaluation left there. Raises ``CheckpointError`` before yielding when the checkpoint
    cannot be read."""
    remove_abandoned_exports(parent)
    step = os.path.basename(step_dir.rstrip("/"))
    folder = tempfile.mkdtemp(prefix=f".hf-{step}.pid{os.getpid()}@{socket.gethostname()}.", dir=parent)
    try:
        export_checkpoint(step_dir, folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
