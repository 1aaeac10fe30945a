"""Auxiliary losses on hidden states: the dispersion loss family and its condensation probe."""

from dispersion_titan.losses.dispersion import (
    TorchStrips,
    dispersion_loss,
    dispersion_loss_reference,
    mean_offdiag_cosine,
)
from dispersion_titan.losses.variants import PRECISIONS, VARIANTS, precision_error

__all__ = [
    "PRECISIONS",
    "VARIANTS",
    "TorchStrips",
    "dispersion_loss",
    "dispersion_loss_reference",
    "mean_offdiag_cosine",
    "precision_error",
]
