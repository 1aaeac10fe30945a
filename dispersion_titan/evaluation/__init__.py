"""Downstream evaluation of saved checkpoints with lm-eval (``python -m dispersion_titan.evaluate``).

One module per job: ``protocol`` says which tasks, shots, limit and metrics (the
paper's by default), ``tasks`` resolves task names with lm-eval's TaskManager,
``export`` writes a checkpoint as ``convert to-hf`` does so that lm-eval's own HFLM
scores it, ``step_results`` stores and summarizes per-step results, ``runner`` evaluates
one run, ``table`` and ``figure`` build the paper's Table 2 over several runs from
``arms``, its rows.
"""

from dispersion_titan.utils.errors import EvaluationError

__all__ = ["EvaluationError"]
