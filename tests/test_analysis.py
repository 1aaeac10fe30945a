"""Condensation analysis: numbers against a plain reference, and the CLI end to end on a
real (tiny) training run: outputs, re-runs, interrupted runs, broken checkpoints,
bad input, and comparing runs."""

from __future__ import annotations

import codecs
import csv
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dispersion_titan.analysis import runner
from dispersion_titan.analysis.arguments import input_options
from dispersion_titan.analysis.condensation_schema import Condensation, _check_numbers
from dispersion_titan.analysis.inputs import InputOptions, select_sequences
from dispersion_titan.analysis.measure import DecoderLayers, cosines, measure, unit_tokens
from dispersion_titan.analysis.statistics import summarize
from dispersion_titan.analyze import REWRITTEN
from dispersion_titan.data.packed import tokenized_documents
from dispersion_titan.models.gpt2.args import gpt2_flavors
from dispersion_titan.models.gpt2.model import GPT2
from dispersion_titan.run_folder.checkpoints import check_complete, list_checkpoints, load_model, load_model_args
from dispersion_titan.run_folder.owners import OWNER_FILE
from dispersion_titan.run_folder.writer_lock import LOCK_NAME
from dispersion_titan.utils.errors import AnalysisError, CheckpointError
from support.cli import analyze, assert_one_line_error, file_size_limit
from support.corpora import texts_jsonl, wikitext_parquet_dir
from support.launch import (
    as_someone_else,
    in_mount_namespace,
    out_gone_while_reading,
    paused_reading,
    python_module,
    second_writer_is_refused,
    torchrun,
)
from support.runs import digests, logged, scale_weights, tiny_run

