"""The shipped training configs carry the authors' hyper-parameters where they say so:
values recomputed here the way the authors' scripts compute them on N GPUs (Hugging Face's
``warmup_ratio``, the token budget, LMEvalCallback's cadence), and every comment that
credits the authors names a file of their repository. Parsing only: no process starts."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import tomllib

from dispersion_titan.evaluation.table import authors_steps
from dispersion_titan.job_config import released
from dispersion_titan.job_config.parse import setup_torchtitan, validated_args
from dispersion_titan.reproduce.paper import catalog
from dispersion_titan.utils.errors import ConfigError, docs_page
from support.launch import REPO

setup_torchtitan()
CONFIG_MODULE = ("--job.custom_config_module", "dispersion_titan.config")

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


def authors_layout(b: int, accumulation: int, tokens: int, lr: float, num_ckpt: int, seq_len: int, gpus: int) -> dict:
    """What the authors' scripts compute from their arguments on ``gpus`` GPUs (midtrain_gpt2.py's
    tokens_per_step, max_steps, learning_rate, log_every_n_steps; TrainingArguments' warmup_ratio 0.2)."""
    max_steps = math.ceil(tokens / (b * seq_len * accumulation * gpus))
    return {
        "global_batch_size": b * accumulation * gpus,
        "steps": max_steps,
        "lr": lr * math.sqrt(gpus),
        "warmup_steps": math.ceil(max_steps * 0.2),
        "every": max_steps // num_ckpt + 1,
    }


def derived(path, gpus: int, *overrides: str) -> dict:
    """The layout a launch of ``path`` on ``gpus`` ranks trains (``[released]``, as the launch checks derive it)."""
    c = validated_args(["--job.config_file", str(path), *CONFIG_MODULE, *overrides], gpus)
    return {
        "global_batch_size": c.training.global_batch_size,
        "steps": c.training.steps,
        "lr": c.optimizer.lr,
        "warmup_steps": c.lr_scheduler.warmup_steps,
        "every": c.checkpoint.interval,
        "validation_every": c.validation.freq,
        "micro_batch": c.training.local_batch_size,
    }


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_paper_configs_train_the_authors_run_on_n_gpus(gpus):
    """GPT-2 mid-training 32 × 4 per GPU, 200M tokens, lr 5e-5 (Readme.md); Qwen3 1 × 32 per GPU of 4096
    tokens, lr 5e-5 (midtrain_qwen3.py); Fig. 3 16 × 8 per GPU, lr 1e-5 (pretrain_toy_gpt2.py): on N GPUs
    N times one GPU's batch, with the steps, lr, warm-up and cadence their scripts compute for N."""
    for path in [*MIDTRAIN, *FIG3]:
        qwen3, fig3 = "qwen3" in path.name, path.name.startswith("fig3")
        b, a, lr, seq_len = (1, 32, 5e-5, 4096) if qwen3 else (16, 8, 1e-5, 1024) if fig3 else (32, 4, 5e-5, 1024)
        tokens, num_ckpt = (2_500_000_000, 2) if fig3 else (200_000_000, 5)
        expected = authors_layout(b, a, tokens, lr, num_ckpt, seq_len, gpus)
        got = derived(path, gpus)
        assert got.pop("micro_batch") == b and got.pop("validation_every") == got["every"], path.name
        assert got == pytest.approx(expected, rel=1e-12), path.name
        # Checkpoints where the authors evaluate: TorchTitan saves every `interval` steps and the last one.
        steps, every = got["steps"], got["every"]
        assert set(range(every, steps + 1, every)) | {steps} == authors_cadence(steps, num_ckpt), path.name
        if not fig3:
            assert authors_cadence(steps) == authors_steps(steps), path.name
    assert derived(MIDTRAIN[0], 8)["steps"] == 191 and derived(MIDTRAIN[0], 8)["warmup_steps"] == 39  # their T, W


