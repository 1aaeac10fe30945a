"""The quickstart (``python -m dispersion_titan.quickstart``): ``pipeline`` runs it; ``summary``
reads the analyzed runs, ``findings`` sets the paper's four findings against them,
``document`` and ``figure`` write ``summary.md`` and ``summary.png``, ``init_panel``
measures condensation at initialization. This ``__init__`` imports nothing, so the
command's ``--help`` stays fast."""

from importlib.resources import files

CONFIG = str(files("dispersion_titan") / "configs" / "quickstart.toml")  # package data
VARIANT = "angular_spread"
"""The dispersion loss of the quickstart's dispersion runs."""
