"""The dispersion points of a training forward (``dispersion.points``), captured by forward hooks on
``model.layers`` and ``model.norm``. Registered after ``parallelize_fn``, each sits outside activation
checkpointing's recomputation and ``torch.compile``: it fires once per forward and keeps the very
tensor the next module consumes, so the gradient flows through it (under TP its local shard).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


class BlockOutputs:
    """Hooks on the dispersion points; ``take()`` hands over one training forward's outputs."""

    def __init__(self, model: nn.Module, points: str) -> None:
        blocks = list(model.layers.values())
        modules = blocks if points == "blocks" else [*blocks[:-1], model.norm]  # hidden_states: the last, the norm
        self.count = len(modules)
        self._outputs: dict[int, torch.Tensor] = {}
        for index, module in enumerate(modules):
            module.register_forward_hook(functools.partial(self._capture, index))

    def _capture(self, index: int, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        if index in self._outputs:
            raise RuntimeError(f"dispersion point {index + 1}'s forward hook fired twice before its outputs were taken")
        self._outputs[index] = output.to_local() if isinstance(output, DTensor) else output

    def take(self) -> list[torch.Tensor]:
        """The outputs of the forward that just ran, point 1 first; the hooks start afresh."""
        outputs, self._outputs = self._outputs, {}
        if len(outputs) != self.count:
            raise RuntimeError(f"captured {len(outputs)} of {self.count} dispersion points in one training forward")
        return [outputs[i] for i in range(self.count)]
