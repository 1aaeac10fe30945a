"""Downstream evaluation with lm-eval, offline: real lm-eval runs of a real (tiny) training
run's checkpoints on the local tasks of ``tests/lm_eval_tasks`` (nothing is downloaded),
checked against lm-eval's own HFLM on the ``convert to-hf`` export; re-runs, broken
checkpoints and bad input; and the Table 2 statistics on fabricated per-step results
against scipy."""

from __future__ import annotations

import collections
import csv
import io
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dispersion_titan.analyze import REWRITTEN
from dispersion_titan.evaluate import main as evaluate_main
from dispersion_titan.evaluation.protocol import PAPER_TASKS, run_protocol, select_tasks
from dispersion_titan.evaluation.runner import lm_eval_seeds, quiet_lm_eval
from dispersion_titan.evaluation.table import min_ranks
from dispersion_titan.models.qwen3_dispersion import Qwen3Args
from dispersion_titan.run_folder.owners import OWNER_FILE
from dispersion_titan.run_folder.writer_lock import LOCK_NAME
from dispersion_titan.utils.errors import EvaluationError
from support.cli import assert_one_line_error, file_size_limit, run_cli
from support.eval_tasks import LM_EVAL_TASKS as TASKS
from support.eval_tasks import seeded_copies, write_evaluation
from support.launch import (
    DEBUG_TOML,
    held_by_another_command,
    out_gone_while_reading,
    paused_reading,
    python_module,
    read_only_from_reading,
    second_writer_is_refused,
)
from support.runs import digests, scale_weights, tiny_hub_model, tiny_run

