"""TorchTitan's extension points, as ``torchtitan.components``: the TrainSpec's builders and
``titan_compat``, the one module touching TorchTitan internals. Import-free."""
