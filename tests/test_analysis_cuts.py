"""Paper cuts of the analysis (issue 16, items 3, 4 and 8), each through the real command:
the default sequence length fits the model, a checkpoint of zeros is skipped in one
line, and the compare outputs say what they show (a line per run told apart)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from dispersion_titan.analysis import figures
from dispersion_titan.analysis.compare import load_runs, steps_title
from support.cli import analyze
from support.corpora import texts_jsonl
from support.launch import python_module
from support.runs import digests, tiny_run


def error_lines(stderr: str) -> list[str]:
    """stderr without progress bars."""
    return [line for line in stderr.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]


@pytest.fixture(scope="module")
def long_texts(tmp_path_factory) -> Path:
    """Documents of well over 256 GPT-2 tokens each."""
    return texts_jsonl(tmp_path_factory.mktemp("texts") / "long.jsonl", documents=2, words=700)


def test_default_seq_len_is_the_models_positions(tmp_path, long_texts):
    run = tiny_run(tmp_path / "debug", steps=(0,))  # the debug model has 256 positions
    proc = python_module("dispersion_titan.analyze", str(run), "--texts", str(long_texts), "--num-sequences", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\ndispersion_titan: note: --seq-len 256 (the model's positions, max_seq_len in" in f"\n{proc.stderr}"
    assert json.loads((run / "condensation" / "step-0" / "condensation.json").read_text())["seq_len"] == 256

    before = digests(run)
    proc = python_module(
        "dispersion_titan.analyze", str(run), "--texts", str(long_texts), "--seq-len", "300", "--force"
    )
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == [
        f"dispersion_titan: error: --seq-len: 300 exceeds the model's 256 positions (max_seq_len in {run}/run.json)"
    ]
    assert digests(run) == before


def test_checkpoint_of_zeros_is_skipped_in_one_line(tmp_path, long_texts):
    """A shard of zeros, a ``.metadata`` of garbage: each skipped in one line naming it (the latter was the
    unpickler's ``UnpicklingError: invalid load key``), what to do with it said."""
    run = tiny_run(tmp_path / "run", steps=(0, 2, 4))
    shard = run / "checkpoint" / "step-2" / "__0_0.distcp"
    shard.write_bytes(bytes(shard.stat().st_size))  # zeros, at its original size
    metadata = run / "checkpoint" / "step-4" / ".metadata"
    metadata.write_bytes(b"\x80\x04garbage")
    checkpoints = digests(run / "checkpoint")
    proc = python_module(
        "dispersion_titan.analyze", str(run), "--texts", str(long_texts), "--num-sequences", "2", "--seq-len", "32"
    )
    assert proc.returncode == 1
    lines = error_lines(proc.stderr)
    assert lines == [
        f"dispersion_titan: skipped checkpoint: {shard.parent}: cannot be loaded "
        "(corrupt shard data: its tensor records do not unpickle)",
        f"dispersion_titan: skipped checkpoint: {metadata}: damaged (not a DCP checkpoint's metadata), so step-4 "
        "cannot be read; re-copy or remove that step, or use another step (analyze, evaluate: --steps)",
        f"dispersion_titan: error: 2 of 3 checkpoints could not be analyzed: {shard.parent}, {metadata.parent}",
    ], proc.stderr[-3000:]
    assert "weights_only" not in proc.stderr and "Traceback" not in proc.stderr
    with open(run / "condensation" / "summary.csv") as f:
        assert {row["step"] for row in csv.DictReader(f)} == {"0"}
    assert (run / "condensation" / "evolution.png").exists()
    assert digests(run / "checkpoint") == checkpoints


SIGNIFICANT = re.compile(r"^-?\d+(\.\d+)?(e[-+]\d+)?$")


def significant_digits(text: str) -> int:
    mantissa = text.lstrip("-").split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa)


def test_compare_outputs_say_what_they_show(tmp_path, long_texts, capsys):
    runs = [tiny_run(tmp_path / name, steps=(0, 3)) for name in ("baseline", "wider")]
    for run in runs:
        assert analyze(run, "--texts", long_texts, "--num-sequences", "2", "--seq-len", "32", capsys=capsys)[0] == 0
    before = {run: digests(run) for run in runs}
    out = tmp_path / "cmp"
    proc = python_module("dispersion_titan.analyze", "compare", *map(str, runs), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(digests(run) == files for run, files in before.items())

    # CSVs: at most 6 significant digits; the JSON keeps every digit.
    for name in ("compare.csv", "compare_layers.csv"):
        with open(out / name) as f:
            numbers = [v for row in csv.DictReader(f) for v in row.values() if SIGNIFICANT.match(v)]
        assert numbers and max(significant_digits(v) for v in numbers) <= 6
    stored = json.loads((runs[0] / "condensation" / "step-3" / "condensation.json").read_text())
    assert max(len(repr(layer["mean_cos"])) for layer in stored["layers"]) > 10

    # The figure names the step by number, says which mean it plots, and keeps its legend off the curves.
    loaded = load_runs(list(map(str, runs)), "last")
    assert steps_title(loaded) == "step 3"
    fig = figures.comparison([(r.label, r.result) for r in loaded], "step 3")
    (ax,) = fig.axes
    assert "mean_cos_offdiag" in ax.get_ylabel()
    fig.canvas.draw()
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= axes.x1  # right of the plotting area
    figures.plt.close(fig)

    # A sweep's 12 runs: each line its own colour and style (was: runs 11 and 12 in the colours of 1 and 2).
    fig = figures.comparison([(f"run {i}", loaded[0].result) for i in range(12)], "step 3")
    assert len({(line.get_color(), line.get_linestyle()) for line in fig.axes[0].get_lines()}) == 12
    figures.plt.close(fig)
