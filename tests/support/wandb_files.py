"""Reading an offline W&B run back: the records of its ``run-ID.wandb`` transaction log.

wandb 0.31 writes that file from its Go core and ships no Python reader. Its layout is
LevelDB's log format: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB
blocks of chunks (4-byte CRC, 2-byte length, 1-byte type: full, first, middle, last),
each chunk's payload part of one protobuf ``Record`` (``wandb.proto.wandb_internal_pb2``).
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    """Every record of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[: len(HEADER)] == HEADER, f"{path}: not a W&B transaction log"
    out, pos, pending = [], len(HEADER), b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if kind == 0:  # zero padding at the end of the file
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def finished_records(path: Path, timeout: float = 120) -> list:
    """The records of a finished run's ``.wandb`` file. ``run.finish()`` can return before
    wandb's core has written the file's last block (a record crossing a 32 KiB boundary is
    then cut short): wait for the run's ``exit`` record."""
    deadline = time.monotonic() + timeout
    while True:
        found = records(path)
        if found and found[-1].WhichOneof("record_type") == "exit":
            return found
        assert time.monotonic() < deadline, f"{path}: no exit record after {timeout} s"
        time.sleep(0.2)


def logged(folder: Path) -> list[tuple[Path, int, dict]]:
    """(run folder, W&B step, metric -> value) of each ``wandb.log`` call of every offline run
    under ``folder``; media (tables, images, histograms) as the JSON that stands for them."""
    out = []
    for path in sorted(folder.rglob("run-*.wandb")):
        for record in finished_records(path):
            if record.WhichOneof("record_type") == "history":
                items: dict = {}
                for item in record.history.item:  # a dict logged (media) comes as one item per nested key
                    *parents, key = [item.key] if item.key else list(item.nested_key)
                    into = items
                    for parent in parents:
                        into = into.setdefault(parent, {})
                    into[key] = json.loads(item.value_json)
                out.append(
                    (path.parent, record.history.step.num, {k: v for k, v in items.items() if not k.startswith("_")})
                )  # not wandb's _step, _runtime
    return out


def history(folder: Path) -> dict[str, dict[int, float]]:
    """Metric -> {step: value} of every offline run under ``folder``, as ``wandb.log`` got them."""
    out: dict[str, dict[int, float]] = {}
    for _, step, items in logged(folder):
        for key, value in items.items():
            out.setdefault(key, {})[step] = value
    return out


def run_ids(folder: Path) -> list[str]:
    """The run id of every offline run under ``folder`` (``offline-run-DATE-ID``)."""
    return sorted(path.name.rsplit("-", 1)[1] for path in folder.rglob("offline-run-*") if path.is_dir())