K, S = 8, 64  # sequences and tokens in the end-to-end analyses
OPTS = ["--num-sequences", str(K), "--seq-len", str(S), "--batch-size", "3"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- plain reference


def plain_hidden_states(model: GPT2, sequence: torch.Tensor) -> list[np.ndarray]:
    """Embedding, every block, final norm: the modules called one by one."""
    with torch.no_grad():
        x = model.tok_embeddings(sequence[None]) + model.pos_embeddings(torch.arange(len(sequence))[None])
        states = [x]
        for block in model.layers.values():
            x = block(x)
            states.append(x)
        states.append(model.norm(x))
    return [s[0].double().numpy() for s in states]


def plain_cosine_matrix(h: np.ndarray) -> np.ndarray:
    n = len(h)
    units = [row / max(np.sqrt(np.dot(row, row)), 1e-3) for row in h]
    m = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            m[i, j] = min(1.0, max(-1.0, np.dot(units[i], units[j])))
    return m


def plain_ranks(values: list[float]) -> list[int]:
    return [sorted(values).index(v) for v in values]  # no ties in these curves


def plain_reference(model: GPT2, tokens: torch.Tensor) -> dict:
    per_sequence = [[plain_cosine_matrix(h) for h in plain_hidden_states(model, seq)] for seq in tokens]
    layers = []
    for index in range(len(per_sequence[0])):
        avg = sum(seqs[index] for seqs in per_sequence) / len(per_sequence)
        n = avg.shape[0]
        entries = avg.ravel()
        counts = np.zeros(128)
        for value in entries:
            counts[min(int((value + 1.0) / (2.0 / 128)), 127)] += 1
        layers.append(
            {
                "entries": n * n,
                "mean_cos": entries.sum() / n**2,
                "mean_cos_offdiag": (entries.sum() - sum(avg[i, i] for i in range(n))) / (n * n - n),
                "hist": counts / (n * n * (2.0 / 128)),
            }
        )
    curve = [layer["mean_cos"] for layer in layers]
    x, y = np.arange(len(curve)), np.array(plain_ranks(curve))
    spearman = np.corrcoef(x, y)[0, 1]
    pairs = [(i, j) for i in range(len(curve)) for j in range(i + 1, len(curve))]
    kendall = sum(np.sign(curve[j] - curve[i]) for i, j in pairs) / len(pairs)
    last_n = [np.mean(curve[-n:]) for n in range(1, len(curve) + 1)]
    return {"layers": layers, "spearman": spearman, "kendall": kendall, "last_n": last_n}


def assert_matches_reference(result: Condensation | SimpleNamespace, ref: dict, names: list[str]) -> None:
    assert [layer.name for layer in result.layers] == names
    assert [layer.index for layer in result.layers] == list(range(len(names)))
    for got, want in zip(result.layers, ref["layers"], strict=True):
        assert got.mean_cos == pytest.approx(want["mean_cos"], abs=1e-5)
        assert got.mean_cos_offdiag == pytest.approx(want["mean_cos_offdiag"], abs=1e-5)
        # Densities agree but for at most two entries within rounding of a bin edge.
        moved = np.abs(np.array(got.hist) - want["hist"]).sum() * (2 / 128) * want["entries"] / 2
        assert moved <= 2 + 1e-9
        assert np.sum(got.hist) * (2 / 128) == pytest.approx(1.0)
    assert result.spearman == pytest.approx(ref["spearman"], abs=1e-9)
    assert result.kendall == pytest.approx(ref["kendall"], abs=1e-9)
    assert [e.n for e in result.last_n] == list(range(1, len(names) + 1))
    assert [e.mean_cos for e in result.last_n] == pytest.approx(ref["last_n"], abs=1e-5)


def debug_names(n_layers: int = 4) -> list[str]:
    return ["embedding", *(f"block_{i}" for i in range(1, n_layers + 1)), "final_norm"]


def test_statistics_match_plain_computation():
    torch.manual_seed(0)
    with torch.device("meta"):
        model = GPT2(gpt2_flavors["debug"])
    model.to_empty(device="cpu")
    model.init_weights()
    # Stronger positional signal than the init gives, so the layers differ clearly.
    with torch.no_grad():
        model.pos_embeddings.weight.mul_(20)
    tokens = torch.randint(0, 50257, (5, 16), generator=torch.Generator().manual_seed(1))
    measured = measure(DecoderLayers(model), tokens, batch_size=2, device="cpu")  # uneven last batch
    assert measured.means.shape == (6, 16, 16)
    assert_matches_reference(SimpleNamespace(**summarize(measured)), plain_reference(model, tokens), debug_names())


class ReadBacks(TorchDispatchMode):
    """Counts the values read back to the host (``.item()``, ``bool(t)``; ``is_nonzero`` under inference mode): on
    CUDA each a wait for the GPU."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)
        return func(*args, **(kwargs or {}))


def test_the_analysis_waits_for_the_device_once_per_batch_not_per_layer():
    """Its NaN check reads one value back per batch (was one per layer and batch: 6 for the debug model's 4 blocks,
    each a GPU sync that leaves the GPU idle while Python queues the next layer)."""
    torch.manual_seed(0)
    model = GPT2(gpt2_flavors["debug"])
    model.init_weights()
    tokens = torch.randint(0, 50257, (5, 16), generator=torch.Generator().manual_seed(1))
    with ReadBacks() as read_backs:
        measure(DecoderLayers(model), tokens, batch_size=2, device="cpu", geometry_sequences=0)
    assert read_backs.count == 3  # the batches


def test_the_number_check_finds_fields_by_type_with_or_without_string_annotations():
    """Readers of ``condensation.json`` refuse a NaN in any number field, found by its resolved type: the schema's
    annotations are strings (``from __future__ import annotations``); a dataclass annotated with types (made without
    that import) is checked the same (was: ``float`` fields of one skipped, ``str(float)`` not being ``"float"``)."""
    nan = float("nan")
    record = dataclasses.make_dataclass(
        "Layer", [("name", str), ("mean_cos", float), ("mev", float | None), ("hist", list[float])]
    )
    _check_numbers(record("block_1", 0.5, None, [1.0]), "layers[1].")
    for values, key in (
        (("block_1", nan, None, [1.0]), "mean_cos"),
        (("block_1", 0.5, nan, [1.0]), "mev"),
        (("block_1", 0.5, None, [1.0, nan]), r"hist\[1\]"),
        (("block_1", True, None, [1.0]), "mean_cos"),
    ):
        with pytest.raises(ValueError, match=rf"^layers\[1\]\.{key}: .* is no finite number$"):
            _check_numbers(record(*values), "layers[1].")


def test_cosines_clamp_tiny_norms_and_clip():
    h = torch.tensor([[[3.0, 4.0], [0.0, 0.0], [3e-4, 4e-4], [-6.0, -8.0]]])
    got = cosines(unit_tokens(h))[0].double().numpy()
    assert np.allclose(got, plain_cosine_matrix(h[0].double().numpy()), atol=1e-6)
    assert got[2, 2] == pytest.approx(0.25)  # |h| = 5e-4 is divided by the clamp 1e-3
    assert got.max() <= 1.0 and got[0, 3] == pytest.approx(-1.0)


def test_sequences_are_seeded_windows_of_long_documents():
    options = InputOptions("enwiki_sample", None, None, num_sequences=12, seq_len=512, seed=0)
    a, b = select_sequences(options), select_sequences(options)
    assert a.sha256 == b.sha256 and torch.equal(a.tokens, b.tokens)
    assert a.tokens.shape == (12, 512)
    other = select_sequences(InputOptions("enwiki_sample", None, None, 12, 512, seed=1))
    assert other.sha256 != a.sha256
    docs = [d.astype(np.int64) for d in tokenized_documents("enwiki_sample", "validation", None, "--dataset")]
    windows = {tuple(d[i : i + 512]) for d in docs if len(d) >= 512 for i in range(0, len(d) - 511, 512)}
    assert all(tuple(seq.tolist()) in windows for seq in a.tokens)
    assert len({tuple(seq.tolist()) for seq in a.tokens}) == 12


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One real 2-process debug training run with checkpoints at steps 0, 2 and 4."""
    dump = tmp_path_factory.mktemp("analysis") / "baseline"
    torchrun(dump, 2, "--training.steps", "4", "--checkpoint.interval", "2", "--validation.no-enable")
    assert sorted(os.listdir(dump / "checkpoint")) == ["step-0", "step-2", "step-4"]
    return dump


@pytest.fixture(scope="module")
def analyzed(run, tmp_path_factory) -> Path:
    """``run`` analyzed once by the CLI; the tests below read or re-run it."""
    code = python_module("dispersion_titan.analyze", str(run), *OPTS)
    assert code.returncode == 0, code.stderr[-3000:]
    return run / "condensation"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def mtimes(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}


def test_end_to_end_outputs(run, analyzed):
    for step in (0, 2, 4):
        result = read_json(analyzed / f"step-{step}" / "condensation.json")
        assert {"step", "num_sequences", "seq_len", "layers", "spearman", "kendall", "last_n", "inputs"} <= set(result)
        assert (result["step"], result["num_sequences"], result["seq_len"]) == (step, K, S)
        assert [layer["name"] for layer in result["layers"]] == debug_names()
        assert set(result["layers"][0]) == {
            "index",
            "name",
            "mean_cos",
            "mean_cos_offdiag",
            "hist",
            "effective_rank",
            "mev",
        }
        png = (analyzed / f"heatmap_step-{step}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert (analyzed / "evolution.png").read_bytes().startswith(PNG_MAGIC)

    # The numbers of the trained checkpoint agree with the plain reference on the same sequences.
    path = analyzed / "step-4" / "condensation.json"
    result = Condensation.from_json(read_json(path), str(path))
    assert Condensation.from_json(result.to_json(), "round trip") == result
    with pytest.raises(AnalysisError, match=r"^old: not a condensation result of this version \('last_n'\)$"):
        Condensation.from_json({k: v for k, v in result.to_json().items() if k != "last_n"}, "old")
    sequences = select_sequences(InputOptions("enwiki_sample", None, None, K, S, seed=0))
    assert result.tokens_sha256 == sequences.sha256
    model = load_model(str(run / "checkpoint" / "step-4"), load_model_args(str(run / "checkpoint")))
    assert_matches_reference(result, plain_reference(model, sequences.tokens), debug_names())
    assert result.spearman > 0.9  # trained weights condense with depth already after 4 steps

    with open(analyzed / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["step"]), r["layer"]) for r in rows] == [(s, n) for s in (0, 2, 4) for n in debug_names()]
    assert float(rows[-1]["mean_cos"]) == pytest.approx(result.layers[-1].mean_cos, rel=1e-5)  # 6 digits

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    histograms = []
    for events in sorted((run / "tb" / "condensation").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"histograms": 0})
        acc.Reload()
        assert {f"analysis/cosine/{n}" for n in debug_names()} <= set(acc.Tags()["histograms"])
        histograms += acc.Histograms("analysis/cosine/final_norm")
    assert {h.step for h in histograms} == {0, 2, 4}
    assert all(h.histogram_value.num == S * S for h in histograms)


