"""A checkpoint as lm-eval's own HFLM sees it: exported by ``convert to-hf`` into a
temporary folder. Scoring that folder is by construction what a user gets from
``lm_eval --model hf --model_args pretrained=<convert to-hf output>``. A Hugging Face model
(``hf:MODEL[@REV]``, a hub id or a local folder) is handed to HFLM as it is."""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from ..run_folder.checkpoints import checkpoint_identity, folder_identity, identity_changed
from ..run_folder.hf_export import export_checkpoint
from ..run_folder.writer_lock import pid_runs
from ..utils.errors import ModelLoadError
from ..utils.hub import PREFIX, parse_spec

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


@contextmanager
def hflm_location(source: str, parent: str) -> Iterator[tuple[str, str]]:
    """HFLM's ``pretrained`` and ``revision`` for ``source``: a checkpoint folder (exported into
    ``parent`` by ``hf_export``) or ``hf:MODEL[@REV]``."""
    if not source.startswith(PREFIX):
        with hf_export(source, parent) as folder:
            yield folder, "main"
        return
    spec = parse_spec(source)
    path, revision = spec.location(spec.revisions[0])
    yield path, revision or "main"


def source_identity(source: str, pretrained: str, config) -> str | None:
    """What a result records of the weights it scored: a checkpoint's or a local folder's identity, a hub
    model's commit (as transformers resolved it)."""
    if not source.startswith(PREFIX):
        return checkpoint_identity(source)
    return folder_identity(pretrained) if os.path.isdir(pretrained) else getattr(config, "_commit_hash", None)


def source_changed(record: dict, source: str) -> bool:
    """Whether ``source`` now holds other weights than the result ``record`` (its ``dispersion_titan``
    entry) scored: a checkpoint saved again, a local Hugging Face folder replaced. A hub revision is
    taken as it was (pin one with ``hf:MODEL@COMMIT``; ``--force`` evaluates it again)."""
    if not source.startswith(PREFIX):
        return identity_changed(record["checkpoint_identity"], source)
    try:
        spec = parse_spec(source)
    except ModelLoadError:  # a local folder gone: it cannot be read, and its load says why
        return False
    path = spec.location(spec.revisions[0])[0]
    return os.path.isdir(path) and folder_identity(path) != record["checkpoint_identity"]
