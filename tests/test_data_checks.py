"""Data errors before launch (the real CLI), the validation pass and its metrics, and the
shipped configs."""

from __future__ import annotations

import glob
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from dispersion_titan.data.packed import PackedSequenceDataset, token_stream
from support.corpora import texts, wikitext_saved_dir, write_parquet
from support.launch import REPO, python_module, torchrun
from support.runs import scalars

pytestmark = pytest.mark.usefixtures("private_caches")

SEQ = 16


def cli_error(tmp_path: Path, *overrides: str) -> str:
    """The one error line of the real command."""
    dump = tmp_path / "dump"
    proc = python_module(
        "dispersion_titan.train",
        "--job.config_file",
        str(REPO / "train_configs" / "debug.toml"),
        "--job.dump_folder",
        str(dump),
        *overrides,
    )
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
    line = cli_error(
        tmp_path, "--training.dataset", "wikitext-103", "--training.dataset_path", str(tmp_path / "no_copy_here")
    )
    assert line.startswith("dispersion_titan: error: training.dataset_path: no file matches")
    line = cli_error(tmp_path, "--training.dataset", "local", "--training.dataset_path", str(tmp_path / "empty.jsonl"))
    assert "training.dataset_path:" in line and "is empty" in line
    line = cli_error(
        tmp_path, "--validation.dataset", "wikitext-103", "--validation.dataset_path", str(tmp_path / "empty_dir")
    )
    assert "validation.dataset_path:" in line and "empty directory" in line


@pytest.mark.slow
def test_offline_hub_dataset_without_copy_fails_before_launch_and_plans(tmp_path, monkeypatch):
    """The launch's own checks, in this process with the hub offline as datasets reads it (HF_HUB_OFFLINE,
    read at import into ``datasets.config``; a fresh interpreter cost 8-14 s): a streamed hub corpus
    without a local copy is refused in one line, before any folder is made. The config's own checks, which
    ``plan`` and the dry runs make for a cluster's machines, pass."""
    import datasets.config

    from dispersion_titan.job_config.parse import validated_args
    from dispersion_titan.job_config.titan_checks import check_runs_here
    from dispersion_titan.utils.errors import ConfigError

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    dump = tmp_path / "dump"
    args = ["--job.config_file", str(REPO / "train_configs" / "debug.toml"), "--job.dump_folder", str(dump)]
    for dataset, named in (
        ("fineweb-edu", "HuggingFaceFW/fineweb-edu (sample-10BT) is"),
        ("fineweb-edu-1B", "codelion/fineweb-edu-1B is"),
    ):
        config = validated_args(
            [*args, "--job.custom_config_module", "dispersion_titan.config", "--training.dataset", dataset]
        )
        with pytest.raises(ConfigError) as err:
            check_runs_here(config)
        line = str(err.value)
        assert line.startswith("training.dataset_path: the Hugging Face hub is offline") and "\n" not in line
        assert f"and {named} not in the datasets cache; set training.dataset_path to a local copy" in line, line
    assert not dump.exists()


# ---------------------------------------------------------------- validation metrics


def test_validation_pass_gives_every_rank_the_same_number_of_batches():
    """TorchTitan's validator runs collectives per batch: uneven counts would hang it."""
    tokens = np.arange(13 * SEQ + 1, dtype=np.uint16)  # 13 sequences; 3 ranks × 2 = 6 per round
    passes = [list(PackedSequenceDataset(tokens, SEQ, 2, r, 3, train=False)) for r in range(3)]
    assert [len(p) for p in passes] == [6, 6, 6]
    real = sorted(int(x["input"][0]) for p in passes for x, y in p if (y != -100).all())
    assert real == [g * SEQ for g in range(13)]  # every sequence exactly once, in the global order
    assert sum(int((y == -100).all()) for p in passes for _, y in p) == 5  # the rest is ignored padding


@pytest.mark.slow
def test_validation_loss_and_perplexity_reach_tensorboard(tmp_path):
    """2 ranks over a whole held-out split whose last global batch is partial: the logged
    loss is the mean over global batches of their token-mean cross-entropy, recomputed
    here from the step-1 checkpoint, and the perplexity is its exponential."""
    from dispersion_titan.run_folder.checkpoints import load_model, load_model_args

    held_out = tmp_path / "validation.jsonl"
    held_out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40, seed=11, max_words=120)))
    run = tmp_path / "run"
    torchrun(
        run,
        2,
        "--training.steps",
        "1",
        "--validation.freq",
        "1",
        "--validation.steps",
        "-1",
        "--validation.dataset",
        "local",
        "--validation.dataset_path",
        str(held_out),
    )
    s = scalars(run)
    assert sorted(s["validation_metrics/loss"]) == [1]
    loss = s["validation_metrics/loss"][1]
    assert s["validation_metrics/perplexity"][1] == pytest.approx(math.exp(loss), rel=1e-5)
    model = load_model(str(run / "checkpoint" / "step-1"), load_model_args(str(run / "checkpoint")))
    tokens = torch.from_numpy(token_stream("local", "validation", str(held_out), "validation.dataset").astype(np.int64))
    seq, global_batch = 128, 8  # debug.toml: seq_len 128, validation batches of training's global batch
    n = (len(tokens) - 1) // seq
    assert n > global_batch and n % global_batch  # several batches, the last one partial
    inputs, labels = tokens[: n * seq].view(n, seq), tokens[1 : n * seq + 1].view(n, seq)
    with torch.no_grad():
        per_batch = [
            torch.nn.functional.cross_entropy(
                model(inputs[i : i + global_batch]).flatten(0, 1), labels[i : i + global_batch].flatten()
            )
            for i in range(0, n, global_batch)
        ]
    assert loss == pytest.approx(torch.stack(per_batch).mean().item(), rel=1e-5)


# ---------------------------------------------------------------- shipped configs


def test_every_shipped_config_passes_the_checks(tmp_path):
    """In-process, never contacting the hub: hub datasets point at local copies."""
    from dispersion_titan.job_config.parse import validated_args

    wikitext = str(wikitext_saved_dir(tmp_path))
    fineweb = str(Path(write_parquet(tmp_path / "fineweb", texts(3, seed=1), files=1)[0]).parent)
    copies = {"wikitext-103": wikitext, "fineweb-edu": fineweb, "fineweb-edu-1B": fineweb}
    configs = sorted(glob.glob(str(REPO / "train_configs" / "**" / "*.toml"), recursive=True))
    assert {"midtrain_gpt2_wikitext103_dispersion.toml", "midtrain_gpt2_wikitext103_baseline.toml"} <= {
        os.path.basename(c) for c in configs
    }
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
        job = validated_args(
            ["--job.config_file", config, "--job.custom_config_module", "dispersion_titan.config", *overrides]
        )
        if os.path.basename(config).startswith(("midtrain_", "fineweb_")):
            assert job.checkpoint.save_initial and job.checkpoint.keep_latest_k == 0, config
            assert job.validation.enable, config
