"""A deterministic global stream of packed sequences, sliced per data-parallel rank: documents, each
followed by the end-of-sequence id, concatenated; sequence ``g`` is tokens ``[g·seq_len, (g+1)·seq_len + 1)``.
Rank ``r`` of ``W`` reads chunks ``r, r+W, …`` of ``b`` sequences, so global step ``s`` consumes sequences
``[s·G, (s+1)·G)`` whatever ``W`` and the accumulation steps: a run keeps its data across GPU counts
(``RankSlice``). Corpora that fit in memory are tokenised once (``cached_tokens``) and shuffled per epoch;
streamed ones are read in order (``StreamingPackedDataset``); a token store replaces both.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import datasets
import numpy as np
import torch
from filelock import FileLock
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.config import JobConfig

from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder, encoder_for
from ..utils.errors import say
from ..utils.records import atomic_write
from .corpora import CORPORA, DataConfigError, documents_identity, has_text, iter_documents
from .store import TokenStore, is_store, open_store

CACHE_ENV = "DISPERSION_TITAN_TOKEN_CACHE"

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


def cached_tokens(
    identity: dict[str, Any], build: Callable[[], np.ndarray], encoder: DocumentEncoder = GPT2_BPE
) -> np.ndarray:
    """``build()``'s tokens (made by ``encoder``), read from (or first written to) the token cache, keyed by
    corpus identity and tokenizer, so that ranks and later runs do not each tokenise the same corpus: the
    first process to take the key's file lock writes it, the others memory-map it. A cache this process
    cannot write (another user's ``HF_HOME``, a full disk) is read where it holds the key, else passed by.
    ``$DISPERSION_TITAN_TOKEN_CACHE`` (``off``: none)."""
    folder = os.path.expanduser(os.environ.get(CACHE_ENV, ""))
    if folder.lower() == "off":
        return build()
    if not folder:
        folder = os.path.join(datasets.config.HF_DATASETS_CACHE, "dispersion_titan_tokens")
    key = json.dumps({**identity, "tokenizer": encoder.fingerprint()}, sort_keys=True, default=str)
    path = os.path.join(folder, f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npy")
    if os.path.exists(path):
        return np.load(path, mmap_mode="r")
    try:
        os.makedirs(folder, exist_ok=True)
        held = FileLock(f"{path}.lock").acquire()
    except OSError as e:
        _unusable(folder, e.strerror or str(e))
        return build()
    with held:
        if not os.path.exists(path):
            tokens = build()
            try:
                with open(f"{path[:-4]}.json", "w") as f:  # what the opaque key stands for, for humans
                    json.dump({**identity, "tokenizer": encoder.name, "tokens": len(tokens)}, f, indent=1, default=str)
                atomic_write(path, lambda f: np.save(f, tokens), binary=True)
            except OSError as e:
                _unusable(folder, e.strerror or str(e))
                return tokens
    return np.load(path, mmap_mode="r")


@functools.cache  # once a process, not once a split
def _unusable(folder: str, reason: str) -> None:
    say(f"note: token cache {folder} unusable ({reason}); tokenising in this process ({CACHE_ENV} names another)")


@functools.cache
def token_stream(
    name: str, split: str, path: str | None, field: str, encoder: DocumentEncoder = GPT2_BPE
) -> np.ndarray:
    """All documents of a split, each followed by the end-of-sequence id, as one (cached) array."""

    def build() -> np.ndarray:
        pieces = list(encoder.tokenize(iter_documents(name, split, path, field)))
        if not pieces:
            raise DataConfigError(f"{field}: dataset {name!r} has no {split} documents")
        return np.concatenate(pieces)

    return cached_tokens(documents_identity(name, split, path, field), build, encoder)


def tokenized_documents(
    name: str, split: str, path: str | None, field: str, encoder: DocumentEncoder = GPT2_BPE
) -> tuple[np.ndarray, ...]:
    """Each document of a corpus split as token ids (no separator)."""
    stream = np.asarray(token_stream(name, split, path, field, encoder))
    return tuple(d[:-1] for d in np.split(stream, np.flatnonzero(stream == encoder.eos_id) + 1)[:-1])


class PackedSequenceDataset(RankSlice):
    """This rank's samples of an in-memory (or memory-mapped) packed stream: with ``train``, endless
    epochs, each in a seeded random order; else one ordered pass (validation)."""

    def __init__(
        self,
        tokens: np.ndarray | TokenStore,
        *layout: int,  # RankSlice's
        train: bool = True,
        seed: int = 0,
        field: str = "training.dataset",
        pad_id: int = GPT2_BPE.eos_id,
    ):
        super().__init__(*layout)
        self.tokens = tokens
        self.pad_id = pad_id
        self.num_sequences = (len(tokens) - 1) // self.seq_len
        if self.num_sequences < 1:
            raise DataConfigError(
                f"{field}: {len(tokens)} tokens are too few for one sequence of seq_len {self.seq_len}"
            )
        self.train = train
        self.seed = seed

    @functools.lru_cache(maxsize=2)
    def _epoch_order(self, epoch: int) -> np.ndarray:
        """As numpy: a sequence's index read from it is no tensor read (``tests/test_sync_free.py`` counts those)."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_sequences, generator=generator).numpy()

    def sequence(self, g: int) -> np.ndarray:
        """The ``seq_len + 1`` tokens of global sequence ``g`` (inputs plus the next token)."""
        epoch, position = divmod(g, self.num_sequences)
        index = int(self._epoch_order(epoch)[position]) if self.train else position
        start = index * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def __iter__(self) -> Iterator[Sample]:
        """Validation's one pass has the same number of batches on every rank (TorchTitan's validator runs
        collectives per batch): places past the end are padding whose labels are ignored."""
        while self.train:
            window = self.sequence(self.global_index(self.samples_yielded))
            self.samples_yielded += 1
            yield self.sample(window)
        rounds = math.ceil(self.num_sequences / (self.dp_world_size * self.local_batch_size))
        for sample in range(rounds * self.local_batch_size):
            g = self.global_index(sample)
            if g < self.num_sequences:
                yield self.sample(self.sequence(g))
            else:
                yield {"input": torch.full((self.seq_len,), self.pad_id)}, torch.full((self.seq_len,), IGNORE_INDEX)


class ContinuousPackedDataset(PackedSequenceDataset):
    """A streamed corpus's training order over its token store: the stream repeated end to end, a window
    spanning two passes, exactly as ``StreamingPackedDataset`` reads it."""

    def sequence(self, g: int) -> np.ndarray:
        start = g * self.seq_len % len(self.tokens)
        window = self.tokens[start : start + self.seq_len + 1]
        missing = self.seq_len + 1 - len(window)
        return np.concatenate([window, self.tokens[:missing]]) if missing else window


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a document starts: rows epoch, ``datasets`` state before it, global token."""

    epoch: int = 0
    rows_state: dict | None = None  # None: the start of the epoch
    position: int = 0


@dataclasses.dataclass
class _Document:
    point: ResumePoint
    tokens: np.ndarray  # with its trailing <|endoftext|>

    @property
    def end(self) -> int:
        return self.point.position + len(self.tokens)


class StreamingPackedDataset(RankSlice):
    """This rank's samples of a streamed packed corpus, read in order: every rank tokenises the whole stream
    (positions depend on every earlier document) and keeps its own windows. The state holds a resume point
    at a document boundary (``datasets``' own state), so a resume skips, not re-reads. ``rows()`` gives a
    fresh pass (called once here, so an unreachable hub fails when the loader is built)."""

    def __init__(self, rows: Callable[[], datasets.IterableDataset], *layout: int, encoder: DocumentEncoder = GPT2_BPE):
        super().__init__(*layout)  # RankSlice's
        self.rows = rows
        self.encoder = encoder
        self.resume = ResumePoint()
        rows()  # fail now if the rows cannot be opened (e.g. an unreachable hub)

    def _texts(self, start: ResumePoint) -> Iterator[tuple[ResumePoint, str]]:
        """(resume point without position, text) of every document from ``start`` on, pass after pass."""
        epoch, state = start.epoch, start.rows_state
        resumed_mid_pass = state is not None
        while True:
            rows = self.rows()
            if state is not None:
                rows.load_state_dict(state)
            found = False
            for row in rows:
                if has_text(row["text"]):  # a document as the corpus's store counts them: not a blank row
                    found = True
                    yield ResumePoint(epoch, state), row["text"]
                state = rows.state_dict()  # taken before the next row: its resume state
            if not found and not resumed_mid_pass:
                raise DataConfigError("training.dataset: the streamed training split has no documents")
            epoch, state, resumed_mid_pass = epoch + 1, None, False

    def _documents(self) -> Iterator[_Document]:
        points, texts = itertools.tee(self._texts(self.resume))
        position = self.resume.position
        for (point, _), tokens in zip(points, self.encoder.tokenize(text for _, text in texts)):
            yield _Document(dataclasses.replace(point, position=position), tokens)
            position += len(tokens)

    def __iter__(self) -> Iterator[Sample]:
        documents = self._documents()
        pending: collections.deque[_Document] = collections.deque()  # overlap [start, covered)
        covered = self.resume.position
        while True:
            g = self.global_index(self.samples_yielded)
            start, end = g * self.seq_len, (g + 1) * self.seq_len + 1
            while pending and pending[0].end <= start:
                pending.popleft()
            while covered < end:
                document = next(documents)
                covered = document.end
                if covered > start:
                    pending.append(document)
            self.resume = pending[0].point
            # every pending document starts before ``end``: it was read while ``covered`` was short of it
            window = np.concatenate(
                [d.tokens[max(start - d.point.position, 0) : end - d.point.position] for d in pending]
            )
            self.samples_yielded += 1
            yield self.sample(window)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **dataclasses.asdict(self.resume)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A state without a resume point (a token-store run's) is read from the stream's start."""
        super().load_state_dict(state_dict)
        self.resume = ResumePoint(*(state_dict.get(f.name, f.default) for f in dataclasses.fields(ResumePoint)))


def run_seed(job_config: JobConfig) -> int:
    """The run's seed: ``debug.seed``, 0 when unset (the data order, the dispersion loss and the baselines)."""
    return job_config.debug.seed if job_config.debug.seed is not None else 0


def build_dataset(section: str, split: str, dp_world_size: int, dp_rank: int, job_config: JobConfig) -> RankSlice:
    cfg = getattr(job_config, section)
    encoder = encoder_for(job_config.model.name, job_config.model.hf_assets_path)
    field = f"{section}.dataset"
    train = split == "train"
    streamed = train and cfg.dataset in CORPORA and CORPORA[cfg.dataset].streams_training
    layout = (cfg.seq_len, cfg.local_batch_size, dp_rank, dp_world_size)
    if is_store(cfg.dataset_path):
        field = f"{field}_path"  # a store too short for one sequence is its path's fault (was said as the dataset's)
        tokens = open_store(cfg.dataset_path, cfg.dataset, split, field, encoder)
        if streamed:
            return ContinuousPackedDataset(tokens, *layout, field=field)
    elif streamed:
        rows = functools.partial(CORPORA[cfg.dataset].training_rows, cfg.dataset_path, f"{field}_path")
        return StreamingPackedDataset(rows, *layout, encoder=encoder)
    else:
        tokens = token_stream(cfg.dataset, split, cfg.dataset_path, field, encoder)
    seed = run_seed(job_config)
    return PackedSequenceDataset(tokens, *layout, train=train, seed=seed, field=field, pad_id=encoder.eos_id)


class PackedDataloader(ParallelAwareDataloader):
    """A loader whose state is global (sequences consumed), so any data-parallel degree resumes it."""

    def state_dict(self) -> dict[str, Any]:
        if isinstance(self.dataset, StreamingPackedDataset):
            return super().state_dict()
        return {GLOBAL_POSITION: self.dataset.samples_yielded * self.dp_world_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if GLOBAL_POSITION not in state_dict:
            super().load_state_dict(state_dict)
            return
        consumed = state_dict[GLOBAL_POSITION]
        if consumed % self.dp_world_size:
            raise DataConfigError(
                f"training: {consumed} sequences consumed cannot be split over {self.dp_world_size} data-parallel ranks"
            )
        self.dataset.load_state_dict({"samples_yielded": consumed // self.dp_world_size})

    def refit(self, parent_seq_len: int | None, global_batch_size: int) -> int | None:
        """A fork's loaded position, counted in its parent's sequences: of other documents (``parent_seq_len``
        None), their start; in sequences of another length, the same number of tokens rounded down to a whole global
        batch, or the start where a streamed corpus's document is the position (this loader's or the parent's, still
        pending). The global sequence it goes on from; None: the start."""
        if (
            parent_seq_len is None
            or self.next_iter_state is not None
            or isinstance(self.dataset, StreamingPackedDataset)
        ):
            self.next_iter_state = None  # TorchTitan's loaded per-rank state, applied at the first batch
            self.dataset.load_state_dict({"samples_yielded": 0})
            return None
        tokens = self.dataset.samples_yielded * self.dp_world_size * parent_seq_len
        consumed = tokens // self.dataset.seq_len // global_batch_size * global_batch_size
        self.load_state_dict({GLOBAL_POSITION: consumed})
        return consumed


GLOBAL_POSITION = "sequences_consumed"
"""The loader state's key (``dataloader.sequences_consumed`` in a checkpoint)."""


def _loader(
    section: str, split: str, dp_world_size: int, dp_rank: int, job_config: JobConfig
) -> ParallelAwareDataloader:
    cfg = getattr(job_config, section)
    dataset = build_dataset(section, split, dp_world_size, dp_rank, job_config)
    dataset.predict_last = section != "training" or job_config.training.predict_last
    return PackedDataloader(
        dataset,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        **{**dataclasses.asdict(cfg.dataloader), "batch_size": cfg.local_batch_size},
    )


def build_packed_dataloader(
    dp_world_size: int, dp_rank: int, tokenizer: None, job_config: JobConfig
) -> ParallelAwareDataloader:
    """TorchTitan ``build_dataloader_fn``: the training split, repeated in epochs."""
    del tokenizer  # none (the TrainSpec builds none): the stream's encoder is chosen from the config (encoder_for)
    return _loader("training", "train", dp_world_size, dp_rank, job_config)


def build_packed_validation_dataloader(
    dp_world_size: int, dp_rank: int, job_config: JobConfig
) -> ParallelAwareDataloader:
    """The held-out split of ``[validation] dataset``, one ordered pass per validation."""
    return _loader("validation", "validation", dp_world_size, dp_rank, job_config)