def test_rerun_skips_and_force_recomputes(run, analyzed, capsys, tmp_path):
    before = mtimes(analyzed)
    code, out, err = analyze(run, *OPTS, "--tb-dir", tmp_path / "tb", capsys=capsys)
    assert code == 0 and "3 checkpoint(s) already analyzed" in out and err == ""  # no bar of 0 batches
    assert not (tmp_path / "tb").exists() and "TensorBoard" not in out  # no histogram to write: none made, none named
    (tmp_path / "file").write_text("")  # nothing to analyze, yet a --tb-dir that cannot be made is refused at once
    code, _, err = analyze(run, *OPTS, "--tb-dir", tmp_path / "file" / "tb", capsys=capsys)
    assert (
        code == 2 and err == f"dispersion_titan: error: --tb-dir: {tmp_path}/file/tb: not writable (Not a directory)\n"
    )
    after = mtimes(analyzed)
    assert all(after[f"step-{s}/condensation.json"] == before[f"step-{s}/condensation.json"] for s in (0, 2, 4))

    old = read_json(analyzed / "step-2" / "condensation.json")
    # RUN may also be the checkpoint folder; results still go to the dump folder's condensation/.
    code, out, _ = analyze(run / "checkpoint", *OPTS, "--steps", "1-3", "--force", capsys=capsys)
    assert code == 0 and "step 2:" in out and "step 4:" not in out
    logged_steps = [step for step, _ in logged(run / "tb" / "condensation", "analysis/mean_cos/final_norm")]
    assert logged_steps == [0, 2, 4]  # step 2's replaced, not added
    board = digests(run / "tb" / "condensation")
    code, out, _ = analyze(run, *OPTS, "--steps", "0", "--out", tmp_path / "again", capsys=capsys)
    assert code == 0 and (tmp_path / "again" / "step-0" / "condensation.json").is_file()
    assert digests(run / "tb" / "condensation") == board  # these checkpoints' histograms are there: not twice
    after_force = mtimes(analyzed)
    assert after_force["step-2/condensation.json"] != before["step-2/condensation.json"]
    assert after_force["step-4/condensation.json"] == before["step-4/condensation.json"]
    assert read_json(analyzed / "step-2" / "condensation.json")["layers"] == old["layers"]


def test_a_full_disk_writing_tensorboard_events_is_one_line_and_leaves_no_events(run, tmp_path):
    """``--tb-dir`` on a file system that fills as TensorBoard writes step-0's histograms (a tmpfs of 4 pages, mounted
    in a namespace of the test's own: ``.owner.json`` takes one): one line naming the events file, exit 74, and the
    events file cut short removed, which the rerun would log the step again beside (was the writer thread's
    traceback, a line naming no file, and the partial events file left)."""
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -rm)")
    argv = [str(run), *OPTS, "--steps", "0", "--out", str(tmp_path / "out"), "--tb-dir", str(full / "tb")]
    mount, after = f"mount -t tmpfs -o size=16k tmpfs {full}", f"ls -A {full}/tb"  # gone with the namespace
    proc = in_mount_namespace(mount, "dispersion_titan.analyze", *argv, tmp=tmp_path, after=after)
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.fullmatch(
        rf"dispersion_titan: error: no space left on device writing {full}/tb/events\.out\.tfevents\.\S+; free space; "
        r"each model state analyzed so far is kept in its folder; the same command analyzes the rest",
        proc.stderr.strip().splitlines()[-1],
    ), proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == ".owner.json", proc.stdout  # ls -A: no events file left


@pytest.mark.parametrize("length", [4075, 4084])
def test_a_tb_dir_too_long_for_its_files_is_one_line_and_keeps_what_was_written(
    run, analyzed, capsys, tmp_path, length
):
    """``--tb-dir`` a path the system takes (4075 bytes: made, written, its ``.owner.json`` read) but not the name its
    record is written through (``atomic_write``'s temporary file, 26 bytes longer: past PATH_MAX's 4096): one line,
    ``file name too long: TB/.owner.json; give a shorter path; …``, exit 74 (was the OSError's traceback, exit 1);
    the results already in ``--out`` and the run unchanged. 4084 bytes, its ``.owner.json`` past PATH_MAX as it is
    read: the same line (was ``TB/.owner.json: unreadable (…); restore it, or remove it and rerun``, exit 2)."""
    out = tmp_path / "out"
    shutil.copytree(analyzed, out)
    shutil.rmtree(out / "step-4")  # a step left to analyze
    tb = tmp_path
    while len(str(tb)) < length:
        tb /= "d" * min(200, max(1, length - len(str(tb)) - 1))
    kept, trained = digests(out), digests(run)
    code, _, err = analyze(run, *OPTS, "--out", out, "--tb-dir", tb, capsys=capsys)
    assert code == 74 and [line for line in err.splitlines() if line.strip() and "%|" not in line] == [
        f"dispersion_titan: error: file name too long: {tb}/.owner.json; give a shorter path; each model state "
        "analyzed so far is kept in its folder; the same command analyzes the rest"
    ], err[-3000:]
    assert kept.items() <= digests(out).items() and digests(run) == trained


@pytest.mark.parametrize("replaced", [False, True])
def test_an_out_removed_or_replaced_by_a_file_mid_run_is_one_line_naming_it(run, tmp_path, replaced):
    """``--out`` removed (``rm -rf``), or moved aside and a file put in its place, while ``analyze`` measures step 0
    (paused as it opens its checkpoint): one line naming ``OUT/.writer.lock``, the first of its files found gone, exit
    74; not ``--out`` made anew by its writes, without its ``.owner.json`` (which a later command would refuse as no
    command's), exit 0; nor the failure of taking its record back as it gives up (``not a directory:
    OUT/.owner.json``). The folder moved aside keeps its record."""
    out = tmp_path / "out"
    argv = [str(run), *OPTS, "--out", str(out), "--tb-dir", str(tmp_path / "tb")]
    proc, said = out_gone_while_reading(
        "dispersion_titan.analyze", *argv, reading="step-0/__0_0.distcp", out=out, replaced=replaced, tmp=tmp_path
    )
    assert proc.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: error: {said.format(out / LOCK_NAME)}; each model state analyzed so far is kept in its "
        "folder; the same command analyzes the rest"
    ), proc.stderr[-3000:]


def test_interrupted_analysis_completes_on_rerun(run, analyzed, capsys, tmp_path):
    out = tmp_path / "interrupted"
    shutil.copytree(analyzed, out)
    complete = read_json(out / "step-2" / "condensation.json")
    # What a kill during step 2 leaves: no json for it, a stray temp file, no summary yet.
    (out / "step-2" / "condensation.json").unlink()
    (out / "step-2" / ".condensation.json.123.tmp").write_text('{"step": 2, "lay')
    (out / ".heatmap_step-2.png._1d43cq7.tmp").write_bytes(b"\x89PNG")  # what kill -9 in save_png left
    (out / ".staging.k9" / "table.md").parent.mkdir()
    (out / ".staging.k9" / "table.md").write_text("| half")  # a staged folder: evaluate table's, convert's
    (out / "summary.csv").unlink()
    tb = tmp_path / "tb"  # and in --tb-dir, where the killed analysis was recording step 2's histograms
    tb.mkdir()
    shutil.copy(run / "tb" / "condensation" / ".owner.json", tb)  # its record: these settings' histograms
    (tb / "..histograms.json.k9.tmp").write_text('{"step-2": ')
    code, stdout, _ = analyze(run, *OPTS, "--out", out, "--tb-dir", tb, capsys=capsys)
    assert code == 0 and "step 2:" in stdout and "step 0:" not in stdout
    assert not [p for p in out.rglob(".*") if p.name != ".owner.json"]  # the stale ones removed, no lock left
    assert sorted(p.name for p in tb.glob(".*")) == [".histograms.json", ".owner.json"]
    assert read_json(out / "step-2" / "condensation.json")["layers"] == complete["layers"]
    assert len((out / "summary.csv").read_text().splitlines()) == 1 + 3 * 6


