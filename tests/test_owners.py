"""Every folder has one owner (``run_folder/owners.py``). The cases of issue 41 where a command
wrote into a folder that belonged to something else, each run for real through the command's
own ``main`` (or its process) on tiny runs: refused in one line, exit 2, the victim's files
unchanged (``digests``); and a run whose checkpoints and TensorBoard files live outside its
dump folder, found and defended wherever its ``run.json`` says they are."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from dispersion_titan.analyze import main as analyze_main
from dispersion_titan.convert import main as convert_main
from dispersion_titan.data.__main__ import main as data_main
from dispersion_titan.evaluate import main as evaluate_main
from dispersion_titan.init import main as init_main
from dispersion_titan.paper import main as paper_main
from dispersion_titan.plan import main as plan_main
from dispersion_titan.quickstart import main as quickstart_main
from dispersion_titan.run_folder.owners import (
    OWNER_FILE,
    FolderOwner,
    owned,
    read_owner,
    record_run_folders,
    refuse_other_owners,
)
from dispersion_titan.run_folder.writer_lock import LOCK_NAME
from dispersion_titan.sweep import main as sweep_main
from dispersion_titan.utils.errors import OutputError
from dispersion_titan.utils.records import atomic_write
from support.cli import analyze, assert_one_line_error, run_cli
from support.eval_tasks import LM_EVAL_TASKS
from support.launch import DEBUG_TOML, python_module, torchrun
from support.runs import digests, tiny_run

OPTS = ["--num-sequences", "2", "--seq-len", "16", "--batch-size", "2"]
EVAL_OPTS = ["--include-path", str(LM_EVAL_TASKS), "--tasks", "wiki_next_word", "--limit", "2", "--device", "cpu"]
CHECK = ["--job.config_file", DEBUG_TOML, "--training.seq_len", "64", "--validation.no-enable", "--check-only"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two runs without training, A (steps 0 and 2) analyzed into its default ``condensation/``, and B."""
    base = tmp_path_factory.mktemp("owners")
    tiny_run(base / "A", steps=(0, 2))
    tiny_run(base / "B")
    with pytest.raises(SystemExit) as done:
        analyze_main([str(base / "A"), *OPTS])
    assert done.value.code == 0
    return base


def refused(code: int, err: str, base: Path, before: dict[str, str], *says: str) -> None:
    assert_one_line_error(code, err, *says)
    assert digests(base) == before


