"""The packed stream of a corpus too large for memory, read in order: every rank tokenises the whole
stream (positions depend on every earlier document) and keeps its own windows. The state holds a
resume point at a document boundary (``datasets``' own state), so a resume skips, not re-reads.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import datasets
import numpy as np

from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder
from ..utils.errors import DataConfigError
from .rank_slice import RankSlice, Sample


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
    """This rank's samples of a streamed packed corpus; ``rows()`` gives a fresh pass (called once here,
    so an unreachable hub fails when the loader is built)."""

    def __init__(
        self,
        rows: Callable[[], datasets.IterableDataset],
        seq_len: int,
        local_batch_size: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        *,
        encoder: DocumentEncoder = GPT2_BPE,
    ):
        super().__init__(seq_len, local_batch_size, dp_rank, dp_world_size)
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
                if row["text"]:
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
        self.check_single_process()
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
            window = np.concatenate(
                [
                    d.tokens[max(start - d.point.position, 0) : end - d.point.position]
                    for d in pending
                    if d.point.position < end
                ]
            )
            self.samples_yielded += 1
            yield self.sample(window)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **dataclasses.asdict(self.resume)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A state without a resume point (a token-store run's) is read from the stream's start."""
        super().load_state_dict(state_dict)
        self.resume = ResumePoint(*(state_dict.get(f.name, f.default) for f in dataclasses.fields(ResumePoint)))
