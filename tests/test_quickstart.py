"""The quickstart pipeline on a tiny real sweep (2 widths × baseline/dispersion, 2 steps):
its summary restates the analyzed numbers and its verdicts follow them; a second
invocation redoes only what is missing and never rewrites what exists."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from dispersion_titan.report.summary import (
    answer_dispersion,
    answer_init,
    answer_training,
    answer_width,
    load_sweep,
)
from helpers import python_module


WIDTHS = (64, 256)
OPTIONS = ("--widths", "64,256", "--steps", "2", "--checkpoint-interval", "1", "--num-sequences", "4",
           "--seq-len", "32", "--coeff", "2.0")
NAMES = [f"w{w}-{kind}-s42" for w in WIDTHS for kind in ("baseline", "angular_spread-c2")]


def quickstart(out: Path, *options: str):
    return python_module("dispersion_titan.quickstart", "--out", str(out), *options, timeout=900)


def digests(folder: Path, pattern: str = "*") -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob(pattern)) if p.is_file()}


def late_offdiag(result: dict) -> float:
    """Independent restatement of the summary's measure: blocks 3 and 4 of 4."""
    return float(np.mean([layer["mean_cos_offdiag"] for layer in result["layers"]
                          if layer["name"] in ("block_3", "block_4")]))


