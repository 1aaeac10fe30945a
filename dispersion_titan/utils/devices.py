"""No silent CPU fallback: refuse to train on CPU where the job was given GPUs.

TorchTitan's device selection (and ``titan_compat.apply``'s CPU shim) follows
``torch.cuda.is_available()``. On a GPU node with a CPU-only torch wheel, a driver
fault or hidden devices that is false, and a job would train on CPU without a word.
Here the environment's own signals of allocated GPUs are read first; where any is
present and torch sees no GPU, training stops in one line. ``DISPERSION_TITAN_ALLOW_CPU=1``
allows CPU anyway (the tests, the quickstart, a local Slurm without GPUs).
``resolve_device`` picks the device of the commands that load checkpoints (``--device``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .errors import DeviceError

if TYPE_CHECKING:
    import torch

ALLOW_CPU_ENV = "DISPERSION_TITAN_ALLOW_CPU"
# For processes that train on CPU (the quickstart's jobs, the tests'). glibc hands every
# allocation above its mmap threshold back to the kernel when freed, so the ~200 MB of
# logits of each step arrive as fresh zeroed pages: on CPU that made a third of a run's
# time kernel time. Keeping them in the heap took a 15-step run from 21 to 15 CPU seconds
# and a 6-step debug run from 24.6 to 17.1 (glibc 2.36). Read at process start.
CPU_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
_NO_DEVICES = ("", "-1", "NoDevFiles", "none")


def _count_ids(value: str) -> int:
    """``0,1,3`` -> 3 (Slurm also writes ranges such as ``0-3``)."""
    total = 0
    for item in filter(None, (v.strip() for v in value.split(","))):
        first, dash, last = item.partition("-")
        total += int(last) - int(first) + 1 if dash and first.isdigit() and last.isdigit() else 1
    return total


def _nvidia_smi_gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def allocated_gpus(env: Mapping[str, str] = os.environ) -> tuple[int, str] | None:
    """(number of GPUs, the signal that says so) when this node was given GPUs, else None."""
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node.isdigit() and int(on_node) > 0:
        return int(on_node), "SLURM_GPUS_ON_NODE"
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name, "").strip()
        if value not in _NO_DEVICES:
            return _count_ids(value), name
    found = _nvidia_smi_gpus()
    return (found, "nvidia-smi -L") if found else None


def check_gpus_usable(env: Mapping[str, str] = os.environ) -> None:
    """Raise ``DeviceError`` when GPUs were allocated but torch sees none, unless
    ``DISPERSION_TITAN_ALLOW_CPU=1``."""
    import torch

    if torch.cuda.is_available() or env.get(ALLOW_CPU_ENV) == "1":
        return
    allocated = allocated_gpus(env)
    if allocated is None:
        return
    count, source = allocated
    where = f"a node with {count} allocated GPU{'s' * (count != 1)} ({source})"
    if torch.version.cuda is None:
        cause, fix = f"torch {torch.__version__} is a CPU-only build", "install a CUDA build of torch"
    else:
        cause, fix = (
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU",
            "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES",
        )
    raise DeviceError(f"{cause} on {where}: {fix}, or set {ALLOW_CPU_ENV}=1 to train on CPU anyway")


def resolve_device(device: str | None, dtype: str) -> torch.device:
    """The device of a command that loads checkpoints (``--device``, ``--dtype``): CUDA when
    available unless ``--device`` says otherwise; bf16 only where supported."""
    import torch

    try:
        resolved = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise DeviceError(f"--device: {e}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"--device: {device}: CUDA is not available here")
    if dtype == "bf16" and resolved.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DeviceError(f"--dtype: bf16 is not supported by {torch.cuda.get_device_name(resolved)}")
    return resolved
