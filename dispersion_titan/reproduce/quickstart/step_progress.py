"""A training job's progress while it runs: its log's step lines read every few seconds, said
as ``train    NAME: step 30/60, ~40 s left``, so the quickstart is not silent for minutes."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

# TorchTitan's log line of a training step, "step: 30  loss: 4.1234 ...", not of a validation.
STEP_LINE = re.compile(rb"(?<!validate )step:\s*(\d+)\s+loss:")
EVERY_S = 15.0


def last_step(log: str, offset: int) -> tuple[int | None, int]:
    """The last logged step in ``log`` from byte ``offset`` on (None: none yet), and the new offset."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read()
    except FileNotFoundError:
        return None, offset
    end = text.rfind(b"\n") + 1  # a line still being written is read next time
    steps = STEP_LINE.findall(text[:end])
    return (int(steps[-1]) if steps else None), offset + end


class StepProgress:
    """While the ``with`` block runs, says every ``every_s`` seconds how far ``log``'s training got,
    and the time left at the rate since the first step seen."""

    def __init__(self, log: str, steps: int, name: str, say: Callable[[str], None], every_s: float = EVERY_S) -> None:
        self.log, self.steps, self.name, self.say, self.every_s = log, steps, name, say, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> StepProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        offset, first, step, said = 0, None, None, None
        while not self._stop.wait(self.every_s):
            seen, offset = last_step(self.log, offset)
            if seen is not None:
                step = seen
                first = first or (step, time.monotonic())
            if step is None or step == said:
                continue
            line = f"train    {self.name}: step {step}/{self.steps}"
            first_step, since = first
            if step > first_step:
                left = (time.monotonic() - since) / (step - first_step) * (self.steps - step)
                line += f", ~{left:.0f} s left"
            self.say(line)
            said = step
