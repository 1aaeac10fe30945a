"""A deterministic global stream of packed sequences, sliced per data-parallel rank.

Documents are tokenised, each followed by ``<|endoftext|>``, concatenated, and cut into
sequences of ``seq_len`` inputs (labels are the inputs shifted by one token). Sequence
``g`` of the global stream is fixed by the corpus, ``seq_len`` and the seed alone.

Rank ``r`` of ``W``, with local batch ``b``, reads chunks of ``b`` consecutive sequences
``r, r+W, r+2W, …``. Global step ``s`` with ``A`` accumulation steps then consumes
chunks ``[s·A·W, (s+1)·A·W)``, i.e. exactly the sequences ``[s·G, (s+1)·G)`` for global
batch ``G = A·W·b``, whatever ``W`` and ``A`` are: an experiment keeps its data when it
moves between 8 and 64 GPUs.
"""

from __future__ import annotations

import functools
from dataclasses import asdict
from typing import Any, Iterator

import numpy as np
import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset, get_worker_info
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import JobConfig

from ..tokenizer import EOT_ID, GPT2Tokenizer
from .corpora import DataConfigError, iter_documents


@functools.cache
def tokenized_documents(name: str, split: str, path: str | None, field: str) -> tuple[np.ndarray, ...]:
    """Each document of a corpus split as GPT-2 token ids (no separator), cached per process."""
    tokenizer = GPT2Tokenizer()
    docs = list(iter_documents(name, split, path, field))
    if not docs:
        raise DataConfigError(f"{field}: dataset {name!r} has no {split} documents")
    return tuple(np.asarray(ids, dtype=np.uint16) for ids in tokenizer.encode_batch(docs))


def token_stream(name: str, split: str, path: str | None, field: str) -> np.ndarray:
    """All documents of a split, each followed by ``<|endoftext|>``, as one array."""
    eot = np.asarray([EOT_ID], dtype=np.uint16)
    return np.concatenate(
        [piece for doc in tokenized_documents(name, split, path, field) for piece in (doc, eot)]
    )


class PackedSequenceDataset(IterableDataset, Stateful):
    """Yields this rank's ``({"input": x}, y)`` samples of the global packed stream.

    ``infinite`` streams repeat the data in epochs; with ``shuffle`` every epoch visits
    the sequences in a seeded random order. The state is the number of samples this
    rank has yielded, so a resumed run continues exactly, mid-epoch included.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        local_batch_size: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        *,
        infinite: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        field: str = "training.dataset",
    ):
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.seq_len = seq_len
        self.num_sequences = (len(tokens) - 1) // seq_len
        if self.num_sequences < 1:
            raise DataConfigError(
                f"{field}: {len(tokens)} tokens are too few for one sequence of seq_len {seq_len}"
            )
        self.local_batch_size = local_batch_size
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.infinite = infinite
        self.shuffle = shuffle
        self.seed = seed
        self.samples_yielded = 0

    def global_index(self, sample: int) -> int:
        """Position in the global stream of this rank's ``sample``-th sample."""
        chunk, within = divmod(sample, self.local_batch_size)
        return (chunk * self.dp_world_size + self.dp_rank) * self.local_batch_size + within

    @functools.lru_cache(maxsize=2)
    def _epoch_order(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_sequences, generator=generator)

    def sequence(self, g: int) -> torch.Tensor:
        """The ``seq_len + 1`` tokens of global sequence ``g`` (inputs plus the next token)."""
        epoch, position = divmod(g, self.num_sequences)
        index = int(self._epoch_order(epoch)[position]) if self.shuffle else position
        start = index * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        if get_worker_info() is not None:
            raise DataConfigError(
                "training.dataloader.num_workers: must be 0 (the packed stream is in memory)"
            )
        if not self.infinite:
            self.samples_yielded = 0  # a finite stream (validation) is one full pass per iteration
        while True:
            g = self.global_index(self.samples_yielded)
            if not self.infinite and g >= self.num_sequences:
                return
            window = self.sequence(g)
            self.samples_yielded += 1
            yield {"input": window[:-1]}, window[1:]

    def state_dict(self) -> dict[str, Any]:
        return {"samples_yielded": self.samples_yielded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.samples_yielded = state_dict["samples_yielded"]


def _seed(job_config: JobConfig) -> int:
    return job_config.debug.seed if job_config.debug.seed is not None else 0


def _build(section: str, split: str, dp_world_size: int, dp_rank: int, job_config: JobConfig) -> ParallelAwareDataloader:
    cfg = getattr(job_config, section)
    train = split == "train"
    tokens = token_stream(cfg.dataset, split, cfg.dataset_path, f"{section}.dataset")
    dataset = PackedSequenceDataset(
        tokens,
        cfg.seq_len,
        cfg.local_batch_size,
        dp_rank,
        dp_world_size,
        infinite=train,
        shuffle=train,
        seed=_seed(job_config),
        field=f"{section}.dataset",
    )
    return ParallelAwareDataloader(
        dataset,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        **{**asdict(cfg.dataloader), "batch_size": cfg.local_batch_size},
    )


def build_packed_dataloader(
    dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer, job_config: JobConfig
) -> ParallelAwareDataloader:
    """TorchTitan ``build_dataloader_fn``: the training split, repeated in shuffled epochs."""
    del tokenizer  # the stream is always GPT-2 BPE
    return _build("training", "train", dp_world_size, dp_rank, job_config)


def build_packed_validation_dataloader(
    dp_world_size: int, dp_rank: int, job_config: JobConfig
) -> ParallelAwareDataloader:
    """The held-out split of ``[validation] dataset``, one ordered pass per validation."""
    return _build("validation", "validation", dp_world_size, dp_rank, job_config)
