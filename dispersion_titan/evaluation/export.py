"""A checkpoint as lm-eval's own HFLM sees it: exported by ``convert to-hf`` into a
temporary folder. Scoring that folder is by construction what a user gets from
``lm_eval --model hf --model_args pretrained=<convert to-hf output>``."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from ..run_folder.hf_export import to_hf


@contextmanager
def hf_export(step_dir: str, parent: str) -> Iterator[str]:
    """The Hugging Face folder of ``step_dir``, inside ``parent`` (the output folder, so
    no small /tmp has to hold GPT-2 xl), removed afterwards. Raises ``CheckpointError``
    before yielding when the checkpoint cannot be read."""
    folder = tempfile.mkdtemp(prefix=f".hf-{os.path.basename(step_dir.rstrip('/'))}.", dir=parent)
    try:
        to_hf(step_dir, folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
