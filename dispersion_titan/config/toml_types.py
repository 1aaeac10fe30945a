"""Keys and types of a TOML file against the JobConfig dataclasses, which TorchTitan does not check;
our own sections (``OWN_SECTIONS``) before TorchTitan is imported."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal

from ..utils.errors import ConfigError
from .schema import JobConfig

OWN_SECTIONS = ("dispersion", "baseline")
"""Sections TorchTitan does not have: our schema alone knows every key of them."""


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # annotations we do not model are left to TorchTitan


def check_toml_types(config_cls: type, values: dict[str, Any], source: str, prefix: str = "") -> None:
    """Every key of ``values`` (from ``source``) is a field of ``config_cls`` with a value of its type."""
    hints = typing.get_type_hints(config_cls)
    known = {f.name for f in dataclasses.fields(config_cls)}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if key not in known:
            what = "key" if prefix else "section"
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {prefix}{close[0]}?" if close else ""
            raise ConfigError(f"{name}: unknown {what} in {source}{hint}")
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: expected a [{name}] table, got {value!r} (in {source})")
            check_toml_types(annotation, value, source, prefix=f"{name}.")
        elif not _matches(value, annotation):
            if typing.get_origin(annotation) is Literal:
                raise ConfigError(f"{name}: {value!r} is not one of {typing.get_args(annotation)} (in {source})")
            expected = getattr(annotation, "__name__", str(annotation))
            raise ConfigError(f"{name}: expected {expected}, got {value!r} (in {source})")


def check_own_sections(values: dict[str, Any], source: str) -> None:
    """``check_toml_types`` on the sections that are wholly ours, before TorchTitan is imported."""
    check_toml_types(JobConfig, {k: v for k, v in values.items() if k in OWN_SECTIONS}, source)