def test_broken_checkpoints_are_reported_and_skipped(run, tmp_path, capsys):
    broken = tmp_path / "broken"
    (broken / "checkpoint").mkdir(parents=True)
    shutil.copy(run / "run.json", broken)
    os.symlink(run / "checkpoint" / "step-0", broken / "checkpoint" / "step-0")
    partial = broken / "checkpoint" / "step-2"  # crashed before .metadata was written
    partial.mkdir()
    for f in (run / "checkpoint" / "step-2").glob("*.distcp"):
        os.symlink(f, partial / f.name)
    corrupt = broken / "checkpoint" / "step-4"  # a truncated shard
    shutil.copytree(run / "checkpoint" / "step-4", corrupt)
    with open(corrupt / "__1_0.distcp", "r+b") as f:
        f.truncate(1000)
    code, out, err = analyze(broken, *OPTS, capsys=capsys)
    assert code == 1
    assert f"{partial}: missing .metadata" in err
    assert f"{corrupt / '__1_0.distcp'}: truncated" in err
    assert "2 of 3 checkpoints could not be analyzed" in err
    assert sorted(p.parent.name for p in (broken / "condensation").glob("step-*/condensation.json")) == ["step-0"]


def test_a_checkpoint_removed_after_it_was_listed_is_said_removed_not_corrupt(tmp_path):
    """``analyze``, ``evaluate`` or ``convert`` of a run still training with ``checkpoint.keep_latest_k``: a step
    listed, then deleted by the trainer, is said removed, run again (was ``missing .metadata (partial or corrupt
    checkpoint)``, as if the run were damaged: analyze's skip line, convert's exit 2)."""
    (tmp_path / "checkpoint" / "step-3").mkdir(parents=True)
    (step,) = list_checkpoints(str(tmp_path / "checkpoint"))
    shutil.rmtree(step.path)  # the trainer's retention, between the listing and the read
    with pytest.raises(CheckpointError) as error:
        check_complete(step.path)
    assert str(error.value) == (
        f"{step.path}: removed since it was listed (a run still training deletes older steps under "
        "checkpoint.keep_latest_k); run the command again, or once it has ended"
    )


def test_a_diverged_checkpoint_is_skipped_in_one_line(tmp_path, capsys):
    """A checkpoint of weights as one step of ``--optimizer.lr 1e30`` leaves them (finite, of 1e30; saved before the
    run stops on the next step's loss): its hidden states past float32, skipped with one line naming it, exit 1, the
    others analyzed (was: a ``LinAlgError`` traceback from the eigensolver, nothing written)."""
    run = tiny_run(tmp_path / "run", steps=(0, 2))
    step = run / "checkpoint" / "step-2"
    scale_weights(step, 1e30)
    code, _, err = analyze(run, *OPTS, capsys=capsys)
    assert code == 1 and "Traceback" not in err
    assert (
        f"skipped checkpoint: {step}: its hidden states are NaN, infinite or too large for float32; "
        "a diverged or damaged model, nothing recorded"
    ) in err
    assert sorted(p.parent.name for p in (run / "condensation").glob("step-*/condensation.json")) == ["step-0"]


def test_an_analysis_that_writes_nothing_leaves_no_folder(run, tmp_path, capsys):
    """Its only checkpoint unreadable: exit 1, and neither ``--out`` (was: left holding its ``.owner.json``) nor
    ``--tb-dir`` (with the folder above it, both new) left behind empty."""
    broken = tmp_path / "broken"
    (broken / "checkpoint" / "step-2").mkdir(parents=True)  # crashed before .metadata was written
    shutil.copy(run / "run.json", broken)
    code, _, err = analyze(broken, *OPTS, "--out", tmp_path / "out", "--tb-dir", tmp_path / "new" / "tb", capsys=capsys)
    assert code == 1 and "1 of 1 checkpoints could not be analyzed" in err
    assert sorted(os.listdir(tmp_path)) == ["broken"]


def test_a_colleagues_read_only_run_with_out_elsewhere_names_the_default_tb_dir_and_the_way_out(run, tmp_path):
    """``chmod -R a-w RUN``, then ``analyze RUN --out MINE``: one line naming the default ``--tb-dir`` (the run's
    TensorBoard folder, which the user did not type) and what to give instead, exit 2, before ``--out`` is made,
    nothing changed (was the line without the way out, once ``--out`` was claimed)."""
    colleague = tmp_path / "colleague"
    shutil.copytree(run, colleague, symlinks=True, ignore=shutil.ignore_patterns("step-2", "step-4", "condensation"))
    subprocess.run(["chmod", "-R", "a-w", str(colleague)], check=True)
    before = digests(colleague)
    try:
        argv = ["dispersion_titan.analyze", str(colleague), *OPTS, "--out", str(tmp_path / "out")]
        proc = python_module(as_someone_else(tmp_path), *argv, timeout=300)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(colleague)], check=True)
    assert_one_line_error(
        proc.returncode,
        proc.stderr,
        f"--tb-dir: {colleague}/tb/condensation: not writable (Permission denied); it is the default: give --tb-dir "
        "a folder you can write",
    )
    assert digests(colleague) == before and not (tmp_path / "out").exists()


def test_a_run_on_a_read_only_file_system_names_that_cause(run, tmp_path):
    """A run on a file system mounted read-only (``mount -o remount,bind,ro``, in a namespace of the test's own),
    ``analyze RUN --out MINE``: its default ``--tb-dir`` is not writable because the file system is read-only,
    and the line says so (was `Permission denied`, of a folder whose permissions allow writing)."""
    ro = tmp_path / "ro"
    shutil.copytree(run, ro, symlinks=True, ignore=shutil.ignore_patterns("step-2", "step-4", "condensation"))
    before = digests(ro)
    mount = f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}"
    if subprocess.run(["unshare", "-rm", "sh", "-c", mount], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -rm)")
    argv = [str(ro), *OPTS, "--out", str(tmp_path / "out")]
    proc = in_mount_namespace(mount, "dispersion_titan.analyze", *argv, tmp=tmp_path)
    assert_one_line_error(
        proc.returncode,
        proc.stderr,
        f"--tb-dir: {ro}/tb/condensation: not writable (Read-only file system); it is the default: give --tb-dir "
        "a folder you can write",
    )
    assert digests(ro) == before and not (tmp_path / "out").exists()


