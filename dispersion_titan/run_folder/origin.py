"""Where a run started, pretrained weights or an initialisation, as ``run.json``'s ``started_from``:
Table 2 tells mid-training from training from scratch by it, as the authors' two scripts do."""

from __future__ import annotations

import os
from typing import Any

from ..utils.errors import CheckpointError
from .checkpoints import load_run_metadata
from .outputs import STEP_FOLDER
from .settings import parse_fork

START_KEY = "started_from"


def start_record(job_config: Any) -> dict[str, Any]:
    """What the run loads before its first step, as TorchTitan's checkpointer decides it: ``source`` hf,
    checkpoint, seed_checkpoint or init; a fork started where its parent did."""
    if job_config.job.fork_from:
        try:
            parent = load_run_metadata(parse_fork(job_config.job.fork_from)[0])
        except CheckpointError:  # a parent not of ours: its checkpoint tells
            parent = None
        if parent is not None:
            return parent[START_KEY]
    checkpoint = job_config.checkpoint
    if checkpoint.enable and checkpoint.initial_load_in_hf:
        path = checkpoint.initial_load_path or job_config.model.hf_assets_path
        return {"pretrained": True, "source": "hf", "path": os.path.abspath(path) if os.path.isdir(path) else path}
    if checkpoint.enable and checkpoint.initial_load_path:
        seed = holds_an_initialisation(checkpoint.initial_load_path)
        return {
            "pretrained": not seed,
            "source": "seed_checkpoint" if seed else "checkpoint",
            "path": os.path.abspath(checkpoint.initial_load_path),
        }
    return {"pretrained": False, "source": "init", "path": None}


def holds_an_initialisation(step_dir: str) -> bool:
    """Whether ``RUN/checkpoint/step-N`` holds an initialisation rather than trained weights."""
    step_dir = os.path.abspath(step_dir)
    run = os.path.dirname(os.path.dirname(step_dir))
    try:
        metadata = load_run_metadata(run)
    except CheckpointError:
        return False
    if (metadata.get("settings") or {}).get("checkpoint.create_seed_checkpoint"):
        return True
    match = STEP_FOLDER.match(os.path.basename(step_dir))
    return match is not None and int(match.group(1)) == 0 and not metadata[START_KEY]["pretrained"]


def from_scratch(dump: str) -> bool:
    """A run that trains from an initialisation, not from pretrained weights."""
    return not load_run_metadata(dump)[START_KEY]["pretrained"]
