"""W&B carries what TensorBoard gets: a real training run with ``[metrics] enable_wandb``,
offline (``WANDB_MODE=offline``), read back from its run files; ``analyze --wandb`` adds the
analysis to the same run."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from dispersion_titan.components.wandb_run import USER_NAMED, WANDB_RUN_FILE, continue_recorded, record
from dispersion_titan.evaluate import main as evaluate_main
from support.cli import analyze, assert_one_line_error, run_cli
from support.eval_tasks import LM_EVAL_TASKS
from support.launch import torchrun
from support.runs import scalars
from support.wandb_files import history, logged, run_ids

OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "dispersion-test"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Two steps with W&B in two launches, the second resuming the first's step 1: checkpoints at steps 0, 1, 2."""
    dump = tmp_path_factory.mktemp("wandb") / "run"
    for steps in ("1", "2"):
        torchrun(
            dump,
            1,
            "--training.steps",
            steps,
            "--checkpoint.no-last-save-model-only",  # step 1 full, for the relaunch to resume
            "--validation.freq",
            "2",
            "--validation.steps",
            "1",
            "--dispersion.variant",
            "angular_spread",
            "--dispersion.coeff",
            "0.3",
            "--dispersion.max_tokens",
            "64",
            "--metrics.enable_wandb",
            env=OFFLINE,
        )
    return dump


def test_wandb_gets_every_scalar_tensorboard_gets(trained):
    board, wandb = scalars(trained), history(trained)
    for tag in (
        "loss_metrics/dispersion",
        "condensation/block_2_mean_cos_offdiag",
        "validation_metrics/loss",
        "validation_metrics/perplexity",
    ):
        assert tag in board, sorted(board)
    assert wandb.keys() == board.keys()
    for tag, by_step in board.items():
        assert wandb[tag] == pytest.approx(by_step, rel=1e-6), tag  # TensorBoard keeps float32
    recorded = json.loads((trained / WANDB_RUN_FILE).read_text())
    # the relaunch continued the first launch's W&B run: two offline folders of one id, which wandb sync uploads in
    # order as one run (was: two W&B runs, the curve split)
    assert run_ids(trained) == [recorded["id"]] * 2 and recorded["project"] == "dispersion-test"


def test_only_the_run_folder_itself_continues_its_wandb_run(trained, tmp_path, monkeypatch):
    """A relaunch of a copy (``cp -a RUN COPY``) starts a W&B run of its own (was: logged into the original's, as
    ``wandb_run.json`` names it); a W&B run the user names (``WANDB_RUN_ID``) wins over the recorded one."""
    for name in (*USER_NAMED, "WANDB_RESUME"):
        monkeypatch.setenv(name, "")  # restored as it was after the test: continue_recorded sets them
        monkeypatch.delenv(name)
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy, symlinks=True)
    continue_recorded(str(copy))
    assert "WANDB_RUN_ID" not in os.environ and "WANDB_RESUME" not in os.environ
    continue_recorded(str(trained))
    recorded = json.loads((trained / WANDB_RUN_FILE).read_text())["id"]
    assert (os.environ["WANDB_RUN_ID"], os.environ["WANDB_RESUME"]) == (recorded, "allow")
    monkeypatch.setenv("WANDB_RUN_ID", "theirs")
    continue_recorded(str(trained))
    assert os.environ["WANDB_RUN_ID"] == "theirs"


@pytest.mark.parametrize("named", [{}, {"id": 3}, {"id": None}])
def test_a_relaunch_beside_a_wandb_run_record_without_an_id_starts_a_new_wandb_run(tmp_path, monkeypatch, named):
    """A ``wandb_run.json`` of this folder whose id is missing or no string is unreadable, as one cut short: a new
    W&B run (were KeyError and TypeError tracebacks at the relaunch)."""
    for name in (*USER_NAMED, "WANDB_RESUME"):
        monkeypatch.setenv(name, "")  # restored as it was after the test
        monkeypatch.delenv(name)
    (tmp_path / WANDB_RUN_FILE).write_text(json.dumps({**named, "run_folder": os.path.realpath(tmp_path)}))
    continue_recorded(str(tmp_path))
    assert "WANDB_RUN_ID" not in os.environ and "WANDB_RESUME" not in os.environ


