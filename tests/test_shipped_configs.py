"""The shipped training configs carry the authors' hyper-parameters where they say so:
values recomputed here the way the authors' scripts compute them (Hugging Face's
``warmup_ratio``, the token budget, LMEvalCallback's cadence), and every comment that
credits the authors names a file of their repository. Parsing only: no process starts."""

from __future__ import annotations

import math
import re

import pytest
import tomllib

from dispersion_titan.evaluation.table import authors_steps
from support.launch import REPO

CONFIGS = REPO / "train_configs"
PAPER = CONFIGS / "paper"
"""Configs that reproduce a released run; ``train_configs/*.toml`` are ours."""
MIDTRAIN = sorted(PAPER.glob("midtrain_*.toml"))
FIG3 = sorted(PAPER.glob("fig3_*.toml"))
FROM_SCRATCH_DISPERSION = sorted(CONFIGS.glob("gpt2_small_mlp*_angular_spread.toml"))
AUTHORS_FILE = r"(lm_dispersion/[\w/]+\.py|Readme\.md)"


def load(path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def authors_cadence(max_steps: int, num_ckpt: int = 5) -> set[int]:
    """Where the authors' LMEvalCallback evaluates: on_step_end at every multiple of
    max_steps // num_ckpt + 1, and on_train_end."""
    every = max_steps // num_ckpt + 1
    return {step for step in range(1, max_steps + 1) if step % every == 0} | {max_steps}


def test_midtraining_configs_match_the_authors_scripts():
    assert len(MIDTRAIN) == 6
    for path in MIDTRAIN:
        c = load(path)
        t, steps = c["training"], c["training"]["steps"]
        qwen3 = c["model"]["name"] == "qwen3_dispersion"
        assert t["seq_len"] == (4096 if qwen3 else 1024), path.name
        assert steps == math.ceil(200_000_000 / (t["global_batch_size"] * t["seq_len"])), path.name
        # Hugging Face's TrainingArguments(warmup_ratio=0.2): ceil(0.2 * max_steps) warm-up steps
        assert c["lr_scheduler"]["warmup_steps"] == math.ceil(0.2 * steps), path.name
        assert (c["lr_scheduler"]["decay_type"], c["lr_scheduler"]["min_lr_factor"]) == ("cosine", 0.0), path.name
        o = c["optimizer"]
        assert (o["lr"], o["beta1"], o["beta2"], o["weight_decay"], t["max_norm"]) == (5e-5, 0.9, 0.95, 0.1, 1.0)
        # Checkpoints where the authors evaluate: TorchTitan saves every `interval` steps and the last one.
        interval = c["checkpoint"]["interval"]
        assert set(range(interval, steps + 1, interval)) | {steps} == authors_cadence(steps) == authors_steps(steps)
        assert c["validation"]["freq"] == interval, path.name
        assert c["baseline"]["noise_alpha"] == (5.0 if qwen3 else 1.0), path.name  # NEFTune α
        # The authors' batches (Readme.md: 32 × 4 per GPU; midtrain_qwen3.py: 1 × 32 per GPU), on one GPU.
        assert t["global_batch_size"] == (32 if qwen3 else 128) and steps == 1526, path.name
        assert t["max_local_batch_size"] == (1 if qwen3 else 32), path.name
        assert o["decay_groups"] == "as_released", path.name  # the HF Trainer's; active forgetting's own
        dropout = {k: c["model"].get(k) for k in ("attn_dropout", "resid_dropout", "embd_dropout")}
        assert dropout == {k: None if qwen3 else 0.1 for k in dropout}, path.name  # HF GPT-2's config
        assert c["baseline"]["forget_every"] < steps, path.name  # active forgetting resets within the run
        d = c["dispersion"]
        assert (d["layers"], d["points"]) == ("all", "hidden_states"), path.name  # hidden_states[1:]
        if d["variant"] != "none":
            assert (d["variant"], d["coeff"], d["tau"]) == ("angular_spread", 0.1, 1.0), path.name
            assert d["clamp"] == (0.25 if qwen3 else 0.1), path.name  # Qwen3: DispersionLoss's default
            assert d["max_tokens"] == 256, path.name  # DispersionLoss's subsampling


def test_fig3_preset_is_the_from_scratch_scripts_defaults():
    """pretrain_toy_gpt2.py: 16 × 8 sequences of 1024 per GPU, lr 1e-5 (× √GPUs), warmup_ratio 0.2,
    num_ckpt 2, codelion/fineweb-edu-1B, HF GPT-2's dropout, DispersionLoss's defaults, λ 1."""
    assert [p.name for p in FIG3] == ["fig3_gpt2_small.toml", "fig3_gpt2_small_angular_spread.toml"]
    for path in FIG3:
        c = load(path)
        t, o, d, steps = c["training"], c["optimizer"], c["dispersion"], c["training"]["steps"]
        assert (t["global_batch_size"], t["max_local_batch_size"], t["seq_len"]) == (128, 16, 1024), path.name
        assert (o["lr"], o["decay_groups"], t["dataset"], c["validation"]["dataset"]) == (
            1e-5,
            "hf",
            "fineweb-edu-1B",
            "fineweb-edu-1B",
        ), path.name
        assert c["lr_scheduler"]["warmup_steps"] == math.ceil(0.2 * steps), path.name
        assert c["checkpoint"]["interval"] == steps // 2 + 1 == c["validation"]["freq"], path.name
        assert all(c["model"][k] == 0.1 for k in ("attn_dropout", "resid_dropout", "embd_dropout")), path.name
        assert (d["layers"], d["points"]) == ("all", "hidden_states"), path.name
        if d["variant"] != "none":
            assert (d["variant"], d["coeff"], d["tau"], d["clamp"], d["max_tokens"]) == (
                "angular_spread",
                1.0,
                1.0,
                0.25,
                256,
            ), path.name


def test_paper_configs_run_as_the_released_code():
    """Every paper config replicates parameters (DDP under autocast, as the authors' accelerate launch),
    scales the loss as their Trainer, scores seq_len − 1 predictions and schedules as transformers;
    our configs keep FSDP and the exact mean."""
    for path in [*MIDTRAIN, *FIG3]:
        c = load(path)
        p, t = c["parallelism"], c["training"]
        assert (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]) == (-1, 1), path.name
        assert (t["loss_scale"], t["predict_last"], c["lr_scheduler"]["form"]) == (
            "as_released",
            False,
            "as_released",
        ), path.name
    for path in CONFIGS.glob("*.toml"):
        c = load(path)
        assert c.get("parallelism", {}).get("data_parallel_replicate_degree", 1) == 1, path.name
        assert "loss_scale" not in c.get("training", {}) and "form" not in c.get("lr_scheduler", {}), path.name


