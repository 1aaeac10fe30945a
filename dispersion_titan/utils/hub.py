"""An unreachable Hugging Face hub turns its offline mode on, so missing files fail at once in one line,
not after retries; and ``hf:MODEL[@REV1,REV2,...]``, how ``analyze`` and ``evaluate`` name a model."""

from __future__ import annotations

import contextlib
import glob
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError

from .errors import ModelLoadError, cause

HUB_PROBE_SECONDS = 3.0
"""How long to wait for a TCP connection to the hub before treating it as unreachable."""
_TRUE = ("1", "ON", "YES", "TRUE")
_LOAD_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    ImportError,
    RuntimeError,
    TypeError,
    SafetensorError,
    StrictDataclassError,
)
"""What transformers, the hub and safetensors raise for a model they cannot load."""


@contextlib.contextmanager
def hub_offline() -> Iterator[str | None]:
    """Why the hub will not be asked (None: it will): the user's offline mode, or no TCP connection
    within ``HUB_PROBE_SECONDS``, which turns it on inside this block."""
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

    # both libraries read HF_HUB_OFFLINE once, at import, into these
    saved = huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    huggingface_hub.constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield reason
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


@contextlib.contextmanager
def quiet_datasets_bars() -> Iterator[None]:
    """datasets' progress bars off inside this block (``Generating test split: 40 examples``): evaluate's tasks
    loading, prepare's corpus read up to its first document, analyze's corpus read; one that then fails (a bad Jinja
    template applied to a task's first document, a corpus without text, a full cache) is its one line alone. A hub
    file's download bars are huggingface_hub's, still shown; ``HF_DATASETS_DISABLE_PROGRESS_BARS=0`` keeps them all."""
    import datasets.config
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if are_progress_bars_disabled() or datasets.config.HF_DATASETS_DISABLE_PROGRESS_BARS is False:
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


PREFIX = "hf:"


@dataclass(frozen=True)
class HFSpec:
    model: str
    revisions: tuple[str | None, ...]
    """``(None,)``: the default revision (a hub model's main branch, or the folder itself)."""
    trust_remote_code: bool = False
    """``--trust-remote-code``: run the code a model ships (the original Qwen's), as transformers allows."""

    @property
    def local(self) -> bool:
        return os.path.isdir(self.model)

    def location(self, revision: str | None) -> tuple[str, str | None]:
        """(``from_pretrained`` path or id, its ``revision=``) of one revision."""
        if revision is None:
            return self.model, None
        if self.local:
            return os.path.join(self.model, revision), None
        return self.model, revision

    def name(self, revision: str | None) -> str:
        return f"{PREFIX}{self.model}" + (f"@{revision}" if revision else "")


def parse_spec(text: str, trust_remote_code: bool = False) -> HFSpec:
    """``hf:MODEL[@REV1,REV2,...]``; the last ``@`` separates the revisions, unless MODEL is no folder and the whole
    is one (``models/gpt2@v1``: was taken for a hub id, and refused as unreachable)."""
    body = text.removeprefix(PREFIX)
    model, at, revisions = body.rpartition("@") if "@" in body else (body, "", "")
    if at and not os.path.isdir(os.path.expanduser(model)) and os.path.isdir(os.path.expanduser(body)):
        model, at = body, ""
    names = tuple(r.strip() for r in revisions.split(",")) if at else (None,)
    if not model or any(r == "" for r in names):
        raise ModelLoadError(f"{text}: expected hf:MODEL or hf:MODEL@REV1,REV2,...")
    if len(set(names)) < len(names):
        raise ModelLoadError(f"{text}: a revision is listed twice")
    model = os.path.expanduser(model)
    if os.path.isdir(model):
        if os.path.isfile(os.path.join(model, "run.json")):  # run_folder's RUN_METADATA_FILE
            raise ModelLoadError(f"{text}: {model} is a training run's folder (run.json); give it without hf:")
        if os.path.isfile(os.path.join(model, ".metadata")):  # a run's checkpoint/step-N (DCP)
            raise ModelLoadError(
                f"{text}: {model} is a training run's checkpoint (DCP), not a Hugging Face model; give its run's "
                "folder without hf:"
            )
        for revision in filter(None, names):
            if not os.path.isdir(os.path.join(model, revision)):
                raise ModelLoadError(f"{text}: no such folder {os.path.join(model, revision)}")
        if not os.path.isfile(os.path.join(model, "config.json")) and not glob.glob(
            os.path.join(glob.escape(model), "*", "config.json")
        ):  # neither a model nor its revisions' folders (an analysis): was transformers' `model_type` key error
            raise ModelLoadError(f"{text}: {model} holds no config.json: not a Hugging Face model's folder")
        return HFSpec(os.path.abspath(model), names, trust_remote_code)
    if (
        model.startswith(("/", ".", "~"))
        or model.count("/") > 1
        or ("/" in model and os.path.isdir(model.split("/")[0]))
    ):  # a folder, not a hub id (``namespace/name``)
        raise ModelLoadError(f"{text}: no such folder {model}")
    return HFSpec(model, names, trust_remote_code)


@contextlib.contextmanager
def loading(name: str, local: bool) -> Iterator[None]:
    """What transformers or the hub raise while loading ``name`` (a ``local`` folder, else a hub id), in one line
    naming it; a hub model with the hub unreachable fails at once (``hub_offline``), not after transformers' retries."""
    with contextlib.nullcontext() if local else hub_offline() as offline:
        try:
            yield
        except _LOAD_ERRORS as e:
            if "trust_remote_code" in str(e):
                raise ModelLoadError(
                    f"{name}: ships its own modelling code, which runs only with --trust-remote-code "
                    "(add it if you trust that code)"
                ) from None
            remedy = "download it where the hub is reachable (hf download), or give a local folder"
            where = f"; {offline}: {remedy}" if offline else ""
            raise ModelLoadError(f"{name}: cannot be loaded ({type(e).__name__}: {cause(e, 0)}){where}") from None
