"""The analysis result of one checkpoint: the schema of ``condensation.json``.

Every reader (compare, the quickstart's summary, the figures) uses these classes, never
string keys, so a field renamed or added is one change here. JSON is the serialisation:
``to_json`` / ``from_json`` round-trip exactly.

Two cosine means per layer, named apart everywhere: ``mean_cos`` averages all S²
entries of the mean cosine matrix, the diagonal (1) included, as the paper does;
``mean_cos_offdiag`` averages the S(S−1) pairs of distinct tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import AnalysisError


@dataclass(frozen=True)
class LayerCondensation:
    index: int
    """0 = the embedding output, 1..n = blocks, n+1 = the final norm."""
    name: str
    """``embedding``, ``block_1`` … ``block_n``, ``final_norm``."""
    mean_cos: float
    """Mean of all S² entries of the sequence-averaged cosine matrix (diagonal included)."""
    mean_cos_offdiag: float
    """Mean over the S(S−1) pairs of distinct positions."""
    hist: list[float]
    """Density histogram of the S² entries on ``hist_range`` in ``hist_bins`` bins."""


@dataclass(frozen=True)
class LastN:
    n: int
    mean_cos: float
    """Mean of the last ``n`` layers' ``mean_cos``."""


@dataclass(frozen=True)
class Condensation:
    step: int
    num_sequences: int
    seq_len: int
    layers: list[LayerCondensation]
    spearman: float | None
    """Rank correlation of ``mean_cos`` with depth (None for a constant curve)."""
    kendall: float | None
    last_n: list[LastN]
    hist_bins: int
    hist_range: list[float]
    inputs: dict[str, Any]
    """How the K token windows were chosen, and their ``tokens_sha256``."""
    dtype: str
    device: str
    checkpoint: str
    run: str
    """The run's dump folder."""
    model_args: dict[str, Any] = field(default_factory=dict)

    @property
    def curve(self) -> list[float]:
        """``mean_cos`` by layer, embedding first."""
        return [layer.mean_cos for layer in self.layers]

    @property
    def mlp_width(self) -> int:
        return self.model_args["mlp_hidden_dim"] or 4 * self.model_args["dim"]

    @property
    def tokens_sha256(self) -> str:
        return self.inputs["tokens_sha256"]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> Condensation:
        """Parse a ``condensation.json``; ``AnalysisError`` naming ``source`` when fields are missing."""
        try:
            return cls(**{
                **data,
                "layers": [LayerCondensation(**layer) for layer in data["layers"]],
                "last_n": [LastN(**entry) for entry in data["last_n"]],
            })
        except (KeyError, TypeError) as e:
            raise AnalysisError(f"{source}: not a condensation result of this version ({e})") from None
