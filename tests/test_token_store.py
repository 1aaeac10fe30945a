"""The token store: ``prepare`` writes exactly the loaders' token stream (in parallel,
resumably), training reads the same sequences from it under every layout and resumes
exactly, and bad or stale stores end in one line with exit status 2."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models

from dispersion_titan.data import corpora
from dispersion_titan.data.__main__ import main, parser
from dispersion_titan.data.corpora import DataConfigError, documents_identity
from dispersion_titan.data.packed import ContinuousPackedDataset, build_dataset, token_stream
from dispersion_titan.data.store import MANIFEST, is_store, open_store, prepare, write_store
from dispersion_titan.run_folder.writer_lock import LOCK_NAME, sole_writer
from dispersion_titan.tokenizer.encoders import EOT_ID
from support.cli import file_size_limit, run_cli
from support.corpora import texts, texts_jsonl
from support.launch import DEBUG_TOML, REPO, launch_env, out_gone_while_reading, paused_reading, python_module
from support.loaders import global_batches, loader, resumed_equals_uninterrupted
from support.runs import digests

SEQ = 16
LAYOUTS = [(1, 2, 4), (2, 1, 4), (4, 1, 2), (2, 2, 2), (4, 2, 1)]  # (ranks, accumulation, local batch)

pytestmark = pytest.mark.usefixtures("private_caches")


def run_prepare(*args: str) -> dict:
    return prepare(parser().parse_args(["prepare", *args]), sole_writer)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def jsonl(path: Path, docs: list[str]) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    return str(path)


def job(dataset: str, path: str | None, local: int, seq_len: int = SEQ) -> SimpleNamespace:
    section = SimpleNamespace(dataset=dataset, dataset_path=path, seq_len=seq_len, local_batch_size=local)
    return SimpleNamespace(
        training=section,
        validation=section,
        debug=SimpleNamespace(seed=3),
        model=SimpleNamespace(name="gpt2", hf_assets_path=""),
    )  # the run's tokenizer: GPT-2's BPE


def maker(dataset: str, path: str | None, split: str = "train"):
    section = "training" if split == "train" else "validation"
    return lambda local, rank, world: build_dataset(section, split, world, rank, job(dataset, path, local))


@pytest.fixture(scope="module")
def enwiki_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("enwiki") / "store"
    run_prepare("enwiki_sample", "--out", str(out), "--workers", "2", "--shard-documents", "10")
    return out


# ---------------------------------------------------------------- what prepare writes


def test_store_holds_exactly_the_token_stream(enwiki_store):
    store = open_store(str(enwiki_store), "enwiki_sample", "train", "f")
    expected = token_stream("enwiki_sample", "train", None, "training.dataset")
    assert len(store) == len(expected) and np.array_equal(store[:], expected)
    assert store[5:5].size == 0 and np.array_equal(store[102_000:102_100], expected[102_000:102_100])  # spans shards
    manifest = store.manifest
    assert manifest["documents"] == 96 and len(manifest["shards"]) == 10 and manifest["dtype"] == "uint16"
    assert manifest["source"] == {
        "dataset": "enwiki_sample",
        "split": "train",
        "path": None,
        "identity": json.loads(json.dumps(documents_identity("enwiki_sample", "train", None, "training.dataset"))),
    }
    assert manifest["source"]["identity"]["files"][0][0].endswith(".bz2")
    starts = np.load(Path(store.folder) / manifest["document_index"])  # every document's first token
    assert starts[0] == 0 and np.array_equal(starts[1:], np.flatnonzero(expected == EOT_ID)[:-1] + 1)


def test_parallel_prepare_writes_the_same_bytes_as_one_worker(enwiki_store, tmp_path):
    run_prepare("enwiki_sample", "--out", str(tmp_path / "serial"), "--workers", "1", "--shard-documents", "10")
    assert folder_bytes(tmp_path / "serial") == folder_bytes(enwiki_store)


def test_prepare_from_a_training_toml_reads_its_sections(tmp_path):
    train, held_out = texts(12, seed=1), texts(5, seed=2)
    (tmp_path / "run.toml").write_text(
        f'[training]\ndataset = "local"\ndataset_path = "{jsonl(tmp_path / "t.jsonl", train)}"\n'
        f'[validation]\ndataset = "local"\ndataset_path = "{jsonl(tmp_path / "v.jsonl", held_out)}"\n'
    )
    for split, docs in (("train", train), ("validation", held_out)):
        out = tmp_path / split
        run_prepare(str(tmp_path / "run.toml"), "--split", split, "--out", str(out))
        store = open_store(str(out), "local", split, "f")
        expected = token_stream("local", split, str(tmp_path / ("t.jsonl" if split == "train" else "v.jsonl")), "f")
        assert np.array_equal(store[:], expected) and store.manifest["documents"] == len(docs)


def test_a_store_of_the_models_own_tokenizer(tmp_path, monkeypatch):
    """A qwen3 TOML naming a Hugging Face folder prepares its ids with that folder's
    tokenizer.json; the store is stamped with it and refused for a run of another tokenizer.
    A process loads it once, however named (a relaunch's check read a relative folder twice)."""
    from dispersion_titan.run_folder.hf_export import save_tokenizer
    from dispersion_titan.tokenizer.encoders import GPT2_BPE, encoder_for, hf_tokenizer

    hf = tmp_path / "hf"
    hf.mkdir()
    save_tokenizer(str(hf), 64)  # GPT-2's BPE as a tokenizer.json: the same ids through `tokenizers`
    path = jsonl(tmp_path / "t.jsonl", texts(12, seed=1))
    (tmp_path / "run.toml").write_text(
        f'[model]\nname = "qwen3_dispersion"\nhf_assets_path = "{hf}"\n'
        f'[training]\ndataset = "local"\ndataset_path = "{path}"\n'
    )
    run_prepare(str(tmp_path / "run.toml"), "--out", str(tmp_path / "store"))
    own = hf_tokenizer(str(hf))
    monkeypatch.chdir(tmp_path)  # --model.hf_assets_path hf, and run.json's fingerprint of its absolute path
    assert encoder_for("qwen3_dispersion", "hf") is own
    store = open_store(str(tmp_path / "store"), "local", "train", "f", own)
    assert np.array_equal(store[:], token_stream("local", "train", path, "f", own))
    assert np.array_equal(store[:], token_stream("local", "train", path, "f", GPT2_BPE))
    assert store.manifest["tokenizer"]["name"] == str(hf) and own.eos_id == EOT_ID
    with pytest.raises(DataConfigError, match="made with another tokenizer"):
        open_store(str(tmp_path / "store"), "local", "train", "f", GPT2_BPE)


# ---------------------------------------------------------------- training reads the store


@pytest.fixture
def local_corpus(tmp_path) -> tuple[str, Path]:
    path = jsonl(tmp_path / "corpus.jsonl", texts(40, seed=8))
    out = tmp_path / "store"
    run_prepare("local", "--dataset-path", path, "--out", str(out), "--shard-documents", "7", "--workers", "2")
    return path, out


def test_store_backed_training_matches_in_memory_for_every_layout(local_corpus):
    path, out = local_corpus
    assert is_store(str(out)) and not is_store(path)
    steps = 15  # past the end of the first epoch (~12 steps of 8 sequences)
    reference = global_batches(maker("local", path), world=1, accum=1, local=8, steps=steps)
    for world, accum, local in [(1, 1, 8), *LAYOUTS]:
        got = global_batches(maker("local", str(out)), world, accum, local, steps)
        assert all(torch.equal(g, r) for g, r in zip(got, reference, strict=True)), (world, accum, local)
    validation = maker("local", str(out), "validation")
    with pytest.raises(DataConfigError, match=r"holds 'local' train, not 'local' validation"):
        validation(2, 0, 1)


def test_store_backed_training_resumes_exactly(local_corpus):
    resumed_equals_uninterrupted(maker("local", str(local_corpus[1])), world=2, stop=7, more=20)  # into epoch 2


@pytest.fixture
def few_held_out(monkeypatch):
    """FineWeb-Edu's rules with 5 held-out documents instead of 10,000 (fast)."""
    fineweb = corpora.CORPORA["fineweb-edu"]
    monkeypatch.setitem(
        corpora.CORPORA,
        "fineweb-edu",
        corpora.HubDataset(fineweb.repo, fineweb.config, held_out_documents=5, streams_training=True),
    )


def test_streamed_corpus_store_matches_the_streaming_loader(tmp_path, few_held_out):
    docs = texts(45, seed=9)
    docs[7:7] = ["", " \n\t"]  # rows without text: a document of neither (a whitespace one was the stream's alone)
    docs[30:30] = ["\n\n"]
    pq.write_table(pa.table({"text": docs}), tmp_path / "fineweb.parquet")
    source, out = str(tmp_path / "fineweb.parquet"), tmp_path / "store"
    run_prepare("fineweb-edu", "--dataset-path", source, "--out", str(out), "--shard-documents", "8")
    assert isinstance(maker("fineweb-edu", str(out))(2, 0, 1), ContinuousPackedDataset)
    steps = 17  # past the end of the first pass: a window spans its last and the next pass's first tokens
    assert steps * 8 * SEQ > open_store(str(out), "fineweb-edu", "train", "f").manifest["tokens"]
    reference = global_batches(maker("fineweb-edu", source), world=1, accum=1, local=8, steps=steps)
    for world, accum, local in [(1, 1, 8), (2, 2, 2), (4, 2, 1)]:
        got = global_batches(maker("fineweb-edu", str(out)), world, accum, local, steps)
        assert all(torch.equal(g, r) for g, r in zip(got, reference, strict=True)), (world, accum, local)
    # Loader states move between a streamed run and a store-backed one: both count samples of one stream.
    for saved_by, resumed_by in ((source, str(out)), (str(out), source)):
        first = loader(maker("fineweb-edu", saved_by)(2, 1, 2), 1, 2)
        it = iter(first)
        for _ in range(9):
            next(it)
        state = first.state_dict()
        expected = [next(it)[0]["input"] for _ in range(4)]
        resumed = loader(maker("fineweb-edu", resumed_by)(2, 1, 2), 1, 2)
        resumed.load_state_dict(state)
        got = [x[0]["input"] for x in islice(resumed, len(expected))]  # resumed never ends
        assert len(got) == len(expected) == 4, (saved_by, len(got))
        assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True)), (saved_by, resumed_by)