@pytest.mark.parametrize(
    "command, target, out, says",
    [
        ("analyze", "A", "A", "--out: {A} is the folder of run {A}; use another --out"),  # the natural slip
        ("analyze", "B", "A", "--out: {A} is the folder of run {A}; use another --out"),
        (
            "analyze",
            "B",
            "A/condensation",
            "--out: {A}/condensation is inside run {A}, which holds only its own results",
        ),
        ("analyze", "A", "A/checkpoint/mine", "is inside run {A}'s checkpoint folder"),
        ("analyze", "A", "A/step-9", "would make run {A}'s root look like a checkpoint folder (step-9)"),
        ("evaluate", "A", "A/condensation", "--out: {A}/condensation holds the analysis of {A}; use another --out"),
        (
            "evaluate",
            "A",
            "A/condensation/mine",
            "--out: {A}/condensation/mine is inside {A}/condensation, the analysis of {A}; use another --out",
        ),
        (
            "convert",
            "A",
            "A/checkpoint/step-99",
            "OUT_DIR: {A}/checkpoint/step-99 is inside run {A}'s checkpoint folder",
        ),
        ("convert", "A", "A/condensation", "OUT_DIR: {A}/condensation holds the analysis of {A}; use another OUT_DIR"),
        ("analyze --tb-dir", "B", "A/tb/condensation", "--tb-dir: {A}/tb/condensation is inside run {A}'s TensorBoard"),
        (
            "analyze --tb-dir",
            "B",
            "A/checkpoint/step-2",
            "--tb-dir: {A}/checkpoint/step-2 is inside run {A}'s checkpoint",
        ),
        (
            "analyze --tb-dir",
            "B",
            "A/condensation",
            "--tb-dir: {A}/condensation is inside run {A}, which holds only its own results; use another --tb-dir",
        ),
        ("data prepare", "", "A", "--out: {A} is the folder of run {A}; use another --out"),
        ("data prepare", "", "A/checkpoint/step-2", "--out: {A}/checkpoint/step-2 is inside run {A}'s checkpoint"),
    ],
    ids=[
        "run-root",
        "another-run",
        "inside-another-run",
        "checkpoint-folder",
        "fake-step",
        "another-kind",
        "inside-another-kind",
        "convert-into-checkpoints",
        "convert-into-results",
        "histograms-beside-another-runs",
        "histograms-into-checkpoints",
        "histograms-into-another-runs-results",
        "token-store-into-a-run",
        "token-store-into-a-checkpoint",
    ],
)
def test_a_command_never_writes_into_a_folder_of_another_owner(runs, capsys, command, target, out, says):
    """Each refused in one line naming the owner, exit 2, nothing under the runs changed."""
    before = digests(runs)
    argv = {
        "analyze": [runs / target, "--out", runs / out, *OPTS],
        "evaluate": [runs / target, "--out", runs / out, *EVAL_OPTS],
        "convert": ["to-hf", runs / target, runs / out],
        "analyze --tb-dir": [runs / target, "--out", runs / target / "mine", "--tb-dir", runs / out, *OPTS],
        "data prepare": ["prepare", "enwiki_sample", "--out", runs / out],
    }[command]
    main = {"evaluate": evaluate_main, "convert": convert_main, "data prepare": data_main}.get(command, analyze_main)
    code, _, err = run_cli(main, *argv, capsys=capsys)
    refused(code, err, runs, before, says.format(A=runs / "A"))


