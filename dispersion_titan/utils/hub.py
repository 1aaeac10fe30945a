"""The Hugging Face hub's reachability, looked at once before anything is fetched: an unreachable hub
turns its offline mode on, so cached files load at once and missing ones fail at once, in one line,
instead of after retries (lm-eval's task data, ``model.hf_assets_path``)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from urllib.parse import urlparse

HUB_PROBE_SECONDS = 3.0
"""How long to wait for a TCP connection to the hub before treating it as unreachable."""
_TRUE = ("1", "ON", "YES", "TRUE")


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
