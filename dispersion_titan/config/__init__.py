"""Configuration without TorchTitan. This package is the ``job.custom_config_module`` TorchTitan
loads for its ``JobConfig``, so it re-exports the schema and imports nothing heavy.
"""

from dispersion_titan.config.schema import Baseline, Checkpoint, Dispersion, JobConfig, Model

__all__ = ["Baseline", "Checkpoint", "Dispersion", "JobConfig", "Model"]
