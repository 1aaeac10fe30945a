"""The quickstart pipeline on a tiny real sweep (2 widths × baseline/dispersion, a second
seed at the smallest width, 2 steps; an init panel of the debug shape): its summary
restates the measured numbers and its verdicts against the paper follow them; a second
invocation redoes only what is missing; other options never mix with existing results."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from dispersion_titan.analysis.condensation_schema import Condensation, LayerCondensation, read_results
from dispersion_titan.analysis.inputs import InputOptions, select_sequences
from dispersion_titan.quickstart import CONFIG, parser
from dispersion_titan.quickstart import main as quickstart_main
from dispersion_titan.reproduce.quickstart import pipeline
from dispersion_titan.reproduce.quickstart.figure import findings_figure
from dispersion_titan.reproduce.quickstart.findings import (
    AGREES,
    DISAGREES,
    NOISE,
    InitPanel,
    RunCondensation,
    at_initialization,
    baselines,
    findings,
    findings_markdown,
    load_sweep,
    table_rows,
    with_dispersion,
    with_width,
)
from dispersion_titan.reproduce.quickstart.pipeline import (
    check_same_options,
    folder_id,
    make_setup,
    out_of_room,
    process,
    step_progress,
)
from dispersion_titan.reproduce.quickstart.pipeline import init_panel as measure_init_panel
from dispersion_titan.run_folder.writer_lock import LOCK_NAME
from dispersion_titan.trainer.save_failure import save_failure, write_failure
from dispersion_titan.utils.errors import WRITE_FAILED, AnalysisError, ArgumentError, OutputError
from dispersion_titan.utils.errors import command as command_main
from support.launch import REPO, held_by_another_command, python_module
from support.runs import digests

WIDTHS = (64, 256)
OPTIONS = (
    "--widths",
    "64,256",
    "--steps",
    "2",
    "--checkpoint-interval",
    "1",
    "--num-sequences",
    "4",
    "--seq-len",
    "32",
    "--coeff",
    "2.0",
    "--init-flavor",
    "debug",
    "--init-widths",
    "64,256",
    "--init-num-sequences",
    "4",
)
MAIN = [f"w{w}-{kind}-s42" for w in WIDTHS for kind in ("baseline", "angular_spread-c2")]
NAMES = [*MAIN, "w64-baseline-s43", "w64-angular_spread-c2-s43"]
FORKED_SERVER = str(REPO / "tests" / "support" / "forked_quickstart.py")


def small_config(path: Path) -> Path:
    """quickstart.toml with 2 sequences of 32 tokens per training step and one such validation batch (was 8 of
    128, 4 batches: validation alone took half of each job): no assertion needs more, the analysis sets its own.
    Its [checkpoint] would save none (a traceback when the quickstart looked for them), or not step 0, or keep 2:
    the quickstart keeps every one from step 0 on, where it looks, whatever its --config says."""
    text = Path(CONFIG).read_text()
    smaller = (("local_batch_size", 8, 2), ("global_batch_size", 8, 2), ("seq_len", 128, 32), ("steps", 4, 1))
    fewer = (("enable", "true(?= +# DCP)", "false"), ("save_initial", "true", "false"), ("keep_latest_k", 0, 2))
    for key, value, new in (*smaller, *fewer):
        text, found = re.subn(rf"^{key} = {value}\b", f"{key} = {new}", text, flags=re.M)
        assert found, key
    path.write_text(text)
    return path


def sweep_options(out: Path) -> tuple[str, ...]:
    """The module's sweep's options: OPTIONS on the small config beside ``out``."""
    return (*OPTIONS, "--config", str(out.parent / "small.toml"))


def quickstart(out: Path, *options: str, fresh_server: bool = False, file_limit: int | None = None):
    """The command forked from the launch server; its own job server forked from it (``support.forked_quickstart``),
    or with ``fresh_server`` started fresh, as from a shell; ``file_limit``: its file size limit in bytes, its jobs'
    too, as ``ulimit -f`` sets one."""
    target = "dispersion_titan.quickstart" if fresh_server else FORKED_SERVER
    return python_module(target, "--out", str(out), *options, timeout=900, file_limit=file_limit)


def setup_for(out: Path, config: Path, *options: str) -> pipeline.QuickstartSetup:
    """The quickstart's setup for these options, in this process: what it checks before any work."""
    return make_setup(parser().parse_args(["--out", str(out), "--config", str(config), *options]))


def late_offdiag(result: dict) -> float:
    """Independent restatement of the summary's measure: blocks 3 and 4 of 4."""
    return float(
        np.mean([layer["mean_cos_offdiag"] for layer in result["layers"] if layer["name"] in ("block_3", "block_4")])
    )


