"""Helpers every layer may use, importing nothing of the package above them."""