# ---------------------------------------------------------------- interrupted prepare


def test_prepare_out_of_room_is_one_line_and_resumes_to_identical_bytes(tmp_path, enwiki_store):
    """The file size limit (as a full disk would) met by a shard write: the commands' out-of-room line,
    exit 74 (was exit 2, '--out: DIR: File too large'); with room again, the same command finishes the
    store byte for byte as an uninterrupted prepare."""
    out = tmp_path / "store"
    args = ["prepare", "enwiki_sample", "--out", str(out), "--workers", "2", "--shard-documents", "10"]
    proc = python_module("dispersion_titan.data", *args, file_limit=100 * 1024)  # ulimit -f 100, its workers too
    assert proc.returncode == 74, proc.stderr[-2000:]
    assert re.fullmatch(
        rf"dispersion_titan: error: file too large writing {out}/shard-\d+\.\w+; raise the file size limit "
        r"\(ulimit -f\); the shards written so far are kept; the same command resumes where it stopped",
        proc.stderr.strip().splitlines()[-1],
    ), proc.stderr[-2000:]
    (out / ".shard-00009.bin.x1y2.tmp").write_bytes(b"half")  # as a worker killed mid-write leaves one
    assert python_module("dispersion_titan.data", *args).returncode == 0
    assert folder_bytes(out) == folder_bytes(enwiki_store)  # no temporary file left either


