"""``python -m dispersion_titan.paper ARTIFACT``: ``catalog`` (the paper's models and costs), ``workflow``
(the commands and their Slurm jobs), ``collect`` (the numbers), ``draw`` and ``render`` (Table 2's too)."""
