"""Task names resolved by lm-eval's own TaskManager, checked before any model loads, and
their data loaded with the hub's offline mode on when the hub cannot be reached."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from . import EvaluationError

HUB_PROBE_SECONDS = 3.0
"""How long to wait for a TCP connection to the hub before treating it as unreachable."""
_TRUE = ("1", "ON", "YES", "TRUE")


def check_include_path(path: str) -> str:
    """The absolute path of a readable folder, or a one-line error naming it."""
    if not os.path.exists(path):
        raise EvaluationError(f"--include-path: {path}: no such directory")
    if not os.path.isdir(path):
        raise EvaluationError(f"--include-path: {path}: not a directory (give the folder holding the task YAMLs)")
    try:
        os.listdir(path)
    except OSError as e:
        raise EvaluationError(f"--include-path: {path}: not readable ({e.strerror or e})") from None
    return os.path.abspath(path)


class Tasks:
    """The requested tasks in one TaskManager.

    Indexing lm-eval's ~13,000 built-in task YAMLs takes 20-30 s on 2 CPU cores, so when
    every name is a plain task of --include-path that folder alone is indexed. Groups
    and tags always get the full index: they may name built-in tasks."""

    def __init__(self, names: tuple[str, ...], include_path: str | None):
        from lm_eval.tasks import TaskManager

        self.names = names
        self.include_path = check_include_path(include_path) if include_path else None
        manager = None
        if self.include_path:
            manager = TaskManager(include_path=self.include_path, include_defaults=False)
            if not set(names) <= set(manager.all_subtasks):
                manager = None
        self.manager = manager or TaskManager(include_path=self.include_path)
        unknown = [name for name in names if name not in self.manager.all_tasks]
        if unknown:
            where = f"lm-eval {_lm_eval_version()}" + (f" or {self.include_path}" if self.include_path else "")
            raise EvaluationError(
                f"--tasks: unknown task {', '.join(unknown)} (not in {where}; lm-eval --tasks list shows the names)"
            )

    def load(self) -> dict[str, list[Any]]:
        """Each name's lm-eval Task or Group objects, built once (datasets are fetched
        here) and reused for every checkpoint. An unreachable hub turns its offline mode
        on first: cached data load at once, missing data fail at once (not after 30 s of
        retries)."""
        objects = {}
        with hub_offline() as offline:
            for name in self.names:
                try:
                    loaded = self.manager.load([name])
                except Exception as e:  # noqa: BLE001 - lm-eval and datasets raise many types
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


@contextlib.contextmanager
def hub_offline() -> Iterator[str | None]:
    """Why the Hugging Face hub will not be asked for data (None: it will be). Its offline
    mode is the user's (``HF_HUB_OFFLINE``), or turned on inside this block when no TCP
    connection to the hub (``HF_ENDPOINT``) opens within ``HUB_PROBE_SECONDS``."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").upper() in _TRUE:
            yield f"{var} is set"
            return
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=HUB_PROBE_SECONDS).close()
    except OSError as e:
        reason = f"{endpoint.hostname}:{port} is unreachable from here ({e.strerror or e})"
    else:
        yield None
        return
    import datasets.config
    import huggingface_hub.constants

    # Both libraries read HF_HUB_OFFLINE once, at import, into these: set them for this block only
    # (the process may go on to other work, e.g. a caller's own dataset checks).
    saved = huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    huggingface_hub.constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield reason
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


def _lm_eval_version() -> str:
    import lm_eval

    return lm_eval.__version__