def test_analyze_logs_histograms_table_and_figures_to_the_training_run(trained, tmp_path, monkeypatch, capsys):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    code, out, err = analyze(
        str(trained), "--num-sequences", "2", "--seq-len", "16", "--batch-size", "2", "--wandb", capsys=capsys
    )
    assert code == 0, err
    (run_id,) = set(run_ids(trained))  # the analysis resumed the training's run
    analysis = trained / "condensation"
    rows = [(folder, items) for folder, _, items in logged(trained) if "checkpoint_step" in items]
    by_step = {items["checkpoint_step"]: items for _, items in rows}
    assert sorted(by_step) == [0, 1, 2]
    board = scalars(trained)
    for step, items in by_step.items():
        result = json.loads((analysis / f"step-{step}" / "condensation.json").read_text())
        assert result["layers"], step
        for layer in result["layers"]:
            histogram = items[f"analysis/cosine/{layer['name']}"]
            assert histogram["_type"] == "histogram" and histogram["values"] == pytest.approx(layer["hist"])
            assert len(histogram["bins"]) == result["hist_bins"] + 1
            assert items[f"analysis/mean_cos/{layer['name']}"] == layer["mean_cos"]
            assert board[f"analysis/mean_cos/{layer['name']}"][step] == pytest.approx(layer["mean_cos"], rel=1e-6)
    ((folder, media),) = [(folder, items) for folder, _, items in logged(trained) if "analysis/summary" in items]
    with open(analysis / "summary.csv", newline="") as f:
        table = list(csv.reader(f))
    logged_table = json.loads((folder / "files" / media["analysis/summary"]["path"]).read_text())
    assert [logged_table["columns"], *logged_table["data"]] == table
    pngs = sorted(analysis.glob("*.png"))
    assert pngs and all(media[f"analysis/{png.stem}"]["_type"] == "image-file" for png in pngs)
    for png in pngs:
        assert (folder / "files" / media[f"analysis/{png.stem}"]["path"]).read_bytes() == png.read_bytes()


@pytest.mark.parametrize("command", ["analyze", "evaluate"])
def test_wandb_needs_a_run_trained_with_it(tmp_path, capsys, command):
    """Refused in one line before anything is written: no output folder is made (was an empty one left)."""
    from support.runs import tiny_run

    run = tiny_run(tmp_path / "run")
    if command == "analyze":
        code, _, err = analyze(str(run), "--num-sequences", "2", "--seq-len", "16", "--wandb", capsys=capsys)
    else:
        options = ["--include-path", str(LM_EVAL_TASKS), "--tasks", "wiki_next_word", "--device", "cpu"]
        code, _, err = run_cli(evaluate_main, str(run), *options, "--wandb", capsys=capsys)
    assert_one_line_error(code, err, f"--wandb: {run} names no W&B run ({WANDB_RUN_FILE})")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "run.json"]


def test_a_run_trained_with_wandb_disabled_names_no_wandb_run(tmp_path, capsys):
    """``WANDB_MODE=disabled``: TorchTitan's ``wandb.init`` gives a no-op run, recorded as training records it, and
    ``analyze --wandb`` is refused in one line (was ``wandb_run.json`` naming it, entity ``dummy``, dir ``/tmp``:
    the analysis logged, exit 0, to a run that never existed, in ``/tmp/wandb``, outside the run)."""
    import wandb

    from support.runs import tiny_run

    run = tiny_run(tmp_path / "run")
    wandb.init(project="dispersion-test", mode="disabled")  # WANDB_MODE's, which W&B reads once a process
    try:
        record(str(run))
    finally:
        wandb.finish()
    code, _, err = analyze(str(run), "--num-sequences", "2", "--seq-len", "16", "--wandb", capsys=capsys)
    assert_one_line_error(code, err, f"--wandb: {run} names no W&B run ({WANDB_RUN_FILE}); ", "WANDB_MODE not disabled")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "run.json"]


def test_a_wandb_mode_wandb_refuses_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """``WANDB_MODE=bogus`` (wandb takes six modes): a launch with ``metrics.enable_wandb`` and ``analyze --wandb``
    are refused in one line naming it, exit 2, nothing made (were: training on without W&B, exit 0, TorchTitan's
    logged ``Failed to create WandB logger``; analyze's 40-line pydantic traceback, exit 1, once it had analyzed)."""
    from dispersion_titan.job_config.parse import validated_args
    from dispersion_titan.utils.errors import ConfigError
    from support.launch import job_args
    from support.runs import tiny_run

    monkeypatch.setenv("WANDB_MODE", "bogus")
    why = "WANDB_MODE: 'bogus' is not one of W&B's modes (online, offline, shared, disabled, dryrun, run); set one"
    with pytest.raises(ConfigError, match=f"^metrics.enable_wandb: {re.escape(why)}"):
        validated_args([*job_args(), "--metrics.enable_wandb"])
    run = tiny_run(tmp_path / "run")
    (run / WANDB_RUN_FILE).write_text(json.dumps({"id": "x", "project": "p", "entity": "", "dir": "tb"}))
    code, _, err = analyze(str(run), "--num-sequences", "2", "--seq-len", "16", "--wandb", capsys=capsys)
    assert_one_line_error(code, err, f"--wandb: {why}")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "run.json", WANDB_RUN_FILE]


