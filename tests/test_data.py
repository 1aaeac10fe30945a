"""Datasets and the packed loader: hub datasets through local copies, local files, the
layout-invariant global batch, exact resumption (in memory and streamed), the token
cache, pre-launch path errors, validation metrics, and the shipped configs."""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchtitan.components.dataloader import ParallelAwareDataloader

from dispersion_titan.data import corpora
from dispersion_titan.data.corpora import CORPORA, DataConfigError, iter_documents, wikitext_articles
from dispersion_titan.data.packed import PackedSequenceDataset, token_stream, tokenized_documents
from dispersion_titan.data.sources import load_files, load_rows
from dispersion_titan.data.streaming import StreamingPackedDataset
from dispersion_titan.data.tokens import CACHE_ENV, cached_tokens, tokenize
from dispersion_titan.tokenizer import EOT_ID, GPT2Tokenizer
from helpers import REPO, python_module, scalars, torchrun

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


@pytest.fixture(autouse=True)
def private_caches(tmp_path, monkeypatch):
    """Keep datasets' Arrow cache and our token cache inside the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "token_cache"))


def texts(n: int, seed: int, max_words: int = 60) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(1, max_words))) for _ in range(n)]


def write_parquet(folder: Path, docs: list[str], files: int, row_group: int = 17) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    size = math.ceil(len(docs) / files)
    paths = []
    for i in range(files):
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(pa.table({"text": docs[i * size : (i + 1) * size]}), path, row_group_size=row_group)
        paths.append(str(path))
    return paths


# ---------------------------------------------------------------- wikitext-103 local copies

def wikitext_article(title: str, seed: int) -> list[str]:
    """Rows of one article in WikiText's raw layout: heading, blank, paragraph lines, sections."""
    body = texts(3, seed, 25)
    return ["", f" = {title} = \n", "", f" {body[0]} \n", "", f" = = Section {seed} = = \n", "",
            f" {body[1]} \n", f" {body[2]} \n"]


ARTICLES = {
    "train": [wikitext_article(f"Train article {i}", i) for i in range(6)],
    "validation": [wikitext_article(f"Held out {i}", 100 + i) for i in range(2)],
}
EXPECTED = {split: ["".join(rows).strip() for rows in arts] for split, arts in ARTICLES.items()}


def wikitext_rows(split: str) -> list[str]:
    return [row for article in ARTICLES[split] for row in article]


def wikitext_parquet_dir(root: Path) -> Path:
    """The layout of ``hf download Salesforce/wikitext``'s ``wikitext-103-raw-v1`` folder."""
    folder = root / "wikitext-103-raw-v1"
    folder.mkdir(parents=True)
    for split in ("train", "validation"):
        pq.write_table(pa.table({"text": wikitext_rows(split)}), folder / f"{split}-00000-of-00001.parquet")
    return folder


def wikitext_saved_dir(root: Path) -> Path:
    folder = root / "saved"
    datasets.DatasetDict(
        {split: datasets.Dataset.from_dict({"text": wikitext_rows(split)}) for split in ARTICLES}
    ).save_to_disk(str(folder))
    return folder


def wikitext_cache_dir(root: Path) -> Path:
    """A ``datasets`` cache holding Salesforce/wikitext: prepared from a local copy of the
    repo (README configs), then placed where datasets keeps hub datasets (owner___name)."""
    repo = root / "repo" / "wikitext"
    shutil.copytree(wikitext_parquet_dir(root / "src"), repo / "wikitext-103-raw-v1")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: wikitext-103-raw-v1\n  data_files:\n"
        "  - split: train\n    path: wikitext-103-raw-v1/train-*\n"
        "  - split: validation\n    path: wikitext-103-raw-v1/validation-*\n---\n"
    )
    cache = root / "cache"
    datasets.load_dataset_builder(str(repo), "wikitext-103-raw-v1", cache_dir=str(cache)).download_and_prepare()
    (cache / "wikitext").rename(cache / "Salesforce___wikitext")
    return cache


def test_wikitext_rows_become_articles():
    rows = wikitext_rows("train")
    assert list(wikitext_articles(rows)) == EXPECTED["train"]
    assert all(doc.startswith("= Train article") and "= = Section" in doc for doc in EXPECTED["train"])


@pytest.mark.parametrize("form", ["saved", "parquet_dir", "cache", "files"])
def test_wikitext_local_copy_forms(tmp_path, form):
    if form == "saved":
        paths = dict.fromkeys(ARTICLES, str(wikitext_saved_dir(tmp_path)))
    elif form == "parquet_dir":
        paths = dict.fromkeys(ARTICLES, str(wikitext_parquet_dir(tmp_path)))
    elif form == "cache":
        paths = dict.fromkeys(ARTICLES, str(wikitext_cache_dir(tmp_path)))
    else:
        folder = wikitext_parquet_dir(tmp_path)
        paths = {split: str(folder / f"{split}-*.parquet") for split in ARTICLES}
    for split in ARTICLES:
        corpora.check_dataset("wikitext-103", paths[split], "validation.dataset")
        assert list(iter_documents("wikitext-103", split, paths[split], "validation.dataset")) == EXPECTED[split]