def test_a_copied_run_analyzes_into_its_own_folder(runs, capsys, tmp_path):
    """``cp -a A COPY``: the copy's analysis, recorded relative to its run, is the copy's own; a second
    analysis with other settings gets its own TensorBoard folder, and one given the first's is refused."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(runs / "A"), str(copy)], check=True)
    code, stdout, err = analyze(copy, *OPTS, capsys=capsys)
    assert code == 0 and "2 checkpoint(s) already analyzed" in stdout, err
    code, stdout, err = analyze(copy, *OPTS, "--force", "--steps", "0", capsys=capsys)
    assert code == 0 and f"TensorBoard histograms: {copy}/tb/condensation)" in stdout, err
    histograms = digests(copy / "tb" / "condensation")
    code, stdout, err = analyze(
        copy, *OPTS, "--num-sequences", "3", "--steps", "0", "--out", copy / "k3", capsys=capsys
    )
    (own,) = [p for p in (copy / "tb").iterdir() if p.name.startswith("condensation-")]
    assert code == 0 and f"TensorBoard histograms: {own})" in stdout, err
    assert list(own.glob("events.out.tfevents.*")) and digests(copy / "tb" / "condensation") == histograms
    before = digests(tmp_path)
    code, _, err = analyze(
        copy,
        *OPTS,
        "--out",
        copy / "k3",
        "--num-sequences",
        "3",
        "--tb-dir",
        copy / "tb" / "condensation",
        capsys=capsys,
    )
    refused(
        code,
        err,
        tmp_path,
        before,
        f"--tb-dir: {copy}/tb/condensation holds the histograms of an analysis with other settings; use another",
    )


OUTPUT_OPTIONS = pytest.mark.parametrize(
    "main, argv, option",
    [
        (analyze_main, ["A", "--out", "OUT", *OPTS], "--out"),
        (analyze_main, ["A", "--tb-dir", "OUT", *OPTS], "--tb-dir"),
        (analyze_main, ["compare", "A", "--out", "OUT"], "--out"),
        (evaluate_main, ["A", "--out", "OUT", *EVAL_OPTS], "--out"),
        (convert_main, ["to-hf", "A", "OUT"], "OUT_DIR"),
        (paper_main, ["fig2", "--out", "OUT", "--dry-run"], "--out"),
        (init_main, ["OUT"], "DIR"),
    ],
    ids=["analyze", "analyze-tb-dir", "compare", "evaluate", "convert", "paper", "init"],
)


def output_folder_cli(main, argv, runs, out, capsys):
    return run_cli(main, *({"A": runs / "A", "OUT": out}.get(a, a) for a in argv), capsys=capsys)


@OUTPUT_OPTIONS
def test_a_quoted_tilde_in_an_output_folder_is_refused_naming_the_expanded_path(
    runs, capsys, tmp_path, monkeypatch, main, argv, option
):
    """``--out '~/x'``: the shell leaves a quoted ~, and a folder named ~ was made in the working directory
    (as ``job.dump_folder``'s, ``test_config_errors.py``)."""
    monkeypatch.chdir(tmp_path)
    before = digests(runs)
    code, _, err = output_folder_cli(main, argv, runs, "~/x", capsys)
    refused(code, err, runs, before, f"argument {option}: ~/x starts with ~", f"made in {tmp_path}); write it as ")
    assert os.path.expanduser("~/x") in err and os.listdir(tmp_path) == []


@OUTPUT_OPTIONS
def test_a_control_character_in_an_output_folder_is_refused_naming_it(
    runs, capsys, tmp_path, monkeypatch, main, argv, option
):
    """A newline pasted into ``--out``: a folder named with it was made, shown by ``ls`` as two names or ``?``
    (``job.dump_folder``'s alike, ``test_config_errors.py``)."""
    monkeypatch.chdir(tmp_path)
    before = digests(runs)
    code, _, err = output_folder_cli(main, argv, runs, "x\ny", capsys)
    says = f"argument {option}: 'x\\ny' holds the control character '\\n'; give a folder name without it"
    refused(code, err, runs, before, says)
    assert os.listdir(tmp_path) == []


@OUTPUT_OPTIONS
def test_an_output_folder_through_a_link_loop_is_refused_naming_it(
    runs, capsys, tmp_path, monkeypatch, main, argv, option
):
    """``ln -s a b; ln -s b a``, ``--out a/x``: each open of it fails (ELOOP); was a traceback (``analyze``,
    ``evaluate``) or ``a/.owner.json: unreadable …; restore it, or remove it`` of a record there is none of."""
    monkeypatch.chdir(tmp_path)
    Path("a").symlink_to("b")
    Path("b").symlink_to("a")
    before = digests(runs)
    code, _, err = output_folder_cli(main, argv, runs, "a/x", capsys)
    refused(code, err, runs, before, f"argument {option}: a/x goes through a symbolic link that loops (")
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


EMPTY = "empty; name "  # the line of an empty path or name, after the argument it names
RUN_EMPTY = f"argument RUN: {EMPTY}a run folder"


@pytest.mark.parametrize(
    "main, argv, says",
    [
        (analyze_main, ["compare", "A", "--out", ""], "--out: empty; name a folder"),
        (analyze_main, ["family", "A", "B", "--out", ""], "--out: empty; name a folder"),
        (evaluate_main, ["table", "A", "--out", ""], "--out: empty; name a folder"),
        (
            quickstart_main,
            ["--out", ""],
            "argument --out: empty; name a folder, or leave the option out for its default",
        ),
        (analyze_main, [""], RUN_EMPTY),
        (evaluate_main, [""], RUN_EMPTY),
        (convert_main, ["to-hf", "", "hf"], f"argument CHECKPOINT_OR_RUN: {EMPTY}"),
        (analyze_main, ["compare", "", "--out", "cmp"], RUN_EMPTY),
        (analyze_main, ["family", "", "--out", "fam"], f"argument SPEC: {EMPTY}"),
        (analyze_main, ["A", "--texts", "", *OPTS], f"argument --texts: {EMPTY}"),
        (analyze_main, ["A", "--dataset", "", *OPTS], f"argument --dataset: {EMPTY}"),
        (analyze_main, ["A", "--dataset-path", "", *OPTS], f"argument --dataset-path/--dataset_path: {EMPTY}"),
        (analyze_main, ["A", "--out", "", *OPTS], f"argument --out: {EMPTY}a folder, or leave the option out"),
        (analyze_main, ["A", "--tb-dir", "", *OPTS], f"argument --tb-dir: {EMPTY}a folder"),
        (evaluate_main, ["A", "--out", "", *EVAL_OPTS], f"argument --out: {EMPTY}a folder"),
        (evaluate_main, ["A", *EVAL_OPTS, "--include-path", ""], f"argument --include-path/--include_path: {EMPTY}"),
        (paper_main, ["fig2", "--texts", "", "--dry-run"], f"argument --texts: {EMPTY}"),
        (paper_main, ["table2", "--include-path", "", "--dry-run"], f"argument --include-path: {EMPTY}"),
        (paper_main, ["fig2", "--models", "gpt2", "", "--dry-run"], f"argument --models: {EMPTY}a hub id, a model"),
        (paper_main, ["robustness", "--corpus", "", "--dry-run"], f"argument --corpus: {EMPTY}a corpus as NAME="),
        (data_main, ["prepare", "enwiki_sample", "--out", "s", "--tokenizer", ""], f"argument --tokenizer: {EMPTY}"),
        (data_main, ["prepare", "enwiki_sample", "--out", "s", "--dataset-path", ""], f"--dataset_path: {EMPTY}"),
        (plan_main, [""], f"CONFIG: {EMPTY}a TOML file"),
        (sweep_main, ["", "--dry-run"], f"SWEEP.toml: {EMPTY}a TOML file"),
        (quickstart_main, ["--config", "", "--out", "q"], f"argument --config: {EMPTY}a training TOML"),
    ],
    ids=[
        "compare",
        "family",
        "table",
        "quickstart",
        *("analyze-RUN", "evaluate-RUN", "convert-RUN", "compare-RUN", "family-SPEC"),
        *("analyze-texts", "analyze-dataset", "analyze-dataset-path", "analyze-out", "analyze-tb-dir"),
        *("evaluate-out", "evaluate-include-path", "paper-texts", "paper-include-path"),
        *("paper-models", "paper-corpus"),
        *("prepare-tokenizer", "prepare-dataset-path", "plan-CONFIG", "sweep-SPEC", "quickstart-config"),
    ],
)
def test_an_empty_path_is_refused_naming_it_not_read_as_another(runs, capsys, tmp_path, monkeypatch, main, argv, says):
    """``"$OUT"``, ``"$TEXTS"``, ``"$RUN"`` with the variable unset: one line naming the argument, exit 2, the working
    folder untouched (were: `--out` a `FileNotFoundError` traceback after a `.owner.json` written there, which then
    refused other commands' output as `holds a comparison folder`; the quickstart's jobs in the working folder itself;
    analyze's and evaluate's `--out` their default folder, `--texts` and `--dataset-path` the default corpus, exit 0;
    an empty RUN `: no such folder`, naming nothing)."""
    monkeypatch.chdir(tmp_path)
    before = digests(runs)
    code, _, err = run_cli(main, *({"A": runs / "A", "B": runs / "B"}.get(a, a) for a in argv), capsys=capsys)
    refused(code, err, runs, before, says)
    assert os.listdir(tmp_path) == []


def test_a_folder_of_files_nobody_recorded_is_refused(runs, capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    before = digests(tmp_path)
    code, _, err = analyze(runs / "A", "--out", tmp_path, *OPTS, capsys=capsys)
    refused(
        code,
        err,
        tmp_path,
        before,
        f"--out: {tmp_path} holds files no dispersion_titan command recorded as its own (notes.txt); use another --out",
    )


def test_a_failed_command_removes_only_the_folder_it_made_and_left_empty(tmp_path):
    """``owned``: a folder this call made and wrote nothing in but its record goes with a failure (a full disk:
    ``test_hf_interop.py::test_convert_out_of_room_...``); one that was there, or holds a result, stays."""
    there, kept = tmp_path / "there", tmp_path / "kept"
    there.mkdir()
    for folder, result in ((tmp_path / "new", False), (there, False), (kept, True)):
        with pytest.raises(OSError), owned(str(folder), FolderOwner("comparison")):
            if result:
                (folder / "table.csv").write_text("a\n")
            raise OSError("the command fails")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "there"]
    assert os.listdir(there) == [] and sorted(os.listdir(kept)) == [OWNER_FILE, "table.csv"]


def test_what_a_killed_write_left_in_a_revisions_result_folder_goes_with_the_next_holder(tmp_path):
    """``analyze hf:MODEL --out OUT`` killed mid-write leaves ``atomic_write``'s temporary file in its
    ``rev-NAME`` result folder, as in a checkpoint's ``step-N``: the next command holding OUT removes both
    (was: the one in ``rev-NAME`` left there for good)."""
    out = tmp_path / "out"
    with owned(str(out), FolderOwner("analysis", "some/model")):
        for folder in ("step-0", "rev-main"):
            (out / folder).mkdir()
            (out / folder / "condensation.json").write_text("{}")
            (out / folder / ".condensation.json.k9.tmp").write_text('{"st')  # what kill -9 leaves
    with owned(str(out), FolderOwner("analysis", "some/model")):
        assert sorted(p.name for p in out.rglob("*.tmp")) == []
    assert (out / "rev-main" / "condensation.json").exists()


def test_an_out_linked_to_a_folder_not_made_yet_is_made_there(tmp_path):
    """``--out`` a link to a folder on scratch space not made yet: made there (was: 'not writable (File exists)')."""
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "scratch" / "out")
    with owned(str(link), FolderOwner("comparison")):
        (link / "table.csv").write_text("a\n")
    assert sorted(os.listdir(tmp_path / "scratch" / "out")) == [OWNER_FILE, "table.csv"]


