"""The analysis result of one model state, the schema of ``condensation.json`` (``OUT/step-N/`` or
``rev-NAME/``), and its readers: every reader uses these classes, never string keys, so a field renamed
or added is one change here.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any

from ..run_folder.checkpoints import identity_changed
from ..run_folder.outputs import (
    FORMAT,
    FORMAT_KEY,
    STEP_FOLDER,
    check_format,
    read_result_folders,
)
from ..run_folder.owners import results_run
from ..utils.errors import AnalysisError
from ..utils.records import finite_number
from .inputs import located

RESULT_FILE = "condensation.json"
LEFT_OUT = {"protocol": "default", "layer_points": "all"}
"""Inputs that analyses made before every option was recorded left out where they were these defaults: read as
them, so that compare, family and the paper's figures take an old analysis alike."""


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
    effective_rank: float | None = None
    """``measure.effective_rank`` averaged over ``geometry_sequences`` sequences (None: not measured)."""
    mev: float | None = None
    """``measure.max_explainable_variance``, averaged likewise."""


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
    """The run's dump folder; for a Hugging Face model, the model id or folder."""
    model_args: dict[str, Any] = field(default_factory=dict)
    """The model's shape (``hf_model.model_args`` for a Hugging Face model)."""
    model: str | None = None
    """The Hugging Face model id or folder (None for our runs)."""
    revision: str | None = None
    """The Hugging Face revision analysed (None: the default one, or one of our runs)."""
    n_params: int | None = None
    """Parameter count (each tied matrix once)."""
    geometry_sequences: int = 0
    """How many of the K sequences ``effective_rank`` and ``mev`` average over."""
    checkpoint_identity: str | None = None
    """``checkpoints.checkpoint_identity`` of the checkpoint analysed, or of a Hugging Face model's local folder
    (``model_folder``; None: a hub model, or one analysed before its folder's was recorded)."""

    @property
    def label(self) -> str:
        """``step N`` for a checkpoint of a run, the revision name for a Hugging Face model."""
        return f"step {self.step}" if self.model is None else self.revision or "default revision"

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

    def changed(self, source: str) -> bool:
        """Whether ``source`` no longer holds the weights this measured: another checkpoint, or another model saved over
        a Hugging Face model's folder (a hub model's taken as it was: no identity recorded)."""
        return self.checkpoint_identity is not None and identity_changed(
            self.checkpoint_identity, source, model_folder=self.model is not None
        )

    def located_inputs(self, folder: str) -> dict[str, Any]:
        """Its inputs, their files located (``inputs.located``), as ``family`` and the paper's rows compare them: one
        an earlier version recorded relative is read from the current folder, else from the run whose analyses
        ``folder`` holds."""
        return located(self.inputs, None if self.model else results_run(folder, self.run))

    def to_json(self) -> dict[str, Any]:
        return {FORMAT_KEY: FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> Condensation:
        """Parse a ``condensation.json``; ``AnalysisError`` naming ``source`` when fields are missing, or a number is
        none (a hand edit's NaN or text)."""
        check_format(data, source)
        try:
            result = cls(
                **{
                    **{key: value for key, value in data.items() if key != FORMAT_KEY},
                    "inputs": {**LEFT_OUT, **data["inputs"]},
                    "layers": [LayerCondensation(**layer) for layer in data["layers"]],
                    "last_n": [LastN(**entry) for entry in data["last_n"]],
                }
            )
        except (KeyError, TypeError) as e:
            raise AnalysisError(f"{source}: not a condensation result of this version ({e})") from None
        records = [("", result), *((f"layers[{i}].", layer) for i, layer in enumerate(result.layers))]
        records += [(f"last_n[{i}].", entry) for i, entry in enumerate(result.last_n)]
        try:
            for prefix, record in records:
                _check_numbers(record, prefix)
        except ValueError as e:
            raise AnalysisError(f"{source}: unreadable ({e}); restore it, or remove it and rerun") from None
        return result


_type_hints = functools.cache(typing.get_type_hints)
"""A class's resolved field types, once per class: a file holds a record per layer and per step."""


def _check_numbers(record: Any, prefix: str) -> None:
    """Each number field of ``record`` (``int``, ``float``, either or None, ``list[float]``) a finite number; its
    types resolved, not read from annotation strings (which differ without ``from __future__ import annotations``)."""
    for name, kind in _type_hints(type(record)).items():
        value = getattr(record, name)
        if kind == list[float]:
            items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        elif kind in (int, float) or (value is not None and kind in (int | None, float | None)):
            items = [(None, value)]
        else:
            continue
        for i, item in items:
            finite_number(item, f"{prefix}{name}{'' if i is None else f'[{i}]'}")


def read_analyses(out: str) -> dict[str, Condensation]:
    """Every analysis stored in ``out``, by result folder name, in name order."""
    return read_result_folders(
        out, RESULT_FILE, lambda data, path: ((result := Condensation.from_json(data, path)), result.step)
    )


def read_results(out: str) -> dict[int, Condensation]:
    """Every checkpoint's analysis stored in ``out``, by step."""
    steps = {int(m.group(1)): r for name, r in read_analyses(out).items() if (m := STEP_FOLDER.match(name))}
    return dict(sorted(steps.items()))
