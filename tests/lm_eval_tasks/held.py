"""``wiki_next_word_held``'s prompt: ``wiki_next_word``'s, which waits for a signal once the file ``$HOLD_WHEN``
exists (a step's result: the next step is being scored), saying so by making ``$HOLD_SAYS``."""

from __future__ import annotations

import os
import time
from pathlib import Path


def doc_to_text(doc: dict) -> str:
    when = os.environ.get("HOLD_WHEN")
    if when and os.path.exists(when):
        Path(os.environ["HOLD_SAYS"]).touch()
        while True:
            time.sleep(1)
    return doc["context"]
