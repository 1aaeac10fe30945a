"""Every block's output of a training forward, for any model that keeps its blocks in
``model.layers`` (our GPT-2, TorchTitan's qwen3 and llama3), captured by forward hooks.

The hooks are registered after ``parallelize_fn`` has wrapped the blocks, so each sits on
the outermost wrapper of ``model.layers[i]``: outside activation checkpointing (whose
recomputation in backward runs the inner module, not the wrapper) and outside
``torch.compile`` (dynamo never traces the hook). It therefore fires exactly once per
block and forward, and what it keeps is the very tensor the next block consumes, not
detached: the dispersion gradient flows back through it.

Only training forwards are captured (module in train mode and grad enabled); validation,
which runs under ``no_grad``, keeps nothing.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn


class BlockOutputs:
    """Hooks on the blocks of ``layers``; ``take()`` hands over one forward's outputs."""

    def __init__(self, layers: nn.ModuleDict) -> None:
        self.count = len(layers)
        self._outputs: dict[int, torch.Tensor] = {}
        for index, block in enumerate(layers.values()):
            block.register_forward_hook(functools.partial(self._capture, index))

    def _capture(self, index: int, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        if index in self._outputs:
            raise RuntimeError(f"block {index + 1}'s forward hook fired twice before its outputs were taken")
        self._outputs[index] = output

    def take(self) -> list[torch.Tensor]:
        """The outputs of the forward that just ran, block 1 first; the hooks start afresh."""
        outputs, self._outputs = self._outputs, {}
        if len(outputs) != self.count:
            raise RuntimeError(f"captured {len(outputs)} of {self.count} block outputs in one training forward")
        return [outputs[i] for i in range(self.count)]