def analysis(out: Path, name: str, step: int) -> dict:
    return json.loads((out / "runs" / name / "condensation" / f"step-{step}" / "condensation.json").read_text())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("quickstart") / "out"
    small_config(out.parent / "small.toml")
    proc = quickstart(out, *sweep_options(out), fresh_server=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout


def init_panel(out: Path) -> InitPanel:
    def read(folder: str) -> Condensation:
        path = out / "init_panel" / folder / "condensation.json"
        return Condensation.from_json(json.loads(path.read_text()), str(path))

    widths = {w: read(f"w{w}") for w in WIDTHS}
    return InitPanel(widths, {42: widths[64], 43: read("w64-s43")})


@pytest.mark.slow
def test_every_run_trained_analyzed_and_compared(sweep):
    out, stdout = sweep
    for name in NAMES:
        assert sorted(p.name for p in (out / "runs" / name / "checkpoint").iterdir()) == ["step-0", "step-1", "step-2"]
        assert sorted(
            p.parent.name for p in (out / "runs" / name / "condensation").glob("step-*/condensation.json")
        ) == ["step-0", "step-1", "step-2"]
        assert f"train    {name}: started (log: {out / 'logs' / name}.train.log)" in stdout
    for comparison in ("final_width_sweep", "final_baseline_vs_dispersion", "init_width_sweep"):
        assert (out / "compare" / comparison / "compare.png").read_bytes().startswith(b"\x89PNG")
    rows = (out / "compare" / "final_baseline_vs_dispersion" / "compare.csv").read_text().splitlines()
    assert len(rows) == 1 + len(MAIN) and "angular_spread λ=2.0" in rows[2]
    panel = init_panel(out)
    assert [panel.widths[w].model_args["mlp_hidden_dim"] for w in WIDTHS] == list(WIDTHS)
    # The init panel measures exactly what the run analysis measures at step 0 (same seed, shape, sequences),
    # also at the second seed.
    for seed in (42, 43):
        analysis = read_results(str(out / "runs" / f"w64-baseline-s{seed}" / "condensation"))[0]
        assert panel.seeds[seed].layers == analysis.layers
    assert re.findall(r"init     MLP width (\d+), seed (\d+): measured in \d+ s \((\d) of 3\)", stdout) == [
        ("64", "42", "1"),
        ("256", "42", "2"),
        ("64", "43", "3"),
    ]
    assert (out / "summary.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((out / "quickstart.json").read_text())["widths"] == list(WIDTHS)
    assert stdout.count("already done") == 0
    # Each job's folder records the job's own command (as typed), not that of the server it is forked from.
    for folder, command in (("", "train --job.config_file "), ("condensation", "analyze ")):
        record = json.loads((out / "runs" / NAMES[0] / folder / ".owner.json").read_text())
        assert record["command"].startswith(f"python -m dispersion_titan.{command}"), record


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
        assert (
            analysis(out, f"w{w}-baseline-s42", 0)["layers"]
            == analysis(out, f"w{w}-angular_spread-c2-s42", 0)["layers"]
        )
    base = {w: late_offdiag(analysis(out, f"w{w}-baseline-s42", 2)) for w in WIDTHS}
    disp = {w: late_offdiag(analysis(out, f"w{w}-angular_spread-c2-s42", 2)) for w in WIDTHS}
    expected = ", ".join(f"{base[w]:.3f} → {disp[w]:.3f} at width {w}" for w in WIDTHS)
    line = next(line for line in summary.splitlines() if "late-block cosine baseline → dispersion" in line)
    assert expected in line
    # The rule restated: the smallest fall against the largest gap between the two seeds at width 64.
    final = {
        (arm, seed): late_offdiag(analysis(out, f"w64-{arm}-s{seed}", 2))
        for arm in ("baseline", "angular_spread-c2")
        for seed in (42, 43)
    }
    spread = max(abs(final[arm, 42] - final[arm, 43]) for arm in ("baseline", "angular_spread-c2"))
    fall = min(base[w] - disp[w] for w in WIDTHS)
    verdict = (
        "within noise at this scale"
        if round(abs(fall), 3) <= round(spread, 3)
        else "agrees"
        if fall > 0
        else "disagrees"
    )
    assert line.endswith(f"(effect {fall:+.3f}, seed spread {spread:.3f}) — **{verdict}**."), line
    for heading in (
        "Is condensation present at initialization?",
        "How does it change with MLP width?",
        "How does it change with training?",
        "What does the dispersion loss do to it?",
    ):
        verdicts = "agrees|disagrees|within noise at this scale"
        assert re.search(rf"^### \d\. {re.escape(heading)} — \*\*({verdicts})\*\*$", summary, re.M), heading
    assert "Scale needed:" in summary  # the toy model disagrees somewhere, and says what it would need


def shifted(result, delta: float, blocks_only: bool = True):
    """``result`` with every block's (or every layer's) off-diagonal cosine moved by ``delta``."""
    layers = [
        dataclasses.replace(layer, mean_cos_offdiag=layer.mean_cos_offdiag + delta)
        if layer.name.startswith("block_") or not blocks_only
        else layer
        for layer in result.layers
    ]
    return dataclasses.replace(result, layers=layers)


@pytest.mark.slow
def test_verdicts_follow_the_numbers(sweep):
    """Each verdict is computed from the numbers: move a number well across and the verdict flips."""
    out, _ = sweep
    runs = load_sweep([str(out / "runs" / name) for name in NAMES])
    panel = init_panel(out)
    assert [(r.width, r.is_baseline, r.seed) for r in runs] == [
        (64, True, 42),
        (64, True, 43),
        (64, False, 42),
        (64, False, 43),
        (256, True, 42),
        (256, False, 42),
    ]
    assert all(r.val_loss is not None and r.final.step == 2 for r in runs)
    far = 1.0  # beyond any seed spread of cosines in [-1, 1] at this size

    def verdicts(panel, runs):
        return [f.verdict for f in findings(panel, runs, 42)]

    def replaced(widths):
        return InitPanel(widths, panel.seeds)

    # 1. present at init: a panel whose blocks sit far above the embedding agrees; a flat one does not.
    high = {w: dataclasses.replace(shifted(r, far), spearman=1.0) for w, r in panel.widths.items()}
    flat = {w: dataclasses.replace(shifted(r, -1.0, blocks_only=False), spearman=None) for w, r in panel.widths.items()}
    assert findings(replaced(high), runs, 42)[0].parts[0].verdict == AGREES
    assert findings(replaced(flat), runs, 42)[0].parts[0].verdict == DISAGREES
    # 2. width: a panel decreasing with width agrees, increasing disagrees.
    down = {64: shifted(panel.widths[64], far), 256: shifted(panel.widths[256], -far)}
    up = {64: shifted(panel.widths[64], -far), 256: shifted(panel.widths[256], far)}
    assert findings(replaced(down), runs, 42)[1].parts[0].verdict == AGREES
    assert findings(replaced(up), runs, 42)[1].parts[0].verdict == DISAGREES
    # 3. training: final far below init everywhere agrees, far above disagrees.
    fell = [dataclasses.replace(r, final=shifted(r.init, -far)) for r in runs]
    rose = [dataclasses.replace(r, final=shifted(r.init, far)) for r in runs]
    assert verdicts(panel, fell)[2] == AGREES and verdicts(panel, rose)[2] == DISAGREES
    # 4. dispersion: far below its baseline at every width agrees, far above at one width disagrees.
    base = {r.width: r for r in runs if r.is_baseline and r.seed == 42}

    def dispersed(delta_by_width):
        return [
            r if r.is_baseline else dataclasses.replace(r, final=shifted(base[r.width].final, delta_by_width[r.width]))
            for r in runs
        ]

    assert with_dispersion(dispersed({64: -far, 256: -far}), 42).parts[0].verdict == AGREES
    assert with_dispersion(dispersed({64: -far, 256: +far}), 42).parts[0].verdict == DISAGREES
    # ... and its validation loss part weighs the gap against the measured seed-to-seed spread.
    s42, s43 = (next(r for r in runs if r.is_baseline and r.width == 64 and r.seed == s) for s in (42, 43))
    spread = abs(s42.val_loss - s43.val_loss)

    def with_loss(gap):  # every dispersion run at its own seed's baseline + gap: the spread stays the baselines'
        own = {(r.width, r.seed): r.val_loss for r in runs if r.is_baseline}
        return [r if r.is_baseline else dataclasses.replace(r, val_loss=own[r.width, r.seed] + gap) for r in runs]

    assert with_dispersion(with_loss(-spread / 2), 42).parts[1].verdict == NOISE
    assert with_dispersion(with_loss(-spread - 0.01), 42).parts[1].verdict == AGREES
    assert with_dispersion(with_loss(spread + 0.01), 42).parts[1].verdict == DISAGREES


def layers(cosines: list[float]) -> list[LayerCondensation]:
    names = ["embeddings", *(f"block_{i}" for i in range(1, len(cosines) - 1)), "norm"]
    return [LayerCondensation(i, name, c, c, []) for i, (name, c) in enumerate(zip(names, cosines, strict=True))]


def constructed(step: int, late: float, width: int) -> Condensation:
    """A 4-block toy model's condensation whose late blocks (3 and 4) average ``late``."""
    return Condensation(
        step,
        4,
        16,
        layers([0.0, 0.1, 0.2, late - 0.05, late + 0.05, late]),
        1.0,
        None,
        [],
        10,
        [-1.0, 1.0],
        {"tokens_sha256": "x"},
        "fp32",
        "cpu",
        "c",
        "r",
        {"dim": 64, "n_layers": 4, "n_heads": 4, "mlp_hidden_dim": width},
    )


def toy_run(width: int, seed: int, final: float, val_loss: float, dispersion: str | None = None) -> RunCondensation:
    return RunCondensation(
        f"w{width}-s{seed}",
        width,
        seed,
        dispersion,
        constructed(0, 0.9, width),
        constructed(100, final, width),
        {0: 0.9, 100: final},
        val_loss,
    )


def test_a_verdict_agrees_only_beyond_the_measured_seed_spread():
    """Constructed numbers, noisy as the issue found them: the second seed at width 64 moves the
    late-block cosine by 0.13 and the validation loss by 0.076."""

    def sweep(finals: tuple[float, float, float], gain: float, second_seed: bool = True) -> list[RunCondensation]:
        runs = [toy_run(w, 42, final, 9.0) for w, final in zip((64, 256, 1024), finals, strict=True)]
        runs += [toy_run(w, 42, 0.1, 9.0 - gain, "angular_spread λ=1.0") for w in (64, 256, 1024)]
        if second_seed:
            runs += [
                toy_run(64, 43, finals[0] - 0.13, 9.076),
                toy_run(64, 43, 0.1, 9.076 - gain, "angular_spread λ=1.0"),
            ]
        return runs

    panel = InitPanel(
        {768: constructed(0, 0.80, 768), 1536: constructed(0, 0.75, 1536)},
        {42: constructed(0, 0.80, 768), 43: constructed(0, 0.86, 768)},
    )
    # Width: every widening must lower the cosine by more than the spread (0.13).
    toy = with_width(panel, sweep((0.60, 0.45, 0.30), 0.0), 42).parts[1]
    assert (toy.verdict, toy.noise) == (AGREES, "effect +0.150, seed spread 0.130")
    toy = with_width(panel, sweep((0.679, 0.527, 0.499), 0.0), 42).parts[1]  # the issue's: 0.152, then 0.028
    assert (toy.verdict, toy.noise) == (NOISE, "effect +0.028, seed spread 0.130")
    toy = with_width(panel, sweep((0.60, 0.80, 0.30), 0.0), 42).parts[1]  # up 0.20 beyond the spread: against
    assert (toy.verdict, toy.noise) == (DISAGREES, "effect -0.200, seed spread 0.130")
    # The init panel's 0.05 is within its own seed spread 0.06; so the whole finding is.
    init = with_width(panel, sweep((0.60, 0.45, 0.30), 0.0), 42).parts[0]
    assert (init.verdict, init.noise) == (NOISE, "effect +0.050, seed spread 0.060")
    assert with_width(panel, sweep((0.60, 0.45, 0.30), 0.0), 42).verdict == NOISE
    # Validation loss: a gain equal to the seed spread (0.076) is noise; a larger one agrees.
    loss = with_dispersion(sweep((0.60, 0.45, 0.30), 0.076), 42).parts[1]
    assert (loss.verdict, loss.noise) == (NOISE, "effect +0.076, seed spread 0.076")
    assert with_dispersion(sweep((0.60, 0.45, 0.30), 0.2), 42).parts[1].verdict == AGREES
    assert with_dispersion(sweep((0.60, 0.45, 0.30), -0.2), 42).parts[1].verdict == DISAGREES
    # The table and the findings print one Spearman alike (were "+1.00" and "1.000").
    runs = sweep((0.60, 0.45, 0.30), 0.0)
    same = InitPanel({r.width: r.init for r in baselines(runs, 42)}, {42: runs[0].init})
    column = " / ".join(row["Spearman @0"] for row in table_rows(baselines(runs, 42)))
    assert column == "+1.00 / +1.00 / +1.00"
    assert f"Spearman with depth {column};" in at_initialization(same, runs, 42).parts[0].measured
    # Written with both numbers in summary.md.
    text = "\n".join(findings_markdown([with_dispersion(sweep((0.60, 0.45, 0.30), 0.076), 42)]))
    assert "(effect +0.076, seed spread 0.076) — **within noise at this scale**." in text
    assert text.startswith("### 1. What does the dispersion loss do to it? — **within noise at this scale**")
    # Without a second seed nothing is measured to weigh against: the sign decides, and says so.
    alone = with_dispersion(sweep((0.60, 0.45, 0.30), 0.076, second_seed=False), 42).parts[1]
    assert (alone.verdict, alone.noise) == (AGREES, "effect +0.076, seed spread unmeasured")
    # summary.png says what summary.md says: each panel's title opens with its finding's verdict, then
    # the verdict of what it draws and of the finding's other measurements (issue 49: finding 4's panel
    # said "agrees" of a finding within noise, finding 2's two panels two verdicts).
    runs = sweep((0.60, 0.45, 0.30), 0.076)
    found = findings(panel, runs, 42)
    headings = {f"{n}. {f.question} — {f.verdict}" for n, f in enumerate(found, start=1)}
    titles = [" ".join(ax.get_title().split()) for ax in findings_figure(panel, runs, found, 42).axes]
    panels = [title for title in titles if title[:1].isdigit()]
    assert len(panels) == 5 and all(any(title.startswith(h) for h in headings) for title in panels), panels
    (fourth,) = [title for title in panels if title.startswith("4.")]
    assert fourth.startswith(
        "4. What does the dispersion loss do to it? — within noise at this scale after 100 steps: agrees;"
    )
    assert fourth.endswith("validation loss (mean over widths): within noise at this scale")
    width = [title for title in panels if title.startswith("2.")]
    assert [t.split("— ", 1)[1].split(" ")[0] for t in width] == [found[1].verdict.split()[0]] * 2
    # One trained width: its panel says nothing was compared (it said the init panel's verdict, "after 100 steps").
    alone = [r for r in runs if r.width == 64]
    titles = [
        " ".join(ax.get_title().split()) for ax in findings_figure(panel, alone, findings(panel, alone, 42), 42).axes
    ]
    (toy,) = [title for title in titles if title.startswith("2.") and "after 100 steps" in title]
    assert "after 100 steps: one MLP width, nothing to compare; init panel: dim 64, 4 blocks, step 0: " in toy, toy


@pytest.mark.slow
def test_second_invocation_redoes_only_what_is_missing(sweep, tmp_path):
    out, _ = sweep
    checkpoints = digests(out / "runs", "*.distcp")
    results = digests(out, "condensation.json")
    # A lost analysis of one checkpoint (say, an interrupted analysis) is the only work left.
    lost = out / "runs" / NAMES[1] / "condensation" / "step-1" / "condensation.json"
    lost.unlink()
    proc = quickstart(out, *sweep_options(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("already done, skipped") == 2 * len(NAMES) - 1
    assert re.findall(r"(\w+) +(\S+): started", proc.stdout) == [("analyze", NAMES[1])]
    assert digests(out / "runs", "*.distcp") == checkpoints
    assert digests(out, "condensation.json") == results  # the lost one recomputed identically, the panel reused


@pytest.mark.slow
def test_a_copied_or_moved_out_reruns_as_the_original(sweep, tmp_path):
    """OUT copied (``cp -a``), then moved to another parent: its rerun reuses every run and analysis, as in place; a
    run whose checkpoints were copied without their times (``cp -r``), which their identities record, is analyzed
    again, not trained (was: its analysis skipped, then the comparison refused it, exit 1). The original unchanged."""
    out, _ = sweep
    before = digests(out)
    shutil.copytree(out, tmp_path / "copy", symlinks=True)
    moved = (tmp_path / "copy").rename(tmp_path / "elsewhere")
    checkpoint = moved / "runs" / NAMES[1] / "checkpoint"
    shutil.rmtree(checkpoint)
    shutil.copytree(out / "runs" / NAMES[1] / "checkpoint", checkpoint, copy_function=shutil.copyfile)  # cp -r
    proc = quickstart(moved, *sweep_options(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("already done, skipped") == 2 * len(NAMES) - 1
    assert re.findall(r"(\w+) +(\S+): started", proc.stdout) == [("analyze", NAMES[1])]
    assert digests(out) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, what",
    [
        (("--steps", "3"), "steps 2 vs 3"),
        (("--seq-len", "16"), "seq_len 32 vs 16"),
        (("--widths", "64"), "widths [64, 256] vs [64]"),
    ],
)
def test_other_options_are_refused_without_touching_results(sweep, change, what):
    out, _ = sweep
    before = digests(out)
    given = sweep_options(out)
    options = dict(zip(given[::2], given[1::2], strict=True)) | dict([change])
    proc = quickstart(out, *(item for pair in options.items() for item in pair))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"dispersion_titan: error: --out: {out} holds results made with other options (recorded vs given: {what}); "
        "use another --out"
    ]
    assert digests(out) == before


@pytest.mark.slow
def test_a_full_disk_while_comparing_is_one_line_and_status_74(sweep, monkeypatch, capsys):
    """The file size limit (or a full disk) met writing a comparison or the summary: the commands' one line naming
    the file and what to do, exit 74 (was exit 1 with Python's ``[Errno 27] File too large: '…'``)."""
    out, _ = sweep
    before = digests(out)

    def full(runs: list[str], folder: str, step: str) -> None:
        raise OSError(errno.EFBIG, "File too large", os.path.join(folder, "compare.png"))

    monkeypatch.setattr(pipeline, "compare", full)
    with pytest.raises(SystemExit) as e:
        quickstart_main(["--out", str(out), *sweep_options(out)])
    assert e.value.code == WRITE_FAILED
    assert capsys.readouterr().err.splitlines() == [
        f"dispersion_titan: error: file too large writing {out / 'compare' / 'final_width_sweep' / 'compare.png'}; "
        "raise the file size limit (ulimit -f); each stage finished so far is kept in --out; the same command goes on "
        "from there"
    ]
    assert digests(out) == before


def test_a_rerun_is_held_to_the_configs_settings_not_its_path(tmp_path):
    """OUT/quickstart.json records the settings of --config that change results, not its path: the same config
    elsewhere (a moved clone) goes on; an edited one is refused naming the setting (its rerun reused the old
    results as done, under the new config's name); a corrupt record is one line and kept (was a traceback)."""
    out, config, moved = tmp_path / "q", small_config(tmp_path / "small.toml"), tmp_path / "moved.toml"
    check_same_options(setup_for(out, config))
    moved.write_text(config.read_text())
    check_same_options(setup_for(out, moved))
    config.write_text(config.read_text().replace("lr = 2e-3", "lr = 5e-2", 1))
    with pytest.raises(ArgumentError) as e:
        check_same_options(setup_for(out, config))
    assert str(e.value) == (
        f"--out: {out} holds results made with other options (recorded vs given: config optimizer.lr 0.002 vs 0.05); "
        "use another --out"
    )
    record = out / "quickstart.json"
    earlier = {**json.loads(record.read_text()), "config": str(config)}  # as an earlier version recorded it
    earlier = {key: value for key, value in earlier.items() if not key.startswith("config ")}
    record.write_text(json.dumps(earlier))
    with pytest.raises(ArgumentError) as e:
        check_same_options(setup_for(out, config))
    assert str(e.value) == (
        f"--out: {record} was written by an earlier dispersion_titan (it names the config by its path, not its "
        "settings, so whether its results are this config's is unknown); use another --out"
    )
    record.write_text('{"widths": [64')
    with pytest.raises(ArgumentError) as e:
        check_same_options(setup_for(out, moved))
    assert str(e.value).startswith(f"--out: {record}: unreadable (")
    assert str(e.value).endswith("); it records the options of the results there: restore it, or use another --out")
    assert record.read_text() == '{"widths": [64'


def test_a_seq_len_beyond_a_models_positions_is_refused_before_any_work(tmp_path, script_python):
    """The init panel's shape (was a traceback from its forward pass), and the trained model's through the launch
    script run from another folder: its relative --config and --out are that folder's, as every command's (they
    were the clone's, the script ran there); was every analysis refusing it once every run had trained. The script
    runs $PYTHON (here forked from the job server, ``script_python``), as launch/train.sh; one that is no
    interpreter is refused in one line (it ran the clone's .venv whatever $PYTHON said)."""
    with pytest.raises(ArgumentError) as e:
        setup_for(tmp_path / "q", Path(CONFIG), "--init-flavor", "debug", "--seq-len", "300")
    assert str(e.value) == "--seq-len: 300 exceeds the 256 positions of the init panel's debug shape (--init-flavor)"
    (tmp_path / "mine.toml").write_text(Path(CONFIG).read_text())
    script = str(REPO / "launch" / "quickstart.sh")
    command = ["bash", script, "--out", "q", "--config", "mine.toml", "--seq-len", "300"]
    env = {**os.environ, "PYTHON": "/no/python"}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (
        2,
        "quickstart.sh: error: PYTHON: '/no/python' is no interpreter to run; unset it, or name one\n",
    )
    env["PYTHON"] = str(script_python)
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"dispersion_titan: error: --seq-len: 300 exceeds the 256 positions of the trained model ({tmp_path}/mine.toml)"
    )
    assert not (tmp_path / "q").exists() and not (REPO / "q").exists()


def test_more_sequences_than_the_analyses_windows_are_refused_before_any_work(tmp_path):
    """``--num-sequences`` beyond the windows of --seq-len tokens the analyses draw from: one line naming the limit,
    exit 2, nothing made (was: every run trained, then every analysis failing, one error line each, exit 1). The limit
    is the analysis's own: that many sequences it selects, one more it refuses; ``--init-num-sequences`` the same."""
    small = ("--widths", "64", "--spread-seeds", "0", "--steps", "1", "--init-flavor", "debug")  # if it trains: fast
    proc = quickstart(tmp_path / "q", *small, "--init-widths", "64,128", "--num-sequences", "100000")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    limit = re.fullmatch(
        r"dispersion_titan: error: --num-sequences: 100000 exceeds the (\d+) windows of 128 tokens \(--seq-len\) in "
        r"enwiki_sample's validation split, which the analyses draw their sequences from; lower it or --seq-len",
        line,
    )
    assert limit, line
    limit = int(limit[1])
    assert len(select_sequences(InputOptions("enwiki_sample", None, None, limit, 128, seed=0)).tokens) == limit
    with pytest.raises(AnalysisError, match=f"only {limit} windows"):
        select_sequences(InputOptions("enwiki_sample", None, None, limit + 1, 128, seed=0))
    with pytest.raises(ArgumentError) as e:
        setup_for(tmp_path / "q", Path(CONFIG), "--init-num-sequences", str(limit + 1))
    assert str(e.value).startswith(f"--init-num-sequences: {limit + 1} exceeds the {limit} windows of 128 tokens")
    assert not (tmp_path / "q").exists()


def test_out_inside_an_earlier_quickstart_is_refused_naming_it(sweep):
    """``--out Q/runs``, the runs folder of an earlier quickstart Q: named as that, with Q to go on with it (was:
    "holds files no dispersion_titan command recorded", of the quickstart's own runs); nothing in Q changed."""
    out, _ = sweep
    before = digests(out)
    proc = quickstart(out / "runs", *sweep_options(out))
    real = os.path.realpath(out)
    assert (proc.returncode, proc.stderr.splitlines()) == (
        2,
        [
            f"dispersion_titan: error: --out: {out / 'runs'} is the runs folder of the quickstart in {real} (give "
            f"{real} to go on with it); use another --out"
        ],
    )
    assert digests(out) == before


def test_a_killed_job_is_named_with_its_signal(tmp_path):
    """A job killed (``kill -9``, the out-of-memory killer): its signal and how to go on, not ``exit -9`` and its
    log's last line, a training step, as its error."""
    setup = setup_for(tmp_path / "q", small_config(tmp_path / "small.toml"), "--widths", "64", "--spread-seeds", "0")
    os.makedirs(setup.out)

    class Killed:
        def run(self, target: str, argv: list[str], log: str) -> int:
            os.makedirs(os.path.dirname(log), exist_ok=True)
            Path(log).write_text("[titan] step: 5  loss: 9.1\n")
            return -signal.SIGKILL

    run = setup.runs[0]
    log = setup.log(run, "train")
    assert process(setup, run, Killed(), lambda line: None, folder_id(setup.out), threading.Event()) == (
        f"train {run.name} was killed by signal 9 (Killed; log: {log}); the same command goes on from what it saved"
    )


def test_time_budget_is_measured_and_written_down():
    """docs/benchmarks.md records the main command's wall time from a fresh clone, under the
    15-minute budget, with its command, and the README quotes that same figure."""
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text()
    (row,) = [
        line for line in benchmarks.splitlines() if line.startswith("| quickstart from a fresh clone, no `.venv`")
    ]
    assert "bash launch/quickstart.sh" in row
    minutes, seconds = map(int, re.search(r"\*\*(\d+) min (\d+) s\*\*", row).groups())
    assert 60 * minutes + seconds < 15 * 60
    assert f"{minutes} min {seconds} s" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(
    "options, message",
    [
        (("--out", "{file}/out"), "--out: {file}/out: not writable (Not a directory)"),
        (("--widths", "64,64"), "argument --widths: '64,64' repeats a width"),
        (("--init-widths", "64"), "argument --init-widths: '64' is one width; finding 2 compares two or more"),
        (("--coeff", "0"), "argument --coeff: '0' is not a finite positive number"),
        (("--coeff", "inf"), "argument --coeff: 'inf' is not a finite positive number"),
        (("--config", "{file}x"), "--config: {file}x: no such file"),
        (
            ("--config", "{file}"),
            "--config: {file}: needs 'training' (training.steps, debug.seed and checkpoint.interval)",
        ),
        (("--init-flavor", "huge"), "--init-flavor: 'huge' is not one of ['debug', 'large', 'medium', 'small', 'xl']"),
    ],
)
def test_bad_options_fail_with_one_line(tmp_path, options, message):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = quickstart(tmp_path / "q", *(o.format(file=blocker) for o in options))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"dispersion_titan: error: {message.format(file=blocker)}"]
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("section", ["training = 3", "training = [1]"])
def test_a_config_section_that_is_no_table_is_named_in_one_line(tmp_path, section):
    """``--config`` whose ``training`` is no table: the line of a config without it (was a TypeError traceback)."""
    config = tmp_path / "config.toml"
    config.write_text(f"{section}\n")
    says = f"--config: {config}: needs tables (training.steps, debug.seed and checkpoint.interval)"
    with pytest.raises(ArgumentError, match=f"^{re.escape(says)}$"):
        setup_for(tmp_path / "q", config)


def test_a_corrupt_init_panel_result_is_refused_in_one_line(tmp_path):
    """A cached ``init_panel/*/condensation.json`` cut short is named with what to do, before any
    measurement, and kept."""
    corrupt = tmp_path / "w64" / "condensation.json"
    corrupt.parent.mkdir()
    corrupt.write_text('{"layers": [')
    texts = InputOptions("enwiki_sample", None, None, 2, 16, seed=0)
    with pytest.raises(OutputError) as e:
        measure_init_panel(str(tmp_path), "debug", (64,), (42,), texts, lambda line: None)
    (line,) = str(e.value).splitlines()
    assert line.startswith(f"{corrupt}: unreadable (") and line.endswith("); restore it, or remove it and rerun")
    assert corrupt.read_text() == '{"layers": ['


def test_a_second_quickstart_into_a_busy_out_is_refused_naming_the_owner(tmp_path):
    out = tmp_path / "q"
    with held_by_another_command(out) as owner:
        proc = quickstart(out, *OPTIONS)
        assert proc.returncode == 2
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"dispersion_titan: error: {out}: another command is writing here (PID {owner} on ")
        assert line.endswith("; wait for it to end, or use another --out")
        assert os.listdir(out) == [LOCK_NAME]


def test_a_failing_job_is_named_with_its_exit_status_error_and_log(tmp_path):
    """Jobs run forked from the quickstart's preloaded server: a training that stops on bad
    input still reports its exit status and one-line error, and the quickstart exits 1."""
    config = tmp_path / "bad.toml"
    config.write_text(Path(CONFIG).read_text().replace('dataset = "enwiki_sample"', 'dataset = "no_such_corpus"', 1))
    out = tmp_path / "q"
    proc = quickstart(
        out,
        "--config",
        str(config),
        "--widths",
        "64",
        "--spread-seeds",
        "0",
        "--steps",
        "1",
        "--init-flavor",
        "debug",
        "--init-widths",
        "64,128",
        "--init-num-sequences",
        "2",
        "--seq-len",
        "16",
    )
    assert proc.returncode == 1, proc.stderr
    for name in ("w64-baseline-s42", "w64-angular_spread-c1-s42"):
        log = out / "logs" / f"{name}.train.log"
        error = [line for line in log.read_text().splitlines() if line.startswith("dispersion_titan: error:")]
        assert len(error) == 1 and "no_such_corpus" in error[0], log.read_text()[-2000:]
        cause = error[0].removeprefix("dispersion_titan: error: ")
        assert (
            f"dispersion_titan: error: train {name} failed (exit 2): {cause} (log: {log})" in proc.stderr.splitlines()
        )
        assert not (out / "logs" / f"{name}.analyze.log").exists()


def test_a_job_out_of_room_stops_the_quickstart_in_one_line_and_the_rerun_finishes(tmp_path):
    """The file size limit (or a full disk) met by a job, here saving its first checkpoint: no job starts after it
    (the next would meet it too), one line naming the file and what to do, exit 74 (was each job's own line, exit 1);
    what it kept stands, and the same command with room finishes."""
    out = tmp_path / "q"
    options = ("--widths", "64", "--spread-seeds", "0", "--steps", "1", "--checkpoint-interval", "1", "--jobs", "1")
    options += ("--config", str(small_config(tmp_path / "small.toml")))
    tiny = ("--init-flavor", "debug", "--init-widths", "64,128", "--init-num-sequences", "2", "--seq-len", "16")
    proc = quickstart(out, *options, *tiny, file_limit=4 << 20)  # the init panel fits, a checkpoint (13 MB) not
    step = out / "runs" / "w64-baseline-s42" / "checkpoint" / "step-0"
    assert proc.returncode == WRITE_FAILED, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        f"dispersion_titan: error: file too large writing {step}; raise the file size limit (ulimit -f); each stage "
        "finished so far is kept in --out; the same command goes on from there"
    ]
    assert not (out / "logs" / "w64-angular_spread-c1-s42.train.log").exists()  # nor did the next run start
    kept = digests(out / "init_panel")
    done = quickstart(out, *options, *tiny)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "init     MLP width 64, seed 42: read back" in done.stdout
    assert digests(out / "init_panel") == kept and (out / "summary.md").is_file()