def test_a_new_run_folder_holding_a_link_to_its_checkpoint_folder_is_its_own(runs, tmp_path):
    """``ln -s /scratch/me/ckpt RUN/checkpoint`` before the first launch: the run's, not `job.dump_folder: RUN holds
    files no dispersion_titan command recorded as its own (checkpoint)`; a link to another run's checkpoints or a
    link the run does not write through is refused as before (a launch trains through it: checked by hand)."""
    dump, scratch = tmp_path / "run", tmp_path / "scratch"
    dump.mkdir()
    scratch.mkdir()
    (dump / "checkpoint").symlink_to(scratch)
    folders = {"checkpoint.folder": str(dump / "checkpoint"), "metrics.save_tb_folder": str(dump / "tb")}
    refuse_other_owners(str(dump), folders)
    (dump / "checkpoint").unlink()
    (dump / "checkpoint").symlink_to(runs / "A" / "checkpoint")
    with pytest.raises(OutputError, match=f"checkpoint.folder: {dump}/checkpoint is run {runs / 'A'}'s checkpoint "):
        refuse_other_owners(str(dump), folders)
    (dump / "checkpoint").unlink()
    (dump / "notes").symlink_to(scratch)
    with pytest.raises(OutputError, match=r"recorded as its own \(notes\); give this run its own --job.dump_folder"):
        refuse_other_owners(str(dump), folders)


