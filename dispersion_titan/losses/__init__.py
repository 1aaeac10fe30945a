"""Auxiliary losses on hidden states: the dispersion loss family and its condensation probe."""

from dispersion_titan.losses.dispersion import (
    VARIANTS,
    dispersion_loss,
    dispersion_loss_reference,
    mean_offdiag_cosine,
)

__all__ = ["VARIANTS", "dispersion_loss", "dispersion_loss_reference", "mean_offdiag_cosine"]
