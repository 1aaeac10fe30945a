"""A run folder is a ledger (run_folder/settings.py, checkpoints.check_resume): its settings are
fixed at the first launch, no step checkpoint is saved over, a fork branches on purpose into a
new folder, and results derived from a checkpoint that changed since are not reused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dispersion_titan.job_config.parse import validated_args
from dispersion_titan.run_folder.checkpoints import (
    CheckpointError,
    check_complete,
    check_resume,
    checkpoint_identity,
    recorded_run,
)
from dispersion_titan.run_folder.owners import FolderOwner, record_run_folders, write_record
from dispersion_titan.run_folder.settings import fork_source, holds_an_initialisation, start_fork
from dispersion_titan.run_folder.writer_lock import LOCK_NAME
from dispersion_titan.utils.errors import ConfigError, RenamedCheckpointError
from support.cli import analyze, assert_one_line_error
from support.corpora import texts_jsonl
from support.launch import (
    DEBUG_SEQ_LEN,
    DEBUG_TOML,
    REFERENCE_STEPS,
    SCHEDULE,
    as_someone_else,
    python_module,
    torchrun,
)
from support.runs import scalars, tiny_run

pytestmark = pytest.mark.slow

RUN = (*SCHEDULE, "--validation.no-enable")  # conftest's reference run: 2 processes, checkpoints 0, 2, 4, 6, 8
FORK_STEP = 4
FORKED = ("--dispersion.coeff", "0", "--optimizer.lr", "2e-3")  # the fork's own settings: the reference's lr is 1e-3
ANALYSIS = ("--num-sequences", "4", "--seq-len", "32")
CHECK = ("--job.config_file", DEBUG_TOML, "--job.custom_config_module", "dispersion_titan.config", *DEBUG_SEQ_LEN)


def sha256_tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def relaunch(dump: Path, *overrides: str, via: tuple[str, ...] = ()):
    """The reference run's own command line, once more, in one process (the refusals come before any rank starts);
    ``via``: the script that runs it (``as_someone_else``)."""
    return python_module(*via, "dispersion_titan.train", "--job.config_file", DEBUG_TOML, "--job.dump_folder",
                         str(dump), "--metrics.log_freq", "1", *DEBUG_SEQ_LEN, "--training.steps",
                         str(REFERENCE_STEPS), *RUN, *overrides, timeout=300)  # fmt: skip


def one_line(proc) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    return line


@pytest.fixture(scope="module")
def fork(reference_run, tmp_path_factory) -> Path:
    """A branch of the reference run from its step 4, on 1 process, with the dispersion term
    off and twice its learning rate (other settings, on purpose), to step 5, whose final checkpoint is full."""
    before = sha256_tree(reference_run)
    dump = tmp_path_factory.mktemp("ledger") / "fork"
    torchrun(
        dump,
        1,
        "--training.steps",
        str(FORK_STEP + 1),
        *RUN,
        *FORKED,
        "--checkpoint.no-last_save_model_only",
        "--job.fork_from",
        f"{reference_run}@{FORK_STEP}",
    )
    assert sha256_tree(reference_run) == before  # the source is only read
    return dump


def test_changed_settings_are_refused_in_one_line_and_change_nothing(reference_run):
    before = sha256_tree(reference_run)
    line = one_line(
        relaunch(
            reference_run,
            "--dispersion.coeff",
            "0.5",
            "--debug.seed",
            "1",
            "--metrics.log_freq",
            "2",
            "--checkpoint.interval",
            "4",
        )
    )  # the last two are allowed
    assert line == (
        f"dispersion_titan: error: run folder {reference_run} was started with other settings: "
        "debug.seed 42 -> 1, dispersion.coeff 0.3 -> 0.5; relaunch with the same settings, or branch on "
        "purpose with --job.fork_from RUN[@STEP] into a new --job.dump_folder"
    )
    assert sha256_tree(reference_run) == before


def test_a_relaunch_from_another_folder_where_a_relative_data_path_names_other_data_is_refused(tmp_path):
    """``--training.dataset_path corpus.jsonl`` (relative) launched from A, relaunched with the same command from B,
    which has a corpus.jsonl of its own: one line naming both files and the folder to relaunch from, exit 2, nothing
    changed (was: the same string, so the run went on training on B's corpus, silently); from C, which has none, the
    same line (was `no file matches`, not where to relaunch from); from A, or a copy of A, it goes on."""
    dump = tmp_path / "run"
    for folder, seed in (("A", 1), ("B", 2)):
        (tmp_path / folder).mkdir()
        texts_jsonl(tmp_path / folder / "corpus.jsonl", 40, 200, seed)
    args = ("--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--validation.no-enable")
    args += ("--training.dataset", "local", "--training.dataset_path", "corpus.jsonl", "--checkpoint.interval", "1")
    args += ("--checkpoint.no-last-save-model-only", "--checkpoint.no-save-initial")
    first = python_module("dispersion_titan.train", *args, "--training.steps", "1", cwd=tmp_path / "A", timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    before = sha256_tree(dump)
    again = ("dispersion_titan.train", *args, "--training.steps", "2", "--check-only")
    assert one_line(python_module(*again, cwd=tmp_path / "B", timeout=300)) == (
        f"dispersion_titan: error: run folder {dump} was first launched from {tmp_path / 'A'}, where "
        f"training.dataset_path 'corpus.jsonl' names {tmp_path / 'A' / 'corpus.jsonl'}, not "
        f"{tmp_path / 'B' / 'corpus.jsonl'} as from here; relaunch from {tmp_path / 'A'}"
    )
    (tmp_path / "C").mkdir()  # no corpus.jsonl here: where to relaunch from (was `no file matches 'corpus.jsonl'`)
    assert one_line(python_module(*again, cwd=tmp_path / "C", timeout=300)) == (
        f"dispersion_titan: error: run folder {dump} was first launched from {tmp_path / 'A'}, where "
        f"training.dataset_path 'corpus.jsonl' names {tmp_path / 'A' / 'corpus.jsonl'}, nothing from here; "
        f"relaunch from {tmp_path / 'A'}"
    )
    assert sha256_tree(dump) == before
    assert python_module(*again, cwd=tmp_path / "A", timeout=300).returncode == 0
    shutil.copytree(tmp_path / "A", tmp_path / "copy_of_A")  # the same data in another folder: the same run
    relaunched = python_module(*again, cwd=tmp_path / "copy_of_A", timeout=300)
    assert relaunched.returncode == 0, relaunched.stderr[-3000:]


def test_a_run_that_saved_no_step_relaunches_with_corrected_settings(tmp_path):
    """A launch that ended before its first save (its rank killed at step 1, out of memory) left ``run.json``: a
    relaunch with corrected settings was refused as "started with other settings", with nothing to keep. It trains,
    and its settings are the run's from then on: once it saved a step, the first launch's are refused."""
    dump = tmp_path / "run"
    first = ("--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump), *DEBUG_SEQ_LEN, "--validation.no-enable")
    first += ("--checkpoint.no-save-initial",)  # the first save: step 5
    killed = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.train", *first, timeout=300)
    while not (dump / "run.json").exists() and not killed.done():
        time.sleep(0.005)
    assert not killed.done(), killed.result().stderr[-3000:]
    os.kill(json.loads((dump / LOCK_NAME).read_text())["pid"], signal.SIGKILL)
    assert killed.result().returncode != 0 and not (dump / "checkpoint").exists()
    corrected = ("--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.5", "--training.steps", "1")
    again = python_module("dispersion_titan.train", *first, *corrected, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (dump / "checkpoint" / "step-1" / ".metadata").is_file()
    assert one_line(python_module("dispersion_titan.train", *first, "--check-only", timeout=300)) == (
        f"dispersion_titan: error: run folder {dump} was started with other settings: dispersion.coeff 0.5 -> 0.0, "
        'dispersion.variant "angular_spread" -> "none"; relaunch with the same settings, or branch on purpose with '
        "--job.fork_from RUN[@STEP] into a new --job.dump_folder"
    )


def test_records_of_another_format_are_refused(reference_run, tmp_path, capsys):
    """A ``run.json`` or ``.owner.json`` of another format, or of none (written before formats were
    numbered), is refused in one line naming the file and what to do, never read as this one; so is one damaged
    (not UTF-8, its paths or settings no object of path strings)."""
    record = json.loads((reference_run / "run.json").read_text())
    old = tmp_path / "old_run"
    old.mkdir()
    (old / "checkpoint").symlink_to(reference_run / "checkpoint")
    for shape in ({k: v for k, v in record.items() if k != "format"}, {**record, "format": 0}):
        (old / "run.json").write_text(json.dumps(shape))
        code, _, err = analyze(str(old), *ANALYSIS, capsys=capsys)
        found = shape.get("format", "unnumbered")
        says = f"{old}/run.json: format {found}, and this dispersion_titan reads format 1 only; read it with the "
        assert_one_line_error(code, err, says, "dispersion_titan that wrote it, or make it anew in a new folder")
    (old / "run.json").write_bytes(json.dumps(record).encode()[:-1] + b', "x": "\xff"}')  # not UTF-8
    code, _, err = analyze(str(old), *ANALYSIS, capsys=capsys)
    assert_one_line_error(
        code, err, f"{old}/run.json: unreadable ('utf-8' codec can't decode byte 0xff", "; restore it"
    )
    for wrong in ({"paths": [1]}, {"settings": "x"}, {"paths": {"checkpoint.folder": 3}}):  # were tracebacks
        (old / "run.json").write_text(json.dumps({**record, **wrong}))
        code, _, err = analyze(str(old), *ANALYSIS, capsys=capsys)
        says = f"{old}/run.json: invalid (paths or settings: no object of path strings); restore it"
        assert_one_line_error(code, err, says)
    out = tmp_path / "old_analysis"
    out.mkdir()
    (out / ".owner.json").write_text(json.dumps({"kind": "analysis", "run": str(reference_run)}))
    code, _, err = analyze(str(reference_run), "--out", str(out), *ANALYSIS, capsys=capsys)
    assert_one_line_error(code, err, f"{out}/.owner.json: format unnumbered")
    assert [p.name for p in out.iterdir()] == [".owner.json"]  # nothing written
    # A record damaged or edited by hand: one line naming it and what to do, nothing written.
    for damaged, why in (
        ("{bad", "Expecting"),
        ('{"format": 1}', "no 'kind'"),
        ('{"format": 1, "kind": "x", "run": {}}', ""),
        ('{"format": 1, "kind": 3, "run": "x"}', "kind or run no string"),  # was 'holds the 3 of x'
        ('{"format": 1, "kind": "analysis", "run": 5}', "kind or run no string"),
    ):
        (out / ".owner.json").write_text(damaged)
        code, _, err = analyze(str(reference_run), "--out", str(out), *ANALYSIS, capsys=capsys)
        assert_one_line_error(
            code, err, f"{out}/.owner.json: unreadable ({why}", "); restore it, or remove it and rerun"
        )
        assert [p.name for p in out.iterdir()] == [".owner.json"]
    assert sorted(p.name for p in old.iterdir()) == ["checkpoint", "run.json"]


def test_resuming_would_save_over_a_step_checkpoint_is_refused(reference_run):
    """The final checkpoint holds weights only: going on to step 10 would retrain from step 6
    and save step 8 again."""
    before = sha256_tree(reference_run)
    line = one_line(relaunch(reference_run, "--training.steps", "10"))
    assert line == (
        f"dispersion_titan: error: {reference_run}/checkpoint: resuming from step 6 (step-8 holds weights "
        "only) would train over step-8 and save it again, and checkpoints are never overwritten; branch "
        f"from step 6 into a new folder with --job.fork_from {reference_run}@6 --job.dump_folder NEW"
    )
    line = one_line(relaunch(reference_run, "--training.steps", "10", "--checkpoint.load_step", "3"))
    assert line == (  # TorchTitan: a FileNotFoundError traceback once the ranks load
        f"dispersion_titan: error: checkpoint.load_step: 3: {reference_run}/checkpoint holds no complete step-3 "
        "(complete steps: 0, 2, 4, 6, 8); name one of them, or -1 for the newest"
    )
    with pytest.raises(CheckpointError, match=r"from step 4 \(checkpoint\.load_step = 4 is older than step-8\)"):
        check_resume(str(reference_run / "checkpoint"), str(reference_run), 10, 2, load_step=4)
    assert sha256_tree(reference_run) == before


def test_the_fork_a_refusal_names_runs_as_printed_from_a_folder_of_any_name(reference_run, tmp_path):
    """A run folder whose name holds a space and a quote: the ``--job.fork_from RUN@STEP`` the refusal names is
    quoted, so it runs as printed (was ``--job.fork_from /x/run one'ü@6``, two words and an open quote)."""
    dump = tmp_path / "run one'ü"
    shutil.copytree(reference_run, dump, copy_function=os.link)
    with pytest.raises(CheckpointError) as refusal:
        check_resume(str(dump / "checkpoint"), str(dump), 10, 2)
    words = shlex.split(str(refusal.value).split("with ", 1)[1])
    assert words == ["--job.fork_from", f"{dump}@6", "--job.dump_folder", "NEW"]


def test_a_run_whose_checkpoints_were_deleted_is_not_started_again(reference_run, tmp_path):
    """``run.json`` records that the run saved checkpoints: with its checkpoint folder deleted or emptied the
    same command is refused in one line (TorchTitan started again from step 0, beside the old curves)."""
    dump = tmp_path / "run"
    shutil.copytree(reference_run, dump, symlinks=True, ignore=shutil.ignore_patterns("checkpoint"))
    for says in ("missing", "holds no complete checkpoint"):
        before = sha256_tree(dump)
        assert one_line(relaunch(dump)) == (
            f"dispersion_titan: error: {dump}/checkpoint: {says}, but run {dump} saved checkpoints there "
            "(run.json); restore them, or train anew in a new --job.dump_folder"
        )
        assert sha256_tree(dump) == before
        (dump / "checkpoint").mkdir(exist_ok=True)


def test_a_run_whose_checkpoints_were_moved_and_linked_back_relaunches(reference_run, tmp_path):
    """``mv RUN/checkpoint /scratch/ckpt; ln -s /scratch/ckpt RUN/checkpoint`` (a fuller disk's way out): the same
    command goes on as before, here finished (was `checkpoint.folder: RUN/checkpoint holds files no dispersion_titan
    command recorded as its own (step-0, …)`, the run's own, and no setting to go on with: exit 2). Linked to
    another run's checkpoints, refused as before."""
    dump, scratch = tmp_path / "run", tmp_path / "scratch" / "ckpt"
    shutil.copytree(reference_run, dump, symlinks=True, copy_function=os.link)
    scratch.parent.mkdir()
    (dump / "checkpoint").rename(scratch)
    (dump / "checkpoint").symlink_to(scratch)
    before = sha256_tree(scratch)
    proc = relaunch(dump)
    assert proc.returncode == 0 and "run already finished at step 8; nothing to do" in proc.stderr, proc.stderr[-3000:]
    (dump / "checkpoint").unlink()
    (dump / "checkpoint").symlink_to(reference_run / "checkpoint")
    assert one_line(relaunch(dump)).startswith(
        f"dispersion_titan: error: checkpoint.folder: {dump}/checkpoint is run {reference_run}'s checkpoint folder; "
    )
    assert sha256_tree(scratch) == before


def test_a_copy_of_a_run_whose_checkpoints_are_linked_back_does_not_write_into_them(reference_run, tmp_path):
    """``cp -a RUN COPY`` of a run whose checkpoints were moved and linked back: the copy's link reaches the original's
    checkpoints, and relaunching it was accepted as its own (here finished: exit 0; with more steps, trained into
    them). Refused in one line saying how to go on, exit 2, nothing written."""
    dump, scratch, copy = tmp_path / "run", tmp_path / "scratch" / "ckpt", tmp_path / "copy"
    shutil.copytree(reference_run, dump, symlinks=True, copy_function=os.link, ignore=shutil.ignore_patterns(".owner*"))
    write_record(str(dump), FolderOwner("run", str(dump)))  # its own, as a run trained there records it
    scratch.parent.mkdir()
    (dump / "checkpoint").rename(scratch)
    (dump / "checkpoint").symlink_to(scratch)
    subprocess.run(["cp", "-a", str(dump), str(copy)], check=True)
    before = sha256_tree(tmp_path)
    assert one_line(relaunch(copy)) == (
        f"dispersion_titan: error: checkpoint.folder: {copy}/checkpoint links to {scratch}, the checkpoint folder of "
        f"run {dump}, which {copy} was copied from; copy the checkpoints in place of the link (rm {copy}/checkpoint; "
        f"cp -a {scratch} {copy}/checkpoint), or branch from that run on purpose with --job.fork_from {dump}[@STEP] "
        "into a new --job.dump_folder"
    )
    assert sha256_tree(tmp_path) == before


def test_a_run_whose_run_json_was_lost_is_not_resumed_with_any_settings(reference_run, tmp_path):
    """A run in its place whose ``run.json`` was deleted, relaunched with other settings: one line, nothing written
    (was resumed from its newest checkpoint with them, and they recorded as the run's from its start)."""
    dump = tmp_path / "run"
    shutil.copytree(reference_run, dump, symlinks=True, ignore=shutil.ignore_patterns("run.json", ".owner.json"))
    write_record(str(dump), FolderOwner("run", str(dump)))  # its own .owner.json, as the original's names it
    before = sha256_tree(dump)
    assert one_line(relaunch(dump, "--optimizer.lr", "0.01")) == (
        f"dispersion_titan: error: {dump}/run.json: missing, but {dump}/checkpoint holds this run's checkpoints "
        "(step-8); it records the settings they were trained with, which a relaunch keeps: restore it, or train anew "
        "in a new --job.dump_folder"
    )
    assert sha256_tree(dump) == before


def test_a_copy_whose_run_json_was_lost_says_so_not_whose_folder_it_is(reference_run, tmp_path):
    """``cp -a RUN COPY; rm COPY/run.json``: the copy's record names the original run, and the launch said
    "COPY is a folder of run RUN"; it says that ``run.json`` is missing and where it is, which restored resumes."""
    dump = tmp_path / "copy"
    shutil.copytree(reference_run, dump, symlinks=True, ignore=shutil.ignore_patterns("run.json"))
    before = sha256_tree(dump)
    assert one_line(relaunch(dump)) == (
        f"dispersion_titan: error: {dump}/run.json: missing, but {dump} is run {reference_run}'s folder, copied or "
        f"moved (its .owner.json says so); restore its run.json from there (cp {reference_run}/run.json {dump}/), or "
        "train anew in a new --job.dump_folder"
    )
    assert sha256_tree(dump) == before
    shutil.copy2(reference_run / "run.json", dump)
    finished = relaunch(dump)
    assert finished.returncode == 0 and "run already finished at step 8" in finished.stderr, finished.stderr[-3000:]


def test_a_finished_read_only_run_relaunched_is_finished_not_unwritable(reference_run, tmp_path):
    """A finished run on a read-only mount, or a colleague's (``chmod -R a-w RUN``), relaunched with the same command:
    finished, exit 0 (``--check-only``: 10), as where it is writable (was `job.dump_folder: RUN exists but is not
    writable`, exit 2); more steps, which it would write, still that line, exit 2; other settings, never run, the
    line they have where it is writable, exit 2 (was finished, exit 0); nothing written."""
    dump = tmp_path / "run"
    shutil.copytree(reference_run, dump, symlinks=True)
    before = sha256_tree(dump)
    subprocess.run(["chmod", "-R", "a-w", str(dump)], check=True)
    via = (as_someone_else(tmp_path),)
    try:
        finished, checked = relaunch(dump, via=via), relaunch(dump, "--check-only", via=via)
        more = relaunch(dump, "--training.steps", "10", via=via)
        other = relaunch(dump, "--optimizer.lr", "0.01", via=via)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(dump)], check=True)
    for proc, status in ((finished, 0), (checked, 10)):
        assert proc.returncode == status and proc.stderr.strip().splitlines() == [
            f"dispersion_titan: run already finished at step {REFERENCE_STEPS}; nothing to do"
        ], proc.stderr[-3000:]
    assert one_line(more) == (
        f"dispersion_titan: error: job.dump_folder: {dump} exists but is not writable; give a folder you can write to"
    )
    assert one_line(other).startswith(
        f"dispersion_titan: error: run folder {dump} was started with other settings: optimizer.lr 0.001 -> 0.01; "
    )
    assert sha256_tree(dump) == before


