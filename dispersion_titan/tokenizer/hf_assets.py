"""``model.hf_assets_path`` as a local folder: a hub id is fetched once into the Hugging Face cache."""

from __future__ import annotations

import os
import re

from ..utils.errors import ConfigError
from ..utils.hub import hub_offline

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
ASSET_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]


def is_hub_id(path: str) -> bool:
    """``owner/name`` that is not a local path."""
    return bool(_HUB_ID.match(path)) and not os.path.exists(path)


def local_assets(path: str, field: str) -> str:
    """``path`` itself when it is empty or a local folder; a hub id's snapshot folder."""
    if not path or os.path.isdir(os.path.expanduser(path)):
        return os.path.expanduser(path)
    if not is_hub_id(path):
        raise ConfigError(f"{field}: {path}: no such folder (nor a Hugging Face hub id such as Qwen/Qwen3-0.6B)")
    from huggingface_hub import snapshot_download

    with hub_offline() as offline:  # an unreachable hub: the cache at once, not retries
        try:
            return snapshot_download(path, allow_patterns=ASSET_PATTERNS, local_files_only=offline is not None)
        except Exception as e:  # noqa: BLE001 - the hub raises many types; the user needs one line
            if offline:
                raise ConfigError(
                    f"{field}: {path}: not in the local Hugging Face cache, and the hub is not asked: {offline}; "
                    f"fetch it where the hub is reachable (hf download {path}), or give a local folder"
                ) from None
            cause = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"{field}: {path}: cannot be fetched from the Hugging Face hub ({cause})") from None