def test_an_analysis_of_other_settings_claiming_the_tb_dir_meanwhile_is_refused(run, tmp_path):
    """Two analyses of other settings into one ``--tb-dir``, started together: both looked before either wrote;
    the later to record the folder is refused, its histograms not written there (was: both wrote theirs there)."""
    from dispersion_titan.analysis import runner
    from dispersion_titan.analyze import analyze_parser
    from dispersion_titan.run_folder.owners import write_record
    from dispersion_titan.utils.errors import OutputError

    out, tb = tmp_path / "out", tmp_path / "tb"
    a = analyze_parser().parse_args([str(run), *OPTS, "--steps", "0", "--out", str(out), "--tb-dir", str(tb)])
    analysis = runner.RunAnalysis(a, input_options(a))  # it has looked: the folder free
    tb.mkdir()
    write_record(str(tb), analysis.owner, settings="other")  # the other analysis's claim
    with pytest.raises(OutputError, match=f"--tb-dir: {tb} holds the histograms of an analysis with other settings"):
        analysis.analyze()
    assert os.listdir(tb) == [".owner.json"]


def test_bad_input_fails_with_one_line(run, analyzed, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(*analyze(empty, capsys=capsys)[::2], str(empty), "no checkpoints")
    (empty / "checkpoint").mkdir()  # a run that has saved none yet: what to do (was: the finding alone)
    assert_one_line_error(*analyze(empty, capsys=capsys)[::2], "no checkpoints", "train the run until it saves one")
    assert_one_line_error(*analyze(empty / "nope", capsys=capsys)[::2], f"{empty / 'nope'}: no such folder")

    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"text": "Too short."}) + "\n" + json.dumps({"text": "Also short."}) + "\n")
    assert_one_line_error(*analyze(short, capsys=capsys)[::2], f"{short}: not a folder")  # was "no such directory"
    assert_one_line_error(
        *analyze(run, "--texts", short, "--seq-len", "64", "--out", tmp_path / "o", capsys=capsys)[::2],
        str(short),
        "64",
    )
    paper = ["--protocol", "paper", "--seq-len", "64", "--out", tmp_path / "o"]
    for path, said in ((empty, "no wikitext-103-v1/train-*.parquet"), (short, "not a parquet file with a text column")):
        assert_one_line_error(
            *analyze(run, *paper, "--dataset-path", path, capsys=capsys)[::2], f"--dataset-path: {path}: {said}"
        )
    assert not (tmp_path / "o").exists()

    before = mtimes(analyzed)
    assert_one_line_error(*analyze(run, "--seq-len", "300", capsys=capsys)[::2], "--seq-len", "256")
    assert_one_line_error(*analyze(run, *OPTS, "--out", short / "sub", capsys=capsys)[::2], "--out", str(short))
    assert_one_line_error(*analyze(run, *OPTS, "--steps", "3", capsys=capsys)[::2], "--steps", "[0, 2, 4]")
    # Different inputs into an existing output folder: refused, nothing touched.
    assert_one_line_error(
        *analyze(run, "--num-sequences", "4", "--seq-len", str(S), capsys=capsys)[::2], "--out", "num_sequences 8 vs 4"
    )
    assert mtimes(analyzed) == before


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["RUN", "--protocol", "paper", "--dataset", "enwiki_sample"], "--dataset: not used with --protocol paper"),
        (["hf:gpt2", "--wandb", "--out", "OUT"], "--wandb: only for runs"),
        (["RUN", "--device-map", "auto"], "--device-map: only for hf: models"),
        (  # was accepted: accelerate spread the model over the GPUs all the same
            ["hf:gpt2", "--device-map", "auto", "--device", "cpu", "--out", "OUT"],
            "--device-map: auto spreads the model over the GPUs, not with --device cpu; drop one",
        ),
        (["RUN", "--texts", "empty.jsonl"], "empty.jsonl: no texts"),
        (["hf:gpt2", "--steps", "3", "--out", "OUT"], "--steps: not used with hf: models"),
        (["hf:gpt2"], "--out: required with hf: models"),
        (["family", "RUN", "--out", "OUT", "--family", "gpt2"], "--family: 'gpt2' is not NAME=VALUE"),
        (["family", "RUN", "--out", "OUT", "--paired", "A="], "--paired: 'A=' is not NAME=VALUE"),
        (  # were read as the working folder ('.: no condensation analyses here'), and the last family named
            ["family", "RUN", "--out", "OUT", "--family", "a=X,,Y"],
            "--family: 'a=X,,Y': give NAME=SPEC,SPEC,..., no empty model",
        ),
        (["family", "RUN", "--out", "OUT", "--family", "a=X", "--family", "b=X/"], "--family: X is put in a and in b"),
        (  # was: its row twice in family_paired.csv
            ["family", "RUN", "--out", "OUT", "--paired", "X=Y", "--paired", "Y/=X"],
            "--paired: 'Y/=X' pairs Y and X again; give each pair once",
        ),
        (["RUN", "--seq-len", "1"], "argument --seq-len: '1' must be an integer >= 2"),
        (["RUN", "--geometry-sequences", "-1"], "argument --geometry-sequences: '-1' is not a non-negative integer"),
        (["RUN", "--device", "gpu"], "argument --device: Expected one of cpu, cuda"),
        (["hf:gpt2@main,main", "--out", "OUT"], "hf:gpt2@main,main: a revision is listed twice"),
    ],
)
def test_option_combinations_are_refused_before_anything_is_read(tmp_path, capsys, argv, line):
    """Refused from the options alone: one line, exit 2, before a run, model or hub is looked at (RUN need not
    exist, hf:gpt2 is never fetched), nothing written."""
    (tmp_path / "empty.jsonl").write_text("\n")
    args = [str(tmp_path / arg) if arg in ("RUN", "OUT", "empty.jsonl") else arg for arg in argv]
    assert_one_line_error(*analyze(*args, capsys=capsys)[::2], line)
    assert os.listdir(tmp_path) == ["empty.jsonl"]


def test_texts_from_a_pipe_are_refused_naming_it(tmp_path, capsys):
    """``--texts <(zcat texts.jsonl.gz)``, a pipe holding the texts, which analyze reads twice: one line saying it is
    no file (was `--texts: /dev/fd/63: no texts`, of 2 texts); a fifo no one writes to, the same line (was a hang
    in its open); no --out made."""
    read, write = os.pipe()
    os.write(write, (json.dumps({"text": "a " * 50}) + "\n").encode() * 2)
    os.close(write)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    try:
        for path in (f"/dev/fd/{read}", fifo):
            code, _, err = analyze(tmp_path / "RUN", "--texts", path, "--out", tmp_path / "o", capsys=capsys)
            assert_one_line_error(code, err, f"--texts: {path} is no regular file (a pipe or a device); save the")
    finally:
        os.close(read)
    assert not (tmp_path / "o").exists()