def test_prepare_on_a_full_disk_leaves_no_out_folder(tmp_path, capsys):
    """A disk full from the start (the file size limit at 0, as ``ulimit -f 0``: the lock, the first write, fails):
    the out-of-room line, exit 74, and no --out left (was the empty folder prepare made, which a rerun took)."""
    out = tmp_path / "new" / "store"
    with file_size_limit(0):
        code, _, err = run_cli(main, "prepare", "enwiki_sample", "--out", out, "--workers", "1", capsys=capsys)
    assert code == 74 and f"file too large writing {out}/{LOCK_NAME}; " in err, err
    assert not any(tmp_path.iterdir())


def test_interrupted_prepare_resumes_to_identical_bytes(tmp_path, capfd):
    docs = texts(30, seed=4)
    source = {"dataset": "local", "split": "train", "path": "test", "identity": None}
    write_store(docs, str(tmp_path / "whole"), source, workers=2, shard_documents=4, progress=False)

    out = tmp_path / "resumed"
    # This worker's other children (a pool an earlier test left to the garbage collector) are not prepare's.
    others = set(multiprocessing.active_children())

    def interrupted():
        yield from docs[:13]
        for _ in range(600):  # let shards 0-2 finish, then stop as Ctrl-C or a time limit would
            if (out / "shard-00002.json").exists():
                break
            time.sleep(0.1)
        # Sent to the workers too (a terminal's reaches its process group; theirs is their own): ignored.
        for worker in set(multiprocessing.active_children()) - others:
            os.kill(worker.pid, signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    # Python's own Ctrl-C, whatever handler an earlier test in this worker left.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_store(interrupted(), str(out), source, workers=2, shard_documents=4, progress=False)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert "Traceback" not in capfd.readouterr().err  # the workers ignore it; the parent stops the pool
    assert (out / "shard-00002.json").exists() and not (out / MANIFEST).exists()
    write_store(docs, str(out), source, workers=2, shard_documents=4, progress=False)
    assert folder_bytes(out) == folder_bytes(tmp_path / "whole")
    # Damaged shards and a lost record are rewritten; verified shards are kept as they are.
    kept = (out / "shard-00000.bin").stat().st_mtime_ns
    with open(out / "shard-00001.bin", "r+b") as f:
        f.truncate(10)
    with open(out / "shard-00002.bin", "r+b") as f:  # its size, other bytes: its digest tells
        f.write(b"\xff\xff")
    (out / "shard-00004.json").unlink()
    (out / MANIFEST).unlink()
    write_store(docs, str(out), source, workers=1, shard_documents=4, progress=False)
    assert folder_bytes(out) == folder_bytes(tmp_path / "whole")
    assert (out / "shard-00000.bin").stat().st_mtime_ns == kept


def test_scancel_of_a_prepare_is_one_line_and_the_rerun_finishes(tmp_path):
    """SIGTERM to prepare's process group (Slurm's scancel; a terminal's Ctrl-C reaches the group too) killed it
    without a line, exit 143; with the command's handler alone, a worker the signal killed in the pool's task queue
    lock hung the parent's shutdown of the pool (4 times in 6). The workers are the parent's to stop: one line, exit
    143, no worker left, the shards written kept as they are; the same command finishes the store."""
    corpus = texts_jsonl(tmp_path / "corpus.jsonl", documents=16000, words=200)
    out = tmp_path / "store"
    args = ["prepare", "local", "--dataset-path", str(corpus), "--out", str(out), "--workers", "2"]
    args += ["--shard-documents", "500"]
    job = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.data", *args, timeout=60)
    while not all((out / f"shard-0000{i}.json").exists() for i in (0, 1)) and not job.done():
        time.sleep(0.005)
    assert not job.done(), job.result().stderr[-3000:]
    pid = json.loads((out / LOCK_NAME).read_text())["pid"]  # the job: a process group of its own
    workers = [
        int(p)
        for t in os.listdir(f"/proc/{pid}/task")
        for p in Path(f"/proc/{pid}/task/{t}/children").read_text().split()
    ]
    kept = digests(out, "shard-0000[01].*")
    os.killpg(pid, signal.SIGTERM)
    done = job.result()
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "dispersion_titan: interrupted; the shards written so far are kept; the same command resumes where it stopped"
    )
    assert len(workers) == 2 and not any(os.path.exists(f"/proc/{w}") for w in workers)
    again = python_module("dispersion_titan.data", *args, timeout=60)
    assert again.returncode == 0 and (out / MANIFEST).is_file(), again.stderr[-2000:]
    assert digests(out, "shard-0000[01].*") == kept


