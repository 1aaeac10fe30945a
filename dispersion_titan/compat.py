"""Everything that makes TorchTitan 0.2.2 run on a CPU-only machine, in one place.

TorchTitan 0.2.2 assumes CUDA: it picks ``device_type``/``device_module`` when
``torchtitan.tools.utils`` is imported (falling back to ``"cuda"``) and several
modules copy those names at import time. Its memory monitor also calls CUDA-only
functions, and FSDP2 reduce-scatters with ``PREMUL_SUM``, which gloo lacks.

``apply()`` is idempotent and is a no-op for device selection when CUDA is
available, so the production path (CUDA + NCCL) is untouched.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import types
from importlib.metadata import version

import torch

TORCHTITAN_VERSION = "0.2.2"

# Modules that bind ``device_type``/``device_module`` by name at import time.
_MODULES_BINDING_DEVICE = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.tools.profiling",
)

_applied = False


def check_torchtitan_version() -> None:
    """Fail loudly if the TorchTitan underneath is not the one this shim was written for."""
    found = version("torchtitan")
    if found != TORCHTITAN_VERSION:
        raise RuntimeError(
            f"dispersion_titan requires torchtitan=={TORCHTITAN_VERSION}, found {found}; "
            "its CPU compatibility layer (dispersion_titan/compat.py) must be re-checked"
        )


def _total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_memory_stats(device: object = None) -> dict[str, int]:
    """Peak resident set size of this process, reported like the CUDA allocator's stats."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "active_bytes.all.peak": peak,
        "reserved_bytes.all.peak": peak,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }


def _cpu_device_module() -> types.SimpleNamespace:
    """``torch.cpu`` plus the CUDA-module functions TorchTitan calls on its device module."""
    return types.SimpleNamespace(
        set_device=lambda device: None,
        current_device=lambda: 0,
        synchronize=torch.cpu.synchronize,
        device_count=lambda: 1,
        is_available=lambda: True,
        get_device_name=lambda device=None: f"CPU ({platform.processor() or platform.machine()})",
        get_device_properties=lambda device=None: types.SimpleNamespace(
            total_memory=_total_memory_bytes()
        ),
        memory_stats=_cpu_memory_stats,
        reset_peak_memory_stats=lambda device=None: None,
        empty_cache=lambda: None,
        memory=types.SimpleNamespace(
            _record_memory_history=lambda *a, **k: None, _snapshot=lambda: {}
        ),
    )


def uses_cpu() -> bool:
    return not torch.cuda.is_available()


def apply() -> None:
    """Point TorchTitan at the CPU when no GPU is present. Must run before a Trainer is built."""
    global _applied
    if _applied:
        return
    check_torchtitan_version()
    if uses_cpu():
        import torchtitan.components.metrics  # noqa: F401  (import so we can rebind below)
        import torchtitan.distributed.utils  # noqa: F401
        import torchtitan.tools.profiling  # noqa: F401

        cpu_module = _cpu_device_module()
        for name in _MODULES_BINDING_DEVICE:
            module = sys.modules[name]
            module.device_type = "cpu"
            if hasattr(module, "device_module"):
                module.device_module = cpu_module
        # DeviceMemoryMonitor's default argument captured "cuda:0" at import time.
        monitor = torchtitan.components.metrics.DeviceMemoryMonitor.__init__
        monitor.__defaults__ = ("cpu:0",)
    _applied = True


def backend_needs_sum_reduction() -> bool:
    """gloo has no PREMUL_SUM, which FSDP2 uses for its reduce-scatter."""
    return torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo"