def test_a_jobs_out_of_room_line_is_read_as_what_filled_up_and_where(tmp_path, capsys):
    """The quickstart tells a job out of room by its exit status and line, as each command says it: the commands'
    line with its file or without one, the trainer's of a checkpoint save or of another write; a save failing
    otherwise (exit 74 too) is no such job."""
    folder, tb = tmp_path / "checkpoint", str(tmp_path / "tb")
    folder.mkdir()
    model = torch.nn.Linear(2, 2)

    def said(error: OSError) -> tuple[int, str]:
        @command_main("kept")
        def main() -> None:
            raise error

        with pytest.raises(SystemExit) as e:
            main()
        return e.value.code, capsys.readouterr().err.strip().removeprefix("dispersion_titan: error: ")

    for (status, line), room in (
        (said(OSError(errno.ENOSPC, "No space left on device", "/x/a b (1).json")), (errno.ENOSPC, "/x/a b (1).json")),
        (said(OSError(errno.EDQUOT, "Disk quota exceeded")), (errno.EDQUOT, None)),
        (
            (WRITE_FAILED, str(save_failure(str(folder), 4, OSError(errno.EFBIG, "x"), model))),
            (errno.EFBIG, f"{folder}/step-4"),
        ),
        (
            (WRITE_FAILED, str(write_failure(OSError(errno.ENOSPC, "x", tb), str(tmp_path), str(folder)))),
            (errno.ENOSPC, tb),
        ),
        ((WRITE_FAILED, str(save_failure(str(folder), 4, RuntimeError("unexpected pos"), model))), None),
        ((2, f"no space left on device writing {tb}; free space"), None),
    ):
        found = out_of_room(status, line)
        assert (found and (found.errno, found.filename)) == room, line


