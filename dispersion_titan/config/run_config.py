"""``RunConfig``: TorchTitan's ``JobConfig`` with our sections, for annotations only (TorchTitan builds
the merged class at run time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchtitan.config import JobConfig as TitanJobConfig

    from .schema import JobConfig as OwnSections

    class RunConfig(OwnSections, TitanJobConfig):
        """Every section and key of TorchTitan's, and ours."""
