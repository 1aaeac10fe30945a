"""Configuration: the extra TOML schema (``schema``), the command-line helpers that run
before TorchTitan is imported (``cli``) and the run grid (``grid``). The checks run
before any process group starts live with the training side (``job_config.checks``).

TorchTitan loads ``job.custom_config_module`` (``dispersion_titan.config``) and reads its
``JobConfig``: this package is that module, so it re-exports the schema and imports
nothing heavy.
"""

from dispersion_titan.config.schema import Baseline, Checkpoint, Dispersion, JobConfig, Model

__all__ = ["Baseline", "Checkpoint", "Dispersion", "JobConfig", "Model"]
