"""The offline lm-eval tasks shipped with the tests (their data files found beside their
YAMLs from any working directory: ``lm_eval_tasks/local_files.py``), and evaluations of
known scores written as ``evaluate`` writes them, for the Table 2 tests."""

from __future__ import annotations

import json
from pathlib import Path

from dispersion_titan.run_folder.checkpoints import checkpoint_identity
from dispersion_titan.run_folder.owners import RUN_ID, FolderOwner, write_record
from support.launch import REPO

LM_EVAL_TASKS = REPO / "tests" / "lm_eval_tasks"


def write_evaluation(dump: Path, step: int, results: dict, settings: dict) -> None:
    """``dump/evaluation/step-N/results.json`` as ``evaluate`` leaves it (lm-eval's ``results``
    and ours, in a folder recording its run, of the identity of its checkpoint where there is one), for
    tests that need scores of known value, not a real evaluation."""
    folder = dump / "evaluation" / f"step-{step}"
    folder.mkdir(parents=True)
    write_record(str(folder.parent), FolderOwner("evaluation", str(dump)))  # once: the first step's
    checkpoint = dump / "checkpoint" / f"step-{step}"  # a fabricated run's: none there, so never changed since
    identity = checkpoint_identity(str(checkpoint)) if checkpoint.is_dir() else "fabricated"
    ours = {"format": 1, "settings": settings, "step": step, "run": str(dump), "checkpoint": str(checkpoint)}
    (folder / "results.json").write_text(
        json.dumps({"results": results, "dispersion_titan": {**ours, "checkpoint_identity": identity}})
    )


PEAKS = {1: {0: 0.2, 1: 0.6, 2: 0.5, 3: 0.3}, 2: {0: 0.2, 1: 0.3, 2: 0.5, 3: 0.65}}
"""Accuracy by seed and step of a 3-step run: seed 1 peaks at step 1, seed 2 at step 3, their mean
at step 2. The authors evaluate a mid-training run every 3 // 5 + 1 = 1 step (best per seed: 1 and 3)
and a from-scratch run every 3 // 2 + 1 = 2 steps and at the last (best of the mean: 2)."""
ARMS = {"base": {"variant": "none", "coeff": 0.0}, "disp": {"variant": "angular_spread", "coeff": 0.1}}
"""The cross-entropy arm and a dispersion arm: two configurations (one seed of one configuration in two arms
would be refused, one seed counted twice)."""


def evaluated_arms(run: Path, root: Path, start: dict | None = None) -> list[str]:
    """``ARM=RUN1,RUN2`` specs of copies of a trained 3-step run (``seeded_copies``), each evaluated
    at steps 0–3 with the ``PEAKS`` of its seed (the dispersion arm 0.1 higher); ``start``: another
    ``started_from`` record for the copies."""
    copies = seeded_copies(run, root, ARMS, tuple(PEAKS))
    for name, dump in copies.items():
        if start is not None:
            metadata = json.loads((dump / "run.json").read_text())
            (dump / "run.json").write_text(json.dumps({**metadata, "started_from": start}))
        seed, shift = int(name[-1]), 0.1 if name.startswith("disp") else 0.0
        for step, acc in PEAKS[seed].items():
            write_evaluation(dump, step, {"t": {"acc,none": acc + shift}}, {"tasks": ["t"]})
    return [f"{arm}={copies[f'{arm}_s1']},{copies[f'{arm}_s2']}" for arm in ARMS]


def seeded_copies(run: Path, root: Path, arms: dict[str, dict], seeds: tuple[int, ...]) -> dict[str, Path]:
    """Copies of a trained run's ``run.json`` (its ``started_from`` record kept), one per arm and seed:
    ``arms`` maps a name to the ``dispersion`` entries it changes; each its own ``run_id``, as each run has, and
    its own TensorBoard folder outside it (``paths``), as a sweep may put them.
    Name -> folder (``ARM_sSEED``)."""
    metadata = json.loads((run / "run.json").read_text())
    copies = {}
    for arm, dispersion in arms.items():
        for seed in seeds:
            dump = root / f"{arm}_s{seed}"
            dump.mkdir(parents=True)
            copy = {
                **metadata,
                RUN_ID: dump.name,
                "paths": {"metrics.save_tb_folder": f"../tb/{dump.name}"},
                "seed": seed,
                "dispersion": {**(metadata["dispersion"] or {}), **dispersion},
            }
            (dump / "run.json").write_text(json.dumps(copy))
            copies[dump.name] = dump
    return copies