def test_wikitext_copy_without_the_split_names_the_field(tmp_path):
    folder = tmp_path / "only_train"
    folder.mkdir()
    pq.write_table(pa.table({"text": wikitext_rows("train")}), folder / "train-00000-of-00001.parquet")
    with pytest.raises(DataConfigError, match=r"^validation\.dataset_path: .* has no 'validation' split"):
        list(iter_documents("wikitext-103", "validation", str(folder), "validation.dataset"))


def test_unreachable_hub_error_names_the_override(tmp_path):
    """Offline (HF_HUB_OFFLINE=1): loading fails with one line naming the path option."""
    code = (
        "from dispersion_titan.data.corpora import DataConfigError, iter_documents\n"
        "try:\n    next(iter_documents('wikitext-103', 'train', None, 'training.dataset'))\n"
        "except DataConfigError as e:\n    print(e)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("training.dataset_path: cannot reach the Hugging Face hub for Salesforce/wikitext")
    assert "set training.dataset_path to a local copy" in lines[0]


# ---------------------------------------------------------------- local files

def test_local_jsonl_txt_parquet_in_order(tmp_path):
    docs = texts(7, seed=3)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(docs[:3])))
    (tmp_path / "b.txt").write_text(docs[3])
    pq.write_table(pa.table({"text": docs[4:]}), tmp_path / "c.parquet")
    spec = f"{tmp_path}/a.jsonl,{tmp_path}/b.txt,{tmp_path}/*.parquet"
    assert list(iter_documents("local", "train", spec, "training.dataset")) == docs


def test_local_file_without_text_field_names_it(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"body": "no text field"}\n')
    with pytest.raises(DataConfigError, match=r"^training\.dataset_path: .*x\.jsonl.* has no 'text' column"):
        list(iter_documents("local", "train", str(tmp_path / "x.jsonl"), "training.dataset"))


def test_token_stream_is_the_documents_separated_by_endoftext(tmp_path):
    docs = texts(5, seed=4)
    pq.write_table(pa.table({"text": docs}), tmp_path / "d.parquet")
    stream = token_stream("local", "train", str(tmp_path / "d.parquet"), "training.dataset")
    tokenizer = GPT2Tokenizer()
    expected = [t for doc in docs for t in [*tokenizer.encode(doc), EOT_ID]]
    assert stream.tolist() == expected
    pieces = tokenized_documents("local", "train", str(tmp_path / "d.parquet"), "training.dataset")
    assert [tokenizer.decode(p.tolist()) for p in pieces] == docs


# ---------------------------------------------------------------- token cache

