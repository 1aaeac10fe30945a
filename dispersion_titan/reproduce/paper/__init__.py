"""``python -m dispersion_titan.paper ARTIFACT``: ``catalog`` (the paper's models and costs), ``workflow``
(the commands and their Slurm jobs), ``render`` (the numbers and figures, Table 2's too)."""