def test_training_progress_says_steps_and_time_left(tmp_path):
    """The watcher on a log that a job appends to: each new step once, with the time left at
    the rate since the first step seen; a half-written line waits for its end; an earlier attempt's
    steps in the same log are never said (they were, with a time left at a wrong rate)."""
    log = tmp_path / "train.log"
    said: list[str] = []
    with step_progress(str(log), 60, "w64-baseline-s42", said.append, every_s=0.05):
        time.sleep(0.2)  # no log yet: nothing said
    assert said == []
    log.write_bytes(b"[titan] step: 50  loss: 4.0  grad_norm: 1.0\n")  # an earlier attempt, killed at step 50
    with step_progress(str(log), 60, "w64-baseline-s42", said.append, every_s=0.05):
        time.sleep(0.2)  # a relaunch appends to the same log: those steps are not this attempt's
        with open(log, "ab", buffering=0) as f:
            f.write(
                b"[titan] step: 10  loss: 4.0  grad_norm: 1.0\n[titan] validate step: 15  loss: 4.1\n[titan] step: 2"
            )
            time.sleep(0.3)
            f.write(b"0  loss: 3.9  grad_norm: 1.0\n")
            time.sleep(0.3)
    assert said[0] == "train    w64-baseline-s42: step 10/60"
    match = re.fullmatch(r"train    w64-baseline-s42: step 20/60, ~(\d+) s left", said[1])
    assert len(said) == 2 and match, said
    assert 0 <= int(match[1]) <= 4  # 10 steps in about 0.3 s: 40 more in about 1.2 s