def test_evaluate_logs_each_checkpoints_scores_and_the_table_to_the_training_run(trained, monkeypatch, capsys):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    code, _, err = run_cli(
        evaluate_main,
        str(trained),
        "--include-path",
        str(LM_EVAL_TASKS),
        "--tasks",
        "wiki_next_word,wiki_text",
        "--limit",
        "4",
        "--num-fewshot",
        "0",
        "--device",
        "cpu",
        "--wandb",
        capsys=capsys,
    )
    assert code == 0, err
    with open(trained / "evaluation" / "summary.csv", newline="") as f:
        summary = list(csv.DictReader(f))
    by_step = {
        items["checkpoint_step"]: items
        for _, _, items in logged(trained)
        if "checkpoint_step" in items and any(k.startswith("evaluation/") for k in items)
    }
    assert sorted(by_step) == sorted(int(row["step"]) for row in summary) == [0, 1, 2]
    for row in summary:  # the scores unrounded, as results.json has them (was: summary.csv's 6 digits read back)
        scores = json.loads((trained / "evaluation" / f"step-{row['step']}" / "results.json").read_text())["results"]
        accuracy, perplexity = scores["wiki_next_word"]["acc,none"], scores["wiki_text"]["word_perplexity,none"]
        assert perplexity != float(row["wiki_text/word_perplexity"])  # rounded there
        assert {k: v for k, v in by_step[int(row["step"])].items() if k.startswith("evaluation/")} == {
            "evaluation/wiki_next_word/acc": accuracy,
            "evaluation/wiki_text/word_perplexity": perplexity,
            "evaluation/mean_acc": accuracy,
        }
    ((folder, media),) = [(folder, items) for folder, _, items in logged(trained) if "evaluation/summary" in items]
    logged_table = json.loads((folder / "files" / media["evaluation/summary"]["path"]).read_text())
    with open(trained / "evaluation" / "summary.csv", newline="") as f:
        assert [logged_table["columns"], *logged_table["data"]] == list(csv.reader(f))


def test_a_copied_run_logs_its_analysis_beside_its_own_wandb_files(trained, tmp_path, monkeypatch, capsys):
    """``wandb_run.json`` names W&B's folder within the run: ``analyze --wandb`` of a copy (``cp -a``), from
    another working directory, writes W&B's files into the copy (was: into the original's folder, or for a
    relative ``job.dump_folder``, the shipped configs', a new ``outputs/…`` under the working directory)."""
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy, symlinks=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    before = run_ids(trained)
    code, _, err = analyze(
        str(copy), "--num-sequences", "2", "--seq-len", "16", "--batch-size", "2", "--wandb", capsys=capsys
    )
    assert code == 0, err
    assert run_ids(trained) == before and list(elsewhere.iterdir()) == []
    assert len(run_ids(copy)) == len(before) + 1


def test_wandb_not_installed_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """Without the wandb package, a launch with ``metrics.enable_wandb`` and ``analyze --wandb`` are refused in one
    line saying how to install it, nothing made."""
    from dispersion_titan.job_config.parse import validated_args
    from dispersion_titan.utils.errors import ConfigError
    from support.launch import job_args
    from support.runs import tiny_run

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: its import fails, find_spec finds none
    why = "the wandb package is not installed; pip install 'dispersion_titan[wandb]'"
    with pytest.raises(ConfigError, match=f"^metrics.enable_wandb: {re.escape(why)}, or set it false$"):
        validated_args([*job_args(), "--metrics.enable_wandb"])
    run = tiny_run(tmp_path / "run")
    (run / WANDB_RUN_FILE).write_text(json.dumps({"id": "x", "project": "p", "entity": "", "dir": "tb"}))
    code, _, err = analyze(str(run), "--num-sequences", "2", "--seq-len", "16", "--wandb", capsys=capsys)
    assert_one_line_error(code, err, f"--wandb: {why}")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "run.json", WANDB_RUN_FILE]


@pytest.mark.parametrize(
    "damage",
    [b'{"id": "\xff"}', b"", b"[]", b'"x"', b"null", b'{"id": 3, "project": "p", "entity": "", "dir": "tb"}'],
    ids=["not-utf8", "empty", "list", "string", "null", "id-a-number"],
)
def test_an_unreadable_wandb_run_record_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, damage):
    """A damaged ``wandb_run.json`` (no JSON, not UTF-8, no object, fields of other types) is named in one line, exit 2,
    nothing made (were tracebacks: JSONDecodeError, UnicodeDecodeError, TypeError, KeyError, or W&B's own)."""
    from support.runs import tiny_run

    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    run = tiny_run(tmp_path / "run")
    (run / WANDB_RUN_FILE).write_bytes(damage)
    code, _, err = analyze(str(run), "--num-sequences", "2", "--seq-len", "16", "--wandb", capsys=capsys)
    assert_one_line_error(code, err, f"--wandb: {run / WANDB_RUN_FILE}: unreadable (", "; restore it: it names the W&B")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "run.json", WANDB_RUN_FILE]
