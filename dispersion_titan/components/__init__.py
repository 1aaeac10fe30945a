"""The ground floor under ``models/`` and ``trainer/``, mirroring ``torchtitan.components``:
the TrainSpec's builders (``metrics``, ``optimizers``, ``validate``) and ``titan_compat``,
the one module allowed to touch TorchTitan internals.

Import-free, so a model family can take one builder without the rest.
"""
