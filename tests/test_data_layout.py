"""The packed loader: the same global batch for every data-parallel layout, distinct data
per rank, exact resumption in memory and streamed, FineWeb's held-out documents."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch

from dispersion_titan.data import corpora
from dispersion_titan.data.corpora import CORPORA, DataConfigError, iter_documents, load_files, load_rows
from dispersion_titan.data.packed import PackedSequenceDataset, StreamingPackedDataset
from dispersion_titan.tokenizer.encoders import EOT_ID, GPT2_BPE, gpt2_encoding
from support.corpora import WORDS, texts, write_parquet
from support.loaders import global_batches, loader, resumed_equals_uninterrupted

pytestmark = pytest.mark.usefixtures("private_caches")


def test_predict_last_false_ignores_each_training_sequences_last_label():
    """``training.predict_last = false`` (the paper configs): seq_len − 1 scored positions per training
    sequence, transformers' shifted cross-entropy on a block of seq_len tokens; the inputs, the other
    labels and validation stay as they are."""
    from dispersion_titan.data.packed import build_packed_dataloader, build_packed_validation_dataloader
    from dispersion_titan.job_config.parse import validated_args
    from support.launch import job_args

    def first(build, *flags: str) -> tuple[torch.Tensor, torch.Tensor]:
        job = validated_args([*job_args(), "--training.seq_len", str(SEQ), "--validation.seq_len", str(SEQ), *flags])
        inputs, labels = next(
            iter(build(1, 0, job) if build is build_packed_validation_dataloader else build(1, 0, None, job))
        )
        return inputs["input"], labels

    for build in (build_packed_dataloader, build_packed_validation_dataloader):
        (x, y), (x_off, y_off) = first(build), first(build, "--training.no-predict_last")
        assert torch.equal(x, x_off) and torch.equal(y[:, :-1], y_off[:, :-1]) and torch.equal(y[:, :-1], x[:, 1:])
        if build is build_packed_dataloader:
            assert (y_off[:, -1] == -100).all() and (y[:, -1] != -100).all()  # TorchTitan's IGNORE_INDEX
        else:
            assert torch.equal(y, y_off)


# ---------------------------------------------------------------- layout invariance and resume

SEQ = 16


@pytest.fixture(scope="module")
def stream_files(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("stream"), texts(240, seed=7), files=3)


def in_memory(tokens):
    return lambda local, rank, world: PackedSequenceDataset(tokens, SEQ, local, rank, world, seed=3)


def streamed(files):
    return lambda local, rank, world: StreamingPackedDataset(
        lambda: load_files(files, "f", True), SEQ, local, rank, world
    )


@pytest.mark.parametrize("kind", ["in_memory", "streamed"])
def test_global_batch_is_the_same_for_every_layout(stream_files, kind):
    tokens = np.concatenate(list(GPT2_BPE.tokenize(texts(240, seed=7))))
    make = in_memory(tokens) if kind == "in_memory" else streamed(stream_files)
    steps = 6
    reference = global_batches(make, world=1, accum=1, local=8, steps=steps)
    for world, accum, local in [(1, 2, 4), (2, 1, 4), (4, 1, 2), (2, 2, 2), (4, 2, 1)]:
        got = global_batches(make, world, accum, local, steps)
        for step in range(steps):
            assert torch.equal(got[step], reference[step]), (world, accum, local, step)
    if kind == "streamed":  # streamed order = the packed stream itself, sequence after sequence
        flat = torch.cat(reference).reshape(-1)
        assert torch.equal(flat, torch.from_numpy(tokens[: len(flat)].astype(np.int64)))
        blank = StreamingPackedDataset(lambda: datasets.Dataset.from_dict({"text": [""]}).to_iterable_dataset(), SEQ, 1)
        with pytest.raises(DataConfigError, match=r"^training\.dataset: the streamed training split has no documents$"):
            next(iter(blank))


@pytest.mark.parametrize("kind", ["in_memory", "streamed"])
def test_ranks_see_different_data(stream_files, kind):
    tokens = np.concatenate(list(GPT2_BPE.tokenize(texts(240, seed=7))))
    make = in_memory(tokens) if kind == "in_memory" else streamed(stream_files)
    seen = [[next(it)[0]["input"] for _ in range(5)] for it in (iter(loader(make(2, r, 2), r, 2)) for r in range(2))]
    rows = [{tuple(row.tolist()) for batch in rank for row in batch} for rank in seen]
    assert len(rows[0]) == len(rows[1]) == 10 and not rows[0] & rows[1]


def test_in_memory_resume_mid_epoch_and_across_epochs():
    tokens = np.concatenate(list(GPT2_BPE.tokenize(texts(40, seed=8))))
    make = in_memory(tokens)
    per_epoch = (len(tokens) - 1) // SEQ  # sequences; each step reads 2 ranks × 2
    resumed_equals_uninterrupted(make, world=2, stop=per_epoch // 8, more=per_epoch // 4)  # into epoch 2
    whole = make(1, 0, 1)
    epochs = [[whole.sequence(g).tobytes() for g in range(e * per_epoch, (e + 1) * per_epoch)] for e in (0, 1)]
    assert sorted(epochs[0]) == sorted(epochs[1]) and epochs[0] != epochs[1]  # every sequence once, shuffled anew
    other_seed = PackedSequenceDataset(tokens, SEQ, 1, 0, 1, seed=4)
    assert [other_seed.sequence(g).tobytes() for g in range(per_epoch)] != epochs[0]  # the order is debug.seed's
    with pytest.raises(DataConfigError, match=rf"^training\.dataset: {SEQ} tokens are too few for one sequence of"):
        PackedSequenceDataset(tokens[:SEQ], SEQ, 2)
    resumed = loader(make(2, 0, 2), 0, 2)  # a fork's position from a global batch these 2 ranks cannot split
    with pytest.raises(DataConfigError, match=r"^training: 3 sequences consumed cannot be split over 2 data-parallel"):
        resumed.load_state_dict({"sequences_consumed": 3})


@pytest.mark.parametrize("copy", ["parquet_files", "saved_dir"])
def test_streamed_resume_mid_file_and_across_epochs(tmp_path, copy):
    files = write_parquet(tmp_path / "files", texts(30, seed=9), files=3, row_group=4)
    if copy == "parquet_files":
        make = streamed(files)
    else:  # a save_to_disk copy is streamed through Dataset.to_iterable_dataset
        saved = str(tmp_path / "saved")
        datasets.Dataset.from_dict({"text": texts(30, seed=9)}).save_to_disk(saved)
        rows = lambda: load_rows("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", saved, "p", True)  # noqa: E731
        make = lambda local, rank, world: StreamingPackedDataset(rows, SEQ, local, rank, world)  # noqa: E731
    per_pass = sum(len(t) for t in GPT2_BPE.tokenize(texts(30, seed=9))) // SEQ
    resumed_equals_uninterrupted(make, world=2, stop=per_pass // 8, more=per_pass // 4)  # into pass 2
    dataset = make(2, 0, 2)
    it = iter(loader(dataset, 0, 2))
    for _ in range(per_pass // 8):
        next(it)
    assert dataset.resume.rows_state is not None  # resumes through datasets' state, not a re-read


# ---------------------------------------------------------------- fineweb-edu held-out slice


def test_fineweb_validation_is_the_first_documents_and_training_skips_them(tmp_path):
    held_out = corpora.FINEWEB_VALIDATION_DOCUMENTS
    docs = [f"doc {i} " + WORDS[i % len(WORDS)] for i in range(held_out + 50)]
    files = write_parquet(tmp_path / "fineweb", docs, files=2, row_group=1000)
    path = str(tmp_path / "fineweb")
    corpora.check_dataset("fineweb-edu", path, "validation.dataset")
    assert CORPORA["fineweb-edu"].streams_training
    assert list(iter_documents("fineweb-edu", "validation", path, "validation.dataset")) == docs[:held_out]
    stream = StreamingPackedDataset(lambda: CORPORA["fineweb-edu"].training_rows(",".join(files), "p"), SEQ, 4)
    first = next(iter(stream))[0]["input"]
    assert first.tolist() == [t for d in docs[held_out:] for t in [*gpt2_encoding().encode_ordinary(d), EOT_ID]][:SEQ]


# ---------------------------------------------------------------- pre-launch errors (real CLI)
