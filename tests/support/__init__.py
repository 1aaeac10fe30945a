"""What several test modules share, one module per concern: ``launch`` (jobs), ``runs`` (what a
run wrote), ``cli``, ``corpora``, ``loaders``, ``condensation`` and ``eval_tasks``."""
