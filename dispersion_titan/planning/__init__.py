"""``dispersion-titan plan``'s work, above the trainer it measures."""
