"""Answers to the paper's questions from a set of analyzed runs (``summary``): used by
``python -m dispersion_titan.quickstart``, and by anyone with an analyzed sweep."""