def test_a_step_folder_renamed_by_hand_is_named_in_one_line(reference_run, tmp_path):
    """``step-4`` renamed ``step-5``: TorchTitan resumed from it at step 4, a relaunch to step 5 was "finished" and
    analyses called it step 5. Its train state's step is read against the name, before anything is written."""
    dump = tmp_path / "run"
    shutil.copytree(reference_run, dump, ignore=lambda folder, names: ["checkpoint"])
    (dump / "checkpoint").mkdir()
    for name, step in (("step-0", 0), ("step-2", 2), ("step-5", 4)):  # the checkpoints themselves, not copies
        (dump / "checkpoint" / name).symlink_to(reference_run / "checkpoint" / f"step-{step}")
    says = f"{dump}/checkpoint/step-5: holds step 4 (TorchTitan's train_state.step), not step 5 as its name says; "
    before = sha256_tree(dump)
    assert one_line(relaunch(dump)) == f"dispersion_titan: error: {says}name it step-4 again"
    assert sha256_tree(dump) == before
    with pytest.raises(RenamedCheckpointError, match=re.escape(says)):
        fork_source(f"{dump}@5")


def test_a_step_link_is_told_by_where_it_leads(reference_run, tmp_path):
    """``step-N`` links (a step kept on another disk): one to another step that is there too is told to move out,
    not to be named as that step (``mv`` would move it inside that checkpoint); one whose target is gone (its disk
    not mounted) names that target (was `not a folder, …; move it away`)."""
    dump = tmp_path / "run"
    shutil.copytree(reference_run, dump, ignore=lambda folder, names: ["checkpoint"])
    (dump / "checkpoint").mkdir()
    for name, target in (("step-0", "step-0"), ("step-2", "step-2"), ("step-6", "step-2")):
        (dump / "checkpoint" / name).symlink_to(reference_run / "checkpoint" / target)
    with pytest.raises(RenamedCheckpointError) as renamed:
        check_complete(str(dump / "checkpoint" / "step-6"))
    assert str(renamed.value).endswith("as its name says; move it out of the checkpoint folder, which holds a step-2")
    (dump / "checkpoint" / "step-6").unlink()
    (dump / "checkpoint" / "step-4").symlink_to(tmp_path / "unmounted" / "step-4")
    with pytest.raises(CheckpointError) as gone:
        check_resume(str(dump / "checkpoint"), str(dump), 6, 2)
    assert str(gone.value) == (
        f"{dump}/checkpoint/step-4: a link to {tmp_path}/unmounted/step-4, which is no folder (not mounted, moved or "
        "removed?), where the run saves its step-4 checkpoint; bring that folder back, or remove the link, and relaunch"
    )