@pytest.mark.parametrize("replaced, by_folder", [(False, False), (True, False), (True, True)])
def test_an_out_removed_or_replaced_mid_prepare_is_one_line_naming_it(tmp_path, replaced, by_folder):
    """--out removed (``rm -rf``), or moved aside and a file or a new empty folder put in its place, while a worker
    checks shard 1 (paused as it opens that shard's record; shard 0 written): one line naming ``OUT/.writer.lock``,
    exit 74 (``records.holding``), as the other commands; not --out made anew by the workers' writes, a store without
    its first shard, exit 0. The folder moved aside keeps the shard written."""
    out = tmp_path / "store"
    args = ["prepare", "enwiki_sample", "--out", str(out), "--workers", "1", "--shard-documents", "10"]
    done, said = out_gone_while_reading(
        "dispersion_titan.data", *args, reading="shard-00001.json", out=out, replaced=replaced, tmp=tmp_path,
        by_folder=by_folder, keeps="shard-00000.json"
    )  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: error: {said.format(out / LOCK_NAME)}; the shards written so far are kept; the same "
        "command resumes where it stopped"
    ), done.stderr[-3000:]


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing deleted


def test_a_second_prepare_into_a_folder_being_written_is_refused(tmp_path, capsys):
    """Two prepares into one --out at once would mix their shards (both exited 0): the second is one line."""
    out = tmp_path / "store"
    fork = multiprocessing.get_context("fork")
    held, done = fork.Event(), fork.Event()

    def first_prepare() -> None:  # another process writing the store: it holds the folder's lock
        with sole_writer(out):
            held.set()
            done.wait(60)

    writer = fork.Process(target=first_prepare)
    writer.start()
    try:
        assert held.wait(30)
        with pytest.raises(SystemExit) as refused:
            main(["prepare", "enwiki_sample", "--out", str(out), "--workers", "1"])
    finally:
        done.set()
        writer.join(30)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and line.startswith(
        f"dispersion_titan: error: {out}: another command is writing here"
    ), line
    assert os.listdir(out) == []  # nothing written; the first's lock gone with it


def test_damaged_stores_fail_naming_the_file(enwiki_store, tmp_path):
    store = tmp_path / "a user's store"  # the repair command the errors print runs as printed
    shutil.copytree(enwiki_store, store)
    # A manifest of another format, version or rules, or one whose entries disagree: named as what it is.
    manifest = json.loads((store / MANIFEST).read_text())
    for edited, says in (
        ({**manifest, "format": "other"}, "corrupt manifest (not a dispersion_titan.token_store manifest)"),
        ({**manifest, "version": 2}, "format version 2, this code reads 1; rebuild it with"),
        ({k: v for k, v in manifest.items() if k != "dtype"}, "corrupt manifest (no dtype)"),
        ({**manifest, "documents_version": 0}, "stale: made with text → documents rules version 0, this"),
        ({**manifest, "dtype": "float64"}, "corrupt manifest (dtype 'float64')"),
        ({**manifest, "tokens": 1}, "corrupt manifest (its shards do not hold its 1 tokens)"),
    ):
        (store / MANIFEST).write_text(json.dumps(edited))
        with pytest.raises(DataConfigError, match=rf"^training\.dataset_path: .*manifest\.json.*{re.escape(says)}"):
            open_store(str(store), "enwiki_sample", "train", "training.dataset_path")
    (store / MANIFEST).write_text(json.dumps(manifest))
    too_long = job("enwiki_sample", str(store), 1, seq_len=manifest["tokens"])  # too short a store: its path named
    with pytest.raises(DataConfigError, match=rf"^training\.dataset_path: {manifest['tokens']} tokens are too few for"):
        build_dataset("training", "train", 1, 0, too_long)
    with open(store / "shard-00003.bin", "r+b") as f:
        f.truncate(100)
    truncated = r"^training\.dataset_path: .*shard-00003\.bin: truncated \(100 bytes"
    with pytest.raises(DataConfigError, match=truncated) as e:
        open_store(str(store), "enwiki_sample", "train", "training.dataset_path")
    assert shlex.split(str(e.value).split("rerun ")[1])[-2:] == ["--out", str(store)]
    # A shard entry no prepare writes (negative tokens, the folder itself), and a shard that is a folder:
    # named as what they are, not as "truncated".
    manifest = json.loads((store / MANIFEST).read_text())
    for shard, says in (({"tokens": -1}, "corrupt manifest"), ({"file": "."}, "corrupt manifest"), ({}, "not a file")):
        edited = {**manifest, "shards": [{**manifest["shards"][0], **shard}, *manifest["shards"][1:]]}
        (store / MANIFEST).write_text(json.dumps(edited))
        if not shard:
            os.rename(store / manifest["shards"][0]["file"], tmp_path / "moved")
            (store / manifest["shards"][0]["file"]).mkdir()
        with pytest.raises(DataConfigError, match=rf"^training\.dataset_path: .*: {says} "):
            open_store(str(store), "enwiki_sample", "train", "training.dataset_path")
    (store / MANIFEST).write_text('{"format": "dispersion_titan.token_store", "version": 1, ')
    with pytest.raises(DataConfigError, match=r"^training\.dataset_path: .*manifest\.json: corrupt manifest"):
        open_store(str(store), "enwiki_sample", "train", "training.dataset_path")
    (store / MANIFEST).unlink()
    assert is_store(str(store))  # an unfinished store is still recognised, and says so
    with pytest.raises(DataConfigError, match=r"manifest\.json: missing: the token store is unfinished") as e:
        open_store(str(store), "enwiki_sample", "train", "training.dataset_path")
    assert shlex.split(str(e.value).split("rerun ")[1])[-2:] == ["--out", str(store)]
    with pytest.raises(DataConfigError, match=r"holds 'enwiki_sample' train, not 'local' train"):
        open_store(str(enwiki_store), "local", "train", "training.dataset_path")


