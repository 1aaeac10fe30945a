"""Downstream evaluation of saved checkpoints with lm-eval (``python -m dispersion_titan.evaluate``);
docs/code_map.md says which module does what."""
