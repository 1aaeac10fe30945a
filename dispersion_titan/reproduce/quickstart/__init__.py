"""The quickstart (``python -m dispersion_titan.quickstart``). This ``__init__`` imports nothing,
so the command's ``--help`` stays fast."""

from importlib.resources import files

CONFIG = str(files("dispersion_titan") / "configs" / "quickstart.toml")  # package data
VARIANT = "angular_spread"  # the dispersion runs' loss
