"""The offline lm-eval tasks shipped with the tests."""

from __future__ import annotations

from pathlib import Path

from support.launch import REPO


LM_EVAL_TASKS = REPO / "tests" / "lm_eval_tasks"


def absolute_lm_eval_tasks(folder: Path) -> Path:
    """The shipped offline lm-eval task YAMLs in ``folder``, their data files made absolute
    (lm-eval 0.4.13 hands ``data_files`` to ``datasets`` unchanged, which resolves it
    against the current folder)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    for path in LM_EVAL_TASKS.glob("*.yaml"):
        config = yaml.safe_load(path.read_text())
        files = config["dataset_kwargs"]["data_files"]
        config["dataset_kwargs"]["data_files"] = {split: str(LM_EVAL_TASKS / name) for split, name in files.items()}
        (folder / path.name).write_text(yaml.safe_dump(config))
    return folder