def test_a_sigterm_to_the_quickstart_alone_stops_its_jobs_at_a_checkpoint(tmp_path):
    """``kill PID`` of the quickstart: its jobs stop too (before, they trained on as orphans of a
    silent exit), the training one saving where it stopped; one line and exit 143."""
    out = tmp_path / "q"
    options = ("--widths", "64", "--spread-seeds", "0", "--steps", "400", "--checkpoint-interval", "200", "--jobs", "1")
    options += ("--config", str(small_config(tmp_path / "small.toml")))  # its faster steps: 400 to stop in
    tiny = ("--init-flavor", "debug", "--init-widths", "64,128", "--init-num-sequences", "2", "--seq-len", "16")
    job = ThreadPoolExecutor(1).submit(quickstart, out, *options, *tiny)
    log = out / "logs" / "w64-baseline-s42.train.log"
    while not (log.exists() and re.search(r"step:\s+\d+\s+loss:", log.read_text())) and not job.done():
        time.sleep(0.05)
    assert not job.done(), job.result().stderr[-3000:]
    os.kill(json.loads((out / LOCK_NAME).read_text())["pid"], signal.SIGTERM)
    done = job.result()
    kept = "each stage finished so far is kept in --out; the same command goes on from there"
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == f"dispersion_titan: interrupted; {kept}"
    stopped = re.search(r"interrupted at step (\d+); checkpoint step-(\d+) saved", log.read_text())
    assert stopped and stopped[1] == stopped[2] and int(stopped[1]) < 400, log.read_text()[-2000:]
    assert (out / "runs" / "w64-baseline-s42" / "checkpoint" / f"step-{stopped[1]}").is_dir()
    assert not (out / "logs" / "w64-angular_spread-c1-s42.train.log").exists()  # nor did the next run start


