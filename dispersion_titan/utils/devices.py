"""No silent CPU fallback: where the environment says the job has GPUs but torch sees none (a CPU
wheel, a driver fault), training stops in one line unless ``DISPERSION_TITAN_ALLOW_CPU=1``. And
``--device`` of the commands that load checkpoints.
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
# For CPU training processes: glibc would hand each step's ~200 MB of logits back to the kernel, a
# third of a run's time; kept in the heap, a 15-step run took 15 CPU seconds, not 21 (glibc 2.36).
CPU_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
_NO_DEVICES = ("", "-1", "NoDevFiles", "none")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "autocast": "float32"}  # ``--dtype``: torch's name of each
AUTOCAST = "autocast"
"""``evaluate --dtype autocast``: fp32 weights, the forward under bf16 autocast (``runner.BF16_AUTOCAST``)."""


def _count_ids(value: str) -> int:
    """``0,1,3`` -> 3 (Slurm also writes ranges such as ``0-3``)."""
    total = 0
    for item in filter(None, (v.strip() for v in value.split(","))):
        first, dash, last = item.partition("-")
        total += int(last) - int(first) + 1 if dash and first.isdigit() and last.isdigit() else 1
    return total


def allocated_gpus(env: Mapping[str, str] = os.environ) -> tuple[int, str] | None:
    """(number of GPUs, the signal that says so) when this node was given GPUs, else None."""
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node.isdigit() and int(on_node) > 0:
        return int(on_node), "SLURM_GPUS_ON_NODE"
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name, "").strip()
        if value not in _NO_DEVICES:
            return _count_ids(value), name
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return (found, "nvidia-smi -L") if found else None


def check_gpus_usable(env: Mapping[str, str] = os.environ) -> None:
    """``DeviceError`` when GPUs were allocated but torch sees none, unless ``ALLOW_CPU_ENV``."""
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


def check_device_map(device_map: str | None, device: str | None) -> None:
    """``--device-map auto`` spreads a model over the GPUs, whatever ``--device`` says: not with ``--device cpu``."""
    if device_map and device and device.split(":")[0] == "cpu":
        raise DeviceError(
            f"--device-map: {device_map} spreads the model over the GPUs, not with --device cpu; drop one"
        )


def resolve_device(device: str | None, dtype: str) -> torch.device:
    """``--device`` (default CUDA when available; its parser checked that torch reads it) and ``--dtype`` checked
    against this machine."""
    import torch

    resolved = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"--device: {device}: CUDA is not available here")
    if resolved.type == "cuda" and (resolved.index or 0) >= (count := torch.cuda.device_count()):
        has = f"this machine has {count} GPU{'s' * (count != 1)}"
        raise DeviceError(f"--device: {device}: {has}; give one of cuda:0 to cuda:{count - 1}")
    if dtype in ("bf16", AUTOCAST) and resolved.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DeviceError(
            f"--dtype: {dtype} needs bf16, which is not supported by {torch.cuda.get_device_name(resolved)}"
        )
    return resolved
