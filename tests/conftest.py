"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import pytest

from dispersion_titan.data.tokens import CACHE_ENV
from helpers import REFERENCE_STEPS, SCHEDULE, torchrun


@pytest.fixture(scope="session", autouse=True)
def session_token_cache(tmp_path_factory):
    """One token cache for the session's jobs, never the user's: the embedded corpus is
    tokenised once, not by every rank of every launch. Tests of the cache itself use
    ``private_caches``."""
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("token_cache"))
    yield
    if before is None:
        del os.environ[CACHE_ENV]
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture
def private_caches(tmp_path, monkeypatch):
    """Keep datasets' Arrow cache and our token cache inside the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "token_cache"))


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Path:
    """The uninterrupted 2-process run (checkpoints 0, 2, 4, 6 and the final weights-only 8) that the crash,
    corruption and resume tests reproduce step for step: launched once per session."""
    dump = tmp_path_factory.mktemp("reference") / "run"
    torchrun(dump, 2, "--training.steps", str(REFERENCE_STEPS), *SCHEDULE, "--validation.no-enable")
    return dump
