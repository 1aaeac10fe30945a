"""Embedding-condensation analysis of saved checkpoints (``python -m dispersion_titan.analyze``).

One module per job: ``inputs`` picks the token sequences, ``measure`` reduces hidden
states to per-layer mean cosine matrices, ``statistics`` turns those into the
paper's numbers, ``results`` / ``figures`` / ``tensorboard`` write them, ``runner``
analyses one run and ``compare`` sets several runs side by side.
"""

from dispersion_titan.errors import AnalysisError

__all__ = ["AnalysisError"]
