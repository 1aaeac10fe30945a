"""The training side, imported only by ``python -m dispersion_titan.train``: TorchTitan's
Trainer with the dispersion objective (``trainer``, ``objective``), the checks run on the
job config before any process group (``config_checks``), the baselines, signal-driven
checkpoints (``preemption``) and sequence-parallel gathers. TorchTitan's extension points
it plugs into live one floor down, in ``components``.

Import-free, so ``train`` can check a config without building the trainer.
"""
