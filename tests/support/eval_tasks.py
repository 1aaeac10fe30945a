"""The offline lm-eval tasks shipped with the tests (their data files found beside their
YAMLs from any working directory: ``lm_eval_tasks/local_files.py``)."""

from __future__ import annotations

from support.launch import REPO

LM_EVAL_TASKS = REPO / "tests" / "lm_eval_tasks"
