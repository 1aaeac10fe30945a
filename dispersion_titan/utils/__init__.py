"""Helpers every layer may use, importing nothing of the package above them: the
user-facing errors (``errors``), device checks (``devices``) and files inside installed
packages (``package_data``)."""
