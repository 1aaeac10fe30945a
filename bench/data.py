"""Benchmark: the token store against tokenising at train time.

(a) ``prepare`` throughput: the embedded ``enwiki_sample`` training articles repeated
    ``--repeat`` times, tokenised into a store by 1 and by ``--workers`` processes
    (the article extraction is done before the clock starts);
(b) per-rank loader throughput reading that store: rank 0 of ``--ranks`` through
    TorchTitan's ``ParallelAwareDataloader`` at ``--seq-len`` and ``--batch``, in the
    shuffled in-memory order and in a streamed corpus's order (``ContinuousPackedDataset``);
(c) for comparison, the streamed loader without a store (``StreamingPackedDataset``,
    which tokenises the whole global stream on every rank) on the same documents.

Rates are tokens of (input) sequences delivered to the rank per second, compared with
0.5 M tokens/s, about what one H100 consumes training GPT-2 small.

    python bench/data.py                       # defaults: --repeat 8 --ranks 8 --seq-len 1024 --batch 8
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import datasets
from torchtitan.components.dataloader import ParallelAwareDataloader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispersion_titan.data.corpora import iter_documents  # noqa: E402
from dispersion_titan.data.packed import (  # noqa: E402
    ContinuousPackedDataset,
    PackedSequenceDataset,
    StreamingPackedDataset,
)
from dispersion_titan.data.store import open_store, write_store  # noqa: E402

H100_GPT2_SMALL_TOKENS_PER_S = 0.5e6


def prepare_rate(docs: list[str], out: str, workers: int, shard_documents: int) -> tuple[float, int]:
    source = {"dataset": "enwiki_sample", "split": "train", "path": None, "identity": {"bench_repeat": len(docs)}}
    start = time.perf_counter()
    manifest = write_store(docs, out, source, workers=workers, shard_documents=shard_documents, progress=False)
    return manifest["tokens"] / (time.perf_counter() - start), manifest["tokens"]


def loader_rate(dataset, rank: int, ranks: int, batches: int) -> float:
    """Tokens/s of rank ``rank``'s first ``batches`` batches, from a fresh loader (no
    warm-up excluded: the streamed loader tokenises 256 documents per call, so its first
    batch pays for many later ones)."""
    start = time.perf_counter()
    it = iter(ParallelAwareDataloader(dataset, dp_rank=rank, dp_world_size=ranks, batch_size=dataset.local_batch_size))
    tokens = sum(next(it)[0]["input"].numel() for _ in range(batches))
    return tokens / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=8, help="copies of the enwiki_sample training articles")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--shard-documents", type=int, default=32)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batches", type=int, default=300, help="timed batches per store-backed loader")
    p.add_argument(
        "--streamed-batches",
        type=int,
        default=100,
        help="timed batches of the streamed loader (it tokenises ranks× as many)",
    )
    a = p.parse_args()

    docs = list(iter_documents("enwiki_sample", "train", None, "bench")) * a.repeat
    print(
        f"cpus={len(os.sched_getaffinity(0))} load_average_1min={os.getloadavg()[0]:.1f} documents={len(docs)} "
        f"ranks={a.ranks} seq_len={a.seq_len} batch={a.batch}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for workers in sorted({1, a.workers}):
            rate, tokens = prepare_rate(docs, os.path.join(tmp, f"w{workers}"), workers, a.shard_documents)
            rows.append((f"(a) prepare, {workers} worker(s), {tokens / 1e6:.2f} M tokens", rate))
        store = open_store(os.path.join(tmp, f"w{a.workers}"), "enwiki_sample", "train", "bench")
        shuffled = PackedSequenceDataset(store, a.seq_len, a.batch, 0, a.ranks, seed=0)
        ordered = ContinuousPackedDataset(store, a.seq_len, a.batch, 0, a.ranks)
        rows.append(
            (
                "(b) store loader, rank 0, shuffled (in-memory corpora's order)",
                loader_rate(shuffled, 0, a.ranks, a.batches),
            )
        )
        rows.append(
            (
                "(b) store loader, rank 0, in order (streamed corpora's order)",
                loader_rate(ordered, 0, a.ranks, a.batches),
            )
        )
        text = datasets.Dataset.from_dict({"text": docs})
        streamed = StreamingPackedDataset(lambda: text.to_iterable_dataset(), a.seq_len, a.batch, 0, a.ranks)
        rows.append(
            (
                "(c) streamed loader without a store, rank 0 (tokenises the global stream)",
                loader_rate(streamed, 0, a.ranks, a.streamed_batches),
            )
        )
    print("| measurement | tokens/s | vs 0.5 M tokens/s |")
    print("|---|---|---|")
    for name, rate in rows:
        ratio = f"{rate / H100_GPT2_SMALL_TOKENS_PER_S:.1f}×" if name.startswith(("(b)", "(c)")) else ""
        print(f"| {name} | {rate / 1e6:.2f} M | {ratio} |")


if __name__ == "__main__":
    main()
