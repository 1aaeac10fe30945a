"""The training side: TorchTitan's Trainer with the dispersion objective (``trainer``,
``objective``, ``metrics``), the held-out pass (``validate``), signal-driven checkpoints
(``preemption``), sequence-parallel gathers, offline checkpoint access (``checkpoints``)
and ``titan_compat``, the one module allowed to touch TorchTitan internals.

Import-free: analysis and conversion import ``checkpoints`` without the trainer.
"""