def test_a_rank_checking_the_run_folder_while_rank_0_records_it_never_reads_half_a_record(tmp_path, monkeypatch):
    """A 2-rank job: rank 0 records the run as its folder's owner while the slower rank 1 still makes the
    launch checks. Rank 1's look in the middle of the write (here: as the record is dumped) finds no record yet
    and nothing foreign, not an empty ``.owner.json`` ("unreadable", exit 2: a Slurm sweep's training job)."""
    dump = str(tmp_path / "run")
    dump_json = json.dump

    def dump_while_rank_1_checks(record: dict, f, **kwargs) -> None:
        refuse_other_owners(dump, {})
        dump_json(record, f, **kwargs)

    monkeypatch.setattr(json, "dump", dump_while_rank_1_checks)
    record_run_folders(dump, {})
    assert read_owner(dump) == FolderOwner("run", dump) and os.listdir(dump) == [OWNER_FILE]


def test_an_hf_export_belongs_to_its_run(runs, capsys, tmp_path):
    """``convert to-hf`` records its folder: a rerun of the same run needs --force, another run's
    export and another command are refused even with it. A run moved away from its export (``mv RUN RUN2``) is the
    same run, by the identity its ``run.json`` and the record keep (was refused as another's: "holds the HF export
    of RUN"); another run in its old place is not."""
    out = tmp_path / "hf"
    convert_main(["to-hf", str(runs / "A"), str(out)])
    capsys.readouterr()
    assert json.loads((out / OWNER_FILE).read_text())["kind"] == "HF export"
    before = digests(tmp_path)
    code, _, err = run_cli(convert_main, "to-hf", runs / "B", out, "--force", capsys=capsys)
    refused(code, err, tmp_path, before, f"OUT_DIR: {out} holds the HF export of {runs / 'A'}; use another OUT_DIR")
    code, _, err = analyze(runs / "A", "--out", out, *OPTS, capsys=capsys)
    refused(code, err, tmp_path, before, f"--out: {out} holds the HF export of {runs / 'A'}")
    convert_main(["to-hf", str(runs / "A"), str(out), "--force"])
    assert (out / "model.safetensors").exists()
    run, out = tiny_run(tmp_path / "run"), tmp_path / "hf2"
    convert_main(["to-hf", str(run), str(out)])
    run.rename(tmp_path / "moved")
    convert_main(["to-hf", str(tmp_path / "moved"), str(out), "--force"])
    tiny_run(run)  # another run where it was
    capsys.readouterr()
    code, _, err = run_cli(convert_main, "to-hf", tmp_path / "moved", out, "--force", capsys=capsys)
    assert_one_line_error(code, err, f"OUT_DIR: {out} holds the HF export of {run}; use another OUT_DIR")


