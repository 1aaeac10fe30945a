"""Model families registered into TorchTitan, each under a name of its own: our ``gpt2``
(laid out as TorchTitan's own families: ``args`` / ``model`` / ``parallelize`` /
``state_dict_adapter``), and TorchTitan's Qwen3 and Llama 3 as they are, as ``qwen3_dispersion``
and ``llama3_dispersion`` (TorchTitan's ``qwen3`` and ``llama3`` stay TorchTitan's). Every
family's ``get_train_spec`` (in its ``__init__``) pairs its model with dispersion_titan's
data, tokenizer and trainer-side builders (``spec``)."""

from __future__ import annotations

import functools
from importlib import import_module
from types import ModuleType

FAMILIES = ("gpt2", "qwen3_dispersion", "llama3_dispersion")


def family(name: str) -> ModuleType:
    """The family's package (``get_train_spec``, ``MODEL_NAME``)."""
    return import_module(f"{__name__}.{name}")


@functools.cache
def register_all() -> None:
    """Register every family's TrainSpec with TorchTitan, once per process, under names TorchTitan
    does not use (registered specs would take precedence over its built-in ones of the same name);
    registering a name twice raises, so a clash is loud."""
    from torchtitan.protocols.train_spec import register_train_spec

    for name in FAMILIES:
        register_train_spec(name, family(name).get_train_spec())
