"""``python -m dispersion_titan.paper ARTIFACT``'s work; its modules: docs/code_map.md."""