def test_a_second_run_on_another_runs_checkpoints_is_refused(runs, tmp_path):
    """Another dump folder, another seed and λ, given A's checkpoint folder: refused at launch in one
    line that names A and the fork to branch from it on purpose; nothing of A changes."""
    before = digests(runs)
    proc = python_module(
        "dispersion_titan.train",
        *CHECK,
        "--job.dump_folder",
        str(tmp_path / "second"),
        "--checkpoint.folder",
        str(runs / "A" / "checkpoint"),
        "--debug.seed",
        "7",
        "--dispersion.variant",
        "angular_spread",
        "--dispersion.coeff",
        "0.5",
        timeout=120,
    )
    refused(
        proc.returncode,
        proc.stderr,
        runs,
        before,
        f"checkpoint.folder: {runs / 'A' / 'checkpoint'} is run {runs / 'A'}'s checkpoint folder; give this run "
        "a checkpoint.folder of its own",
        f"--job.fork_from {runs / 'A'}[@STEP]",
    )
    assert not (tmp_path / "second").exists()
    for dump in (runs / "A" / "condensation", runs / "A" / "checkpoint"):
        proc = python_module("dispersion_titan.train", *CHECK, "--job.dump_folder", str(dump), timeout=120)
        refused(proc.returncode, proc.stderr, runs, before, f"job.dump_folder: {dump} ")


RUN = "a user's run"  # a name that needs quoting in the commands the refusals print


@pytest.fixture(scope="module")
def scattered(tmp_path_factory) -> Path:
    """A real 1-process run whose checkpoint folder (``../ckpt``) and TensorBoard folder (an
    absolute path) lie outside its dump folder."""
    base = tmp_path_factory.mktemp("scattered")
    torchrun(
        base / RUN,
        1,
        "--training.steps",
        "2",
        "--checkpoint.interval",
        "2",
        "--validation.no-enable",
        "--checkpoint.no-last_save_model_only",
        "--checkpoint.folder",
        "../ckpt",
        "--metrics.save_tb_folder",
        str(base / "tb"),
    )
    return base


