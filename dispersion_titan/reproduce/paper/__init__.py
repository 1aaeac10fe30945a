"""``python -m dispersion_titan.paper ARTIFACT``: ``catalog`` (the paper's models and costs), ``workflow``
(the commands and their Slurm jobs), ``collect`` (the numbers), ``render`` (the figures, Table 2's too)."""
