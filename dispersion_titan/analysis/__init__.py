"""Embedding-condensation analysis of saved checkpoints (``python -m dispersion_titan.analyze``).

One module per job: ``inputs`` picks the token sequences, ``measure`` reduces hidden
states to per-layer mean cosine matrices (and ``geometry`` to effective rank and MEV),
``statistics`` turns those into the paper's numbers (typed by ``condensation_schema``),
``result_files`` / ``figures`` / ``tensorboard`` write them (through ``run_folder.outputs``),
``runner`` analyses one run, ``hf_model`` / ``hf_revisions`` a Hugging Face model,
``compare`` sets several runs side by side and ``size_series`` models of several sizes.
"""

from dispersion_titan.utils.errors import AnalysisError

DEFAULT_GEOMETRY_SEQUENCES = 2
"""Sequences of the K whose effective rank and MEV are averaged (see ``measure``)."""

ANALYSIS_PROTOCOLS = ("default", "paper")
"""``--protocol``: our inputs, or the authors' (see ``inputs``)."""

LAYER_POINTS = ("all", "hidden_states")
"""Which layers the depth trend (Spearman, Kendall) runs over: ``all`` (embedding, blocks 1…n,
final norm: n + 2 points) or ``hidden_states``, transformers' n + 1 (the last block's own output
left out, as the authors' ``output_hidden_states`` gives them); see ``statistics.depth_points``."""

__all__ = ["ANALYSIS_PROTOCOLS", "DEFAULT_GEOMETRY_SEQUENCES", "LAYER_POINTS", "AnalysisError"]
