"""The dispersion points of a training forward, for any model that keeps its blocks in
``model.layers`` and its final norm in ``model.norm`` (our GPT-2, TorchTitan's qwen3 and
llama3), captured by forward hooks.

``dispersion.points`` says which n tensors: ``blocks``, every block's output; or
``hidden_states``, blocks 1..n-1 and the final norm's output, which is what transformers'
``hidden_states[1:]`` holds (the authors' Hugging Face scripts take the loss there).

The hooks are registered after ``parallelize_fn`` has wrapped the blocks, so each sits on
the outermost wrapper of ``model.layers[i]``: outside activation checkpointing (whose
recomputation in backward runs the inner module, not the wrapper) and outside
``torch.compile`` (dynamo never traces the hook; under ``compile.whole_model`` it does, and
the hook still fires once, tests/test_block_outputs.py). It therefore fires exactly once per
block and forward, and what it keeps is the very tensor the next module consumes, not
detached: the dispersion gradient flows back through it. Under tensor parallelism the
final norm's output is a sequence-sharded DTensor; its local shard is kept, like a
block's output.

Only training forwards are captured (module in train mode and grad enabled); validation,
which runs under ``no_grad``, keeps nothing.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def point_modules(model: nn.Module, points: str) -> list[nn.Module]:
    """The modules whose outputs are the dispersion points, first block first."""
    blocks = list(model.layers.values())
    return blocks if points == "blocks" else [*blocks[:-1], model.norm]


class BlockOutputs:
    """Hooks on the dispersion points of ``model``; ``take()`` hands over one forward's outputs."""

    def __init__(self, model: nn.Module, points: str) -> None:
        modules = point_modules(model, points)
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
