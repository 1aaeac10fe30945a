"""``RunConfig``: the type of the job config a launch parses, TorchTitan's ``JobConfig`` with
our sections merged in (``job.custom_config_module``), so that a reader (and a type checker)
can jump from ``config.dispersion.coeff`` to its field. For annotations only: TorchTitan builds
the merged class at run time (``titan_compat.merged_job_config_class``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchtitan.config import JobConfig as TitanJobConfig

    from .schema import JobConfig as OwnSections

    class RunConfig(OwnSections, TitanJobConfig):
        """Every section and key of TorchTitan's, and ours: ``[dispersion]``, ``[baseline]``, the
        extra ``[model]``, ``[job]``, ``[training]``, ``[validation]`` and ``[checkpoint]`` keys."""