def test_fork_starts_from_the_source_checkpoint_and_records_it(fork, reference_run):
    """The fork loads the whole training state of step 4 (weights, optimizer, schedule, data
    position): its step-5 cross-entropy, computed before its own first update, is the
    reference's (1 process against 2: float summation order). That update is at the fork's own
    learning rate, twice the reference's at that step of the same schedule (was the reference's:
    the optimizer's and the schedule's states loaded held its lr)."""
    reference, branch = scalars(reference_run), scalars(fork)
    want, got = reference["loss_metrics/ce"], branch["loss_metrics/ce"]
    assert sorted(got) == [FORK_STEP + 1]
    assert got[FORK_STEP + 1] == pytest.approx(want[FORK_STEP + 1], rel=1e-4)
    assert branch["lr"][FORK_STEP + 1] == pytest.approx(2 * reference["lr"][FORK_STEP + 1], rel=1e-6)
    source = reference_run / "checkpoint" / f"step-{FORK_STEP}"
    recorded = json.loads((fork / "run.json").read_text())
    assert recorded["forked_from"] == {
        "run": str(reference_run),
        "step": FORK_STEP,
        "checkpoint": str(source),
        "identity": checkpoint_identity(str(source)),
        "model_only": False,
    }
    assert recorded["settings"]["dispersion.coeff"] == 0.0
    parent = json.loads((reference_run / "run.json").read_text())["started_from"]
    assert recorded["started_from"] == parent and parent["pretrained"] is False  # a branch of a run from scratch


