"""Which sequences of the global packed stream a data-parallel rank reads: rank ``r`` of ``W`` reads
chunks ``r, r+W, …`` of ``b`` sequences, so global step ``s`` consumes sequences ``[s·G, (s+1)·G)``
whatever ``W`` and the accumulation steps: a run keeps its data across GPU counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset, get_worker_info
from torchtitan.components.loss import IGNORE_INDEX

from ..utils.errors import DataConfigError

Sample = tuple[dict[str, torch.Tensor], torch.Tensor]


class RankSlice(IterableDataset, Stateful):
    """This rank's samples of a global stream; the state counts the samples yielded."""

    def __init__(self, seq_len: int, local_batch_size: int, dp_rank: int = 0, dp_world_size: int = 1):
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.samples_yielded = 0

    def global_index(self, sample: int) -> int:
        """Position in the global stream of this rank's ``sample``-th sample."""
        chunk, within = divmod(sample, self.local_batch_size)
        return (chunk * self.dp_world_size + self.dp_rank) * self.local_batch_size + within

    @staticmethod
    def check_single_process() -> None:
        if get_worker_info() is not None:
            raise DataConfigError("training.dataloader.num_workers: must be 0 (the packed stream is stateful)")

    predict_last = True
    """``training.predict_last``; False: the last position's label is ignored."""

    def sample(self, window: np.ndarray) -> Sample:
        """``seq_len + 1`` tokens → ``({"input": x}, y)`` with ``y`` = ``x`` shifted by one."""
        tokens = torch.from_numpy(np.asarray(window, dtype=np.int64))
        labels = tokens[1:] if self.predict_last else torch.cat([tokens[1:-1], tokens.new_full((1,), IGNORE_INDEX)])
        return {"input": tokens[:-1]}, labels

    def state_dict(self) -> dict[str, Any]:
        return {"samples_yielded": self.samples_yielded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.samples_yielded = state_dict["samples_yielded"]