def cli_failure(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(["prepare", *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_prepare_bad_input_fails_in_one_line(capsys, monkeypatch, tmp_path, enwiki_store):
    (tmp_path / "file").write_text("x")
    out = str(tmp_path / "out")
    with pytest.raises(SystemExit):  # was "the following arguments are required: prepare"
        main([])
    assert capsys.readouterr().err.strip() == (
        "dispersion_titan: error: name a command; python -m dispersion_titan.data's commands: prepare (each "
        "command's --help says more)"
    )
    with pytest.raises(SystemExit):  # was "argument prepare: invalid choice: 'prep' (choose from 'prepare')"
        main(["prep", "--out", out])
    assert capsys.readouterr().err.strip() == (
        "dispersion_titan: error: unknown command 'prep'; python -m dispersion_titan.data's commands: prepare (each "
        "command's --help says more)"
    )
    line = cli_failure(capsys, "nope", "--out", out)
    assert "CONFIG_OR_DATASET: 'nope' is neither a .toml file nor a dataset" in line
    assert "--dataset-path: needs a path" in cli_failure(capsys, "local", "--out", out)
    assert "--dataset-path: no file matches" in cli_failure(
        capsys, "local", "--dataset-path", "/no/such.jsonl", "--out", out
    )
    # A folder or a file of another kind as local files, a path for the embedded corpus, an empty local copy,
    # a token store as the corpus, a TOML without the split's dataset, one whose model is no table (was a traceback).
    (tmp_path / "void").mkdir()
    (tmp_path / "nodata.toml").write_text('[model]\nname = "gpt2"\n')
    (tmp_path / "nomodel.toml").write_text('model = 3\n[training]\ndataset = "enwiki_sample"\n')
    for args, says in (
        (("local", "--dataset-path", str(tmp_path)), f"'{tmp_path}' is a directory; name files or a glob"),
        (("local", "--dataset-path", str(tmp_path / "file")), f"--dataset-path: '{tmp_path / 'file'}' is not one of ["),
        (("enwiki_sample", "--dataset-path", "x.jsonl"), "--dataset-path: 'enwiki_sample' is embedded and takes no"),
        (("fineweb-edu", "--dataset-path", str(tmp_path / "void")), f"'{tmp_path / 'void'}' is an empty directory"),
        (("enwiki_sample", "--dataset-path", str(enwiki_store)), f"{enwiki_store} is a token store already; name the"),
        ((str(tmp_path / "nodata.toml"),), f"CONFIG_OR_DATASET: {tmp_path / 'nodata.toml'}: [training] sets no"),
        ((str(tmp_path / "nomodel.toml"),), f"CONFIG_OR_DATASET: {tmp_path / 'nomodel.toml'}: [model] is no table"),
    ):
        assert says in cli_failure(capsys, *args, "--out", out)
    # A TOML's path is its key; --dataset-path over it is named as typed (was the TOML's key, and the
    # underscore spelling for a dataset name).
    toml = '[model]\nname = "gpt2"\n[training]\ndataset = "local"\ndataset_path = "/no/a"\n'
    (tmp_path / "local.toml").write_text(toml)
    assert "error: training.dataset_path: no file matches '/no/a'" in cli_failure(
        capsys, str(tmp_path / "local.toml"), "--out", out
    )
    assert "error: --dataset-path: no file matches '/no/b'" in cli_failure(
        capsys, str(tmp_path / "local.toml"), "--dataset-path", "/no/b", "--out", out
    )
    assert "CONFIG_OR_DATASET: /no/such.toml: no such file" in cli_failure(capsys, "/no/such.toml", "--out", out)
    # An empty --out was the current folder: "--out: : No such file or directory" where it is empty.
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    empty = cli_failure(capsys, "enwiki_sample", "--out", "")
    assert empty == "dispersion_titan: error: --out: empty; name the store's folder, e.g. --out data/enwiki_sample"
    # A worker per document on a big machine exhausted memory (exit 137); past sys.maxsize, islice's traceback.
    most = 8 * len(os.sched_getaffinity(0))
    assert cli_failure(capsys, "enwiki_sample", "--workers", str(most + 1), "--out", out) == (
        f"dispersion_titan: error: argument --workers: '{most + 1}' is more than {most} "
        "(8 per CPU this process may use)"
    )
    assert cli_failure(capsys, "enwiki_sample", "--shard-documents", str(2**63), "--out", out).endswith(
        f"'{2**63}' is more than {2**63 - 1}"
    )
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n{"text": " \\n"}\n')  # was "local: no train documents"
    (tmp_path / "blank.txt").write_text("  \n\n\t \n")  # whitespace alone: was a store of one such document
    for blank in (tmp_path / "blank.jsonl", tmp_path / "blank.txt"):
        assert cli_failure(capsys, "local", "--dataset-path", str(blank), "--out", out) == (
            f"dispersion_titan: error: local {blank}: no train documents (no row with text)"
        )  # alone: was below datasets' "Generating train split" bar
        assert not os.path.exists(out)
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "moved.jsonl")  # was a FileNotFoundError traceback
    assert cli_failure(capsys, "local", "--dataset-path", str(tmp_path / "gone.jsonl"), "--out", out) == (
        f"dispersion_titan: error: --dataset-path: '{tmp_path / 'gone.jsonl'}' is a symbolic link to nothing "
        f"('{tmp_path / 'moved.jsonl'}')"
    )
    line = cli_failure(capsys, "enwiki_sample", "--out", str(tmp_path / "file" / "store"))
    assert line.startswith("dispersion_titan: error: --out: ") and "file/store: Not a directory" in line
    # --out holding another store (here: another shard size): refused, nothing deleted.
    store = tmp_path / "store"
    shutil.copytree(enwiki_store, store)
    before = folder_bytes(store)
    assert (
        f"--out: {store} holds a token store of 'enwiki_sample' train made from other inputs "
        "(there vs here: shard_documents 10 vs 16384); choose another folder"
    ) in cli_failure(capsys, "enwiki_sample", "--out", str(store))
    assert (  # each difference once (was: source.identity.split too)
        "(there vs here: source.split 'train' vs 'validation'); choose"
    ) in cli_failure(capsys, "enwiki_sample", "--split", "validation", "--shard-documents", "10", "--out", str(store))
    assert folder_bytes(store) == before
    # Shards of a prepare from other inputs that stopped before its manifest: the first readable record is named.
    partial = tmp_path / "partial"
    shutil.copytree(enwiki_store, partial)
    (partial / MANIFEST).unlink()
    (partial / "shard-00000.json").write_text("{")  # unreadable: that shard would be rewritten
    assert cli_failure(capsys, "enwiki_sample", "--out", str(partial)) == (
        f"dispersion_titan: error: --out: {partial / 'shard-00001.json'} belongs to a prepare from other inputs "
        "(source, tokenizer or --shard-documents); choose another folder"
    )
    assert cli_failure(capsys, "enwiki_sample", "--tokenizer", str(tmp_path / "absent"), "--out", out) == (
        f"dispersion_titan: error: --tokenizer: {tmp_path / 'absent'}: no such folder"
    )
    assert cli_failure(capsys, "enwiki_sample", "--tokenizer", str(tmp_path / "file"), "--out", out) == (
        f"dispersion_titan: error: --tokenizer: {tmp_path / 'file'} is a file; give the folder that holds the model's "
        "tokenizer.json"
    )  # was "no such folder"
    assert cli_failure(capsys, "enwiki_sample", "--tokenizer", str(tmp_path), "--out", out) == (
        f"dispersion_titan: error: --tokenizer: {tmp_path} has no tokenizer.json (the model's tokenizer); copy the "
        "model's tokenizer files into it"
    )  # was the line without what to do
    # A corrupt tokenizer.json, then a sound one beside a corrupt or non-object tokenizer_config.json.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"broken')
    assert cli_failure(capsys, "enwiki_sample", "--tokenizer", str(bad), "--out", out).startswith(
        f"dispersion_titan: error: --tokenizer: {bad / 'tokenizer.json'}: not a tokenizer file ("
    )
    Tokenizer(models.WordLevel({"a": 0, "<eos>": 1}, unk_token="a")).save(str(bad / "tokenizer.json"))
    for config, says in (
        ("{bad", "not JSON ("),
        ("[1]", "not a JSON object; give the model's own"),
        ('{"eos_token": {"content": 3}}', "eos_token or pad_token is no token string; give the model's own"),
        ('{"eos_token": "<eos>", "pad_token": ["a"]}', "eos_token or pad_token is no token string"),  # were TypeErrors
    ):
        (bad / "tokenizer_config.json").write_text(config)
        line = cli_failure(capsys, "enwiki_sample", "--tokenizer", str(bad), "--out", out)
        assert line.startswith(f"dispersion_titan: error: --tokenizer: {bad / 'tokenizer_config.json'}: {says}")
    (bad / "tokenizer_config.json").unlink()  # none: no eos_token, the document separator, to take from it
    assert cli_failure(capsys, "enwiki_sample", "--tokenizer", str(bad), "--out", out) == (
        f"dispersion_titan: error: --tokenizer: {bad / 'tokenizer_config.json'} names no eos_token of the tokenizer "
        "(the document separator)"
    )
    assert not (tmp_path / "out").exists()


def test_a_row_without_text_is_refused_naming_file_and_line(capsys, caplog, tmp_path):
    """``data prepare local`` on a jsonl whose second row lacks ``"text"`` (or whose text is null or a
    number: was a worker's TypeError traceback): refused naming the file and line, exit 2, before --out is
    created; a row dropped in silence would make a store of fewer documents than the file holds. A file
    its reader cannot parse (a cut jsonl, a txt not UTF-8, a parquet that is not one) is named with the
    reader's reason (was datasets' 30-line DatasetGenerationError traceback), and datasets logs nothing
    of it (a parquet's was its own ``Failed to read schema`` line above ours)."""
    cut = "fix the file"
    cases = {
        "lacks.jsonl": {"title": "two"},
        "null.jsonl": {"text": None},
        "number.jsonl": {"text": 5},
        "cut.jsonl": '{"text": "tw',
        "latin.txt": b"caf\xe9",
        "broken.parquet": b"PAR1 not parquet PAR1",
    }
    for name, second in cases.items():
        path = tmp_path / name
        if isinstance(second, bytes):
            path.write_bytes(second)
        else:
            rows = ({"text": "one"}, second, {"text": "three"})[: 3 if isinstance(second, dict) else 2]
            path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
        with pytest.raises(SystemExit) as exit_:
            main(["prepare", "local", "--dataset-path", str(path), "--out", str(tmp_path / "out")])
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dispersion_titan:")]
        assert exit_.value.code == 2 and len(errors) == 1, (name, errors)
        assert not [r for r in caplog.records if r.name.startswith("datasets") and r.levelno >= logging.WARNING]
        if isinstance(second, dict):
            assert errors[0] == (
                f'dispersion_titan: error: --dataset-path: {path}: line 2 has no "text"; give every row a "text" string'
            )
        else:
            assert errors[0].startswith(f"dispersion_titan: error: --dataset-path: {path}: not readable as ")
            assert errors[0].endswith(cut)
    pq.write_table(pa.table({"text": ["one", None]}), tmp_path / "null.parquet")  # no line to name: its row
    with pytest.raises(SystemExit) as exit_:
        main(["prepare", "local", "--dataset-path", str(tmp_path / "null.parquet"), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1] == (
        f'dispersion_titan: error: --dataset-path: row 2 of {tmp_path / "null.parquet"} has no "text"; '
        'give every row a "text" string'
    )
    assert not (tmp_path / "out").exists()


def test_a_file_named_with_glob_characters_is_that_file(capsys, tmp_path):
    """``--dataset-path 'corpus[1].jsonl'``, a file that is there, is that file (was read as a glob: refused as
    ``no file matches`` alone; beside ``corpus1.jsonl``, that other file prepared in silence). A pipe named as a
    corpus is refused as no regular file (was ``is empty``, of a pipe that may hold text)."""
    (tmp_path / "corpus[1].jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    (tmp_path / "corpus1.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n')
    out = tmp_path / "store"
    main(["prepare", "local", "--dataset-path", str(tmp_path / "corpus[1].jsonl"), "--out", str(out), "--workers", "1"])
    assert json.loads((out / MANIFEST).read_text())["documents"] == 2
    capsys.readouterr()
    os.mkfifo(tmp_path / "pipe.txt")
    assert cli_failure(capsys, "local", "--dataset-path", str(tmp_path / "pipe.txt"), "--out", str(tmp_path / "o")) == (
        f"dispersion_titan: error: --dataset-path: '{tmp_path / 'pipe.txt'}' is no regular file (a pipe or a device); "
        "name files"
    )


# ---------------------------------------------------------------- the real command lines


def test_prepare_job_script_runs_the_command_line(tmp_path):
    """launch/slurm/prepare.sbatch outside Slurm: the real ``python -m dispersion_titan.data prepare``."""
    path = jsonl(tmp_path / "c.jsonl", texts(9, seed=5))
    proc = subprocess.run(
        [
            "bash",
            str(REPO / "launch" / "slurm" / "prepare.sbatch"),
            "local",
            "--dataset-path",
            path,
            "--out",
            str(tmp_path / "store"),
            "--workers",
            "2",
        ],
        cwd=tmp_path,
        env=launch_env({"PYTHON": sys.executable}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"--training.dataset local --training.dataset_path {tmp_path / 'store'}" in proc.stdout
    assert np.array_equal(
        open_store(str(tmp_path / "store"), "local", "train", "f")[:], token_stream("local", "train", path, "f")
    )


def test_prepares_closing_options_run_as_printed(capsys, tmp_path, enwiki_store):
    """``--out "my store"``: the closing ``--training.dataset_path`` quoted, so it pastes as printed
    (was ``--training.dataset_path my store``, the store's name cut at its space)."""
    store = tmp_path / "my store"
    shutil.copytree(enwiki_store, store)
    main(["prepare", "enwiki_sample", "--out", str(store), "--workers", "1", "--shard-documents", "10"])
    printed = capsys.readouterr().out.strip().splitlines()[-1].split("train on it with ")[1]
    assert shlex.split(printed) == ["--training.dataset", "enwiki_sample", "--training.dataset_path", str(store)]


def test_prepare_command_line_fails_in_one_line_and_deletes_nothing(tmp_path, enwiki_store):
    store = tmp_path / "store"
    shutil.copytree(enwiki_store, store)
    (store / MANIFEST).write_text("{not json")
    before = folder_bytes(store)
    # forked, as the out-of-room test runs it (the fresh interpreter: test_prepare_job_script_runs_the_command_line)
    proc = python_module("dispersion_titan.data", "prepare", "enwiki_sample", "--out", str(store), timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"dispersion_titan: error: --out: {store / MANIFEST}: corrupt manifest")
    assert folder_bytes(store) == before


def test_stale_store_is_refused_before_launch(tmp_path, enwiki_store):
    """The check ``dispersion_titan.train`` runs before any process group starts (its
    ConfigError ends the command in one line, exit 2: test_data's cli_error tests)."""
    from dispersion_titan.job_config.parse import validated_args
    from dispersion_titan.utils.errors import ConfigError

    store = tmp_path / "store"
    shutil.copytree(enwiki_store, store)
    args = [
        "--job.config_file",
        DEBUG_TOML,
        "--job.custom_config_module",
        "dispersion_titan.config",
        "--training.dataset_path",
        str(store),
    ]
    assert validated_args(args).training.dataset_path == str(store)
    manifest = json.loads((store / MANIFEST).read_text())
    manifest["tokenizer"]["sha256"] = "0" * 64  # as if made with another tokenizer
    (store / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as error:
        validated_args(args)
    assert len(str(error.value).splitlines()) == 1
    assert str(error.value).startswith(
        f"training.dataset_path: token store {store / MANIFEST} is stale: made with another tokenizer"
    )
    assert str(error.value).endswith("; rebuild it with python -m dispersion_titan.data prepare")


def test_a_shard_removed_while_training_is_one_line_naming_the_last_good_checkpoint(tmp_path, enwiki_store):
    """A store's shard removed while a run trains on it (paused as it opens ``shard-00003.bin``, which it maps once
    step 2 is saved): ``no such file or directory: STORE/shard-00003.bin; the last good checkpoint is step-2; put
    back what was removed or moved …``, exit 74 (was the OSError's traceback, exit 1; without the trainer's own line,
    the commands' ``…; nothing saved``), the checkpoints unchanged; the shard put back, the same command finishes."""
    store, dump = tmp_path / "store", tmp_path / "run"
    shutil.copytree(enwiki_store, store)
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), "--training.seq_len", "64"]
    argv += ["--training.steps", "4", "--checkpoint.interval", "2", "--training.dataset_path", str(store)]
    shard = store / "shard-00003.bin"
    pid, job = paused_reading("dispersion_titan.train", *argv, reading=shard.name, tmp=tmp_path)
    kept = shard.read_bytes()
    shard.unlink()
    saved = digests(dump / "checkpoint")
    os.kill(pid, signal.SIGCONT)
    proc = job.result()
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: error: no such file or directory: {shard}; the last good checkpoint is step-2; put back "
        "what was removed or moved (it, or a folder on its path) and relaunch the same command to resume"
    ), proc.stderr[-3000:]
    assert digests(dump / "checkpoint") == saved
    shard.write_bytes(kept)
    again = python_module("dispersion_titan.train", *argv)
    assert again.returncode == 0 and "step-4" in os.listdir(dump / "checkpoint"), again.stderr[-3000:]


def test_a_relaunch_names_its_documents_by_any_path_and_a_store_prepared_again_is_refused(tmp_path, monkeypatch):
    """``run.json`` records beside each data path the identity of the documents it gave (``run_folder.settings``:
    ``DATA_IDENTITY``), so a relaunch may name them by another path: the store copied or moved (was refused as
    `started with other settings: training.dataset_path "store" -> "copy"`), written absolute, prepared again in
    other shards, the corpus it was made from (docs/data.md: a run resumes on a store of its corpus and back).
    Another corpus is refused as before; a store prepared again from another corpus at the same path is refused in
    one line (was: trained on, silently); a path with nothing there now (the store moved) says so (was the corpus's
    check: `no file matches`, or for enwiki_sample `is embedded and takes no path`). A run recorded without the
    identity keeps comparing paths. In process: the launch's own checks, on a ``run.json`` as the trainer writes it."""
    from dispersion_titan.config.cli import load_toml
    from dispersion_titan.job_config.parse import check, parse_job_config, validated_args
    from dispersion_titan.run_folder.checkpoints import recorded_run
    from dispersion_titan.run_folder.outputs import FORMAT, FORMAT_KEY
    from dispersion_titan.run_folder.settings import check_same_settings, refuse_other_data_here, run_settings
    from dispersion_titan.utils.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    corpus, other = jsonl(tmp_path / "a.jsonl", texts(30, seed=1)), jsonl(tmp_path / "b.jsonl", texts(30, seed=2))
    run_prepare("local", "--dataset-path", corpus, "--out", "store", "--workers", "1")
    dump = tmp_path / "run"
    args = ["--job.config_file", DEBUG_TOML, "--job.custom_config_module", "dispersion_titan.config"]
    args += ["--job.dump_folder", str(dump), "--training.dataset", "local"]

    def relaunch(path: str) -> None:  # as check_launch orders them
        argv = [*args, "--training.dataset_path", path]
        job = parse_job_config(argv, load_toml(argv))
        refuse_other_data_here(str(dump), recorded_run(str(dump)), job)
        check_same_settings(str(dump), recorded_run(str(dump)), check(job))

    def refused(path: str) -> str:
        with pytest.raises(ConfigError) as refusal:
            relaunch(path)
        return str(refusal.value)

    settings = run_settings(validated_args([*args, "--training.dataset_path", "store"]))
    record = {FORMAT_KEY: FORMAT, "model_args": {}, "settings": settings, "saved_checkpoints": True, "cwd": "."}
    dump.mkdir()
    (dump / "run.json").write_text(json.dumps(record))
    shutil.copytree(tmp_path / "store", tmp_path / "copy")
    run_prepare("local", "--dataset-path", corpus, "--out", "resharded", "--workers", "1", "--shard-documents", "7")
    for path in ("store", str(tmp_path / "store"), "copy", "resharded", corpus, "a.jsonl"):
        relaunch(path)
    assert refused(other) == (
        f'run folder {dump} was started with other settings: training.dataset_path "store" -> "{other}"; relaunch '
        "with the same settings, or branch on purpose with --job.fork_from RUN[@STEP] into a new --job.dump_folder"
    )
    shutil.rmtree(tmp_path / "store")
    assert refused("store") == (
        f"training.dataset_path: store: nothing there now, and run folder {dump} trained on it; put it back there "
        "(a symbolic link to where it is now will do)"
    )
    run_prepare("local", "--dataset-path", other, "--out", "store", "--workers", "1")
    assert refused("store") == (
        f"training.dataset_path: token store store holds other documents than run folder {dump} trained on (prepared "
        "again since, from other inputs); put the run's store back there, or branch on purpose with --job.fork_from "
        "RUN[@STEP] into a new --job.dump_folder"
    )
    del settings["training.dataset_identity"]  # recorded before identities were
    (dump / "run.json").write_text(json.dumps(record))
    assert 'training.dataset_path "store" -> "copy"' in refused("copy")