def test_a_paper_config_trains_another_gpu_counts_run_and_refuses_what_their_script_cannot():
    """``released.gpus = 8`` on 2 ranks trains the 8-GPU run (4 × the micro-batches per rank); a smaller
    micro-batch keeps the step; the keys [released] derives are refused by hand, and so are layouts
    their script has no form of."""
    gpt2 = PAPER / "midtrain_gpt2_wikitext103_dispersion.toml"
    eight = derived(gpt2, 8)
    assert derived(gpt2, 2, "--released.gpus", "8") == eight
    assert derived(gpt2, 8, "--training.max_local_batch_size", "8") == {**eight, "micro_batch": 8}
    refusals = {
        ("--training.steps", "100"): f"training.steps: set from [released] for the run's GPU count, as the "
        f"authors' script does ({docs_page('reproduction.md', 'A paper config on N GPUs')});",
        ("--optimizer.lr=1e-3",): "optimizer.lr: set from [released]",
        ("--training.global_batch_size", "32"): "training.global_batch_size: set from [released]",
        ("--released.gpus", "8", "--parallelism.data_parallel_replicate_degree", "3"): "released.gpus: the authors' "
        "8-GPU step of 1024 sequences cannot be split over 3 ranks",
        ("--parallelism.data_parallel_shard_degree", "-1", "--parallelism.data_parallel_replicate_degree", "1"): (
            "parallelism: the authors' script replicates the whole model on every GPU (DDP)"
        ),
    }
    for overrides, message in refusals.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            derived(gpt2, 3 if "3" in overrides else 2, *overrides)
    # Switched off, the config's own keys are the layout again.
    own = derived(gpt2, 2, "--released.per_device_train_batch_size", "0", "--training.steps", "7")
    assert (own["steps"], own["lr"]) == (7, 8e-4), own  # TorchTitan's default lr otherwise


def test_the_launch_says_the_warmup_each_schedule_takes():
    """transformers' W = ⌈0.2·T⌉ (TrainingArguments.get_warmup_steps), the authors' ActiveForgettingLRScheduler's
    ⌊0.2·T⌋ (midtrain_gpt2_other_counter_condensation.py): the [released] line says the one the run's body takes."""
    for name, warmup in (("baseline", math.ceil), ("active_forgetting", int)):
        c = validated_args(
            [*CONFIG_MODULE, "--job.config_file", str(PAPER / f"midtrain_gpt2_wikitext103_{name}.toml")], 1
        )
        assert f", warm-up {warmup(0.2 * c.training.steps)}, " in released.summary(c), name


VARIANTS = {  # a mid-training config's file name -> its dispersion loss, as the authors' --dispersion
    "dispersion": "angular_spread",
    "angular_spread": "angular_spread",
    "decorrelation": "decorrelation",
    "l2_repel": "l2_repel",
    "orthogonalization": "orthogonalization",
}
METHODS = {"neftune": "noisy_embedding", "active_forgetting": "active_forgetting"}


def test_every_table2_row_has_its_config_or_hub_model():
    """Table 2: per block the Pretrained row (a hub model) and the mid-trained rows, each a config here."""
    rows = [(row.block, row.label) for row in catalog.TABLE2_ROWS]
    assert len(rows) == len(set(rows)) == 19
    assert {row.config for row in catalog.TABLE2_ROWS if row.config} == {
        f"train_configs/paper/{p.name}" for p in MIDTRAIN
    }
    assert [row.model for row in catalog.TABLE2_ROWS if row.model] == [
        *catalog.GPT2_HUB_IDS,
        "Qwen/Qwen3-0.6B",
        "Qwen/Qwen3-1.7B",
    ]
    for row in catalog.TABLE2_ROWS:
        if row.config:
            c = load(REPO / row.config)
            arm = Path(row.config).stem.rsplit("wikitext103_", 1)[-1].rsplit("b_", 1)[-1]
            assert c["dispersion"]["variant"] == VARIANTS.get(arm, "none"), row
            assert c["baseline"]["method"] == METHODS.get(arm, "none"), row
            flavor = {"GPT2": "small", "GPT2-medium": "medium"}.get(row.block, row.block.removeprefix("Qwen3-"))
            assert c["model"]["flavor"] == flavor, row
    # table2 --plan: a block trained here scores its baseline's step 0; GPT2-large and -xl, the hub models
    pretrained = catalog.pretrained_rows()
    assert "and 6 Pretrained rows, no training (0 GPU-hours)" in pretrained
    assert pretrained.count("| --pretrained auto |") == 4
    for model in catalog.GPT2_HUB_IDS[2:]:
        assert f"| {model} | --pretrained hf:{model} |" in pretrained