LOCAL_TASKS = "wiki_next_word,wiki_text"
LIMIT = 12
OPTS = ["--tasks", LOCAL_TASKS, "--limit", str(LIMIT), "--num-fewshot", "1", "--batch-size", "8", "--device", "cpu"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def evaluate(*args, capsys) -> tuple[int, str, str]:
    return run_cli(evaluate_main, *args, capsys=capsys)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def tree(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` with its modification time: 'nothing changed' checks."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- fixtures


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A real 1-process debug training run with checkpoints at steps 0 and 2."""
    dump = tmp_path_factory.mktemp("evaluate") / "baseline"
    proc = python_module(
        "dispersion_titan.train",
        "--job.config_file",
        DEBUG_TOML,
        "--job.dump_folder",
        str(dump),
        "--training.steps",
        "2",
        "--checkpoint.interval",
        "2",
        "--validation.no-enable",
        env=OFFLINE,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(dump / "checkpoint")) == ["step-0", "step-2"]
    return dump


@pytest.fixture(scope="module")
def evaluated(run, tmp_path_factory) -> Path:
    """``run`` evaluated once by the CLI, from another working directory than the tasks'
    (their data files are found beside them); the tests below read or re-run it."""
    elsewhere = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("elsewhere"))
    try:
        with pytest.raises(SystemExit) as exit_info:
            evaluate_main([str(run), "--include-path", os.path.relpath(TASKS), *OPTS])
    finally:
        os.chdir(elsewhere)
    assert exit_info.value.code == 0
    return run / "evaluation"


# ---------------------------------------------------------------- evaluate


FEW_SHOT = ["arc_easy", "arc_challenge", "medmcqa", "mmlu"]  # the authors' fewshot_tasks; the rest run 0-shot


def test_lm_evals_git_lookup_is_quiet_outside_a_checkout(tmp_path, monkeypatch, capfd):
    """lm-eval's ``git describe`` prints "fatal: not a git repository" on every evaluation outside a checkout
    (when lm-eval stops doing so, the first assertion fails and ``quiet_lm_eval``'s ``git_hash`` can go)."""
    from lm_eval import evaluator

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    evaluator.get_git_commit_hash()
    assert "not a git repository" in capfd.readouterr().err
    with quiet_lm_eval():
        assert evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""


def test_an_offline_task_loads_without_lm_evals_metadata_advice(caplog):
    """Our tasks' ``custom_dataset`` made lm-eval warn, at each load, of its CLI's ``--metadata`` (2 lines)."""
    from dispersion_titan.evaluation.runner import Tasks

    with caplog.at_level(logging.INFO):
        Tasks(("wiki_next_word",), str(TASKS)).load({})
    assert not [r for r in caplog.records if "--metadata" in r.getMessage()]


def test_an_unusable_datasets_cache_is_named_not_the_task(tmp_path, monkeypatch):
    """A read-only HOME, or a cache under a file: the line names the cache and HF_HOME, not --tasks."""
    import datasets.config

    from dispersion_titan.evaluation.runner import Tasks

    (tmp_path / "file").write_text("")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "file" / "hf"))
    with pytest.raises(EvaluationError) as refused:
        Tasks(("wiki_next_word",), str(TASKS)).load({})
    assert str(refused.value) == (
        f"{tmp_path / 'file' / 'hf'}: Not a directory (datasets' cache, loading task wiki_next_word); set HF_HOME, "
        "or HF_DATASETS_CACHE, to a writable folder with room"
    )


def test_the_authors_protocols_are_presets():
    gpt2 = select_tasks(None, None, None)  # --protocol gpt2, the default
    assert (gpt2.protocol, gpt2.tasks, gpt2.limit) == ("gpt2", PAPER_TASKS, 500)
    assert [name for name, shots in gpt2.num_fewshot.items() if shots] == FEW_SHOT
    assert set(gpt2.num_fewshot.values()) == {0, 1}
    qwen3 = select_tasks(None, None, None, "qwen3")
    assert (qwen3.tasks, qwen3.limit) == (PAPER_TASKS, 200)
    assert {name: shots for name, shots in qwen3.num_fewshot.items() if shots} == dict.fromkeys(FEW_SHOT, 5)
    authors = "anli,hellaswag,lambada,openbookqa,paloma_wikitext_103,piqa,truthfulqa_mc2,winogrande,mmlu"
    assert select_tasks(authors, None, None, "qwen3").num_fewshot == {**dict.fromkeys(authors.split(","), 0), "mmlu": 5}
    custom = select_tasks("piqa,my_task", 3, "all", "qwen3")
    assert custom.num_fewshot == {"piqa": 3, "my_task": 3} and custom.limit is None
    assert select_tasks("piqa,my_task", None, 7).num_fewshot == {"piqa": 0, "my_task": None}


def hflm_reference(folder: Path, **seeds: int) -> dict:
    """lm-eval's own HFLM on a Hugging Face folder, with OPTS' tasks, shots, limit and batch size."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={folder}",
        tasks=LOCAL_TASKS.split(","),
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        num_fewshot=1,
        limit=LIMIT,
        batch_size=8,
        device="cpu",
        log_samples=False,
        **seeds,
    )


def test_a_seed_numpy_cannot_take_is_taken_mod_2_32_in_a_note(capsys):
    """A run trained before launches refused seeds outside 0..2**32-1 still evaluates (numpy refuses them)."""
    with pytest.raises(ValueError):
        np.random.seed(-1)
    for seed, taken in ((-1, 2**32 - 1), (2**32 + 5, 5)):
        seeds = lm_eval_seeds(seed)
        np.random.seed(seeds["numpy_random_seed"])
        assert set(seeds.values()) == {taken}
        assert capsys.readouterr().err == (
            f"dispersion_titan: note: run.json's seed {seed} is outside numpy's 0..4294967295; "
            f"lm-eval is seeded with {taken}\n"
        )
    assert set(lm_eval_seeds(2**32 - 1).values()) == {2**32 - 1} and not capsys.readouterr().err


def test_scores_equal_lm_eval_hflm_on_the_hf_export(run, evaluated, tmp_path):
    import lm_eval

    from dispersion_titan import convert

    convert.main(["to-hf", str(run / "checkpoint" / "step-2"), str(tmp_path / "hf")])
    seed = read_json(run / "run.json")["seed"]  # the authors seed all four of lm-eval's generators with it
    reference = hflm_reference(
        tmp_path / "hf", random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed
    )
    ours = read_json(evaluated / "step-2" / "results.json")
    for task in ("wiki_next_word", "wiki_text"):
        want, got = reference["results"][task], ours["results"][task]
        assert set(got) == set(want)
        for key, value in want.items():
            if key.startswith("acc"):
                assert got[key] == value, (task, key)
            elif isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-5), (task, key)
    assert ours["results"]["wiki_text"]["word_perplexity,none"] > 1  # a real perplexity was computed
    for key in ("n-shot", "n-samples", "versions", "higher_is_better", "pretty_env_info", "transformers_version"):
        assert ours[key] == json.loads(json.dumps(reference[key])), key  # the environment: gathered once, recorded
    assert ours["n-shot"] == {"wiki_next_word": 1, "wiki_text": 0}  # the YAML pins wiki_text to 0 shots
    assert ours["n-samples"]["wiki_next_word"] == {"original": 40, "effective": LIMIT}
    assert "samples" not in ours
    mine = ours["dispersion_titan"]
    assert mine["lm_eval_version"] == lm_eval.__version__ == "0.4.13"
    assert mine["settings"] == {
        "protocol": "gpt2",
        "tasks": ["wiki_next_word", "wiki_text"],
        "num_fewshot": {"wiki_next_word": 1, "wiki_text": 1},
        "limit": LIMIT,
        "dtype": "fp32",
    }
    assert (mine["step"], mine["run"]) == (2, str(run))
    assert seed == 42 and mine["seeds"] == lm_eval_seeds(seed)
    assert {
        key: ours["config"][key] for key in ("random_seed", "numpy_seed", "torch_seed", "fewshot_seed")
    } == dict.fromkeys(("random_seed", "numpy_seed", "torch_seed", "fewshot_seed"), seed)
    assert not [p for p in os.listdir(evaluated) if p.startswith(".") and p != OWNER_FILE]  # the export is gone

    with open(evaluated / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["step", "wiki_next_word/acc", "wiki_text/word_perplexity", "mean_acc"]
    assert [r["step"] for r in rows] == ["0", "2"]
    # summary.csv shows 6 significant digits
    assert float(rows[1]["wiki_next_word/acc"]) == pytest.approx(
        reference["results"]["wiki_next_word"]["acc,none"], rel=1e-5
    )
    assert float(rows[1]["mean_acc"]) == float(rows[1]["wiki_next_word/acc"])


def test_autocast_scores_as_the_authors_in_training_evaluation(run, evaluated, tmp_path, capsys):
    """``--dtype autocast`` scores a checkpoint as the authors' LMEvalCallback scored theirs: lm-eval's HFLM
    on the model accelerate prepared for ``bf16=True`` (its forward under bf16 autocast, fp32 weights)."""
    import lm_eval
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dispersion_titan import convert

    out = tmp_path / "autocast"
    code, _, err = evaluate(
        str(run), "--include-path", str(TASKS), *OPTS, "--steps", "2", "--dtype", "autocast", "--out", str(out),
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    ours = read_json(out / "step-2" / "results.json")
    convert.main(["to-hf", str(run / "checkpoint" / "step-2"), str(tmp_path / "hf")])
    seed = read_json(run / "run.json")["seed"]
    AcceleratorState._reset_state(reset_partial_state=True)  # HFLM set up accelerate's (process-wide) state
    try:
        model = Accelerator(mixed_precision="bf16", cpu=True).prepare(
            AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
        )
        theirs = lm_eval.simple_evaluate(
            model=HFLM(pretrained=model.eval(), tokenizer=AutoTokenizer.from_pretrained(tmp_path / "hf"), batch_size=8),
            tasks=LOCAL_TASKS.split(","),
            task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
            num_fewshot=1,
            limit=LIMIT,
            device="cpu",
            log_samples=False,
            **lm_eval_seeds(seed),
        )
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    for task in ("wiki_next_word", "wiki_text"):
        want, got = theirs["results"][task], ours["results"][task]
        for key, value in want.items():
            if key.startswith("acc"):
                assert got[key] == value, (task, key)
            elif isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-6), (task, key)
    fp32 = read_json(evaluated / "step-2" / "results.json")["results"]["wiki_text"]["word_perplexity,none"]
    assert ours["results"]["wiki_text"]["word_perplexity,none"] != pytest.approx(fp32, rel=1e-5)  # not fp32's
    assert ours["dispersion_titan"]["settings"]["dtype"] == "autocast"


def named_tasks(folder: Path) -> Path:
    """The local wiki_next_word task under the names of an authors' few-shot and zero-shot task, on its first
    8 examples: a protocol's limit of 200 scores them all (5 shots drawn from the other 7), in a fifth of the CPU."""
    folder.mkdir()
    data = folder / "wiki_next_word.jsonl"
    data.write_text("".join((TASKS / "wiki_next_word.jsonl").read_text().splitlines(keepends=True)[:8]))
    for name in ("arc_easy", "piqa"):
        (folder / f"{name}.yaml").write_text(
            (TASKS / "wiki_next_word.yaml")
            .read_text()
            .replace("task: wiki_next_word", f"task: {name}")
            .replace("custom_dataset: !function local_files.jsonl\n", "")
            .replace("test: wiki_next_word.jsonl", f"test: {data}")
        )
    return folder


def test_a_hugging_face_model_is_evaluated_as_published(run, evaluated, tmp_path, capsys):
    """``evaluate hf:MODEL --out DIR``: the model as published, one result at step 0, scored as lm-eval's own
    HFLM scores that folder (lm-eval's default seeds: no training seed), under the protocol of its config's
    model_type; a rerun skips it (its --out inside the model's folder: was refused as a folder replaced since), a
    replaced folder is refused; ``evaluate table --pretrained DIR`` makes it the Pretrained row, above arms or
    alone (the paper's GPT2-large and -xl blocks)."""

    from dispersion_titan.run_folder.checkpoints import checkpoint_identity

    model = tiny_hub_model(tmp_path / "gpt2-tiny")
    out = model / "eval"
    code, printed, err = evaluate(f"hf:{model}", "--include-path", TASKS, *OPTS, "--out", out, capsys=capsys)
    assert code == 0, err
    reference = hflm_reference(model)  # lm-eval's default seeds
    ours = read_json(out / "step-0" / "results.json")
    for task in ("wiki_next_word", "wiki_text"):
        for key, value in reference["results"][task].items():
            if isinstance(value, float):
                assert ours["results"][task][key] == pytest.approx(value, rel=1e-6), (task, key)
    assert ours["results"]["wiki_text"]["word_perplexity,none"] > 1000  # random weights: a real, poor score
    mine = ours["dispersion_titan"]
    assert (mine["step"], mine["run"], mine["checkpoint"]) == (0, f"hf:{model}", f"hf:{model}")
    assert mine["settings"]["protocol"] == "gpt2" and mine["seeds"] == {}
    assert mine["checkpoint_identity"] == checkpoint_identity(str(model), model_folder=True)
    assert sorted(os.listdir(out)) == [OWNER_FILE, "step-0", "summary.csv"]

    code, printed, _ = evaluate(f"hf:{model}", "--include-path", TASKS, *OPTS, "--out", out, capsys=capsys)
    assert code == 0 and "1 step(s) already evaluated" in printed

    code, printed, err = run_cli(
        evaluate_main, "table", "--pretrained", out, "--out", tmp_path / "alone", capsys=capsys
    )
    assert code == 0, err
    assert "| Pretrained | 1 |" in printed and "the Pretrained row alone" in printed
    assert "Difference from" not in printed  # no arm to differ: no empty table
    code, printed, err = run_cli(
        evaluate_main,
        "table",
        f"baseline={run}",
        "--pretrained",
        out,
        "--select",
        "last",
        "--out",
        tmp_path / "both",
        capsys=capsys,
    )
    assert code == 0, err
    assert "Difference from Pretrained" in printed
    rows = read_csv(tmp_path / "both" / "table.csv")
    assert list(rows) == ["Pretrained", "baseline"]
    assert float(rows["baseline"]["average_diff"]) == pytest.approx(
        float(rows["baseline"]["average_mean"]) - float(rows["Pretrained"]["average_mean"])
    )
    code, _, err = run_cli(
        evaluate_main, "table", "--pretrained", f"hf:{model}", "--out", tmp_path / "t", capsys=capsys
    )
    assert_one_line_error(code, err, f"--pretrained: hf:{model} is a model, not its evaluation", "--out DIR")

    for args, fragments in (
        ([], ("--out", "give --out DIR")),
        (["--out", tmp_path / "o", "--steps", "2"], ("--steps", "evaluated once, as step 0")),
    ):
        code, _, err = evaluate(f"hf:{model}", "--include-path", TASKS, *OPTS, *args, capsys=capsys)
        assert_one_line_error(code, err, *fragments)
    code, _, err = evaluate(f"hf:{model}@a,b", *OPTS, "--out", tmp_path / "o", capsys=capsys)
    assert_one_line_error(code, err, f"hf:{model}@a,b")
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text('{"model_type": "llama"}')  # no family of ours: its note names it
    code, _, err = evaluate(f"hf:{llama}", *OPTS, capsys=capsys)
    assert code == 2 and err.startswith("dispersion_titan: note: the authors evaluated no llama model;"), err

    before = tree(out)
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")  # the folder replaced
    code, _, err = evaluate(f"hf:{model}", "--include-path", TASKS, *OPTS, "--out", out, capsys=capsys)
    assert_one_line_error(code, err, f"--out: {out}: step-0 was evaluated from another checkpoint", "--force")
    assert tree(out) == before
    code, _, err = run_cli(evaluate_main, "table", "--pretrained", out, "--out", tmp_path / "t2", capsys=capsys)
    assert_one_line_error(code, err, f"again with python -m dispersion_titan.evaluate hf:{model} --out {out} --force")

    broken = shutil.copytree(model, tmp_path / "broken", ignore=shutil.ignore_patterns("eval"))
    for damage in ("truncated", "missing"):  # a folder's weights unreadable: one line naming it (was a traceback)
        weights = broken / "model.safetensors"
        if damage == "truncated":
            weights.write_bytes(weights.read_bytes()[:100])
        else:
            weights.unlink()
        code, _, err = evaluate(
            f"hf:{broken}", "--include-path", TASKS, *OPTS, "--out", tmp_path / damage, capsys=capsys
        )
        assert_one_line_error(code, err, f"hf:{broken}: cannot be loaded (")


def test_protocol_shots_per_task_reach_lm_eval(run, tmp_path, capsys, caplog):
    """Two local tasks under the names of an authors' few-shot and zero-shot task: lm-eval's
    own record (n-shot, each task's config) shows the preset's shots, without its warning that they
    replace the tasks' own (once per task); explicit options win (--num-fewshot: the ``evaluated`` fixture)."""
    named = named_tasks(tmp_path / "named_tasks")
    common = [
        run,
        "--include-path",
        named,
        "--tasks",
        "arc_easy,piqa",
        "--steps",
        "2",
        "--batch-size",
        "1",
        "--device",
        "cpu",
    ]
    with caplog.at_level(logging.INFO):
        code, _, _ = evaluate(*common, "--protocol", "qwen3", "--limit", "4", "--out", tmp_path / "q", capsys=capsys)
    said = [r.getMessage() for r in caplog.records if r.name == "lm_eval.evaluator"]
    assert said and not [m for m in said if "Overwriting default num_fewshot" in m], said  # the rest it says stays
    result = read_json(tmp_path / "q" / "step-2" / "results.json")
    assert code == 0 and result["n-shot"] == {"arc_easy": 5, "piqa": 0}
    assert {name: result["configs"][name]["num_fewshot"] for name in ("arc_easy", "piqa")} == {"arc_easy": 5, "piqa": 0}
    assert result["n-samples"]["arc_easy"]["effective"] == 4  # --limit overrides the preset's 200
    assert result["dispersion_titan"]["batch_size"] == 1 and result["config"]["batch_size"] == 1
    assert_one_line_error(
        *evaluate(run, "--protocol", "paper", capsys=capsys)[::2],
        "--protocol",
        "invalid choice: 'paper'",
        "gpt2",
        "qwen3",
    )


def test_the_protocol_follows_the_runs_family(tmp_path, capsys):
    """A qwen3 run evaluated without --protocol gets the authors' Qwen3 protocol (5 shots for the
    few-shot tasks, 200 examples per task) at their batch size 1, as its results record; a
    family the authors never evaluated gets gpt2's, with a note."""
    args = Qwen3Args(
        dim=32,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        hidden_dim=64,
        vocab_size=50257,
        max_seq_len=128,
        enable_weight_tying=True,
    )
    qwen3 = tiny_run(tmp_path / "qwen3", steps=(0,), args=args)
    code, _, err = evaluate(
        qwen3,
        "--include-path",
        named_tasks(tmp_path / "named"),
        "--tasks",
        "arc_easy,piqa",
        "--device",
        "cpu",
        capsys=capsys,
    )
    assert code == 0, err
    result = read_json(qwen3 / "evaluation" / "step-0" / "results.json")
    assert result["dispersion_titan"]["settings"] == {
        "protocol": "qwen3",
        "tasks": ["arc_easy", "piqa"],
        "num_fewshot": {"arc_easy": 5, "piqa": 0},
        "limit": 200,
        "dtype": "fp32",
    }
    assert result["n-shot"] == {"arc_easy": 5, "piqa": 0} and result["config"]["limit"] == 200
    assert result["n-samples"]["arc_easy"] == {"original": 8, "effective": 8}  # the limit takes every example
    assert result["dispersion_titan"]["batch_size"] == 1 and result["config"]["batch_size"] == 1
    assert run_protocol("gpt2") == ("gpt2", None) and run_protocol("qwen3_dispersion") == ("qwen3", None)
    protocol, note = run_protocol("llama3_dispersion")
    assert protocol == "gpt2" and note.startswith("the authors evaluated no llama3_dispersion model")


def test_an_out_remounted_read_only_while_evaluating_is_one_line_and_keeps_its_results(
    run, evaluated, tmp_path, capsys
):
    """``--out`` remounted read-only as step 2's checkpoint is read (ext4's ``errors=remount-ro``; a mount namespace
    of the test's own): one line, ``read-only file system: OUT/…; remount its file system writable, or give a folder
    on another; …``, exit 74 (was the OSError's traceback, exit 1), naming step 2's export, the first write to fail (was
    the lock's release as the command gave up); step 0's results unchanged, and the same command, writable again,
    evaluates step 2."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -rm)")
    out = tmp_path / "out"
    shutil.copytree(evaluated, out)
    shutil.rmtree(out / "step-2")
    kept, argv = digests(out), [str(run), "--include-path", str(TASKS), *OPTS, "--out", str(out)]
    module = "dispersion_titan.evaluate"
    proc = read_only_from_reading(out, module, *argv, reading="step-2/__0_0.distcp", tmp=tmp_path, env=OFFLINE)
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.fullmatch(
        rf"dispersion_titan: error: read-only file system: {out}/\.staging\.hf-step-2\.\S+; remount its file system "
        r"writable, or give a folder on another; each step evaluated so far is kept in its folder; the same command "
        r"goes on",
        proc.stderr.strip().splitlines()[-1],
    ), proc.stderr[-3000:]
    assert kept.items() <= digests(out).items()
    code, _, err = evaluate(*argv, capsys=capsys)  # in this process: its imports paid
    assert code == 0 and (out / "step-2" / "results.json").exists(), err[-3000:]
    assert kept.items() <= digests(out).items()


@pytest.mark.parametrize("replaced", [False, True])
def test_an_out_removed_or_replaced_by_a_file_mid_run_is_one_line_naming_it(run, tmp_path, replaced):
    """``--out`` removed (``rm -rf``), or moved aside and a file put in its place, while lm-eval scores step 0 (paused
    as lm-eval's evaluator reads its own source, a stack walk as the tasks run, the model loaded): one line naming
    ``OUT/.writer.lock``, exit 74 (``records.holding``); not ``--out`` made anew by the writes of the results, without
    its ``.owner.json`` (which a later command refuses as no command's), exit 0. The folder moved aside keeps its
    record."""
    out = tmp_path / "out"
    argv = [str(run), "--include-path", str(TASKS), *OPTS, "--out", str(out)]
    proc, said = out_gone_while_reading(
        "dispersion_titan.evaluate", *argv, reading="lm_eval/evaluator.py", out=out, replaced=replaced, tmp=tmp_path
    )
    assert proc.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: error: {said.format(out / LOCK_NAME)}; each step evaluated so far is kept in its folder; "
        "the same command goes on"
    ), proc.stderr[-3000:]


def test_a_file_where_a_steps_result_folder_goes_is_one_line(run, evaluated, tmp_path, capsys):
    """A file named ``step-2`` in ``--out`` where step 2's results go: ``not a directory: OUT/step-2; move aside the
    file that stands where a folder on its path should be; …``, exit 74 (was ``os.makedirs``' FileExistsError
    traceback, exit 1, after the step was scored); step 0's results unchanged."""
    out = tmp_path / "out"
    shutil.copytree(evaluated, out)
    shutil.rmtree(out / "step-2")
    (out / "step-2").write_text("a file\n")
    kept = digests(out)
    code, _, err = evaluate(run, "--include-path", TASKS, *OPTS, "--out", out, capsys=capsys)
    assert code == 74 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"dispersion_titan: error: not a directory: {out}/step-2; move aside the file that stands where a folder on "
        "its path should be; each step evaluated so far is kept in its folder; the same command goes on"
    ), err[-3000:]
    assert kept.items() <= digests(out).items()


def test_rerun_skips_resumes_and_refuses_other_settings(run, evaluated, tmp_path, capsys):
    before = tree(evaluated)
    code, out, _ = evaluate(run, "--include-path", TASKS, *OPTS, capsys=capsys)
    assert code == 0 and "2 step(s) already evaluated" in out and "step 0 [" not in out
    after = tree(evaluated)
    assert after == {**before, "summary.csv": after["summary.csv"]}  # only the summary is refreshed

    # What a kill during step 2 leaves: no results.json for it, a stray temporary file.
    resumed = tmp_path / "resumed"
    shutil.copytree(evaluated, resumed)
    (resumed / "step-2" / "results.json").unlink()
    (resumed / "step-2" / ".results.json.123.tmp").write_text('{"resu')
    # Its tasks named in another order: the same settings, the same scores (was refused as other settings).
    reordered = ("--tasks", ",".join(reversed(LOCAL_TASKS.split(","))))
    code, out, err = evaluate(run, "--include-path", TASKS, *OPTS, *reordered, "--out", resumed, capsys=capsys)
    assert code == 0 and "step 2 [2/2] wiki_next_word: acc" in out and "step 0 [" not in out, err
    assert "other settings" not in err
    again, first = read_json(resumed / "step-2" / "results.json"), read_json(evaluated / "step-2" / "results.json")
    assert again["results"] == first["results"]

    # A folder where the summary goes: one line naming it (was os.replace's IsADirectoryError traceback).
    (resumed / "summary.csv").unlink()
    (resumed / "summary.csv").mkdir()
    code, _, err = evaluate(run, "--include-path", TASKS, *OPTS, "--out", resumed, capsys=capsys)
    assert_one_line_error(code, err, f"{resumed / 'summary.csv'}: a folder where this command writes a file", "rerun")

    # Other settings into an existing folder: refused in one line, nothing touched.
    code, _, err = evaluate(run, "--include-path", TASKS, *OPTS, "--limit", "6", capsys=capsys)
    assert_one_line_error(
        code,
        err,
        f"--out: {evaluated}: step-0, step-2 were evaluated with other settings (limit 12 vs 6)",
        "use another --out, or --force to recompute",
    )
    assert tree(evaluated) == after


def test_a_killed_evaluations_export_is_removed_by_the_next_run(run, tmp_path, capsys):
    """SIGKILL while a checkpoint's temporary Hugging Face export exists: the folder stays
    (no ``finally`` runs); the next evaluation into that folder removes it."""
    out = tmp_path / "out"
    argv = [str(run), "--include-path", str(TASKS), *OPTS, "--steps", "0", "--out", str(out)]
    job = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.evaluate", *argv, env=OFFLINE)
    deadline = time.monotonic() + 300
    while not list(out.glob(".staging.hf-step-*/config.json")) and not job.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = read_json(out / LOCK_NAME)["pid"]  # the evaluation's own process, as its writer lock records it
    os.kill(pid, signal.SIGKILL)
    assert job.result().returncode == -signal.SIGKILL
    assert len(list(out.glob(".staging.hf-step-0.*"))) == 1  # left by the killed evaluation
    code, _, err = evaluate(run, "--include-path", TASKS, *OPTS, "--steps", "0", "--out", out, capsys=capsys)
    assert code == 0, err
    assert not list(out.glob(".staging.*")) and (out / "step-0" / "results.json").exists()


def test_other_settings_on_other_steps_are_refused_unless_force(run, evaluated, tmp_path, capsys):
    """Issue 35: a folder holding step 0's results refuses step 2 scored with other settings
    (here wiki_text alone) in one line, changing nothing. With --force step 2 is scored, step 0's
    results and row stay; ``evaluate table`` then refuses to weigh the two steps against each other."""
    out = tmp_path / "out"
    shutil.copytree(evaluated / "step-0", out / "step-0")
    shutil.copy(evaluated / "summary.csv", out / "summary.csv")
    shutil.copy(evaluated / ".owner.json", out)  # the evaluation's record: the folder is its own
    before = digests(out)
    with open(evaluated / "summary.csv") as f:
        step0 = next(csv.DictReader(f))
    options = [*OPTS[2:], "--tasks", "wiki_text", "--steps", "2", "--out", out]
    code, _, err = evaluate(run, "--include-path", TASKS, *options, capsys=capsys)
    assert_one_line_error(
        code,
        err,
        f"--out: {out}: step-0 was evaluated with other settings (tasks "
        "['wiki_next_word', 'wiki_text'] vs ['wiki_text'], num_fewshot ",
        "); use another --out, or --force to recompute",
    )
    assert digests(out) == before

    code, _, err = evaluate(run, "--include-path", TASKS, *options, "--force", capsys=capsys)
    assert code == 0 and "\ndispersion_titan: note: step(s) [0]" in f"\n{err}", err
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["step", "wiki_next_word/acc", "wiki_text/word_perplexity", "mean_acc"]
    assert rows[0] == step0
    step2 = read_json(out / "step-2" / "results.json")["results"]["wiki_text"]
    assert rows[1] == {
        "step": "2",
        "wiki_next_word/acc": "",
        "mean_acc": "",
        "wiki_text/word_perplexity": f"{step2['word_perplexity,none']:.6g}",
    }
    assert {k: v for k, v in digests(out).items() if k.startswith("step-0/")} == {
        k: v for k, v in before.items() if k.startswith("step-0/")
    }

    table_out = tmp_path / "table"
    code, _, err = run_cli(evaluate_main, "table", str(out), "--out", str(table_out), capsys=capsys)
    assert_one_line_error(
        code,
        err,
        f"{out} step 2 was evaluated with other settings than {out} step 0 "
        "(tasks ['wiki_next_word', 'wiki_text'] vs ['wiki_text'], num_fewshot ",
        "--select best weighs them together",
        "--force",
    )
    assert not table_out.exists()


def test_two_evaluations_at_once_one_writer(run, tmp_path):
    """Issue 35: two real ``evaluate`` processes with other settings into one folder. The first
    is paused while it holds the folder; the second is refused in one line naming it and changes
    nothing; the first then ends with its own results only."""
    out = tmp_path / "evaluation"
    second_writer_is_refused(
        "dispersion_titan.evaluate",
        [str(run), "--include-path", str(TASKS), *OPTS, "--steps", "0", "--out", str(out)],
        [str(run), "--include-path", str(TASKS), *OPTS, "--limit", "6", "--out", str(out)],
        out,
        env=OFFLINE,
    )
    assert sorted(p.parent.name for p in out.glob("step-*/results.json")) == ["step-0"]
    assert read_json(out / "step-0" / "results.json")["dispersion_titan"]["settings"]["limit"] == LIMIT


def test_a_result_of_a_replaced_checkpoint_is_not_reused(run, evaluated, tmp_path, capsys):
    """step-N/results.json records its checkpoint's identity: once step-N holds other weights,
    the rerun says so in one line instead of skipping it, and changes nothing."""
    replaced = tmp_path / "run"
    out = replaced / "evaluation"  # a copy of the run, its results with it
    shutil.copytree(run / "checkpoint", replaced / "checkpoint")  # copies keep mtimes: the same identity
    shutil.copy(run / "run.json", replaced)
    shutil.copytree(evaluated, out)
    before = tree(out)
    step = replaced / "checkpoint" / "step-2"
    # Replaced by step-0's; then saved again: step-2's own .metadata, names and sizes, other bytes, new times.
    for source, copy in ((run / "checkpoint" / "step-0", shutil.copy2), (run / "checkpoint" / "step-2", shutil.copy)):
        shutil.rmtree(step)
        shutil.copytree(source, step, copy_function=copy)
        if source.name == "step-2":
            with open(max(step.glob("*.distcp"), key=lambda p: p.stat().st_size), "r+b") as shard:
                shard.seek(-1, os.SEEK_END)
                last = shard.read(1)
                shard.seek(-1, os.SEEK_END)
                shard.write(bytes([last[0] ^ 1]))
        code, _, err = evaluate(replaced, "--include-path", TASKS, *OPTS, "--out", out, capsys=capsys)
        assert_one_line_error(
            code,
            err,
            f"--out: {out}: step-2 was evaluated from another checkpoint than {step} holds now",
            "--force recomputes it",
        )
        assert tree(out) == before


def test_table_refuses_a_result_of_a_replaced_checkpoint(run, evaluated, tmp_path, capsys):
    """``evaluate table`` weighs only results that still describe their checkpoint: a moved run's
    are found relative to it, and once step-N holds other weights its row is refused in one line; so is its best
    among steps not all evaluated."""
    moved = tmp_path / "a user's run"  # the command the refusal prints runs as printed
    shutil.copytree(run, moved)  # copies keep mtimes: the same identities, at another path
    code, out, err = run_cli(
        evaluate_main, "table", str(moved), "--select", "step:2", "--out", str(tmp_path / "t1"), capsys=capsys
    )
    assert code == 0, err
    shutil.rmtree(moved / "checkpoint" / "step-2")
    shutil.copytree(run / "checkpoint" / "step-0", moved / "checkpoint" / "step-2")
    code, _, err = run_cli(
        evaluate_main, "table", str(moved), "--select", "step:2", "--out", str(tmp_path / "t2"), capsys=capsys
    )
    assert_one_line_error(
        code,
        err,
        f"{moved / 'evaluation'}: step 2 was evaluated from another checkpoint than "
        f"{moved / 'checkpoint' / 'step-2'} holds now",
        "again with python -m dispersion_titan.evaluate ",
    )
    advice = shlex.split(err.split("again with ")[1])  # runs as printed
    assert advice[3:] == [str(moved), "--out", str(moved / "evaluation"), "--force"]
    assert not (tmp_path / "t2").exists()
    # --select best where a saved step the authors evaluate has no evaluation (evaluated while the run trained, or
    # cut short): refused (was step 0, the initialization, taken as the best, silently); its checkpoints counted as
    # a resume counts them: step-0 renamed step-2 is refused as renamed (was counted as step 2)
    shutil.rmtree(moved / "evaluation" / "step-2")
    code, _, err = run_cli(evaluate_main, "table", str(moved), "--out", str(tmp_path / "t3"), capsys=capsys)
    assert_one_line_error(code, err, f"{moved / 'checkpoint' / 'step-2'}: holds step 0 (TorchTitan's train_state.step)")
    shutil.rmtree(moved / "checkpoint" / "step-2")
    shutil.copytree(run / "checkpoint" / "step-2", moved / "checkpoint" / "step-2")
    code, _, err = run_cli(evaluate_main, "table", str(moved), "--out", str(tmp_path / "t3"), capsys=capsys)
    assert_one_line_error(
        code, err, f"--select best: {moved} saved step 2, which the authors evaluate, and has no evaluation of it"
    )
    assert not (tmp_path / "t3").exists()
    # stopped before its last step, or still training, or its step-2 being copied (rsync's order: its .metadata
    # first; was counted as saved)
    for shard in (moved / "checkpoint" / "step-2").glob("*.distcp"):
        shard.unlink()
    code, _, err = run_cli(evaluate_main, "table", str(moved), "--out", str(tmp_path / "t3"), capsys=capsys)
    assert_one_line_error(code, err, f"--select best: {moved} has saved up to step 0 of its 2 (still training, or")
    assert not (tmp_path / "t3").exists()


def copy_with_step_2(run: Path, evaluated: Path, folder: Path) -> tuple[Path, Path]:
    """``run`` as ``folder`` with step 0 (linked) already evaluated and its own copy of step 2, to damage: only
    step 2 is attempted. Its step-2 folder and evaluation folder."""
    (folder / "checkpoint").mkdir(parents=True)
    shutil.copy(run / "run.json", folder)
    os.symlink(run / "checkpoint" / "step-0", folder / "checkpoint" / "step-0")
    step = folder / "checkpoint" / "step-2"
    shutil.copytree(run / "checkpoint" / "step-2", step)
    out = folder / "evaluation"
    shutil.copytree(evaluated / "step-0", out / "step-0")
    shutil.copy(evaluated / ".owner.json", out)
    return step, out


def test_broken_checkpoint_is_reported_and_skipped(run, evaluated, tmp_path, capsys):
    corrupt, out = copy_with_step_2(run, evaluated, tmp_path / "broken")
    shard = next(corrupt.glob("*.distcp"))
    with open(shard, "r+b") as f:
        f.truncate(1000)
    code, stdout, err = evaluate(tmp_path / "broken", "--include-path", TASKS, *OPTS, "--out", out, capsys=capsys)
    assert code == 1
    assert f"skipped checkpoint: {shard}: truncated" in err
    assert "1 of 2 checkpoints could not be evaluated" in err
    assert "1 step(s) already evaluated" in stdout
    assert sorted(p.parent.name for p in out.glob("step-*/results.json")) == ["step-0"]
    assert not [p for p in os.listdir(out) if p.startswith(".") and p != OWNER_FILE]  # no export left behind


@pytest.mark.parametrize(
    ("prefix", "factor", "why"),
    [
        ("", 1e30, "task wiki_next_word: its logits hold NaN or infinite values"),  # one step of lr 1e30
        ("norm.", 1e20, "task wiki_text: its perplexity is past float's range"),  # finite logits of 1e20
    ],
    ids=["diverged", "huge-logits"],
)
def test_a_diverged_checkpoint_is_skipped_in_one_line(run, evaluated, tmp_path, capsys, prefix, factor, why):
    """A checkpoint whose logits are not finite (saved by a run diverging at the next step, as with
    ``--optimizer.lr 1e30``), or whose perplexity overflows lm-eval's ``exp``: skipped with one line naming it and
    the task, exit 1, nothing recorded for it (was: a NaN word perplexity and a garbage accuracy written, then a
    ``ValueError`` traceback, and every rerun refused as a hand-edited file; an ``OverflowError`` traceback)."""
    step, out = copy_with_step_2(run, evaluated, tmp_path / "diverged")
    scale_weights(step, factor, prefix)
    code, _, err = evaluate(tmp_path / "diverged", "--include-path", TASKS, *OPTS, "--out", out, capsys=capsys)
    assert code == 1 and "Traceback" not in err
    assert f"skipped checkpoint: {step}: {why}; a diverged or damaged model, nothing recorded" in err
    assert err.strip().splitlines()[-1] == f"dispersion_titan: error: 1 of 2 checkpoints could not be evaluated: {step}"
    assert sorted(p.parent.name for p in out.glob("step-*/results.json")) == ["step-0"]


def test_bad_input_fails_in_one_line_before_anything_loads(run, evaluated, tmp_path, capsys):
    # Every paper task name resolves in lm-eval's index (nothing downloaded); only the typo is named. Naming a
    # task outside --include-path makes lm-eval index its ~14,000 built-in task YAMLs, in this process.
    # The run folder is a stand-in (an empty step folder, its protocol gpt2): the check comes before any load.
    stand_in = tmp_path / "stand_in"
    (stand_in / "checkpoint" / "step-0").mkdir(parents=True)
    (stand_in / "run.json").write_text(json.dumps({"format": 1, "model_name": "gpt2", "model_args": {}}))
    tasks = ",".join([*PAPER_TASKS, "wiki_nxt_word"])
    code, _, err = evaluate(stand_in, "--include-path", TASKS, "--tasks", tasks, capsys=capsys)
    assert_one_line_error(code, err, "--tasks: unknown task wiki_nxt_word (")
    # A task YAML lm-eval cannot read, which its index skips: named (was `unknown task wiki_next_word`).
    broken = tmp_path / "broken_tasks"
    shutil.copytree(TASKS, broken)
    (broken / "wiki_next_word.yaml").write_text("task: wiki_next_word\n  bad: [unclosed\n")
    code, _, err = evaluate(stand_in, "--include-path", broken, "--tasks", "wiki_next_word", capsys=capsys)
    assert_one_line_error(
        code,
        err,
        "--tasks: unknown task wiki_next_word; lm-eval skips the task YAMLs in --include-path it cannot read: "
        f"{broken / 'wiki_next_word.yaml'} (ScannerError: mapping values are not allowed in this context",
        "line 2, column 6)",
        "; fix them",
    )
    assert sorted(p.name for p in stand_in.rglob("*")) == ["checkpoint", "run.json", "step-0"]

    before, run_files = tree(evaluated), sorted(os.listdir(run))
    new_out = tmp_path / "new"
    assert_one_line_error(
        *evaluate(run, "--include-path", tmp_path / "nope", *OPTS, "--out", new_out, capsys=capsys)[::2],
        "--include-path",
        "nope: no such file or directory (give a readable folder",
    )
    a_file = tmp_path / "tasks.yaml"
    a_file.write_text("task: x\n")
    assert_one_line_error(
        *evaluate(run, "--include-path", a_file, *OPTS, "--out", new_out, capsys=capsys)[::2],
        "--include-path",
        "not a directory",
    )
    missing = tmp_path / "missing_data"
    missing.mkdir()
    (missing / "wiki_missing.yaml").write_text(
        (TASKS / "wiki_text.yaml")
        .read_text()
        .replace("task: wiki_text", "task: wiki_missing")
        .replace("custom_dataset: !function local_files.jsonl\n", "")
        .replace("test: wiki_text.jsonl", f"test: {tmp_path / 'nope.jsonl'}")
    )
    assert_one_line_error(
        *evaluate(run, "--include-path", missing, "--tasks", "wiki_missing", "--out", new_out, capsys=capsys)[::2],
        "--tasks: wiki_missing: cannot be loaded",
        "nope.jsonl",
    )
    assert_one_line_error(
        *evaluate(run, "--tasks", "piqa,,mmlu", "--out", new_out, capsys=capsys)[::2], "--tasks", "empty task name"
    )
    assert_one_line_error(*evaluate(run, "--limit", "0", capsys=capsys)[::2], "--limit")
    assert_one_line_error(  # more shots than the task has: was lm-eval's traceback, after the model loaded
        *evaluate(run, "--include-path", TASKS, *OPTS, "--num-fewshot", "99999999", "--out", new_out, capsys=capsys)[
            ::2
        ],
        "--num-fewshot: 99999999 is more than the 39 few-shot examples of task wiki_next_word; give at most 39",
    )
    assert_one_line_error(
        *evaluate(run, *OPTS, "--steps", "3", "--out", new_out, capsys=capsys)[::2],
        "--steps: no checkpoint for step 3 (have [0, 2])",
    )
    assert_one_line_error(
        *evaluate(run, *OPTS, "--steps", "2-x", "--out", new_out, capsys=capsys)[::2], "--steps: '2-x' is not a step"
    )
    assert_one_line_error(  # one of our runs named as a Hugging Face model
        *evaluate(f"hf:{run}", *OPTS, "--out", new_out, capsys=capsys)[::2],
        f"hf:{run}: {run} is a training run's folder (run.json); give it without hf:",
    )
    assert tree(evaluated) == before and sorted(os.listdir(run)) == run_files and not new_out.exists()


@pytest.mark.usefixtures("private_caches")
def test_a_task_with_a_bad_template_is_its_one_line_alone(tmp_path, capsys):
    """A task YAML whose Jinja template does not parse fails once its data are read (lm-eval applies the template to
    the first document): one line, exit 2, without datasets' ``Generating test split: 40 examples`` bar above it."""
    stand_in = tmp_path / "stand_in"
    (stand_in / "checkpoint" / "step-0").mkdir(parents=True)
    (stand_in / "run.json").write_text(json.dumps({"format": 1, "model_name": "gpt2", "model_args": {}}))
    broken = shutil.copytree(TASKS, tmp_path / "tasks")
    yaml = broken / "wiki_next_word.yaml"
    yaml.write_text(yaml.read_text().replace('doc_to_text: "{{context}}"', 'doc_to_text: "{{context"'))
    code, _, err = evaluate(stand_in, "--include-path", broken, "--tasks", "wiki_next_word", capsys=capsys)
    assert code == 2 and err.splitlines() == [
        "dispersion_titan: error: --tasks: wiki_next_word: cannot be loaded (TemplateSyntaxError: unexpected end of "
        "template, expected 'end of print statement'.)"
    ], err
    assert sorted(p.name for p in stand_in.rglob("*")) == ["checkpoint", "run.json", "step-0"]


@pytest.mark.usefixtures("private_caches")
def test_a_datasets_cache_out_of_room_is_the_commands_out_of_room_line(tmp_path, capsys):
    """datasets' cache meeting the file size limit (``ulimit -f 1``) or a full disk as it copies a task's data:
    the commands' out-of-room line naming the cache, exit 74 (was ``--tasks: wiki_next_word: cannot be loaded
    (DatasetGenerationError: An error occurred while generating the dataset)``, exit 2, the task blamed)."""
    import datasets.config

    stand_in = tmp_path / "stand_in"
    (stand_in / "checkpoint" / "step-0").mkdir(parents=True)
    (stand_in / "run.json").write_text(json.dumps({"format": 1, "model_name": "gpt2", "model_args": {}}))
    with file_size_limit(1024):
        code, _, err = evaluate(stand_in, "--include-path", TASKS, "--tasks", "wiki_next_word", capsys=capsys)
    assert (code, err.splitlines()[-1]) == (
        74,
        f"dispersion_titan: error: file too large writing {datasets.config.HF_DATASETS_CACHE}; raise the file size "
        "limit (ulimit -f); each step evaluated so far is kept in its folder; the same command goes on",
    ), err


def test_unreachable_hub_fails_at_once_without_retries(tmp_path):
    """A task whose data are on the hub, with the hub unreachable (a closed local port as
    HF_ENDPOINT) and an empty cache: one line saying why, no retries, nothing written."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hub_task.yaml").write_text(
        (TASKS / "wiki_text.yaml")
        .read_text()
        .replace("task: wiki_text", "task: hub_task")
        .replace("dataset_path: json", "dataset_path: nobody/no-such-dataset")
        .replace("custom_dataset: !function local_files.jsonl\n", "")
    )
    run = tmp_path / "run"
    (run / "checkpoint" / "step-0").mkdir(parents=True)
    (run / "run.json").write_text('{"format": 1, "model_name": "gpt2", "model_args": {}}')
    proc = python_module(
        "dispersion_titan.evaluate",
        str(run),
        "--include-path",
        str(tasks),
        "--tasks",
        "hub_task",
        env={
            "HF_ENDPOINT": "http://127.0.0.1:9",
            "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_OFFLINE": "",
            "HF_DATASETS_OFFLINE": "",
        },
        timeout=300,
    )
    assert_one_line_error(
        proc.returncode,
        proc.stderr,
        "--tasks: hub_task: cannot be loaded; not in the local Hugging "
        "Face cache, and the hub is not asked: 127.0.0.1:9 is unreachable from here",
    )
    assert "Retry" not in proc.stderr
    assert sorted(p.name for p in run.rglob("*")) == ["checkpoint", "run.json", "step-0"]
    # a hub model as published, not cached: its one line at once (transformers retried it 5 times, 25 s)
    proc = python_module(
        "dispersion_titan.evaluate",
        "hf:nobody/no-such-model",
        "--out",
        str(tmp_path / "out"),
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": ""},
        timeout=300,
    )
    assert_one_line_error(
        proc.returncode,
        proc.stderr,
        "hf:nobody/no-such-model: cannot be loaded",
        "127.0.0.1:9 is unreachable",
        "download it where the hub is reachable (hf download), or give a local folder",  # was: no remedy
    )
    assert "Retry" not in proc.stderr and not (tmp_path / "out").exists()


def test_an_unreachable_hub_is_offline_only_while_the_tasks_load(monkeypatch):
    """The offline switch is the libraries' process-wide constant: it must not outlive the task loading,
    or a caller's later dataset checks in the same process would see the hub as offline."""
    import datasets.config
    import huggingface_hub.constants

    from dispersion_titan.utils.hub import hub_offline

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    before = huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    with hub_offline() as reason:
        assert reason.startswith("127.0.0.1:9 is unreachable from here")
        assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE
    assert (huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE) == before


# ---------------------------------------------------------------- table

SETTINGS = {
    "protocol": "gpt2",
    "tasks": ["t_a", "t_b", "t_ppl"],
    "num_fewshot": {"t_a": 0, "t_b": 1, "t_ppl": 0},
    "limit": 500,
    "dtype": "fp32",
}
TRAINING_STEPS = 10  # the authors evaluate at 3, 6, 9 (every 10 // 5 + 1) and 10; step 5 is off their cadence
# run -> (dispersion variant, coeff, seed, {step: (t_a acc, t_b acc, t_ppl word perplexity)})
FABRICATED = {
    "base_s1": (
        "none",
        0.0,
        1,
        {0: (0.30, 0.40, 900.0), 3: (0.36, 0.44, 500.0), 5: (0.38, 0.47, 480.0), 10: (0.35, 0.43, 450.0)},
    ),
    "base_s2": (
        "none",
        0.0,
        2,
        {0: (0.31, 0.41, 880.0), 3: (0.35, 0.45, 520.0), 5: (0.34, 0.44, 500.0), 10: (0.37, 0.46, 470.0)},
    ),
    "disp_s1": (
        "angular_spread",
        0.1,
        1,
        {0: (0.30, 0.40, 900.0), 3: (0.40, 0.50, 480.0), 5: (0.45, 0.55, 470.0), 10: (0.41, 0.52, 430.0)},
    ),
    "disp_s2": (
        "angular_spread",
        0.1,
        2,
        {0: (0.50, 0.60, 890.0), 3: (0.44, 0.51, 470.0), 5: (0.39, 0.49, 460.0), 10: (0.40, 0.50, 440.0)},
    ),
}


HUB_GPT2 = f"/hub/models--openai-community--gpt2/snapshots/{'1' * 40}"  # a paper config's start, fetched
MID_TRAINING = {"started_from": {"pretrained": True, "source": "hf", "path": HUB_GPT2}}
FROM_SCRATCH = {"started_from": {"pretrained": False, "source": "init", "path": None}}


def fabricate(root: Path, start: dict | None = None) -> dict[str, Path]:
    """Four evaluated runs (2 configurations × 2 seeds) as ``evaluate`` leaves them; ``start``: what
    their run.json records of where they started (default mid-training)."""
    runs = {}
    for name, (variant, coeff, seed, by_step) in FABRICATED.items():
        dump = root / name
        dump.mkdir()
        (dump / "run.json").write_text(
            json.dumps(
                {
                    "format": 1,
                    "model_name": "gpt2",
                    "model_args": {"dim": 64, "n_layers": 4, "mlp_hidden_dim": 0},
                    "dispersion": {"variant": variant, "coeff": coeff, "tau": 1.0},
                    "seed": seed,
                    "training_steps": TRAINING_STEPS,
                    **(MID_TRAINING if start is None else start),
                }
            )
        )
        for step, (a, b, ppl) in by_step.items():
            write_evaluation(
                dump,
                step,
                {
                    "t_a": {"acc,none": a},
                    "t_b": {"acc,none": b, "acc_norm,none": 0.9},
                    "t_ppl": {"word_perplexity,none": ppl, "byte_perplexity,none": 2.0},
                },
                SETTINGS,
            )
        runs[name] = dump
    return runs


@pytest.fixture
def fabricated(tmp_path) -> dict[str, Path]:
    return fabricate(tmp_path)


def authors_best(name: str, include_initial: bool = False) -> int:
    """The authors' choice, computed as their scripts do: LMEvalCallback evaluates in
    on_step_end when global_step % (max_steps // num_ckpt + 1) == 0, in on_train_end, and
    in on_train_begin only with --eval_at_begin; plot_results.py then keeps, per seed,
    the first step of highest mean accuracy (perplexity left out)."""
    every = TRAINING_STEPS // 5 + 1
    evaluated = [0] if include_initial else []
    evaluated += [step for step in range(1, TRAINING_STEPS + 1) if step % every == 0]
    evaluated += [TRAINING_STEPS] if TRAINING_STEPS not in evaluated else []
    by_step = FABRICATED[name][3]
    best, best_score = None, -1.0
    for step in evaluated:
        if step in by_step and sum(by_step[step][:2]) / 2 > best_score:
            best, best_score = step, sum(by_step[step][:2]) / 2
    return best


def authors_averaged_best(names: list[str]) -> int:
    """The authors' from-scratch choice (pretrain_toy_gpt2_change_ffn/plot_results.py): each metric
    averaged over the seeds that evaluated a step (aggregate_metrics_across_seeds), the mean over the
    accuracy metrics per step, the first step of the highest (compute_best_steps' nanargmax)."""
    every = TRAINING_STEPS // 5 + 1
    evaluated = sorted({*range(every, TRAINING_STEPS + 1, every), TRAINING_STEPS})
    steps = [step for step in evaluated if any(step in FABRICATED[n][3] for n in names)]
    scores = []
    for step in steps:
        per_metric = [sum(FABRICATED[n][3][step][m] for n in names) / len(names) for m in (0, 1)]
        scores.append(sum(per_metric) / 2)
    return steps[scores.index(max(scores))]


def averages(steps: dict[str, int], names: list[str]) -> list[float]:
    return [sum(FABRICATED[n][3][steps[n]][:2]) / 2 for n in names]


def read_csv(path: Path) -> dict[str, dict]:
    with open(path) as f:
        return {row["arm"]: row for row in csv.DictReader(f)}


BASE_RUNS, DISP_RUNS = ["base_s1", "base_s2"], ["disp_s1", "disp_s2"]


def by_hand_min_ranks(means: dict[str, list[float]]) -> dict[str, float]:
    """Each row's rank per column, 1 + the rows strictly better on the 4-digit cells (ties share the
    smallest), averaged over the columns: the paper's Table 2 ranks."""
    columns = len(next(iter(means.values())))
    return {
        row: sum(1 + sum(round(o[c], 4) > round(m[c], 4) for o in means.values()) for c in range(columns)) / columns
        for row, m in means.items()
    }


def test_min_ranks_share_the_smallest_on_the_printed_cells():
    means = {"a": [0.45671, 0.3], "b": [0.45669, 0.5], "c": [0.40, 0.5], "d": [0.5, 0.1]}
    got = min_ranks([{"x": m[0], "y": m[1]} for m in means.values()], ["x", "y"])
    assert got == list(by_hand_min_ranks(means).values()) == [(2 + 3) / 2, (2 + 1) / 2, (4 + 1) / 2, (1 + 4) / 2]


def test_a_table_that_cannot_be_written_leaves_the_last_one_whole(fabricated, tmp_path, capsys):
    """A table rewritten with other options meets the file size limit (as a full disk would) at its figure:
    one line, exit 74, and --out still holds the last table whole, not a new table.md beside the old table.png.
    The line says so as ``analyze compare``'s does (was evaluate's ``each step evaluated so far is kept``, of a
    command that evaluates nothing)."""
    out = tmp_path / "table"
    assert evaluate("table", *fabricated.values(), "--select", "last", "--out", out, capsys=capsys)[0] == 0
    before = digests(out)
    argv = ["table", *map(str, fabricated.values()), "--out", str(out)]
    proc = python_module("dispersion_titan.evaluate", *argv, file_limit=8 * 1024)  # 8 KiB: not the figure
    assert proc.returncode == 74 and proc.stderr.startswith(f"dispersion_titan: error: file too large writing {out}/")
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.endswith(f"; {REWRITTEN}\n"), proc.stderr  # as compare's
    assert digests(out) == before


def test_two_tables_at_once_into_one_out_one_writes(fabricated, tmp_path):
    """Two ``evaluate table`` into one --out, the second started while the first reads its runs' results: refused
    in one line naming the first, exit 2, before it writes; the first then writes its table whole (was: both exit 0
    and said "written:", the folder the last one's, as --out was held only to write the files)."""
    out, runs = tmp_path / "table", list(map(str, fabricated.values()))
    argv = ["table", *runs, "--out", str(out)]
    module = "dispersion_titan.evaluate"
    pid, first = paused_reading(module, *argv, "--select", "last", reading="results.json", tmp=tmp_path)
    try:
        second = python_module(module, *argv)
    finally:
        os.kill(pid, signal.SIGCONT)
    here = f"PID {pid} on {socket.gethostname()}, python -m {module} table"
    assert_one_line_error(second.returncode, second.stderr, f"{out}: another command is writing here ({here}")
    done = first.result()
    assert done.returncode == 0 and (out / "table.md").read_text() in done.stdout, done.stderr[-3000:]
    assert sorted(os.listdir(out)) == [OWNER_FILE, "table.csv", "table.md", "table.png"]


def test_a_table_whose_out_is_removed_mid_write_is_one_line_not_a_new_folder(fabricated, tmp_path):
    """``evaluate table``'s ``--out`` removed (``rm -rf``) once its files are staged in it but its figure (paused as
    matplotlib imports its Agg backend, for the table's figure): ``no such file or directory: OUT/.writer.lock; …``,
    exit 74, no folder left (was: ``--out`` made anew by the figure's write, ``table.png`` moved in alone, without its
    ``.owner.json``, and ``written: OUT/table.md, table.csv, table.png``, exit 0)."""
    out = tmp_path / "table"
    argv = ["table", *map(str, fabricated.values()), "--out", str(out)]
    agg = f"backend_agg.{sys.implementation.cache_tag}.pyc"
    pid, job = paused_reading("dispersion_titan.evaluate", *argv, reading=agg, tmp=tmp_path)
    try:
        shutil.rmtree(out)
    finally:
        os.kill(pid, signal.SIGCONT)
    proc = job.result()
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: error: no such file or directory: {out}/{LOCK_NAME}; put back what was removed or moved "
        f"(it, or a folder on its path); {REWRITTEN}"
    ), proc.stderr[-3000:]
    assert not out.exists()


@pytest.mark.parametrize(
    "edit",
    [lambda _: b"[]", lambda _: b"\xff", lambda text: text.replace(b'"acc,none": 0.35', b'"acc,none": "high"')],
    ids=["json-not-an-object", "not-utf8", "a-score-not-a-number"],
)
def test_a_results_file_of_another_shape_is_named_in_one_line(fabricated, tmp_path, capsys, edit):
    """Was an AttributeError, UnicodeDecodeError or ValueError traceback, exit 1."""
    result = fabricated["base_s2"] / "evaluation" / "step-3" / "results.json"
    text = edit(result.read_bytes())
    assert text != result.read_bytes()
    result.write_bytes(text)
    code, _, err = evaluate("table", *fabricated.values(), "--out", tmp_path / "t", capsys=capsys)
    assert_one_line_error(code, err, f"{result}: unreadable (", "); restore it, or remove it and rerun")
    assert not (tmp_path / "t").exists() and result.read_bytes() == text


def test_a_run_without_a_column_the_others_have_is_named_in_one_line(fabricated, tmp_path, capsys):
    """A task lm-eval left unscored in one run (here: removed by hand from every step of base_s2): was a
    KeyError traceback, or the column silently dropped where that run came first."""
    for result in (fabricated["base_s2"] / "evaluation").glob("step-*/results.json"):
        record = json.loads(result.read_text())
        del record["results"]["t_b"]["acc,none"]
        result.write_text(json.dumps(record))
    code, _, err = evaluate("table", *fabricated.values(), "--out", tmp_path / "t", capsys=capsys)
    assert_one_line_error(code, err, "'s scores are not of the columns of ", "(t_b/acc); evaluate that step again")
    assert not (tmp_path / "t").exists()


def test_moved_runs_tabulate_as_before(fabricated, tmp_path, capsys):
    """``mv`` of evaluated runs to another folder: the same table (was: RUN/run.json missing, naming the
    old path, as its results record where the run was when evaluated)."""
    assert evaluate("table", *fabricated.values(), "--out", tmp_path / "before", capsys=capsys)[0] == 0
    (tmp_path / "elsewhere").mkdir()
    moved = [shutil.move(run, tmp_path / "elsewhere" / run.name) for run in fabricated.values()]
    code, _, err = evaluate("table", *moved, "--out", tmp_path / "after", capsys=capsys)
    assert code == 0, err
    after = (tmp_path / "after" / "table.csv").read_text()  # the same numbers, naming the runs where they are
    assert after.replace(f"{tmp_path}/elsewhere/", f"{tmp_path}/") == (tmp_path / "before" / "table.csv").read_text()


def test_table_reads_each_runs_run_json_once(fabricated, tmp_path, capsys, monkeypatch):
    """Each run's run.json read once for its arm, seed, start and steps, and once more for its checkpoint folder
    where steps the authors evaluate lack an evaluation (was 6 to 11 reads a run, here)."""
    reads, real_open = collections.Counter(), io.open

    def counted(file, *args, **kwargs):  # Path.read_text's and json.load's open alike
        reads.update([os.path.basename(file) if isinstance(file, (str, os.PathLike)) else ""])
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counted)  # pathlib's
    monkeypatch.setattr("builtins.open", counted)
    assert evaluate("table", *fabricated.values(), "--out", tmp_path / "t", capsys=capsys)[0] == 0
    assert reads["run.json"] == 2 * len(fabricated)


def test_runs_of_another_learning_rate_are_another_arm(run, tmp_path, capsys):
    """Copies of a real run's run.json, one seed trained (as recorded) with another --optimizer.lr: its own arm,
    named by it (was: three seeds of one arm, or, at a seed the others have, refused as a copy). A lone arm is
    named as the sweep names its cells (was ``none``, also for a noisy-embedding arm)."""
    copies = seeded_copies(run, tmp_path, {"base": {}}, (1, 2, 3))
    other = json.loads((copies["base_s3"] / "run.json").read_text())
    (copies["base_s3"] / "run.json").write_text(
        json.dumps({**other, "settings": {**other["settings"], "optimizer.lr": 3e-4}})
    )
    for seed, dump in enumerate(copies.values(), start=1):  # tasks named in another order: the same settings
        tasks = ["t", "u"] if seed % 2 else ["u", "t"]
        write_evaluation(dump, 2, {"t": {"acc,none": seed / 10}, "u": {"acc,none": 0.5}}, {"tasks": tasks})
    code, _, err = evaluate("table", *copies.values(), "--select", "last", "--out", tmp_path / "t", capsys=capsys)
    rows = read_csv(tmp_path / "t" / "table.csv")
    assert code == 0 and {arm: row["seeds"] for arm, row in rows.items()} == {"lr=0.001": "2", "lr=0.0003": "1"}, err
    code, _, err = evaluate("table", copies["base_s1"], "--select", "last", "--out", tmp_path / "one", capsys=capsys)
    assert code == 0 and list(read_csv(tmp_path / "one" / "table.csv")) == ["baseline"], err


def test_table_groups_arms_selects_best_and_tests_against_scipy(fabricated, tmp_path, capsys):
    out = tmp_path / "table"
    code, stdout, _ = evaluate("table", *fabricated.values(), "--exclude-initial", "--out", out, capsys=capsys)
    assert code == 0
    rows = read_csv(out / "table.csv")
    base, disp = "variant=none, coeff=0.0", "variant=angular_spread, coeff=0.1"  # the settings that differ
    assert list(rows) == ["Pretrained", base, disp]  # step 0 of the arm without a dispersion loss heads the table
    best = {name: authors_best(name) for name in FABRICATED}
    assert best == {"base_s1": 3, "base_s2": 10, "disp_s1": 10, "disp_s2": 3}  # steps 5 and 0 score higher, unseen
    assert rows[base]["steps"] == "3;10" and rows[disp]["steps"] == "10;3"
    base_avg, disp_avg = averages(best, BASE_RUNS), averages(best, DISP_RUNS)
    # Student's t-test against the arm with a dispersion loss, the paper's Table 2 default.
    p = stats.ttest_ind(base_avg, disp_avg, equal_var=True).pvalue
    assert rows[disp]["reference"] == disp and rows[disp]["p_value"] == "" and rows[base]["test"] == "student"
    assert float(rows[base]["p_value"]) == pytest.approx(p, rel=1e-5)  # the CSV shows 6 significant digits
    assert p < 0.05 and rows[base]["significance"] == ("***" if p < 0.001 else "**" if p < 0.01 else "*")
    t_a = [FABRICATED[n][3][best[n]][0] for n in BASE_RUNS]
    assert float(rows[base]["t_a/acc_mean"]) == pytest.approx(sum(t_a) / 2)
    assert float(rows[base]["t_a/acc_std"]) == pytest.approx(stats.tstd(t_a))
    assert float(rows[disp]["average_mean"]) == pytest.approx(sum(disp_avg) / 2)
    assert float(rows[disp]["t_ppl/word_perplexity_mean"]) == pytest.approx((430.0 + 470.0) / 2)
    pretrained = [FABRICATED[n][3][0] for n in BASE_RUNS]  # (t_a, t_b, t_ppl) at step 0
    means = {  # the accuracy columns' means (perplexity is not ranked), the Pretrained row ranked too
        "Pretrained": [sum(p[i] for p in pretrained) / 2 for i in (0, 1)],
        **{
            arm: [sum(FABRICATED[n][3][best[n]][i] for n in names) / 2 for i in (0, 1)]
            for arm, names in ((base, BASE_RUNS), (disp, DISP_RUNS))
        },
    }
    assert (
        {arm: float(rows[arm]["avg_rank"]) for arm in rows}
        == by_hand_min_ranks(means)
        == {
            "Pretrained": 3.0,
            base: 2.0,
            disp: 1.0,
        }
    )
    pretrained_avg = [sum(p[:2]) / 2 for p in pretrained]
    assert rows["Pretrained"]["steps"] == "0;0"  # tested against the reference like the arms
    p_pre = stats.ttest_ind(pretrained_avg, disp_avg, equal_var=True).pvalue
    assert float(rows["Pretrained"]["p_value"]) == pytest.approx(p_pre, rel=1e-5)
    assert float(rows["Pretrained"]["t_a/acc_mean"]) == pytest.approx((0.30 + 0.31) / 2)
    assert float(rows["Pretrained"]["average_mean"]) == pytest.approx((0.35 + 0.36) / 2)
    for arm, names in ((base, BASE_RUNS), (disp, DISP_RUNS)):  # each arm's difference from the Pretrained row
        for index, column in enumerate(("t_a/acc", "t_b/acc", "t_ppl/word_perplexity")):
            chosen = [FABRICATED[n][3][best[n]][index] for n in names]
            assert float(rows[arm][f"{column}_diff"]) == pytest.approx(
                sum(chosen) / 2 - sum(p[index] for p in pretrained) / 2
            )
        assert float(rows[arm]["average_diff"]) == pytest.approx(
            sum(averages(best, names)) / 2 - sum(sum(p[:2]) / 2 for p in pretrained) / 2
        )
    assert float(rows[disp]["average_diff"]) == pytest.approx(0.47 - 0.355)  # by hand
    table_md = (out / "table.md").read_text()
    assert table_md == stdout.split("written:")[0].rstrip("\n") + "\n"
    assert f"| {disp} | 2 | 0.4250 ± 0.0212 |" in table_md and f"p vs {disp}" in table_md
    assert (
        "Student's t-test" in table_md and "its runs train with angular_spread, the paper's reference row" in table_md
    )
    assert "Pretrained included; ties share the smallest, on the means rounded to the 4 digits printed" in table_md
    assert "and the last; per seed" in table_md  # --exclude-initial: step 0 no candidate
    assert (
        "Difference from Pretrained" in table_md and f"| {disp} | +0.1200 | +0.1100 | -440.00 | +0.1150 |" in table_md
    )
    png = (out / "table.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10000

    # By default step 0 is a candidate where evaluated (the authors' --eval_at_begin); Welch's test; another
    # reference.
    code, _, _ = evaluate(
        "table",
        *fabricated.values(),
        "--test",
        "welch",
        "--reference",
        base,
        "--out",
        tmp_path / "initial",
        capsys=capsys,
    )
    rows = read_csv(tmp_path / "initial" / "table.csv")
    best = {name: authors_best(name, include_initial=True) for name in FABRICATED}
    assert code == 0 and best["disp_s2"] == 0 and rows[disp]["steps"] == f"{best['disp_s1']};0"
    p = stats.ttest_ind(averages(best, DISP_RUNS), averages(best, BASE_RUNS), equal_var=False).pvalue
    assert float(rows[disp]["p_value"]) == pytest.approx(p, rel=1e-5) and rows[base]["p_value"] == ""
    assert rows[disp]["test"] == "welch" and "given with --reference" in (tmp_path / "initial" / "table.md").read_text()
    assert "and the last, and step 0 where evaluated" in (tmp_path / "initial" / "table.md").read_text()

    # Other selections, explicit arms.
    code, _, _ = evaluate(
        "table",
        f"B={fabricated['base_s1']},{fabricated['base_s2']}",
        f"D={fabricated['disp_s1']},{fabricated['disp_s2']}",
        "--select",
        "last",
        "--out",
        tmp_path / "last",
        capsys=capsys,
    )
    rows = read_csv(tmp_path / "last" / "table.csv")
    last = {name: 10 for name in FABRICATED}
    p = stats.ttest_ind(averages(last, BASE_RUNS), averages(last, DISP_RUNS), equal_var=True).pvalue
    assert code == 0 and list(rows) == ["Pretrained", "B", "D"] and rows["B"]["steps"] == "10;10"
    assert float(rows["B"]["p_value"]) == pytest.approx(p, rel=1e-5) and rows["D"]["p_value"] == ""
    code, _, _ = evaluate("table", *fabricated.values(), "--select", "step:5", "--out", tmp_path / "s5", capsys=capsys)
    assert code == 0 and {r["steps"] for r in read_csv(tmp_path / "s5" / "table.csv").values()} == {"0;0", "5;5"}
    # Named and grouped arms mixed keep the command line's order; one group is named as the sweep's cells.
    code, _, _ = evaluate(
        "table",
        f"D={fabricated['disp_s1']},{fabricated['disp_s2']}",
        fabricated["base_s1"],
        fabricated["base_s2"],
        "--out",
        tmp_path / "mixed",
        capsys=capsys,
    )
    rows = read_csv(tmp_path / "mixed" / "table.csv")
    assert code == 0 and list(rows) == ["Pretrained", "D", "baseline"] and rows["baseline"]["reference"] == "D"
    # The reference is the angular_spread arm by its variant, not the first arm with a dispersion loss.
    for name in BASE_RUNS:
        shutil.copytree(fabricated[name], tmp_path / f"l2_{name}")
        metadata = json.loads((tmp_path / f"l2_{name}" / "run.json").read_text())
        metadata["dispersion"] = {"variant": "l2_repel", "coeff": 0.1, "tau": 1.0}
        (tmp_path / f"l2_{name}" / "run.json").write_text(json.dumps(metadata))
    code, _, err = evaluate(
        "table",
        f"L={tmp_path / 'l2_base_s1'},{tmp_path / 'l2_base_s2'}",
        f"D={fabricated['disp_s1']},{fabricated['disp_s2']}",
        "--out",
        tmp_path / "by_name",
        capsys=capsys,
    )
    assert code == 0, err
    assert {row["reference"] for row in read_csv(tmp_path / "by_name" / "table.csv").values()} == {"D"}


def test_from_scratch_arms_take_the_best_step_of_the_seed_averaged_curve(tmp_path, capsys):
    """From-scratch runs: one step per arm, best on the seed-averaged curve, as the authors' pre-training
    plot_results.py, among the steps their pretrain_toy_gpt2.py evaluates (--num_ckpt 2 by default:
    every 10 // 2 + 1 = 6 steps and the last, so step 10 here); --best-step per-seed chooses per seed;
    the Pretrained row from named runs, or none."""
    runs = fabricate(tmp_path, start=FROM_SCRATCH)
    code, _, err = evaluate("table", *runs.values(), "--out", tmp_path / "k2", capsys=capsys)
    assert code == 0, err
    assert {row["steps"] for row in read_csv(tmp_path / "k2" / "table.csv").values()} == {"10;10"}
    code, _, err = evaluate("table", *runs.values(), "--num-ckpt", "5", "--out", tmp_path / "avg", capsys=capsys)
    assert code == 0, err
    rows = read_csv(tmp_path / "avg" / "table.csv")
    base, disp = "variant=none, coeff=0.0", "variant=angular_spread, coeff=0.1"
    assert list(rows) == [base, disp]  # step 0 of a from-scratch run is no pretrained model
    assert (
        "No Pretrained row: variant=none, coeff=0.0 trains from scratch" in (tmp_path / "avg" / "table.md").read_text()
    )
    assert (authors_averaged_best(BASE_RUNS), authors_averaged_best(DISP_RUNS)) == (10, 3)  # by hand: .4025, .4625
    assert rows[base]["steps"] == "10;10" and rows[disp]["steps"] == "3;3"
    averaged = {**dict.fromkeys(BASE_RUNS, 10), **dict.fromkeys(DISP_RUNS, 3)}
    assert float(rows[disp]["average_mean"]) == pytest.approx(sum(averages(averaged, DISP_RUNS)) / 2)
    p = stats.ttest_ind(averages(averaged, BASE_RUNS), averages(averaged, DISP_RUNS), equal_var=True).pvalue
    assert float(rows[base]["p_value"]) == pytest.approx(p, rel=1e-5)
    code, _, _ = evaluate(
        "table",
        *runs.values(),
        "--best-step",
        "per-seed",
        "--pretrained",
        "none",
        "--num-ckpt",
        "5",
        "--exclude-initial",
        "--out",
        tmp_path / "per_seed",
        capsys=capsys,
    )
    rows = read_csv(tmp_path / "per_seed" / "table.csv")
    assert code == 0 and list(rows) == [base, disp] and rows[disp]["average_diff"] == ""
    assert rows[base]["steps"] == "3;10" and rows[disp]["steps"] == "10;3"  # authors_best, per seed
    code, _, _ = evaluate(
        "table",
        f"D={runs['disp_s1']},{runs['disp_s2']}",
        "--pretrained",
        str(runs["disp_s2"]),
        "--num-ckpt",
        "5",
        "--exclude-initial",
        "--out",
        tmp_path / "named",
        capsys=capsys,
    )
    rows = read_csv(tmp_path / "named" / "table.csv")
    assert code == 0 and rows["Pretrained"]["runs"] == str(runs["disp_s2"])
    assert rows["D"]["steps"] == "3;3" and float(rows["D"]["t_a/acc_diff"]) == pytest.approx((0.40 + 0.44) / 2 - 0.50)
    shutil.rmtree(runs["disp_s1"] / "evaluation" / "step-3")
    assert_one_line_error(
        *evaluate("table", *runs.values(), "--num-ckpt", "5", "--out", tmp_path / "bad", capsys=capsys)[::2],
        f"{runs['disp_s1']} has no evaluation of step",
        "seed-averaged curve",
        "--best-step per-seed",
    )
    shutil.rmtree(runs["disp_s1"] / "evaluation" / "step-0")
    assert_one_line_error(
        *evaluate(
            "table",
            *runs.values(),
            "--pretrained",
            str(runs["disp_s1"]),
            "--best-step",
            "per-seed",
            "--out",
            tmp_path / "bad",
            capsys=capsys,
        )[::2],
        f"--pretrained: {runs['disp_s1']} has no evaluation of step 0 (have [5, 10])",
    )
    assert not (tmp_path / "bad").exists()


def test_seeds_that_score_alike_give_no_false_p_value(fabricated, tmp_path, capsys, recwarn):
    """A step where each arm's seeds score alike: no spread on either side, no p (scipy said 0, ``***``); one
    side's spread, scipy's p without its "precision loss" warning for the other, exact, side."""
    scores = {"base_s1": (0.3, 0.3), "base_s2": (0.3, 0.3), "disp_s1": (0.4, 0.4), "disp_s2": (0.4, 0.5)}
    for name, (alike, spread) in scores.items():
        for step, acc in ((7, alike), (8, spread)):
            results = {"t_a": {"acc,none": acc}, "t_b": {"acc,none": acc}, "t_ppl": {"word_perplexity,none": 9.0}}
            write_evaluation(fabricated[name], step, results, SETTINGS)
    base = "variant=none, coeff=0.0"
    for step, p in ((7, ""), (8, 2 * stats.t.sf(3, 2))):  # Student's t = 0.15 / 0.05 over 2 degrees of freedom
        out = tmp_path / f"step-{step}"
        code, _, err = evaluate("table", *fabricated.values(), "--select", f"step:{step}", "--out", out, capsys=capsys)
        assert code == 0, err
        row = read_csv(out / "table.csv")[base]
        assert row["p_value"] == "" if p == "" else float(row["p_value"]) == pytest.approx(p, rel=1e-5), row
    assert [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)] == []


def test_table_bad_input_fails_in_one_line(fabricated, tmp_path, capsys):
    out = tmp_path / "bad"
    runs = list(map(str, fabricated.values()))
    assert_one_line_error(
        *evaluate("table", *runs, "--select", "step:7", "--out", out, capsys=capsys)[::2],
        "--select",
        "no evaluation of step 7 (have [0, 3, 5, 10])",
    )
    assert_one_line_error(
        *evaluate("table", *runs, "--select", "first", "--out", out, capsys=capsys)[::2],
        "--select",
        "best, last or step:N",
    )
    assert_one_line_error(
        *evaluate("table", *runs, "--reference", "X", "--out", out, capsys=capsys)[::2],
        "--reference",
        "no arm 'X'",
        "have 'variant=none, coeff=0.0', 'variant=angular_spread",
    )
    assert_one_line_error(*evaluate("table", *runs, "--test", "z", "--out", out, capsys=capsys)[::2], "--test")
    for option in (("--num-ckpt", "3"), ("--best-step", "per-seed"), ("--exclude-initial",)):  # were ignored
        assert_one_line_error(
            *evaluate("table", *runs, "--select", "last", *option, "--out", out, capsys=capsys)[::2],
            f"{option[0]}: chooses among the steps of --select best, and --select is last; drop it",
        )
    assert_one_line_error(*evaluate("table", "--out", out, capsys=capsys)[::2], "RUN: no runs to tabulate")
    # the second was an arm named ' ' (a row without a label), the third ': no such folder', of ""
    for spec in (f"={runs[0]}", f" ={runs[0]}", f"a={runs[0]},,{runs[1]}"):
        assert_one_line_error(
            *evaluate("table", spec, "--out", out, capsys=capsys)[::2],
            f"{spec!r}: give [ARM=]RUN1,RUN2,..., a name before = and no empty run",
        )
    assert_one_line_error(
        *evaluate("table", f"Pretrained={runs[0]}", "--out", out, capsys=capsys)[::2],
        "arm 'Pretrained': named explicitly and also found by grouping (or named Pretrained, the table's own row)",
    )
    assert_one_line_error(
        *evaluate("table", *runs, runs[0], "--out", out, capsys=capsys)[::2],
        f"{runs[0]}: the same settings and seed as {runs[0]} (named twice, a copy or a rerun), not another seed",
    )
    copy = shutil.copytree(runs[0], tmp_path / "copy")  # cp -a: one seed, not two
    assert_one_line_error(
        *evaluate("table", *runs, str(copy), "--out", out, capsys=capsys)[::2],
        f"{copy}: the same settings and seed as {runs[0]} (named twice, a copy or a rerun), not another seed",
    )
    assert not out.exists() and tree(copy) == tree(Path(runs[0]))
    write_evaluation(tmp_path / "gone", 3, {"t_a": {"acc,none": 0.5}}, {"tasks": ["t_a"]})
    shutil.move(tmp_path / "gone" / "evaluation", tmp_path / "kept")  # an evaluation --out elsewhere, its run since
    shutil.rmtree(tmp_path / "gone")  # removed (was: 'GONE/run.json: missing; it is written by … train at start')
    assert_one_line_error(
        *evaluate("table", *runs, str(tmp_path / "kept"), "--out", out, capsys=capsys)[::2],
        f"{tmp_path / 'kept'}: the evaluation of {tmp_path / 'gone'}, which is gone",
    )
    assert_one_line_error(*evaluate("table", str(tmp_path), "--out", out, capsys=capsys)[::2], "no evaluations")
    assert_one_line_error(
        *evaluate("table", str(tmp_path / "absent"), "--out", out, capsys=capsys)[::2],
        f"{tmp_path / 'absent'}: no such folder",
    )
    # A score edited by hand into NaN, text or true (was: a nan cell, or true averaged as 1.0, exit 0).
    edited = fabricated["disp_s1"] / "evaluation" / "step-3" / "results.json"
    kept = edited.read_text()
    for value, shown in ((float("nan"), "nan"), ("x", "'x'"), (True, "True")):
        result = json.loads(kept)
        result["results"]["t_a"]["acc,none"] = value
        edited.write_text(json.dumps(result))
        assert_one_line_error(
            *evaluate("table", *runs, "--out", out, capsys=capsys)[::2],
            f"{edited}: unreadable (results.t_a.acc,none: {shown} is no finite number); restore it, or remove it "
            "and rerun",
        )
    shutil.copy(fabricated["disp_s1"] / "evaluation" / "step-0" / "results.json", edited)  # (was: read as step 3's)
    assert_one_line_error(
        *evaluate("table", *runs, "--out", out, capsys=capsys)[::2],
        f"{edited}: holds the result of step 0, not of step 3; move it back, or remove it and rerun",
    )
    edited.write_text(kept)
    # A table into a folder another live command writes: refused, naming it.
    busy = tmp_path / "busy"
    with held_by_another_command(busy) as holder:
        assert_one_line_error(
            *evaluate("table", *runs, "--out", busy, capsys=capsys)[::2],
            f"{busy}: another command is writing here (PID {holder} on {socket.gethostname()}, ",
            "use another --out",
        )
        assert sorted(os.listdir(busy)) == [LOCK_NAME]
    # Results of other settings: across runs, and among the steps --select best weighs in one run.
    for step in (0, 3, 5, 10):
        other = read_json(fabricated["disp_s2"] / "evaluation" / f"step-{step}" / "results.json")
        other["dispersion_titan"]["settings"] = {**SETTINGS, "limit": 100}
        (fabricated["disp_s2"] / "evaluation" / f"step-{step}" / "results.json").write_text(json.dumps(other))
    assert_one_line_error(
        *evaluate("table", *runs, "--out", out, capsys=capsys)[::2], "other settings", "limit 500 vs 100"
    )
    (fabricated["disp_s2"] / "evaluation" / "step-10" / "results.json").write_text(
        json.dumps({**other, "dispersion_titan": {**other["dispersion_titan"], "settings": SETTINGS, "step": 10}})
    )
    assert_one_line_error(
        *evaluate("table", *runs, "--out", out, capsys=capsys)[::2],
        f"{fabricated['disp_s2'] / 'evaluation'} step 10 was evaluated with other settings than "
        f"{fabricated['disp_s2'] / 'evaluation'} step 0 (limit 100 vs 500); --select best weighs them together",
    )
    for step in (0, 3, 10):  # none of the steps the authors evaluate left (step 0: a candidate where evaluated)
        shutil.rmtree(fabricated["base_s2"] / "evaluation" / f"step-{step}")
    assert_one_line_error(
        *evaluate("table", *runs, "--out", out, capsys=capsys)[::2],
        "--select best",
        "no evaluation of the steps the authors evaluate",
        "([0, 3, 6, 9, 10]; have [5])",
    )
    assert not out.exists()
    # Evaluations of perplexity tasks only: no accuracy to average or to pick a step by.
    for path in tmp_path.glob("*/evaluation/step-*/results.json"):
        result = read_json(path)
        result["results"] = {"t_ppl": result["results"]["t_ppl"]}
        path.write_text(json.dumps(result))
    for select, said in (
        ("best", "has evaluations without accuracy scores"),
        ("last", "the evaluations have no accuracy scores to tabulate"),
    ):
        assert_one_line_error(*evaluate("table", *runs, "--select", select, "--out", out, capsys=capsys)[::2], said)
    assert not out.exists()


def test_table_arms_and_runs_given_oddly(fabricated, tmp_path, capsys):
    """A run folder whose name holds '=' or ',' is a run (was split: `1e-3_s2: no such folder`); one arm named in two
    specs is refused (was: merged into one arm, its seeds of two configurations weighed together, exit 0); an empty
    --pretrained (an unset $VAR) names the option (was `: no such folder`), and one naming a run twice is refused."""
    base, disp = [str(fabricated[n]) for n in BASE_RUNS], [str(fabricated[n]) for n in DISP_RUNS]
    odd = tmp_path / "lr=1e-3, s2"
    shutil.move(disp[1], odd)
    out = tmp_path / "out"
    code, text, _ = evaluate("table", *base, disp[0], str(odd), "--out", out, capsys=capsys)
    assert code == 0 and read_csv(out / "table.csv")["variant=angular_spread, coeff=0.1"]["seeds"] == "2", text
    twice = tmp_path / "twice"
    assert_one_line_error(
        *evaluate("table", f"a={base[0]},{base[1]}", f"a={disp[0]}", "--out", twice, capsys=capsys)[::2],
        "arm 'a': named twice; give its runs once (a=RUN1,RUN2,...), or rename one",
    )
    for spec in ("", f"{base[0]},"):
        assert_one_line_error(
            *evaluate("table", *base, "--pretrained", spec, "--out", twice, capsys=capsys)[::2],
            f"--pretrained: {spec!r}: give auto, none or RUN1,RUN2,..., no empty run",
        )
    os.symlink(base[0], tmp_path / "link")  # one result as the Pretrained row's two seeds (was: its std 0, exit 0)
    for spec in (f"{base[0]},{base[0]}/evaluation", f"{base[0]},{tmp_path / 'link'}"):
        assert_one_line_error(
            *evaluate("table", *base, "--pretrained", spec, "--out", twice, capsys=capsys)[::2],
            f"--pretrained: {spec!r} names {base[0]}/evaluation twice (a link, or a run and its evaluation)",
        )
    assert not twice.exists()
