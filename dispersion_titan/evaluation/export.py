"""A checkpoint as lm-eval's own HFLM sees it: exported as ``convert to-hf`` does, so its scores are what
``lm_eval --model hf`` gives on that export; a Hugging Face model is handed to HFLM as it is."""

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


@contextmanager
def hflm_location(source: str, parent: str) -> Iterator[tuple[str, str]]:
    """HFLM's ``pretrained`` and ``revision`` for ``source``: ``hf:MODEL[@REV]`` as it is; a checkpoint folder
    exported inside ``parent`` (no small /tmp has to hold GPT-2 xl), once the exports there left by an
    evaluation of this host that died (SIGKILL, OOM) are removed."""
    if source.startswith(PREFIX):
        path, revision = hub_location(source)
        yield path, revision or "main"
        return
    host = socket.gethostname()
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        match = _EXPORT.match(name)
        if match and match[2] == host and not pid_runs(int(match[1])):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    prefix = f".hf-{os.path.basename(source.rstrip('/'))}.pid{os.getpid()}@{host}."
    with tempfile.TemporaryDirectory(prefix=prefix, dir=parent, ignore_cleanup_errors=True) as folder:
        export_checkpoint(source, folder)
        yield folder, "main"


def hub_location(source: str) -> tuple[str, str | None]:
    """``from_pretrained``'s path or id, and revision, of ``hf:MODEL[@REV]``."""
    spec = parse_spec(source)
    return spec.location(spec.revisions[0])


def source_identity(source: str, pretrained: str, config) -> str | None:
    """What a result records of the weights it scored: their identity, or a hub model's commit."""
    if not source.startswith(PREFIX):
        return checkpoint_identity(source)
    return folder_identity(pretrained) if os.path.isdir(pretrained) else getattr(config, "_commit_hash", None)


def source_changed(record: dict, source: str) -> bool:
    """Whether ``source`` now holds other weights than the result ``record`` scored (a hub revision is
    taken as it was: pin one with ``hf:MODEL@COMMIT``)."""
    if not source.startswith(PREFIX):
        return identity_changed(record["checkpoint_identity"], source)
    try:
        path = hub_location(source)[0]
    except ModelLoadError:  # a local folder gone: it cannot be read, and its load says why
        return False
    return os.path.isdir(path) and folder_identity(path) != record["checkpoint_identity"]