def test_midtraining_configs_match_the_authors_scripts():
    assert len(MIDTRAIN) == 13
    for path in MIDTRAIN:
        c = load(path)
        t, o, r = c["training"], c["optimizer"], c["released"]
        qwen3 = c["model"]["name"] == "qwen3_dispersion"
        assert t["seq_len"] == (4096 if qwen3 else 1024), path.name
        assert (r["train_tokens"], r["lr"], r["warmup_ratio"], r["num_ckpt"]) == (200_000_000, 5e-5, 0.2, 5), path.name
        assert (r["per_device_train_batch_size"], r["gradient_accumulation_steps"]) == ((1, 32) if qwen3 else (32, 4))
        assert (c["lr_scheduler"]["decay_type"], c["lr_scheduler"]["min_lr_factor"]) == ("cosine", 0.0), path.name
        assert (o["beta1"], o["beta2"], o["weight_decay"], t["max_norm"]) == (0.9, 0.95, 0.1, 1.0)
        assert c["baseline"]["noise_alpha"] == (5.0 if qwen3 else 1.0), path.name  # NEFTune α
        assert o["decay_groups"] == "as_released", path.name  # the HF Trainer's; active forgetting's own
        dropout = {k: c["model"].get(k) for k in ("attn_dropout", "resid_dropout", "embd_dropout")}
        assert dropout == {k: None if qwen3 else 0.1 for k in dropout}, path.name  # HF GPT-2's config
        assert c["baseline"]["forget_every"] == 1000, path.name  # K: their default, fixed whatever T
        d = c["dispersion"]
        assert (d["layers"], d["points"]) == ("all", "hidden_states"), path.name  # hidden_states[1:]
        if d["variant"] != "none":
            assert (d["coeff"], d.get("tau", 1.0), d["precision"]) == (0.1, 1.0, "exact"), path.name  # fp32 as theirs
            assert d.get("clamp", 0.1) == (0.25 if qwen3 else 0.1), path.name  # Qwen3: DispersionLoss's default
            assert d["max_tokens"] == 256, path.name  # DispersionLoss's subsampling


def test_fig3_preset_is_the_from_scratch_scripts_defaults():
    """pretrain_toy_gpt2.py: 16 × 8 sequences of 1024 per GPU, lr 1e-5 (× √GPUs), warmup_ratio 0.2,
    num_ckpt 2, codelion/fineweb-edu-1B, HF GPT-2's dropout, DispersionLoss's defaults, λ 1."""
    assert [p.name for p in FIG3] == ["fig3_gpt2_small.toml", "fig3_gpt2_small_angular_spread.toml"]
    for path in FIG3:
        c = load(path)
        t, o, d, r = c["training"], c["optimizer"], c["dispersion"], c["released"]
        assert (r["per_device_train_batch_size"], r["gradient_accumulation_steps"], t["seq_len"]) == (16, 8, 1024)
        assert (r["lr"], r["num_ckpt"], o["decay_groups"], t["dataset"], c["validation"]["dataset"]) == (
            1e-5,
            2,
            "hf",
            "fineweb-edu-1B",
            "fineweb-edu-1B",
        ), path.name
        assert all(c["model"][k] == 0.1 for k in ("attn_dropout", "resid_dropout", "embd_dropout")), path.name
        widths = " | ".join(map(str, catalog.FIG3_PRESETS["paper"].widths))  # what paper fig3 trains
        assert f"--model.mlp_hidden_dim {widths}" in path.read_text(), path.name
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
    assert len(gpu) == 25
    for path in gpu:
        c = load(path)
        assert c["compile"]["enable"] and c["compile"]["components"] == ["model", "loss"], path.name
        assert c["optimizer"]["implementation"] == "fused", path.name
        assert c["training"]["mixed_precision_param"] == "bfloat16", path.name
        gpt2 = c["model"]["name"] == "gpt2"
        if gpt2 and not path.name.startswith("midtrain_"):  # mid-training keeps OpenAI's 50,257 rows
            assert c["model"]["vocab_size"] == 50304, path.name
        # Qwen3's paper configs: the authors' one sequence per micro-batch (their token subsets are per call)
        micro_batch = (
            c["released"]["per_device_train_batch_size"] if "released" in c else c["training"]["max_local_batch_size"]
        )
        assert micro_batch == (32 if gpt2 else 1), path.name
