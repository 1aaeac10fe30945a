"""Configuration without TorchTitan. This package is the ``job.custom_config_module`` TorchTitan
loads for its ``JobConfig`` (only that), so it re-exports it and imports nothing heavy.
"""

from dispersion_titan.config.schema import JobConfig as JobConfig
