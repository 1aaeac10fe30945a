"""TensorBoard's writer thread's failed write, raised in the thread that asked for it: a ``SummaryWriter`` writes its
events file in a thread of its own, whose failure (a full disk) Python prints as that thread's traceback and
TensorBoard raises in the caller's thread only at a next write or flush. Shared by training and ``analyze --tb-dir``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class WriterThread:
    """From its making to ``close`` (``contextlib.closing``), a TensorBoard writer thread's ``OSError`` is kept, not
    printed, for ``writes`` to raise; every other thread's failure goes to the hook found."""

    def __init__(self) -> None:
        self.error: OSError | None = None
        self._hook = threading.excepthook
        threading.excepthook = self._failed

    def _failed(self, args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, OSError):
            self.error = args.exc_value
        else:
            self._hook(args)

    @contextlib.contextmanager
    def writes(self) -> Iterator[None]:
        """TensorBoard's failed write raised at the block's end, and at every later block's: the one TensorBoard
        raises in this thread, or the thread's kept, which TensorBoard would raise only at a later write or flush."""
        try:
            yield
        except OSError as e:  # the thread's, which TensorBoard raises at the next write, before or after the hook
            self.error = e
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Threads' failures printed again as before."""
        threading.excepthook = self._hook
