"""``python -m dispersion_titan.paper ARTIFACT``: each of the paper's figures and Table 2
from one command. ``catalog`` holds the paper's models and what each artifact costs,
``plan`` turns an artifact and its options into ``analyze`` / ``evaluate`` commands,
``slurm`` submits those as dependent jobs, ``collect`` reads their results into the
numbers drawn, ``draw`` makes the figures and ``table2`` the table."""

from dispersion_titan.utils.errors import ArgumentError

__all__ = ["ArgumentError"]