def test_from_scratch_configs_use_the_authors_clamp():
    assert len(FROM_SCRATCH_DISPERSION) == 4
    for path in FROM_SCRATCH_DISPERSION:
        assert load(path)["dispersion"]["clamp"] == 0.25, path.name  # pretrain_toy_gpt2.py passes no clamp
    fineweb_mlp = sorted(CONFIGS.glob("fineweb_gpt2_mlp*.toml"))
    assert len(fineweb_mlp) == 4
    for path in fineweb_mlp:
        c = load(path)
        assert c["lr_scheduler"]["warmup_steps"] == math.ceil(0.2 * c["training"]["steps"]), path.name


def test_our_configs_keep_the_exact_loss():
    """Outside train_configs/paper/, every dispersion term uses every position."""
    for path in sorted(CONFIGS.glob("*.toml")):
        assert load(path).get("dispersion", {}).get("max_tokens", 0) == 0, path.name


def test_each_paper_config_names_the_script_it_follows():
    assert MIDTRAIN and FIG3 and set(PAPER.glob("*.toml")) == set(MIDTRAIN) | set(FIG3)
    for path in PAPER.glob("*.toml"):
        first = path.read_text().splitlines()[0]
        assert re.match(r"# Reproduces a released run: follows lm_dispersion/[\w/]+\.py", first), path.name
    assert not list(CONFIGS.glob("midtrain_*.toml"))  # every mid-training config is the authors'


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.toml")), ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_every_credit_to_the_authors_names_their_file(path):
    """A comment that credits the authors names the file of theirs that holds the value."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        comment = line.partition("#")[2]
        if 'authors: FILE"' in comment:  # the header's legend
            continue
        for credit in re.findall(r"authors: (\S+)", comment):
            assert re.fullmatch(AUTHORS_FILE, credit.rstrip(",;)")), (path.name, number, credit)
        if "authors" in comment:
            assert re.search(AUTHORS_FILE + "|github.com/ChenLiu-1996/LM-Dispersion", comment), (path.name, number)


def test_gpu_configs_run_the_fast_path():
    """Compiled blocks and loss, fused AdamW, bf16 compute; from scratch, GPT-2's vocabulary padded
    to a multiple of 64; micro-batches sized for an 80 GB GPU (bench/h100_model.py --fast-path)."""
    gpu = sorted(p for p in CONFIGS.rglob("*.toml") if p.name.startswith(("gpt2_small_", "fineweb_gpt2_", "midtrain_")))
    assert len(gpu) == 18
    for path in gpu:
        c = load(path)
        assert c["compile"]["enable"] and c["compile"]["components"] == ["model", "loss"], path.name
        assert c["optimizer"]["implementation"] == "fused", path.name
        assert c["training"]["mixed_precision_param"] == "bfloat16", path.name
        gpt2 = c["model"]["name"] == "gpt2"
        if gpt2 and not path.name.startswith("midtrain_"):  # mid-training keeps OpenAI's 50,257 rows
            assert c["model"]["vocab_size"] == 50304, path.name
        # Qwen3's paper configs: the authors' one sequence per micro-batch (their token subsets are per call)
        assert c["training"]["max_local_batch_size"] == (32 if gpt2 else 1), path.name