def analysis(out: Path, name: str, step: int) -> dict:
    return json.loads((out / "runs" / name / "condensation" / f"step-{step}" / "condensation.json").read_text())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("quickstart") / "out"
    proc = quickstart(out, *OPTIONS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout


@pytest.mark.slow
def test_every_run_trained_analysed_and_compared(sweep):
    out, stdout = sweep
    for name in NAMES:
        assert sorted(p.name for p in (out / "runs" / name / "checkpoint").iterdir()) == ["step-0", "step-1", "step-2"]
        assert sorted(p.parent.name for p in (out / "runs" / name / "condensation").glob("step-*/condensation.json")) \
            == ["step-0", "step-1", "step-2"]
        assert f"train    {name}: started (log: {out / 'logs' / name}.train.log)" in stdout
    for comparison in ("final_width_sweep", "final_baseline_vs_dispersion", "init_width_sweep"):
        assert (out / "compare" / comparison / "compare.png").read_bytes().startswith(b"\x89PNG")
    rows = (out / "compare" / "final_baseline_vs_dispersion" / "compare.csv").read_text().splitlines()
    assert len(rows) == 1 + len(NAMES) and "angular_spread λ=2.0" in rows[2]
    assert (out / "summary.png").read_bytes().startswith(b"\x89PNG")
    assert stdout.count("already done") == 0


@pytest.mark.slow
def test_summary_restates_the_measured_numbers(sweep):
    out, stdout = sweep
    summary = (out / "summary.md").read_text()
    assert summary in stdout  # printed as written
    for name in NAMES:
        row = next(line for line in summary.splitlines() if line.startswith(name + " "))
        trajectory = {step: late_offdiag(analysis(out, name, step)) for step in (0, 1, 2)}
        peak = max(trajectory, key=trajectory.get)
        assert f" {trajectory[0]:.3f} " in row and f" {trajectory[2]:.3f} " in row, row
        assert f" {trajectory[peak]:.3f} ({peak}) " in row, row
    # Same seed: a baseline and its dispersion run start from identical weights.
    for w in WIDTHS:
        assert analysis(out, f"w{w}-baseline-s42", 0)["layers"] == analysis(out, f"w{w}-angular_spread-c2-s42", 0)["layers"]

    base = {w: late_offdiag(analysis(out, f"w{w}-baseline-s42", 2)) for w in WIDTHS}
    disp = {w: late_offdiag(analysis(out, f"w{w}-angular_spread-c2-s42", 2)) for w in WIDTHS}
    lower = sum(disp[w] < base[w] for w in WIDTHS)
    verdict = {2: "It lowers it", 0: "It raises it"}.get(lower, "Mixed")
    assert f"{verdict}: with angular_spread λ=2.0" in summary and f"in {lower} of 2 widths" in summary
    init = [late_offdiag(analysis(out, f"w{w}-baseline-s42", 0)) for w in WIDTHS]
    trend = "wider MLPs condense more" if init[1] > init[0] else "narrower MLPs condense more"
    assert f"At step 0 {trend} (late-block cosine {init[0]:.3f} / {init[1]:.3f} for MLP width 64 / 256)" in summary


@pytest.mark.slow
def test_verdicts_follow_the_numbers(sweep):
    out, _ = sweep
    runs = load_sweep([str(out / "runs" / name) for name in NAMES])
    assert [(r.width, r.is_baseline) for r in runs] == [(64, True), (64, False), (256, True), (256, False)]
    assert all(r.val_loss is not None and r.final.step == 2 for r in runs)

    # Played backwards (final as init), training must read the other way round.
    backwards = [dataclasses.replace(r, init=r.final, final=r.init) for r in runs]
    forward_up = re.search(r"up in (\d) of 2", answer_training(runs)).group(1)
    backward_up = re.search(r"up in (\d) of 2", answer_training(backwards)).group(1)
    assert int(forward_up) + int(backward_up) == 2

    # Swapping the labels of baseline and dispersion runs flips the dispersion verdict.
    swapped = [dataclasses.replace(r, dispersion=None if r.dispersion else "other") for r in runs]
    lower = re.search(r"in (\d) of 2 widths", answer_dispersion(runs)).group(1)
    assert re.search(rf"in {2 - int(lower)} of 2 widths", answer_dispersion(swapped))

    one_width = [r for r in runs if r.width == 64]
    assert answer_width(one_width) == "Not measured: the runs have a single MLP width."
    assert answer_dispersion([r for r in runs if r.is_baseline]).startswith("Not measured")
    flat = [dataclasses.replace(r, init=dataclasses.replace(r.init, spearman=None)) for r in runs]
    assert answer_init(flat).startswith("No: at step 0 the cosine rises with depth in 0 of 2 widths")


@pytest.mark.slow
def test_second_invocation_redoes_only_what_is_missing(sweep, tmp_path):
    out, _ = sweep
    checkpoints = digests(out / "runs", "*.distcp")
    results = digests(out / "runs", "condensation.json")
    # A lost analysis of one checkpoint (say, an interrupted analysis) is the only work left.
    lost = out / "runs" / NAMES[1] / "condensation" / "step-1" / "condensation.json"
    lost.unlink()
    proc = quickstart(out, *OPTIONS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("already done, skipped") == 2 * len(NAMES) - 1
    assert re.findall(r"(\w+) +(\S+): started", proc.stdout) == [("analyze", NAMES[1])]
    assert digests(out / "runs", "*.distcp") == checkpoints
    assert digests(out / "runs", "condensation.json") == results  # the lost one recomputed identically


@pytest.mark.slow
def test_other_analysis_options_are_refused_without_touching_results(sweep):
    out, _ = sweep
    before = digests(out / "runs")
    options = dict(zip(OPTIONS[::2], OPTIONS[1::2])) | {"--widths": "64", "--seq-len": "16"}
    proc = quickstart(out, *(item for pair in options.items() for item in pair))
    assert proc.returncode == 1
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 2 and all(e.startswith("dispersion_titan: error: analyze w64-") for e in errors)
    assert "seq_len 32 vs 16" in errors[0] and "use another --out, or --force" in errors[0]
    assert digests(out / "runs") == before


@pytest.mark.parametrize("options, message", [
    (("--out", "{file}/out"), "--out: {file}/out: not writable (Not a directory)"),
    (("--widths", "64,64"), "argument --widths: '64,64' repeats a width"),
    (("--coeff", "0"), "argument --coeff: '0' is not a positive number"),
    (("--config", "{file}x"), "--config: {file}x: no such file"),
    (("--config", "{file}"), "--config: {file}: needs 'training' (training.steps and checkpoint.interval)"),
])
def test_bad_options_fail_with_one_line(tmp_path, options, message):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = quickstart(tmp_path / "q", *(o.format(file=blocker) for o in options))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"dispersion_titan: error: {message.format(file=blocker)}"]
    assert not (tmp_path / "q").exists()
