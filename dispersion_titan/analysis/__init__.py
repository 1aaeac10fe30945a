"""Embedding-condensation analysis of saved checkpoints (``python -m dispersion_titan.analyze``);
docs/code_map.md says which module does what."""

DEFAULT_GEOMETRY_SEQUENCES = 2
"""Sequences of the K whose effective rank and MEV are averaged."""

ANALYSIS_PROTOCOLS = ("default", "paper")
"""``--protocol``: our inputs, or the authors' (see ``inputs``)."""

LAYER_POINTS = ("all", "hidden_states")
"""Which layers the depth trend runs over (``statistics.depth_points``)."""

DEFAULT_LAST_N = 3
"""``analyze family --last-n``: the layers at the end of depth whose mean cosine a model's row averages."""
