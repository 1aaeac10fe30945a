"""``python -m dispersion_titan.paper ARTIFACT``: ``catalog`` (the paper's models and costs), ``workflow``
(the commands), ``slurm`` (the jobs), ``collect`` (the numbers), ``draw`` and ``table2``."""
