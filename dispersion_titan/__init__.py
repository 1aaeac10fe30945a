"""dispersion_titan: GPT-2-like pre-training with a dispersion loss on TorchTitan 0.2.2,
and condensation analysis of the checkpoints.

The package root holds only commands (``python -m dispersion_titan.<command>``, or the
``dispersion-titan`` console script). Kept import-free on purpose: each command pays
only its own imports.
"""