def test_run_paths_outside_the_dump_folder_are_recorded_and_found(scattered, capsys):
    run, ckpt, tb = (Path(os.path.realpath(scattered / name)) for name in (RUN, "ckpt", "tb"))
    assert sorted(p.name for p in ckpt.iterdir() if p.name != OWNER_FILE) == ["step-0", "step-2"]
    assert not (run / "comm_traces").exists()  # the flight recorder dumps NCCL's collectives, not gloo's
    assert json.loads((run / "run.json").read_text())["paths"] == {  # relative: the run moves with them
        "checkpoint.folder": "../ckpt",
        "metrics.save_tb_folder": "../tb",
    }
    for folder in (run, ckpt, tb):
        assert json.loads((folder / OWNER_FILE).read_text())["run_relative"] == os.path.relpath(run, folder)
    code, stdout, _ = analyze(run, *OPTS, capsys=capsys)
    assert code == 0 and (run / "condensation" / "step-2" / "condensation.json").exists(), stdout
    assert list((tb / "condensation").glob("events.out.tfevents.*"))  # beside the run's training curves
    code, _, err = run_cli(evaluate_main, run, "--steps", "7", *EVAL_OPTS, capsys=capsys)
    assert_one_line_error(code, err, "--steps: no checkpoint for step 7 (have [0, 2])")
    convert_main(["to-hf", str(run), str(scattered / "hf")])
    assert f"converting step 2: {ckpt}/step-2" in capsys.readouterr().err


def test_another_run_or_command_on_a_runs_outside_folders_is_refused(scattered, capsys, tmp_path):
    """Refused in one line naming the run that owns them; the fork the refusal names is a real
    run, and branching from it passes the launch checks."""
    run, ckpt = (Path(os.path.realpath(scattered / name)) for name in (RUN, "ckpt"))
    before = digests(scattered)
    proc = python_module(
        "dispersion_titan.train",
        *CHECK,
        "--job.dump_folder",
        str(tmp_path / "second"),
        "--checkpoint.folder",
        str(ckpt),
        timeout=120,
    )
    refused(
        proc.returncode,
        proc.stderr,
        scattered,
        before,
        f"checkpoint.folder: {ckpt} is a folder of run {run}",
        "--job.fork_from ",
    )
    printed = shlex.split(proc.stderr.split("--job.fork_from ")[1].split("[@STEP]")[0])
    assert printed == [str(run)]  # runs as printed, whatever the name holds
    proc = python_module(
        "dispersion_titan.train",
        *CHECK,
        "--job.dump_folder",
        str(tmp_path / "second"),
        "--metrics.save_tb_folder",
        str(scattered / "tb" / "mine"),
        timeout=120,
    )
    refused(proc.returncode, proc.stderr, scattered, before, f"is inside {scattered / 'tb'}, a folder of run {run}")
    code, _, err = analyze(run, "--out", ckpt / "mine", *OPTS, capsys=capsys)
    refused(code, err, scattered, before, f"--out: {ckpt / 'mine'} is inside {ckpt}, a folder of run {run}")
    fork = ("--job.dump_folder", str(tmp_path / "fork"), "--job.fork_from", *printed, "--training.steps", "3")
    tb = os.path.realpath(scattered / "tb")
    proc = python_module("dispersion_titan.train", *CHECK, *fork, "--metrics.save_tb_folder", tb, timeout=120)
    refused(  # was: "…, or branch from that run on purpose with --job.fork_from RUN[@STEP]", which it did
        proc.returncode,
        proc.stderr,
        scattered,
        before,
        f"metrics.save_tb_folder: {tb} is a folder of run {run}; give this run a metrics.save_tb_folder of its own "
        "(inside its --job.dump_folder, or a new folder)",
    )
    assert "fork_from" not in proc.stderr
    fork = python_module("dispersion_titan.train", *CHECK, *fork, timeout=120)
    assert fork.returncode == 0, fork.stderr[-2000:]
    assert digests(scattered) == before and not (tmp_path / "fork").exists()