def test_token_cache_is_written_once_and_keyed_by_the_files(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": texts(4, seed=5)}), path)
    first = token_stream("local", "train", str(path), "training.dataset")
    cached = glob.glob(str(tmp_path / "token_cache" / "*.npy"))
    assert len(cached) == 1 and isinstance(first, np.memmap)
    description = json.loads(Path(cached[0][:-4] + ".json").read_text())
    assert description["dataset"] == "local" and description["tokens"] == len(first)
    assert not glob.glob(str(tmp_path / "token_cache" / "*.tmp"))
    # A rewritten file is a new key: never a stale cache.
    pq.write_table(pa.table({"text": texts(6, seed=6)}), path)
    token_stream.cache_clear()
    second = token_stream("local", "train", str(path), "training.dataset")
    assert len(glob.glob(str(tmp_path / "token_cache" / "*.npy"))) == 2
    assert len(second) != len(first)


def _build_under_lock(cache: str, log: str, queue) -> None:
    """One 'rank': builds the tokens (slowly, logging that it did) unless another has."""
    import os
    import time

    os.environ[CACHE_ENV] = cache

    def build():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return np.arange(1000, dtype=np.uint16)

    queue.put(cached_tokens({"dataset": "concurrency-test"}, build).tolist())


def test_token_cache_builds_once_when_ranks_start_together(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    log = str(tmp_path / "builds.log")
    ranks = [context.Process(target=_build_under_lock, args=(str(tmp_path / "cache"), log, queue)) for _ in range(4)]
    for p in ranks:
        p.start()
    results = [queue.get(timeout=120) for _ in ranks]
    for p in ranks:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in ranks)
    assert len(Path(log).read_text().split()) == 1  # one rank tokenised, the others waited and read
    assert all(r == list(range(1000)) for r in results)


# ---------------------------------------------------------------- layout invariance and resume

SEQ = 16


def loader(dataset, rank: int, world: int) -> ParallelAwareDataloader:
    return ParallelAwareDataloader(dataset, dp_rank=rank, dp_world_size=world, batch_size=dataset.local_batch_size)


def global_batches(make, world: int, accum: int, local: int, steps: int) -> list[torch.Tensor]:
    """What each optimizer step trains on: every rank's micro-batches, in sequence order."""
    iters = [iter(loader(make(local, r, world), r, world)) for r in range(world)]
    out = []
    for _ in range(steps):
        micro = [[next(it)[0]["input"] for it in iters] for _ in range(accum)]
        out.append(torch.cat([b for m in micro for b in m]))
    return out


@pytest.fixture(scope="module")
def stream_files(tmp_path_factory):
    return write_parquet(tmp_path_factory.mktemp("stream"), texts(240, seed=7), files=3)


def in_memory(tokens):
    return lambda local, rank, world: PackedSequenceDataset(tokens, SEQ, local, rank, world, seed=3)


def streamed(files):
    return lambda local, rank, world: StreamingPackedDataset(lambda: load_files(files, "f", True), SEQ, local, rank, world)


@pytest.mark.parametrize("kind", ["in_memory", "streamed"])
def test_global_batch_is_the_same_for_every_layout(stream_files, kind):
    tokens = np.concatenate(list(tokenize(texts(240, seed=7))))
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


@pytest.mark.parametrize("kind", ["in_memory", "streamed"])
def test_ranks_see_different_data(stream_files, kind):
    tokens = np.concatenate(list(tokenize(texts(240, seed=7))))
    make = in_memory(tokens) if kind == "in_memory" else streamed(stream_files)
    seen = [[next(it)[0]["input"] for _ in range(5)] for it in (iter(loader(make(2, r, 2), r, 2)) for r in range(2))]
    rows = [{tuple(row.tolist()) for batch in rank for row in batch} for rank in seen]
    assert len(rows[0]) == len(rows[1]) == 10 and not rows[0] & rows[1]


def resumed_equals_uninterrupted(make, world: int, stop: int, more: int) -> None:
    for rank in range(world):
        uninterrupted = iter(loader(make(2, rank, world), rank, world))
        expected = [next(uninterrupted) for _ in range(stop + more)][stop:]
        first = loader(make(2, rank, world), rank, world)
        it = iter(first)
        for _ in range(stop):
            next(it)
        state = first.state_dict()
        resumed = loader(make(2, rank, world), rank, world)
        resumed.load_state_dict(state)
        for (x, y), (ex, ey) in zip(resumed, expected):
            assert torch.equal(x["input"], ex["input"]) and torch.equal(y, ey)


def test_in_memory_resume_mid_epoch_and_across_epochs():
    tokens = np.concatenate(list(tokenize(texts(40, seed=8))))
    make = in_memory(tokens)
    per_epoch = (len(tokens) - 1) // SEQ  # sequences; each step reads 2 ranks × 2
    resumed_equals_uninterrupted(make, world=2, stop=per_epoch // 8, more=per_epoch // 4)  # into epoch 2


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
    per_pass = sum(len(t) for t in tokenize(texts(30, seed=9))) // SEQ
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
    assert first.tolist() == [t for d in docs[held_out:] for t in [*GPT2Tokenizer().encode(d), EOT_ID]][:SEQ]


# ---------------------------------------------------------------- pre-launch errors (real CLI)

def cli_error(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> str:
    dump = tmp_path / "dump"
    proc = python_module("dispersion_titan.train", "--job.config_file", str(REPO / "train_configs" / "debug.toml"),
                         "--job.dump_folder", str(dump), *overrides, env=env)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert not dump.exists()
    return lines[0]


@pytest.mark.slow
def test_missing_and_empty_paths_fail_before_launch(tmp_path):
    """(A missing 'local' file is test_config_errors.py's case.)"""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "empty_dir").mkdir()
    line = cli_error(tmp_path, "--training.dataset", "wikitext-103", "--training.dataset_path",
                     str(tmp_path / "no_copy_here"))
    assert line.startswith("dispersion_titan: error: training.dataset_path: no file matches")
    line = cli_error(tmp_path, "--training.dataset", "local", "--training.dataset_path", str(tmp_path / "empty.jsonl"))
    assert "training.dataset_path:" in line and "is empty" in line
    line = cli_error(tmp_path, "--validation.dataset", "wikitext-103", "--validation.dataset_path",
                     str(tmp_path / "empty_dir"))
    assert "validation.dataset_path:" in line and "empty directory" in line


@pytest.mark.slow
def test_offline_hub_dataset_without_copy_fails_before_launch(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    line = cli_error(tmp_path, "--training.dataset", "fineweb-edu", env=env)
    assert line.startswith("dispersion_titan: error: training.dataset_path: the Hugging Face hub is offline")
    assert "set training.dataset_path to a local copy" in line


# ---------------------------------------------------------------- validation metrics

def test_validation_pass_gives_every_rank_the_same_number_of_batches():
    """TorchTitan's validator runs collectives per batch: uneven counts would hang it."""
    tokens = np.arange(13 * SEQ + 1, dtype=np.uint16)  # 13 sequences; 3 ranks × 2 = 6 per round
    passes = [list(PackedSequenceDataset(tokens, SEQ, 2, r, 3, infinite=False)) for r in range(3)]
    assert [len(p) for p in passes] == [6, 6, 6]
    real = sorted(int(x["input"][0]) for p in passes for x, y in p if (y != -100).all())
    assert real == [g * SEQ for g in range(13)]  # every sequence exactly once, in the global order
    assert sum(int((y == -100).all()) for p in passes for _, y in p) == 5  # the rest is ignored padding


@pytest.mark.slow
def test_validation_loss_and_perplexity_reach_tensorboard(tmp_path):
    """2 ranks over a whole held-out split whose last global batch is partial: the logged
    loss is the mean over global batches of their token-mean cross-entropy, recomputed
    here from the step-1 checkpoint, and the perplexity is its exponential."""
    from dispersion_titan.trainer.checkpoints import load_model, load_model_args

    held_out = tmp_path / "validation.jsonl"
    held_out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40, seed=11, max_words=120)))
    run = tmp_path / "run"
    torchrun(run, 2, "--training.steps", "1", "--validation.freq", "1", "--validation.steps", "-1",
             "--validation.dataset", "local", "--validation.dataset_path", str(held_out))
    s = scalars(run)
    assert sorted(s["validation_metrics/loss"]) == [1]
    loss = s["validation_metrics/loss"][1]
    assert s["validation_metrics/perplexity"][1] == pytest.approx(math.exp(loss), rel=1e-5)
    model = load_model(str(run / "checkpoint" / "step-1"), load_model_args(str(run / "checkpoint")))
    tokens = torch.from_numpy(token_stream("local", "validation", str(held_out), "validation.dataset").astype(np.int64))
    seq, global_batch = 128, 2 * 4  # debug.toml: seq_len 128, validation local_batch_size 4
    n = (len(tokens) - 1) // seq
    assert n > global_batch and n % global_batch  # several batches, the last one partial
    inputs, labels = tokens[: n * seq].view(n, seq), tokens[1 : n * seq + 1].view(n, seq)
    with torch.no_grad():
        per_batch = [torch.nn.functional.cross_entropy(model(inputs[i : i + global_batch]).flatten(0, 1),
                                                       labels[i : i + global_batch].flatten())
                     for i in range(0, n, global_batch)]
    assert loss == pytest.approx(torch.stack(per_batch).mean().item(), rel=1e-5)


