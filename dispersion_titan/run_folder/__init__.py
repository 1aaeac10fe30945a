"""A run's dump folder read and written offline, one process, no process group:
checkpoint discovery, ``run.json`` and model loading (``checkpoints``). Analysis,
evaluation, reporting, conversion and the quickstart use it without the trainer.
"""
