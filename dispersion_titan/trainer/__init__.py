"""The training side, imported only by ``python -m dispersion_titan.train`` (and its launcher,
``python -m dispersion_titan.torchrun``): TorchTitan's Trainer with the dispersion objective
(``trainer``, ``objective``), the baselines, signal-driven checkpoints (``preemption``) and
sequence-parallel gathers. TorchTitan's extension points
it plugs into live one floor down, in ``components``.

Import-free, so ``train`` can check a config without building the trainer.
"""