def loader_position(step_dir: Path) -> int:
    """The global sequences consumed that a full checkpoint's loader state holds."""
    import torch.distributed.checkpoint as dcp

    state = {"dataloader": {"sequences_consumed": -1}}
    dcp.load(state, checkpoint_id=str(step_dir), no_dist=True)
    return state["dataloader"]["sequences_consumed"]


@pytest.mark.parametrize("other", ["seq_len", "documents"])
def test_a_fork_onto_other_data_does_not_skip_its_parents_count_of_sequences(other, reference_run, tmp_path):
    """The reference's step 4 has consumed 4 × 8 sequences of 64 tokens. A fork to sequences of 32 goes on from
    the same number of tokens (64 of its sequences), one onto another corpus from its beginning, each saying so;
    then one step of 8 (was 40 either way: the parent's count of sequences skipped of the new data)."""
    data = ("--training.seq_len", "32") if other == "seq_len" else ()
    if other == "documents":
        corpus = texts_jsonl(tmp_path / "corpus.jsonl", 40, 200)
        data = ("--training.dataset", "local", "--training.dataset_path", str(corpus))
    dump, spec, step = tmp_path / "fork", f"{reference_run}@{FORK_STEP}", FORK_STEP
    if other == "documents":  # RUN alone: its newest step
        spec, step = str(reference_run), fork_source(str(reference_run))[1]
    fork = ("--checkpoint.no-last_save_model_only", "--job.fork_from", spec)
    proc = torchrun(dump, 1, "--training.steps", str(step + 1), *RUN, *data, *fork)
    said = f"dispersion_titan: note: the fork from {reference_run}@{step} "  # RUN as the launch resolved it
    said += (
        "has training.seq_len 32, its parent 64: its data goes on from the same number of tokens: sequence 64, "
        "the parent's 32 × 64 / 32 rounded down to a whole global batch"
        if other == "seq_len"
        else "trains on other documents than its parent: its data starts from their beginning"
    )
    assert loader_position(dump / "checkpoint" / f"step-{step + 1}") == (72 if other == "seq_len" else 8)
    assert said in proc.stderr.splitlines()


