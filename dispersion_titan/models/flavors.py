"""Flavor tables and the ``[model]`` shape overrides, shared by every family. A lookup returns a fresh
copy (TorchTitan hands out shared instances); a key a family has no field for is refused, not ignored.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from ..config.schema import Model
from ..utils.errors import ConfigError
from . import family

A = TypeVar("A")


class Flavors(Mapping[str, A], Generic[A]):
    """``table``'s flavors as fresh ``cls`` instances, only those ``offered`` accepts."""

    def __init__(
        self, table: Mapping[str, Any], cls: type[A], offered: Callable[[Any], bool] = lambda args: True
    ) -> None:
        self.table = {name: args for name, args in table.items() if offered(args)}
        self.cls = cls

    def __getitem__(self, name: str) -> A:
        source = self.table[name]
        return self.cls(**{f.name: copy.deepcopy(getattr(source, f.name)) for f in dataclasses.fields(source)})

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


class ShapeOverrides:
    """Mixin for a family's model arguments: the ``[model]`` keys it takes, and how."""

    FAMILY: ClassVar[str]
    OVERRIDES: ClassVar[dict[str, str]]
    """``[model]`` key -> this family's field; keys missing here are refused when set."""
    REFUSED_BECAUSE: ClassVar[dict[str, str]] = {}
    """Why a ``[model]`` key is not available for this family (the default says it has no such field)."""
    HF_FIELDS: ClassVar[dict[str, str]]
    """config.json field -> ``[model]`` key: what the export writes and a loaded folder's config.json is held to."""

    def value_of(self, key: str) -> Any:
        """This model's value of a ``[model]`` key: the MLP width and key/value heads it computes."""
        if key == "n_kv_heads":
            return getattr(self, key, None) or self.n_heads  # type: ignore[attr-defined]
        return getattr(self, "hidden_dim" if key == "mlp_hidden_dim" else key)

    def least_parameters(self) -> int:
        """A floor of this model's parameter count from its shape alone (no model built): every family's blocks hold
        at least two MLP matrices (a gated MLP three) besides attention, and it embeds its tokens."""
        dim = self.value_of("dim")
        return self.value_of("n_layers") * 2 * dim * self.value_of("mlp_hidden_dim") + self.value_of("vocab_size") * dim

    def hf_config(self, model_type: str, architecture: str, tokenizer: Any, **fields: Any) -> Any:
        """transformers' config of this shape (``HF_FIELDS``, then ``fields``), EOS also as BOS."""
        from transformers import AutoConfig

        shape = {field: self.value_of(key) for field, key in self.HF_FIELDS.items()} | fields
        eos = tokenizer.eos_id
        return AutoConfig.for_model(
            model_type, **shape, bos_token_id=eos, eos_token_id=eos, architectures=[architecture]
        )

    def apply_overrides(self, model_config: Any) -> None:
        for key in (*SHAPE_KEYS, *DROPOUT_KEYS):
            value = getattr(model_config, key, None)
            if value is None or (value == 0 and not isinstance(value, bool)):
                continue
            field = self.OVERRIDES.get(key)
            if field is None and getattr(self, key, None) == value:
                continue  # what this family does anyway (e.g. llama3 untied)
            if field is None:
                why = self.REFUSED_BECAUSE.get(key, f"{self.FAMILY} has no such setting")
                raise ConfigError(f"model.{key}: {why} (got {value!r}; leave it unset)")
            setattr(self, field, value)


DROPOUT_KEYS = {"attn_dropout": "attn_pdrop", "resid_dropout": "resid_pdrop", "embd_dropout": "embd_pdrop"}
"""The ``[model]`` dropout probabilities (gpt2 only) and the Hugging Face ``GPT2Config`` fields they map to."""
SHAPE_KEYS = tuple(f.name for f in dataclasses.fields(Model) if f.name not in DROPOUT_KEYS)
"""The other ``[model]`` keys (``config.schema.Model``): those that change a flavor's shape."""


def pretrained_folder(job_config: Any) -> tuple[str, str] | None:
    """The option naming the Hugging Face folder whose weights TorchTitan loads, and the folder (None: it loads
    none): ``checkpoint.initial_load_path``, else ``model.hf_assets_path``."""
    checkpoint = job_config.checkpoint
    if not (checkpoint.enable and checkpoint.initial_load_in_hf):
        return None
    if checkpoint.initial_load_path:
        return "checkpoint.initial_load_path", checkpoint.initial_load_path
    return "model.hf_assets_path", job_config.model.hf_assets_path or ""


def pretrained_config(job_config: Any) -> dict[str, Any]:
    """``config.json`` of the Hugging Face folder whose weights TorchTitan loads ({} when it loads none or it
    has none); one that is no JSON object is named in one line."""
    key, folder = pretrained_folder(job_config) or ("", "")
    path = os.path.join(folder, "config.json")
    if not (key and os.path.isfile(path)):
        return {}
    try:
        with open(path, "rb") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}: {path}: unreadable ({e}); copy the model's config.json again") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{key}: {path}: not a JSON object; copy the model's config.json again")
    return config


def args_from_dict(family_name: str, fields: dict[str, Any]) -> Any:
    """A family's arguments from their ``dataclasses.asdict`` form (``run.json``), nested ones too."""
    cls = family(family_name).get_train_spec().model_args.cls
    values = dict(fields)
    for f in (f for f in dataclasses.fields(cls) if f.name in values):
        value, number = values[f.name], isinstance(f.default, (int, float))
        # a hand-edited file: a text for a number fails deep in torch
        if isinstance(f.default, (int, float, str)) and value is not None and number != isinstance(value, (int, float)):
            raise ValueError(f"model_args.{f.name}: {value!r} is no {'number' if number else 'text'}")
        if f.default_factory is not dataclasses.MISSING and isinstance(value, dict):
            default = f.default_factory()
            if dataclasses.is_dataclass(default):
                values[f.name] = type(default)(**value)
    return cls(**values)
