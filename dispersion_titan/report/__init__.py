"""Answers to the paper's questions from a set of analysed runs (``summary``): used by
``python -m dispersion_titan.quickstart``, and by anyone with an analysed sweep."""
