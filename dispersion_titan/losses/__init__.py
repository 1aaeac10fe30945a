"""Auxiliary losses on hidden states: the dispersion loss family and its condensation probe."""

from dispersion_titan.losses.dispersion import (
    KERNELS,
    NORM_EPS,
    PRECISIONS,
    VARIANTS,
    KernelUnavailable,
    TorchStrips,
    dispersion_loss,
    dispersion_loss_reference,
    mean_offdiag_cosine,
)

__all__ = [
    "KERNELS",
    "NORM_EPS",
    "PRECISIONS",
    "VARIANTS",
    "KernelUnavailable",
    "TorchStrips",
    "dispersion_loss",
    "dispersion_loss_reference",
    "mean_offdiag_cosine",
]
