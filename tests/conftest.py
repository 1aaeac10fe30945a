"""Fixtures shared by several test modules."""

from __future__ import annotations

import datasets
import pytest

from dispersion_titan.data.tokens import CACHE_ENV


@pytest.fixture
def private_caches(tmp_path, monkeypatch):
    """Keep datasets' Arrow cache and our token cache inside the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "token_cache"))
