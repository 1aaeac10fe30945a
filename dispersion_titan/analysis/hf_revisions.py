"""``analyze hf:MODEL[@REV1,REV2,...] --out DIR``: the revisions of a Hugging Face model,
measured like the checkpoints of a run (same texts, windows, statistics, files), each
cached in ``OUT/rev-NAME/`` under (model, revision, inputs hash) so reruns skip it."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from ..run_folder.owners import FolderOwner
from ..utils.errors import ArgumentError, ModelLoadError
from ..utils.hub import parse_spec
from . import hf_model
from .measure import LayeredModel
from .runner import DTYPES, Analysis, AnalyzeOptions, Unit, fitted_inputs

DEFAULT_REVISION_FOLDER = "rev-default"


def _folder(revision: str | None) -> str:
    return f"rev-{revision.replace('/', '--')}" if revision else DEFAULT_REVISION_FOLDER


class HFAnalysis(Analysis):
    noun = "revision"

    def __init__(self, options: AnalyzeOptions):
        if options.steps is not None:
            raise ArgumentError("--steps: not used with hf: models (list revisions: hf:MODEL@REV1,REV2)")
        if not options.out:
            raise ArgumentError("--out: required with hf: models")
        if options.device_map and importlib.util.find_spec("accelerate") is None:
            raise ModelLoadError("--device-map auto needs accelerate: pip install 'dispersion_titan[hf]'")
        self.spec = parse_spec(options.target, options.trust_remote_code)
        first = self.spec.revisions[0]
        config = hf_model.load_config(self.spec, first)
        self.args = hf_model.model_args(config)
        self.n_params = hf_model.count_parameters(self.spec, config)
        dtype = options.dtype or ("bf16" if self.n_params > hf_model.BF16_ABOVE_PARAMS else "fp32")
        inputs = fitted_inputs(options, self.args["max_seq_len"], f"max_position_embeddings of {self.spec.model}")
        units = [
            Unit(hf_model.revision_step(rev, i), _folder(rev), self.spec.location(rev)[0], rev)
            for i, rev in enumerate(self.spec.revisions)
        ]
        super().__init__(
            options,
            units,
            os.path.basename(os.path.normpath(self.spec.model)),
            options.out,
            os.path.join(options.out, "tb"),
            inputs,
            dtype,
            FolderOwner("analysis", self.spec.model),
            model=self.spec.model,
            encode=hf_model.load_encoder(self.spec, first, inputs.protocol == "paper"),
        )

    def load(self, unit: Unit) -> LayeredModel:
        return hf_model.load_pretrained(
            self.spec, unit.revision, DTYPES[self.dtype], self.device, self.options.device_map
        )

    def metadata(self, unit: Unit) -> dict[str, Any]:
        return {"run": self.spec.model, "model_args": self.args, "n_params": self.n_params, "model": self.spec.model}
