"""The CPU compatibility layer is written for one TorchTitan version; it must say so loudly."""

from __future__ import annotations

import importlib.metadata

import pytest

from dispersion_titan import compat


def test_installed_torchtitan_is_the_pinned_release():
    assert importlib.metadata.version("torchtitan") == compat.TORCHTITAN_VERSION == "0.2.2"
    compat.check_torchtitan_version()


def test_other_torchtitan_version_fails_loudly(monkeypatch):
    monkeypatch.setattr(compat, "version", lambda name: "0.3.0")
    with pytest.raises(RuntimeError, match=r"requires torchtitan==0\.2\.2, found 0\.3\.0"):
        compat.check_torchtitan_version()


def test_cpu_shim_rebinds_every_module_that_captured_the_device():
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("the shim only acts without a GPU")
    compat.apply()
    for name in compat._MODULES_BINDING_DEVICE:
        assert sys.modules[name].device_type == "cpu", name
    from torchtitan.components.metrics import DeviceMemoryMonitor

    monitor = DeviceMemoryMonitor()
    assert monitor.device.type == "cpu" and monitor.device_capacity > 0
    assert monitor.get_peak_stats().max_reserved_gib > 0
