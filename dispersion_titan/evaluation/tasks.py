"""Task names resolved by lm-eval's own TaskManager, checked before any model loads, and
their data loaded with the hub's offline mode on when the hub cannot be reached."""

from __future__ import annotations

import errno
import os
from importlib.metadata import version
from typing import Any

from ..utils.errors import EvaluationError
from ..utils.hub import hub_offline


class Tasks:
    """The requested tasks in one TaskManager: only --include-path's when each is a plain task there (indexing
    lm-eval's ~13,000 built-in task YAMLs takes 20-30 s on 2 cores)."""

    def __init__(self, names: tuple[str, ...], include_path: str | None):
        from lm_eval.tasks import TaskManager

        self.names = names
        self.include_path = os.path.abspath(include_path) if include_path else None
        manager = None
        if include_path:  # a readable folder, or a one-line error naming it
            try:
                os.listdir(include_path)
            except OSError as e:  # none there, a file, not readable
                raise EvaluationError(
                    f"--include-path: {include_path}: {(e.strerror or str(e)).lower()} "
                    "(give a readable folder holding the task YAMLs)"
                ) from None
            manager = TaskManager(include_path=self.include_path, include_defaults=False)
            if not set(names) <= set(manager.all_subtasks):
                manager = None
        self.manager = manager or TaskManager(include_path=self.include_path)
        unknown = [name for name in names if name not in self.manager.all_tasks]
        if unknown:
            where = f"lm-eval {version('lm_eval')}" + (f" or {self.include_path}" if self.include_path else "")
            raise EvaluationError(
                f"--tasks: unknown task {', '.join(unknown)} (not in {where}; lm-eval --tasks list shows the names)"
            )

    def load(self) -> dict[str, list[Any]]:
        """Each name's lm-eval Task or Group objects, built once; an unreachable hub's offline mode on first,
        so missing data fail at once (not after 30 s of retries)."""
        objects = {}
        with hub_offline() as offline:
            for name in self.names:
                try:
                    loaded = self.manager.load([name])
                except Exception as e:  # noqa: BLE001 - lm-eval and datasets raise many types
                    if (
                        isinstance(e, OSError)
                        and e.errno in (errno.EROFS, errno.EACCES, errno.ENOSPC, errno.ENOTDIR)
                        and e.filename
                    ):
                        raise EvaluationError(  # where datasets caches the tasks' data: not the task's fault
                            f"{e.filename}: {e.strerror} (datasets' cache, loading task {name}); set HF_HOME, or "
                            "HF_DATASETS_CACHE, to a writable folder with room"
                        ) from None
                    message = str(e).splitlines()[0] if str(e) else ""
                    why = (
                        f"; not in the local Hugging Face cache, and the hub is not asked: {offline}"
                        if offline and isinstance(e, ConnectionError)
                        else ""
                    )
                    raise EvaluationError(
                        f"--tasks: {name}: cannot be loaded{why} ({type(e).__name__}: {message})"
                    ) from None
                top = loaded["groups"].get(name) or loaded["tasks"].get(name)
                objects[name] = [top] if top is not None else list(loaded["tasks"].values())  # a tag: its tasks
        return objects
