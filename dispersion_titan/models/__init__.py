"""Model families registered into TorchTitan, each laid out as TorchTitan's own
(``args`` / ``model`` / ``parallelize`` / ``state_dict_adapter``, and ``get_train_spec``
in the family's ``__init__``)."""

from __future__ import annotations


def register_all() -> None:
    """Register every family's TrainSpec with TorchTitan. Idempotent: TorchTitan refuses
    to register a name twice."""
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

    from . import gpt2

    for name, build in ((gpt2.MODEL_NAME, gpt2.get_train_spec),):
        try:
            get_train_spec(name)
        except ValueError:
            register_train_spec(name, build())
