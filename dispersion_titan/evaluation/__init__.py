"""Downstream evaluation with lm-eval (``python -m dispersion_titan.evaluate``); its modules: docs/code_map.md."""