def test_out_moved_mid_way_is_one_line_and_nothing_starts_after(tmp_path):
    """``mv OUT ELSEWHERE`` while the quickstart trains: no job starts after that (it would make a new OUT),
    one line saying where the work went and how to go on, exit 1. (The same command on the moved folder
    then finishes, as on any copied or moved OUT: docs/reliability.md, by hand.)"""
    out, moved = tmp_path / "q", tmp_path / "elsewhere"
    options = ("--widths", "64", "--spread-seeds", "0", "--steps", "2", "--checkpoint-interval", "1", "--jobs", "1")
    options += ("--config", str(small_config(tmp_path / "small.toml")))
    tiny = ("--init-flavor", "debug", "--init-widths", "64,128", "--init-num-sequences", "2", "--seq-len", "16")
    job = ThreadPoolExecutor(1).submit(quickstart, out, *options, *tiny)
    while not (out / "logs" / "w64-baseline-s42.train.log").exists() and not job.done():
        time.sleep(0.02)
    os.rename(out, moved)
    done = job.result()
    assert done.returncode == 1, done.stderr[-3000:]
    strays = f"; what its running jobs wrote after that is in a new {out}" if out.exists() else ""
    assert done.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: error: --out: {out} was moved or removed while the quickstart ran; what it finished "
        f"went with it: rerun the same command with --out naming where it is now{strays}"
    )
    assert (moved / "quickstart.json").is_file()
    assert not (out / "logs" / "w64-baseline-s42.analyze.log").exists()  # nothing started after the move
    assert not (moved / "logs" / "w64-baseline-s42.analyze.log").exists()