def test_fork_needs_a_new_or_empty_folder(reference_run, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    line = one_line(relaunch(tmp_path, "--job.fork_from", str(reference_run)))
    assert line == (
        f"dispersion_titan: error: job.fork_from: {tmp_path} is not empty; a fork starts a new run, "
        "so give it a new or empty --job.dump_folder"
    )
    step = reference_run / "checkpoint" / f"step-{FORK_STEP}"  # the checkpoint's folder for RUN: RUN@STEP said
    with pytest.raises(ConfigError) as refused:
        fork_source(str(step))
    assert str(refused.value) == (
        f"job.fork_from: {step}: one checkpoint's folder, not a run's; give {reference_run}@{FORK_STEP}"
    )
    for spec in (f"{reference_run}@", f"@{FORK_STEP}"):  # were read as RUN, and as the working directory
        with pytest.raises(ConfigError, match=f"^job.fork_from: '{spec}': give RUN or RUN@STEP, STEP a checkpoint"):
            fork_source(spec)
    with pytest.raises(ConfigError, match=rf"^job.fork_from: {reference_run}/checkpoint/step-7: no such checkpoint "):
        fork_source(f"{reference_run}@7")
    (tmp_path / "partial" / "checkpoint" / "step-3").mkdir(parents=True)  # a save that stopped before its .metadata
    with pytest.raises(ConfigError, match=r"^job.fork_from: .*/step-3: missing \.metadata \(partial or corrupt"):
        fork_source(f"{tmp_path / 'partial'}@3")
    with pytest.raises(ConfigError, match=r"^job.fork_from: .*/checkpoint: no complete checkpoint to fork from$"):
        fork_source(str(tmp_path / "partial"))
    # Into the source's own folder, without checkpoints, or not past the fork's step: refused before anything starts.
    for dump, spec, overrides, says in (
        (reference_run, str(reference_run), (), "a run cannot be forked into its own folder; give the fork a new"),
        (tmp_path / "a", f"{reference_run}@4", ("--checkpoint.no-enable",), "needs checkpoint.enable = true (the fork"),
        (tmp_path / "b", f"{reference_run}@4", ("--training.steps", "4"), "training.steps: 4 does not go past step 4,"),
    ):
        job = validated_args([*CHECK, "--job.dump_folder", str(dump), "--job.fork_from", spec, *overrides])
        with pytest.raises(ConfigError) as refused:
            start_fork(job, recorded_run(str(dump)), 1)
        assert says in str(refused.value)
    (tmp_path / "hf model").mkdir()  # an HF export: how to start from it (was `no checkpoints (no step-N folders …)`)
    (tmp_path / "hf model" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError) as refused:
        fork_source(str(tmp_path / "hf model"))
    assert str(refused.value) == (
        f"job.fork_from: {tmp_path / 'hf model'}: a Hugging Face model's folder, not a run; start from it with "
        f"--checkpoint.initial_load_path '{tmp_path / 'hf model'}' --checkpoint.initial_load_in_hf"
    )
    named = tmp_path / "lr@1e-3"  # a run folder whose name holds '@' (was 'STEP must be a checkpoint step number')
    named.symlink_to(reference_run)
    assert fork_source(str(named))[1:] == fork_source(str(reference_run))[1:]


def test_a_fork_of_another_model_shape_is_one_line_before_any_folder(reference_run, tmp_path):
    """A fork, or a run from ``checkpoint.initial_load_path``, whose ``[model]`` keys build another shape than
    the checkpoint holds, or that loads a train state from a weights-only step: one line naming what differs, exit
    2, no folder made, the source unchanged (was TorchTitan's 70-line ``Size mismatch`` or ``Missing key``
    traceback, exit 1, after a run.json and tb/ were written)."""
    kept = sha256_tree(reference_run)
    step = reference_run / "checkpoint" / f"step-{FORK_STEP}"
    shape = "layers.0.feed_forward.w1.weight is [256, 64] there, [128, 64] here (and 11 more)"
    for key, source, dump, says in (
        ("--job.fork_from", f"{reference_run}@{FORK_STEP}", tmp_path / "fork",
         "a fork keeps its source's model (model.mlp_hidden_dim 0 there, 128 here)"),
        ("--checkpoint.initial_load_path", str(step), tmp_path / "start",
         "set the [model] keys to its shape, or give a checkpoint of this model"),
    ):  # fmt: skip
        line = one_line(relaunch(dump, key, source, "--model.mlp_hidden_dim", "128"))
        assert line == (
            f"dispersion_titan: error: {key[2:]}: {source} holds another model than this gpt2 (flavor debug): "
            f"{shape}; {says}"
        )
        assert not dump.exists()
    last = reference_run / "checkpoint" / f"step-{REFERENCE_STEPS}"  # weights only (last_save_model_only)
    line = one_line(relaunch(tmp_path / "all", "--checkpoint.initial_load_path", str(last),
                             "--checkpoint.no-initial_load_model_only"))  # fmt: skip
    assert line == (  # was TorchTitan's 76-line `Missing key in checkpoint state_dict: dataloader…`, exit 1
        "dispersion_titan: error: checkpoint.initial_load_model_only: false loads the optimizer, schedule and data "
        f"position from {last} too, and it holds weights only (a last_save_model_only step); set it true to start "
        "from its weights"
    )
    assert not (tmp_path / "all").exists() and sha256_tree(reference_run) == kept


def test_relaunch_raising_steps_goes_on_and_keeps_every_checkpoint(fork):
    """The fork relaunched without --job.fork_from (it is recorded), with more steps and another
    checkpoint interval and log frequency: it resumes from its own step 5; run.json keeps the first
    launch's settings and source, and records the new training.steps; a stale temporary file is removed."""
    kept = sha256_tree(fork / "checkpoint")
    first = json.loads((fork / "run.json").read_text())
    (fork / ".run.json.k9x.tmp").write_text("{")  # a launch killed writing run.json left it
    again = torchrun(
        fork,
        1,
        "--training.steps",
        str(FORK_STEP + 2),
        *RUN,
        *FORKED,
        "--checkpoint.no-last_save_model_only",
        "--checkpoint.interval",
        "3",
        "--metrics.log_freq",
        "2",
    )
    assert f"Training starts at step {FORK_STEP + 2}" in again.stdout + again.stderr
    assert {k: v for k, v in sha256_tree(fork / "checkpoint").items() if k in kept} == kept
    assert (fork / "checkpoint" / f"step-{FORK_STEP + 2}" / ".metadata").is_file()
    now = json.loads((fork / "run.json").read_text())
    assert (now["settings"], now["forked_from"]) == (first["settings"], first["forked_from"])
    assert (first["training_steps"], now["training_steps"]) == (FORK_STEP + 1, FORK_STEP + 2)
    assert now["saved_checkpoints"] and not (fork / ".run.json.k9x.tmp").exists()


def test_a_fork_that_died_in_its_first_save_is_not_started_from_scratch(fork, tmp_path):
    """A fork killed in its first save keeps a checkpoint folder with no complete checkpoint (the step moved to
    incomplete/); TorchTitan then skipped the fork's checkpoint and trained from a fresh initialisation, with only
    a warning (so also a fork, or a run from Hugging Face weights, whose outside checkpoint folder was recorded)."""
    dump = tmp_path / "fork"
    shutil.copytree(fork, dump, ignore=lambda folder, names: ["checkpoint"] if folder == str(fork) else [])
    record = json.loads((dump / "run.json").read_text())
    (dump / "run.json").write_text(json.dumps({k: v for k, v in record.items() if k != "saved_checkpoints"}))
    (dump / "checkpoint" / "incomplete" / "step-5.20261129-045000").mkdir(parents=True)
    before = sha256_tree(dump)
    again = python_module("dispersion_titan.train", "--job.config_file", DEBUG_TOML, "--job.dump_folder", str(dump),
                          "--metrics.log_freq", "1", *DEBUG_SEQ_LEN, "--training.steps", str(FORK_STEP + 1), *RUN,
                          *FORKED, "--checkpoint.no-last_save_model_only", timeout=300)  # fmt: skip
    assert one_line(again) == (
        f"dispersion_titan: error: {dump}/checkpoint: holds no complete checkpoint, and TorchTitan would then start "
        "from a fresh initialisation, not from checkpoint.initial_load_*; move it aside (nothing in it is loaded) "
        "and relaunch"
    )
    assert sha256_tree(dump) == before


def test_a_result_of_a_replaced_checkpoint_is_not_reused(fork, reference_run, tmp_path, capsys):
    """condensation/step-N records its checkpoint's identity: once step-N holds other weights,
    the rerun says so in one line instead of skipping it."""
    run = tmp_path / "run"
    shutil.copytree(fork, run, ignore=shutil.ignore_patterns("tb"))  # copies keep mtimes: the same identity
    step = f"step-{FORK_STEP + 1}"
    code, _, err = analyze(str(run), "--steps", str(FORK_STEP + 1), *ANALYSIS, capsys=capsys)
    assert code == 0, err
    result = run / "condensation" / step / "condensation.json"
    assert json.loads(result.read_text())["checkpoint_identity"] == checkpoint_identity(str(run / "checkpoint" / step))
    shutil.rmtree(run / "checkpoint" / step)  # replaced by other weights of the same shape
    shutil.copytree(reference_run / "checkpoint" / f"step-{FORK_STEP}", run / "checkpoint" / step)
    before = sha256_tree(run / "condensation")
    code, _, err = analyze(str(run), "--steps", str(FORK_STEP + 1), *ANALYSIS, capsys=capsys)
    assert_one_line_error(
        code,
        err,
        f"--out: {run / 'condensation'}: {step} was analyzed from another checkpoint "
        f"than {run / 'checkpoint' / step} holds now",
        "--force recomputes it",
    )
    assert sha256_tree(run / "condensation") == before


def test_a_fork_relaunched_from_its_source_moved_elsewhere_goes_on(fork, reference_run, tmp_path):
    """The source a fork recorded is recognised by its checkpoint's identity, not its path: named where
    it was copied (``cp -a`` keeps what the identity reads), the fork's relaunch passes the launch checks."""
    moved = tmp_path / "moved"
    (moved / "checkpoint").mkdir(parents=True)
    subprocess.run(["cp", "-a", str(reference_run / "run.json"), str(moved)], check=True)
    subprocess.run(
        ["cp", "-a", str(reference_run / "checkpoint" / f"step-{FORK_STEP}"), str(moved / "checkpoint")], check=True
    )
    proc = python_module("dispersion_titan.train", "--check-only", "--job.config_file", DEBUG_TOML,
                         "--job.dump_folder", str(fork), "--metrics.log_freq", "1", *DEBUG_SEQ_LEN, *RUN,
                         "--training.steps", str(FORK_STEP + 3), *FORKED,
                         "--checkpoint.no-last_save_model_only", "--job.fork_from", f"{moved}@{FORK_STEP}",
                         timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_forks_relaunch_resumes_its_own_checkpoint_without_a_warning(fork, reference_run, tmp_path):
    """The same command again, one step further: the fork goes on from its own step-5, without TorchTitan's
    ``WARNING - checkpoint.initial_load_path is provided but the checkpoint.folder exists`` (on every relaunch of a
    fork or a mid-training run: what the same command is for)."""
    copy = tmp_path / "fork"
    subprocess.run(["cp", "-a", str(fork), str(copy)], check=True)  # the module's fork stays as it is
    proc = python_module("dispersion_titan.train", "--job.config_file", DEBUG_TOML, "--job.dump_folder", str(copy),
                         "--metrics.log_freq", "1", *DEBUG_SEQ_LEN, *RUN, "--training.steps", str(FORK_STEP + 2),
                         *FORKED, "--checkpoint.no-last_save_model_only", "--job.fork_from",
                         f"{reference_run}@{FORK_STEP}", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (copy / "checkpoint" / f"step-{FORK_STEP + 2}" / ".metadata").is_file()
    assert "WARNING" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_a_file_where_a_step_is_saved_is_named_before_training(fork, reference_run, tmp_path):
    """A file named ``step-N`` in the checkpoint folder of a run (a user's notes, a copy gone wrong), relaunched by
    its own command to step N: one line naming it, exit 2, nothing changed (was: trained up to step N, then
    `file exists saving step-N …`, exit 74)."""
    copy = tmp_path / "fork"
    subprocess.run(["cp", "-a", str(fork), str(copy)], check=True)  # the module's fork stays as it is
    step = max(int(p.name.split("-")[1]) for p in (copy / "checkpoint").glob("step-*")) + 1
    (copy / "checkpoint" / f"step-{step}").write_text("notes")
    kept = sha256_tree(copy)
    proc = python_module("dispersion_titan.train", "--job.config_file", DEBUG_TOML, "--job.dump_folder", str(copy),
                         "--metrics.log_freq", "1", *DEBUG_SEQ_LEN, *RUN, "--training.steps", str(step),
                         *FORKED, "--checkpoint.no-last_save_model_only", "--job.fork_from",
                         f"{reference_run}@{FORK_STEP}", timeout=300)  # fmt: skip
    assert one_line(proc) == (
        f"dispersion_titan: error: {copy}/checkpoint/step-{step}: not a folder, where the run saves its step-{step} "
        "checkpoint; move it away and relaunch"
    )
    assert sha256_tree(copy) == kept


def test_step_0_of_a_run_from_scratch_is_an_initialisation_wherever_its_checkpoint_folder_lies(tmp_path):
    """A run started from step 0 of a run from scratch whose ``checkpoint.folder`` lies outside it records
    ``started_from`` as an initialisation, its run found as ``checkpoints.run_of`` finds it (was: the folder two
    levels up taken for the run, none there, so pretrained weights: ``evaluate table`` took it for mid-training)."""
    seed = tiny_run(tmp_path / "seed", steps=(0, 1))
    outside = tmp_path / "scratch" / "ck"
    outside.parent.mkdir()
    (seed / "checkpoint").rename(outside)
    record_run_folders(str(seed), {"checkpoint.folder": str(outside)})  # as its launch records it
    assert holds_an_initialisation(str(outside / "step-0"))
    assert not holds_an_initialisation(str(outside / "step-1"))  # trained weights
    (seed / "run.json").rename(tmp_path / "run.json")  # its run.json gone: nothing says it is an initialisation
    assert not holds_an_initialisation(str(outside / "step-0"))