def test_a_copied_or_moved_run_works_as_the_original(scattered, capsys, tmp_path):
    """Runs are folders that can be copied and moved (issue 49). ``cp -a`` of the run with its outside
    folders analyzes, evaluates, relaunches and forks as the original would, the original unchanged;
    ``mv`` to another parent folder, it relaunches and trains on, in the folders that moved with it."""
    before = digests(scattered)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(scattered), str(copy)], check=True)
    run = copy / RUN
    code, _, err = analyze(run, *OPTS, "--steps", "2", capsys=capsys)
    assert code == 0 and (copy / "tb" / "condensation").is_dir(), err
    code, _, err = run_cli(evaluate_main, run, "--steps", "2", *EVAL_OPTS, capsys=capsys)
    assert code == 0 and (run / "evaluation" / "step-2" / "results.json").is_file(), err
    same = ("--checkpoint.folder", "../ckpt", "--checkpoint.no-last_save_model_only", "--training.steps", "3")
    for dump, how in ((run, ()), (tmp_path / "fork", ("--job.fork_from", str(run)))):
        proc = python_module("dispersion_titan.train", *CHECK, "--job.dump_folder", str(dump), *same, *how, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert digests(scattered) == before
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    subprocess.run(["mv", str(copy), str(moved)], check=True)
    torchrun(
        moved / RUN,
        1,
        *same,
        "--checkpoint.interval",
        "2",
        "--validation.no-enable",
        "--metrics.save_tb_folder",
        str(moved / "tb"),
    )
    assert (moved / "ckpt" / "step-3" / ".metadata").is_file() and not copy.exists()


@pytest.mark.parametrize("replaced", [False, True])
def test_an_out_link_removed_or_replaced_while_held_is_not_made_anew(tmp_path, replaced):
    """``--out`` a link to a folder, the link removed (``rm OUT``) or replaced by a folder while the command writes:
    an OSError naming ``OUT/.writer.lock``, as for a folder removed, nothing written there (was: ``OUT`` made anew,
    or the new folder written, without its record: the held folder was only known by its real path)."""
    link, target = tmp_path / "out", tmp_path / "scratch"
    target.mkdir()
    link.symlink_to(target)
    with owned(str(link), FolderOwner("comparison")):
        link.unlink()
        if replaced:
            link.mkdir()
        with pytest.raises(FileNotFoundError) as gone:
            atomic_write(str(link / "table.csv"), lambda f: f.write("a\n"))
    assert gone.value.filename == str(link / LOCK_NAME)
    assert not link.exists() or os.listdir(link) == []


def test_a_copy_sharing_the_original_run_s_linked_checkpoint_folder_is_refused(tmp_path):
    """``mv RUN/checkpoint /scratch/ckpt; ln -s /scratch/ckpt RUN/checkpoint``, then ``cp -a RUN COPY``: the copy's
    link reaches the original's checkpoints, which no record names (moved after they were saved), and relaunching
    the copy would write into them. Refused in one line saying how to go on; the original goes on; nothing
    written (was: accepted, as the copy's own)."""
    run, scratch, copy = tmp_path / "run", tmp_path / "scratch" / "ckpt", tmp_path / "copy"
    tiny_run(run)
    record_run_folders(str(run), {})
    scratch.parent.mkdir()
    (run / "checkpoint").rename(scratch)
    (run / "checkpoint").symlink_to(scratch)
    subprocess.run(["cp", "-a", str(run), str(copy)], check=True)
    before = digests(tmp_path)
    refuse_other_owners(str(run), {"checkpoint.folder": str(run / "checkpoint")})
    with pytest.raises(OutputError) as refusal:
        refuse_other_owners(str(copy), {"checkpoint.folder": str(copy / "checkpoint")})
    assert str(refusal.value) == (
        f"checkpoint.folder: {copy}/checkpoint links to {scratch}, the checkpoint folder of run {run}, which {copy} "
        f"was copied from; copy the checkpoints in place of the link (rm {copy}/checkpoint; cp -a {scratch} "
        f"{copy}/checkpoint), or branch from that run on purpose with --job.fork_from {run}[@STEP] into a new "
        "--job.dump_folder"
    )
    assert digests(tmp_path) == before
    (copy / "checkpoint").unlink()
    subprocess.run(["cp", "-a", str(scratch), str(copy / "checkpoint")], check=True)
    refuse_other_owners(str(copy), {"checkpoint.folder": str(copy / "checkpoint")})