def test_a_run_given_as_hf_says_so_before_asking_for_out(tmp_path, capsys):
    """``analyze hf:RUN/checkpoint/step-N`` (or ``hf:RUN``) without ``--out``, or with a run's ``--steps``: what the
    folder is, and how to give it, comes first (was ``--out: required with hf: models`` or ``--steps: not used with
    hf: models``, then that line once the option was mended)."""
    run = tiny_run(tmp_path / "run")
    step = run / "checkpoint" / "step-0"
    for spec, says in (
        (step, "is a training run's checkpoint (DCP), not a Hugging Face model; give its run's folder without hf:"),
        (run, "is a training run's folder (run.json); give it without hf:"),
    ):
        before = digests(tmp_path)
        assert_one_line_error(*analyze(f"hf:{spec}", "--steps", "0", capsys=capsys)[::2], f"hf:{spec}: {spec} {says}")
        assert digests(tmp_path) == before


def test_two_analyses_at_once_one_writer(run, tmp_path):
    """Issue 35: two real ``analyze`` processes with other settings on one run. The first is
    paused while it holds the output folder; the second is refused in one line naming it and
    changes nothing; the first then ends with its own results only."""
    out, tb = tmp_path / "condensation", tmp_path / "tb"
    second_writer_is_refused(
        "dispersion_titan.analyze",
        [str(run), *OPTS, "--steps", "0", "--out", str(out), "--tb-dir", str(tb)],
        [str(run), "--num-sequences", "4", "--seq-len", str(S), "--seed", "7", "--out", str(out), "--tb-dir", str(tb)],
        out,
    )
    results = {p.parent.name: read_json(p) for p in out.glob("step-*/condensation.json")}
    assert sorted(results) == ["step-0"]
    assert (results["step-0"]["num_sequences"], results["step-0"]["inputs"]["seed"]) == (K, 0)


def test_two_compares_at_once_into_one_out_one_writes(run, analyzed, tmp_path):
    """Two ``analyze compare`` into one --out, the second started while the first reads its analyses: refused in
    one line naming the first, exit 2, before it writes; the first then writes its comparison whole (was: both
    exit 0 and said "written:", as --out was held only to write the files)."""
    out, module = tmp_path / "cmp", "dispersion_titan.analyze"
    argv = ["compare", str(run), "--out", str(out)]
    pid, first = paused_reading(module, *argv, reading="condensation.json", tmp=tmp_path)
    try:
        second = python_module(module, *argv)
    finally:
        os.kill(pid, signal.SIGCONT)
    here = f"PID {pid} on {socket.gethostname()}, python -m {module} compare"
    assert_one_line_error(second.returncode, second.stderr, f"{out}: another command is writing here ({here}")
    done = first.result()
    assert done.returncode == 0 and f"written: {out / 'compare.csv'}" in done.stdout, done.stderr[-3000:]
    assert sorted(os.listdir(out)) == [OWNER_FILE, "compare.csv", "compare.png", "compare_layers.csv"]


def test_other_settings_into_a_folder_holding_results_are_refused_unless_force(
    run, analyzed, tmp_path, capsys, monkeypatch
):
    """Settings that differ from the results a folder holds are refused even for steps it does not
    hold yet, naming the settings; --force computes the selected steps and keeps the others, which
    ``--wandb`` leaves out as summary.csv does (was: logged beside them, one curve of two settings)."""
    logged = {}
    monkeypatch.setattr(runner, "recorded", lambda dump: {})
    monkeypatch.setattr(runner, "log_results", lambda dump, job, prefix, per_step, folder: logged.update(per_step))
    out, tb = tmp_path / "out", tmp_path / "tb"
    for step in (0, 2):
        shutil.copytree(analyzed / f"step-{step}", out / f"step-{step}")
    shutil.copy(analyzed / ".owner.json", out)  # the analysis's record: the folder is its own
    before = digests(out)
    other = ["--steps", "4", "--num-sequences", "4", "--seq-len", str(S), "--seed", "7", "--out", out, "--tb-dir", tb]
    assert_one_line_error(
        *analyze(run, *other, capsys=capsys)[::2],
        f"--out: {out}: step-0, step-2 were analyzed with other settings (num_sequences 8 vs 4, "
        "seed 0 vs 7); use another --out, or --force to recompute",
    )
    assert digests(out) == before and not tb.exists()
    code, _, err = analyze(run, *other, "--force", "--wandb", capsys=capsys)
    assert code == 0 and "\ndispersion_titan: note: 2 older analyses" in f"\n{err}", err
    assert list(logged) == [4]
    assert read_json(out / "step-4" / "condensation.json")["num_sequences"] == 4
    assert {k: v for k, v in digests(out).items() if k.startswith((".owner", "step-0/", "step-2/"))} == before


