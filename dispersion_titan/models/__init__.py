"""Model families registered into TorchTitan under names of their own: our ``gpt2``, and TorchTitan's
Qwen3 and Llama 3 as ``qwen3_dispersion`` and ``llama3_dispersion``, each with our data, tokenizer and
builders (``spec``)."""

from __future__ import annotations

import functools
from importlib import import_module
from types import ModuleType

FAMILIES = ("gpt2", "qwen3_dispersion", "llama3_dispersion")


def family(name: str) -> ModuleType:
    """The family's package (``get_train_spec``, ``MODEL_NAME``, ``HF_MODEL_TYPE``, ``hf_config``)."""
    return import_module(f"{__name__}.{name}")


@functools.cache
def register_all() -> None:
    """Register every family's TrainSpec, once per process, under names TorchTitan does not use."""
    from torchtitan.protocols.train_spec import register_train_spec

    for name in FAMILIES:
        register_train_spec(name, family(name).get_train_spec())
