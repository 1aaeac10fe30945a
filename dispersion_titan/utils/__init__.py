"""Helpers every layer may use, importing nothing of the package above them: the
user-facing errors (``errors``), device checks (``devices``), files inside installed
packages (``package_data``) and the job server that forks ``python -m`` and torchrun jobs (``preloaded``)."""