# ---------------------------------------------------------------- shipped configs

def test_every_shipped_config_passes_the_checks(tmp_path):
    """In-process, never contacting the hub: hub datasets point at local copies."""
    from dispersion_titan.train import validated_args

    wikitext = str(wikitext_saved_dir(tmp_path))
    fineweb = str(Path(write_parquet(tmp_path / "fineweb", texts(3, seed=1), files=1)[0]).parent)
    copies = {"wikitext-103": wikitext, "fineweb-edu": fineweb}
    configs = sorted(glob.glob(str(REPO / "train_configs" / "*.toml")))
    assert {"midtrain_gpt2_wikitext103_dispersion.toml", "midtrain_gpt2_wikitext103_baseline.toml"} <= {
        os.path.basename(c) for c in configs}
    assert len([c for c in configs if os.path.basename(c).startswith("fineweb_")]) == 4
    import tomllib

    for config in configs:
        with open(config, "rb") as f:
            toml = tomllib.load(f)
        overrides = []
        for section in ("training", "validation"):
            name = toml.get(section, {}).get("dataset")
            if name in copies:
                overrides += [f"--{section}.dataset_path", copies[name]]
        if toml.get("checkpoint", {}).get("initial_load_in_hf"):
            overrides += ["--checkpoint.initial_load_path", str(tmp_path)]
        job = validated_args(["--job.config_file", config, "--job.custom_config_module", "dispersion_titan.config",
                              *overrides])
        if os.path.basename(config).startswith(("midtrain_", "fineweb_")):
            assert job.checkpoint.save_initial and job.checkpoint.keep_latest_k == 0, config
            assert job.validation.enable, config