def test_compare_runs(run, analyzed, tmp_path, capsys):
    # A second "run" folder over the same checkpoints, whose run.json records dispersion settings.
    other = tmp_path / "dispersed"
    other.mkdir()
    os.symlink(run / "checkpoint", other / "checkpoint")
    metadata = json.loads((run / "run.json").read_text())
    metadata["dispersion"] = {**metadata["dispersion"], "variant": "angular_spread", "coeff": 0.5}
    (other / "run.json").write_text(json.dumps(metadata))
    assert analyze(other, *OPTS, "--steps", "4", capsys=capsys)[0] == 0

    out = tmp_path / "cmp"
    code, stdout, _ = analyze("compare", run, other / "condensation", "--out", f"{out}/", capsys=capsys)
    assert code == 0
    assert "baseline (mlp 256, dispersion none)" in stdout  # the trainer records its dispersion settings
    assert "dispersed (mlp 256, dispersion angular_spread λ=0.5)" in stdout
    assert f"written: {out / 'compare.csv'}, compare_layers.csv" in stdout  # --out cmp/ (the README's) wrote cmp//
    with open(out / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    final = read_json(analyzed / "step-4" / "condensation.json")
    assert [r["step"] for r in rows] == ["4", "4"]
    assert float(rows[0]["mean_cos_final_norm"]) == pytest.approx(final["layers"][-1]["mean_cos"], rel=1e-5)
    assert float(rows[1]["spearman"]) == pytest.approx(final["spearman"], rel=1e-5)
    assert len((out / "compare_layers.csv").read_text().splitlines()) == 1 + 2 * 6
    assert (out / "compare.png").read_bytes().startswith(PNG_MAGIC)

    assert (
        analyze(
            other,
            "--num-sequences",
            str(K),
            "--seq-len",
            "32",
            "--steps",
            "4",
            "--out",
            tmp_path / "s32",
            capsys=capsys,
        )[0]
        == 0
    )
    assert_one_line_error(
        *analyze("compare", run, tmp_path / "s32", "--out", tmp_path / "bad", capsys=capsys)[::2],
        "different inputs",
        "seq_len 64 vs 32",
    )
    assert not (tmp_path / "bad").exists()
    # A number edited by hand into NaN (was: a nan cell in compare.csv and its figure, exit 0).
    edited = other / "condensation" / "step-4" / "condensation.json"
    kept = edited.read_text()
    result = json.loads(kept)
    result["layers"][-1]["mean_cos"] = float("nan")
    edited.write_text(json.dumps(result))
    assert_one_line_error(
        *analyze("compare", run, other, "--out", tmp_path / "bad", capsys=capsys)[::2],
        f"{edited}: unreadable (layers[{len(result['layers']) - 1}].mean_cos: nan is no finite number); restore it, "
        "or remove it and rerun",
    )
    # A step's result copied into another step's folder by hand (was: step 4's curve drawn as step 2's, exit 0).
    edited.write_text(kept)
    shutil.copytree(other / "condensation" / "step-4", other / "condensation" / "step-2")
    assert_one_line_error(
        *analyze("compare", run, other, "--out", tmp_path / "bad", capsys=capsys)[::2],
        f"{other / 'condensation' / 'step-2' / 'condensation.json'}: holds the result of step 4, not of step 2; move "
        "it back, or remove it and rerun",
    )
    assert not (tmp_path / "bad").exists()
    # The run moved (mv) since its analysis: labelled by where it is, its settings read there (was: by its old name,
    # its dispersion settings looked up in the folder it left, so left out).
    shutil.rmtree(other / "condensation" / "step-2")
    moved = other.rename(tmp_path / "moved")
    code, stdout, _ = analyze("compare", run, moved, "--out", tmp_path / "cmp-moved", capsys=capsys)
    assert code == 0 and "moved (mlp 256, dispersion angular_spread λ=0.5)" in stdout, stdout
    # Two runs of one folder name in different places: each labelled by the path it was given.
    (tmp_path / "elsewhere").mkdir()
    moved = moved.rename(tmp_path / "elsewhere" / run.name)
    code, stdout, _ = analyze("compare", run, moved, "--out", tmp_path / "cmp-namesakes", capsys=capsys)
    assert code == 0 and f"{run} (mlp 256, dispersion none)" in stdout, stdout
    assert f"{moved} (mlp 256, dispersion angular_spread λ=0.5)" in stdout, stdout
    # A checkpoint saved again since its analysis (here its shard's mtime, which its identity records): compare
    # and family refuse the stale numbers, as evaluate table does (was: drawn, exit 0).
    shard = next((run / "checkpoint" / "step-4").glob("*.distcp"))
    kept = shard.stat()
    os.utime(shard, ns=(kept.st_atime_ns, kept.st_mtime_ns + 1))
    try:
        refusals = [analyze(cmd, moved, run, "--out", tmp_path / "bad", capsys=capsys) for cmd in ("compare", "family")]
    finally:
        os.utime(shard, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    for code, _, err in refusals:
        assert_one_line_error(
            code,
            err,
            f"{moved / 'condensation'}: step 4 was analyzed from another checkpoint than {moved}/checkpoint/step-4 "
            f"holds now (saved again or replaced since); analyze it again with python -m dispersion_titan.analyze "
            f"{moved} --steps 4 --out {moved / 'condensation'} --force",
        )
    assert not (tmp_path / "bad").exists()
    # Its analyses' record, which names their run, damaged by hand: one line naming it, as where a command writes.
    record = moved / "condensation" / ".owner.json"
    record.write_text("{")
    assert_one_line_error(
        *analyze("compare", run, moved, "--out", tmp_path / "bad", capsys=capsys)[::2],
        f"{record}: unreadable (",
        "restore it, or remove it and rerun",
    )
    assert not (tmp_path / "bad").exists()


def test_a_stale_analysis_is_refused_with_the_command_that_measures_it_again_alike(tmp_path, capsys):
    """compare and family refuse an analysis whose checkpoint was saved again since, naming the command that measures
    it again: it carries the options the analysis records, so that, run, compare and family take it (was: analyze's
    defaults, K=100 and S=256 where these are 4 and 32, then refused as of different inputs)."""
    runs = [tiny_run(tmp_path / name, steps=(step,)) for name, step in (("a", 1), ("b", 2))]
    for run in runs:
        options = ["--num-sequences", "4", "--seq-len", "32", "--seed", "3", "--geometry-sequences", "2"]
        assert analyze(run, *options, "--batch-size", "4", capsys=capsys)[0] == 0
    shard = next((runs[0] / "checkpoint" / "step-1").glob("*.distcp"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))  # saved again, as its identity sees
    for command in ("compare", "family"):
        code, _, err = analyze(command, *runs, "--out", tmp_path / command, capsys=capsys)
        assert_one_line_error(code, err, "(saved again or replaced since); analyze it again with python -m ")
        again = shlex.split(err.split("python -m dispersion_titan.analyze ")[1])
    assert analyze(*again, capsys=capsys)[0] == 0
    for command in ("compare", "family"):
        code, _, err = analyze(command, *runs, "--out", tmp_path / command, capsys=capsys)
        assert code == 0, err


def test_relative_texts_are_recorded_absolute_and_the_command_again_runs_from_anywhere(tmp_path, capsys, monkeypatch):
    """The same ``--texts`` named from two folders is the same input to compare and family (was: refused by family,
    ``texts: texts.jsonl -> here/texts.jsonl``), and the command that measures a stale analysis again, printed by
    compare, runs from another folder (was: ``--texts texts.jsonl: no such file``)."""
    runs = [tiny_run(tmp_path / name, steps=(1,)) for name in ("a", "b")]
    (tmp_path / "here").mkdir()
    texts_jsonl(tmp_path / "here" / "texts.jsonl", documents=4, words=300)
    for run, where, texts in ((runs[0], "here", "texts.jsonl"), (runs[1], "", "here/texts.jsonl")):
        monkeypatch.chdir(tmp_path / where)
        options = ["--texts", texts, "--num-sequences", "4", "--seq-len", "32", "--batch-size", "4"]
        assert analyze(run, *options, capsys=capsys)[0] == 0
    shard = next((runs[0] / "checkpoint" / "step-1").glob("*.distcp"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))  # saved again, as its identity sees
    monkeypatch.chdir(runs[1])
    code, _, err = analyze("compare", *runs, "--out", tmp_path / "compare", capsys=capsys)
    assert_one_line_error(code, err, "(saved again or replaced since); analyze it again with python -m ")
    assert analyze(*shlex.split(err.split("python -m dispersion_titan.analyze ")[1]), capsys=capsys)[0] == 0
    for command in ("compare", "family"):
        code, _, err = analyze(command, *runs, "--out", tmp_path / command, capsys=capsys)
        assert code == 0, err


def test_an_older_analysis_recording_relative_texts_pairs_with_one_recording_them_absolute(
    tmp_path, capsys, monkeypatch
):
    """Analyses made before --texts was recorded absolute hold it as typed: family reads it from the current folder,
    else from the run's, where that names the file the other analysis names (was refused, ``texts 'texts.jsonl' vs
    '/…/texts.jsonl'``, until analyzed again); a link to that file is that file too. Elsewhere: one line, as before."""
    runs = [tiny_run(tmp_path / name, steps=(1,)) for name in ("old", "new")]
    (tmp_path / "here").mkdir()
    texts = texts_jsonl(tmp_path / "here" / "texts.jsonl", documents=4, words=300)
    os.symlink(texts, tmp_path / "link.jsonl")
    for run, named in zip(runs, (texts, tmp_path / "link.jsonl"), strict=True):
        options = ["--texts", named, "--num-sequences", "4", "--seq-len", "32", "--batch-size", "4"]
        assert analyze(run, *options, capsys=capsys)[0] == 0
    result = runs[0] / "condensation" / "step-1" / "condensation.json"
    older = read_json(result)
    for recorded, where in (("texts.jsonl", tmp_path / "here"), ("../here/texts.jsonl", tmp_path)):
        older["inputs"]["texts"] = recorded  # as an earlier version recorded it: as typed
        result.write_text(json.dumps(older))
        monkeypatch.chdir(where)
        for command in ("compare", "family"):
            code, _, err = analyze(command, *runs, "--out", tmp_path / command, capsys=capsys)
            assert code == 0, err
    monkeypatch.chdir(runs[1])  # neither here nor from the run's folder
    older["inputs"]["texts"] = "texts.jsonl"
    result.write_text(json.dumps(older))
    code, _, err = analyze("family", *runs, "--out", tmp_path / "refused", capsys=capsys)
    assert_one_line_error(
        code, err, f"was analyzed with other inputs than {runs[0]} (texts 'texts.jsonl' vs '{os.path.realpath(texts)}')"
    )


@pytest.mark.usefixtures("private_caches")
@pytest.mark.parametrize("dataset", ["local", "wikitext-103"])
def test_a_datasets_cache_out_of_room_is_the_commands_out_of_room_line(tmp_path, capsys, dataset):
    """A ``--dataset-path`` whose Arrow copy in datasets' cache meets the file size limit (``ulimit -f 1``) or a full
    disk: the commands' out-of-room line naming the cache, alone, exit 74 (was, of ``local``'s files, ``--dataset-path:
    FILE: not readable as json ([Errno 27] File too large); fix the file``, exit 2, the file blamed; of a folder,
    ``file too large; …``, naming none; below datasets' ``Generating train split`` bar, twice on one line)."""
    import datasets.config

    run = tiny_run(tmp_path / "run", steps=(1,))
    docs = texts_jsonl(tmp_path / "docs.jsonl", 8, 300) if dataset == "local" else wikitext_parquet_dir(tmp_path)
    options = ["--dataset", dataset, "--dataset-path", docs, "--num-sequences", "4", "--seq-len", "32"]
    with file_size_limit(1024):
        code, _, err = analyze(run, *options, "--out", tmp_path / "out", capsys=capsys)
    assert (code, err.splitlines()) == (
        74,
        [
            f"dispersion_titan: error: file too large writing {datasets.config.HF_DATASETS_CACHE}; raise the file "
            "size limit (ulimit -f); each model state analyzed so far is kept in its folder; the same command analyzes "
            "the rest"
        ],
    ), err


def test_texts_saved_with_a_bom_are_read_as_without(tmp_path, capsys):
    """A jsonl saved "UTF-8 with BOM" (a Windows editor's choice): ``--texts`` measures the same sequences as
    without it (was refused: ``invalid JSON (Unexpected UTF-8 BOM (decode using utf-8-sig))``), as ``data prepare``
    and training read it (datasets skips the BOM); a first row without "text" there is named by its line."""
    from dispersion_titan.data.__main__ import main as data_main

    run = tiny_run(tmp_path / "run", steps=(1,))
    plain = texts_jsonl(tmp_path / "plain.jsonl", documents=4, words=300)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(codecs.BOM_UTF8 + plain.read_bytes())
    hashes = []
    for texts in (plain, bom):
        options = ["--texts", texts, "--num-sequences", "4", "--seq-len", "32", "--batch-size", "4"]
        code, _, err = analyze(run, *options, "--out", tmp_path / texts.stem, capsys=capsys)
        assert code == 0, err
        hashes.append(read_json(tmp_path / texts.stem / "step-1" / "condensation.json")["inputs"]["tokens_sha256"])
    assert hashes[0] == hashes[1]
    bom.write_bytes(codecs.BOM_UTF8 + b'{"title": "x"}\n{"text": "y"}\n')
    with pytest.raises(SystemExit):
        data_main(["prepare", "local", "--dataset-path", str(bom), "--out", str(tmp_path / "store")])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f'dispersion_titan: error: --dataset-path: {bom}: line 1 has no "text"; give every row a "text" string'
    )


def test_ctrl_c_in_compare_or_family_says_out_is_as_it_was(tmp_path, capsys, monkeypatch):
    """Their files are moved in together once all are written: not "the same command analyzes the rest"."""
    import dispersion_titan.analysis.compare
    import dispersion_titan.analysis.size_series

    for module, name, command in (("compare", "compare", "compare"), ("size_series", "write_size_series", "family")):
        monkeypatch.setattr(getattr(dispersion_titan.analysis, module), name, lambda *_: signal.raise_signal(2))
        code, _, err = analyze(command, "A", "B", "--out", tmp_path / "out", capsys=capsys)
        assert (code, err.splitlines()) == (130, [f"dispersion_titan: interrupted; {REWRITTEN}"])
    assert not (tmp_path / "out").exists()


def test_compare_refuses_a_run_named_twice(run, analyzed, tmp_path, capsys):
    """``analyze compare RUN RUN`` would draw two identical rows: refused, as the sweep, the
    quickstart and ``evaluate table`` refuse duplicates; also when named by its dump and its
    condensation folder."""
    for twice in ([run, run], [run, analyzed]):
        code, _, err = analyze("compare", *twice, "--out", tmp_path / "cmp", capsys=capsys)
        assert_one_line_error(
            code,
            err,
            f"compare: {twice[0]} and {twice[1]} are the same run's analyses ({analyzed}); name each run once",
        )
    assert not (tmp_path / "cmp").exists()
