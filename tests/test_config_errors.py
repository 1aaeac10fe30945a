"""Bad configuration fails before any process group starts: one line naming the field,
exit code 2, and nothing written to the dump folder. Every configuration refused on its own
(no run folder involved) is a case of ``REFUSALS``, the suite's one table of them."""

from __future__ import annotations

import copy
import dataclasses
import re
import time
import typing
from typing import NamedTuple

import pytest

from dispersion_titan.config import schema
from dispersion_titan.config.schema import resolve_layers
from dispersion_titan.job_config.parse import check_launch, validated_args
from dispersion_titan.losses import variants
from dispersion_titan.utils.errors import ArgumentError, ConfigError
from support.cli import analyze, assert_one_line_error
from support.launch import DEBUG_TOML, QWEN3_TOML, REPO, job_args, python_module

GPU_CONFIG = str(next(REPO.glob("train_configs/**/gpt2_small_mlp3072.toml")))  # compiled, fused AdamW


def write_toml(tmp_path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


class Refusal(NamedTuple):
    """A configuration ``validated_args`` refuses in one line. ``{toml}`` (a file holding
    ``toml``), ``{empty}`` (an empty file), ``{file}`` (a regular file) and ``{dir}`` (a
    folder, holding ``loop``, a link to itself) in ``args`` and ``says`` are filled in."""

    args: list[str]
    says: str  # the line starts with it
    world: int | None = None  # processes (None: $WORLD_SIZE, else 1)
    toml: str = ""
    error: type[Exception] = ConfigError
    how: str = "starts"  # or "is": the whole line; "holds": somewhere in it


DEBUG, QWEN3_TP2 = job_args(), [*job_args(QWEN3_TOML), "--parallelism.tensor_parallel_degree", "2"]
TOML = job_args("{toml}")
MIDTRAIN_TOML = str(REPO / "train_configs" / "paper" / "midtrain_gpt2_wikitext103_baseline.toml")
QWEN3_MIDTRAIN_TOML = str(REPO / "train_configs" / "paper" / "midtrain_qwen3_0.6b_baseline.toml")
REFUSALS = [
    # invalid values, named by their field
    Refusal([*DEBUG, "--model.mlp_hidden_dim", "250", "--parallelism.tensor_parallel_degree", "3"], "model.n_heads:"),
    Refusal(
        [*DEBUG, "--model.mlp_hidden_dim", "255", "--parallelism.tensor_parallel_degree", "2"], "model.mlp_hidden_dim:"
    ),
    Refusal([*DEBUG, "--model.n_heads", "3", "--parallelism.tensor_parallel_degree", "3"], "model.dim:"),
    Refusal([*DEBUG, "--model.dim", "66"], "model.dim:"),
    Refusal([*DEBUG, "--model.dim", "-8"], "model.dim:"),
    Refusal([*DEBUG, "--model.n_heads", "-2"], "model.n_heads:"),
    Refusal([*DEBUG, "--model.mlp_hidden_dim", "-4"], "model.mlp_hidden_dim:"),
    Refusal([*DEBUG, "--model.vocab_size", "-1"], "model.vocab_size:"),
    Refusal([*DEBUG, "--model.vocab_size", "1000"], "model.vocab_size:"),  # below the tokenizer's 50257 ids
    Refusal([*DEBUG, "--model.max_seq_len", "-1"], "model.max_seq_len:"),
    Refusal([*DEBUG, "--model.flavor", "huge"], "model.flavor:"),
    Refusal([*DEBUG, "--model.n_layers", "-1"], "model.n_layers:"),
    Refusal([*DEBUG, "--model.name", "llama4"], "model.name:"),
    Refusal([*DEBUG, "--training.seq_len", "512"], "training.seq_len:"),
    Refusal([*DEBUG, "--validation.seq_len", "512"], "validation.seq_len:"),  # the model has 256 positions
    Refusal([*DEBUG, "--training.local_batch_size", "-1"], "training.local_batch_size:"),
    Refusal([*DEBUG, "--training.dataset", "nope"], "training.dataset:"),
    Refusal(
        [*DEBUG, "--training.dataset", "local", "--training.dataset_path", "/nonexistent/*.jsonl"],
        "training.dataset_path:",
    ),
    Refusal(
        [*DEBUG, "--validation.dataset", "local", "--validation.dataset_path", "{empty}"], "validation.dataset_path:"
    ),
    Refusal(  # a folder meant as a token store (a prepare killed before its first shard): said it is none
        [*DEBUG, "--training.dataset_path", "{dir}"],
        "training.dataset_path: 'enwiki_sample' is embedded and takes no path (did you mean 'local'?); nor is '{dir}' "
        "a token store (no manifest.json in it)",
        how="is",
    ),
    Refusal(
        [*DEBUG, "--training.dataset", "local", "--training.dataset_path", "{dir}"],
        "training.dataset_path: '{dir}' is a directory; name files or a glob; nor is '{dir}' a token store (no "
        "manifest.json in it)",
        how="is",
    ),
    Refusal(
        [*DEBUG, "--dispersion.variant", "spread"],
        "dispersion.variant: 'spread' is not one of ('none', 'angular_spread'",
        error=ArgumentError,
    ),
    Refusal([*DEBUG, "--dispersion.coeff", "-0.1"], "dispersion.coeff:"),
    Refusal([*DEBUG, "--dispersion.tau", "0"], "dispersion.tau:"),
    Refusal([*DEBUG, "--dispersion.clamp", "1.0"], "dispersion.clamp:"),
    Refusal([*DEBUG, "--dispersion.clamp", "0"], "dispersion.clamp:"),
    Refusal([*DEBUG, "--dispersion.lambda_norm", "-1"], "dispersion.lambda_norm:"),
    Refusal([*DEBUG, "--dispersion.layers", "0", "2"], "dispersion.layers:"),
    Refusal([*DEBUG, "--dispersion.layers", "5"], "dispersion.layers:"),
    Refusal([*DEBUG, "--dispersion.layers", "middle"], "dispersion.layers:"),
    Refusal([*DEBUG, "--dispersion.max_tokens", "1"], "dispersion.max_tokens:"),
    Refusal(
        [*DEBUG, "--dispersion.variant", "l2_repel", "--training.seq_len", "1"],
        "training.seq_len: 1 token per sequence leaves no pair of tokens for the l2_repel term",
    ),
    Refusal(
        [*DEBUG, "--job.save_config_file", "../other/run.json"],
        "job.save_config_file: ../other/run.json lands outside job.dump_folder",
    ),
    Refusal(  # created by TensorBoard, the checkpoint folder made a fork train from scratch, exit 0
        [*DEBUG, "--metrics.save_tb_folder", "checkpoint"],
        "metrics.save_tb_folder: ./outputs/debug/checkpoint is inside checkpoint.folder ./outputs/debug/checkpoint,",
    ),
    Refusal(  # was `metrics.save_tb_folder: …/tb is inside checkpoint.folder …/`, a key the user had not touched
        [*DEBUG, "--checkpoint.folder", ""],
        "checkpoint.folder: '' puts the checkpoints in job.dump_folder ./outputs/debug itself, beside the run's other "
        'folders; give them a folder of their own, e.g. "checkpoint"',
        how="is",
    ),
    Refusal(
        [*DEBUG, "--checkpoint.folder", "ckpt", "--comm.trace_buf_size", "1", "--comm.save_traces_folder", "ckpt/t"],
        "comm.save_traces_folder: ./outputs/debug/ckpt/t is inside checkpoint.folder ./outputs/debug/ckpt,",
    ),
    Refusal([*DEBUG, "--dispersion.warmup_steps", "-2"], "dispersion.warmup_steps:"),
    Refusal(
        [*DEBUG, "--dispersion.precision", "fp8"], "dispersion.precision: 'fp8' is not one of (", error=ArgumentError
    ),
    Refusal(
        [*DEBUG, "--dispersion.variant", "perplexity_entropy", "--dispersion.precision", "tf32"],
        "dispersion.precision:",
    ),
    Refusal([*DEBUG, "--dispersion.coeff", "1e"], "dispersion.coeff: '1e' is not a number", error=ArgumentError),
    Refusal([*DEBUG, "--training.max_norm", "-1"], "training.max_norm: must be > 0 (inf: no clipping), got -1"),
    Refusal(
        [*DEBUG, "--job.dump_folder", "-run"],
        "job.dump_folder: no value given ('-run' is read as an option); write --job.dump_folder=-run",
        error=ArgumentError,
        how="is",
    ),
    Refusal([*DEBUG, "--debug.seed", "-1"], "debug.seed: must be in 0..4294967295, got -1: evaluate seeds numpy"),
    Refusal([*DEBUG, "--debug.seed", str(2**64)], "debug.seed: must be in 0..4294967295, got 18446744073709551616:"),
    Refusal([*DEBUG, "--training.max_norm", "0"], "training.max_norm: must be > 0 (inf: no clipping), got 0"),
    Refusal(
        [*DEBUG, "--dispersion.form", "authors"],
        "dispersion.form: 'authors' is not one of ('released', 'paper')",
        error=ArgumentError,
    ),
    Refusal(
        [*DEBUG, "--dispersion.points", "norm"],
        "dispersion.points: 'norm' is not one of ('blocks', 'hidden_states')",
        error=ArgumentError,
    ),
    # non-finite floats: refused wherever infinity has no meaning
    Refusal([*DEBUG, "--dispersion.coeff", "inf"], "dispersion.coeff: must be a finite number, got inf", how="is"),
    Refusal([*DEBUG, "--dispersion.coeff", "nan"], "dispersion.coeff:"),
    Refusal([*DEBUG, "--dispersion.tau", "inf"], "dispersion.tau:"),
    Refusal([*DEBUG, "--dispersion.lambda_norm", "inf"], "dispersion.lambda_norm:"),
    Refusal([*DEBUG, "--optimizer.lr", "inf"], "optimizer.lr:"),
    Refusal([*DEBUG, "--optimizer.weight_decay", "nan"], "optimizer.weight_decay:"),
    Refusal([*DEBUG, "--training.max_norm", "nan"], "training.max_norm:"),
    Refusal([*DEBUG, "--baseline.noise_alpha", "inf"], "baseline.noise_alpha:"),
    Refusal(
        [*DEBUG, "--dispersion.layers", "1,1,2"],
        "dispersion.layers: block 1 named twice in 1,1,2; name each block once",
        how="is",
    ),
    Refusal(
        [*DEBUG, "--optimizer.name", "SGD"],
        "optimizer.name: 'SGD' is not one of ('Adam', 'AdamW')",
        error=ArgumentError,
    ),
    Refusal(
        [*DEBUG, "--optimizer.decay_groups", "bias"],
        "optimizer.decay_groups: 'bias' is not one of ('all', 'hf', 'as_released')",
        error=ArgumentError,
    ),
    Refusal([*DEBUG, "--model.attn_dropout", "1.0"], "model.attn_dropout:"),
    Refusal([*DEBUG, "--model.embd_dropout", "-0.1"], "model.embd_dropout:"),
    Refusal(
        [
            *DEBUG,
            "--model.resid_dropout",
            "0.1",
            "--activation_checkpoint.mode",
            "full",
            "--activation_checkpoint.no-preserve-rng-state",
        ],
        "activation_checkpoint.preserve_rng_state:",
    ),
    Refusal(
        [*DEBUG, "--model.name", "qwen3_dispersion", "--model.flavor", "debugmodel", "--model.resid_dropout", "0.1"],
        "model.resid_dropout:",
    ),  # gpt2 only
    Refusal(
        [*DEBUG, "--training.head_loss", "cce"],
        "training.head_loss: 'cce' is not one of ('torch', 'liger')",
        error=ArgumentError,
    ),
    Refusal([*QWEN3_TP2[:-2], "--training.head_loss", "liger"], 'training.head_loss: "liger" takes gpt2 without'),
    Refusal([*QWEN3_TP2[:-2], "--compile.whole_model"], "compile.whole_model: gpt2 only"),
    Refusal([*DEBUG, "--checkpoint.keep_latest_k", "3"], "checkpoint.keep_latest_k:"),
    Refusal([*DEBUG, "--checkpoint.interval", "0"], "checkpoint.interval:"),
    Refusal(
        [*DEBUG, "--checkpoint.create_seed_checkpoint"], "checkpoint.create_seed_checkpoint: needs one process", world=2
    ),
    Refusal(
        [*DEBUG, "--baseline.method", "neftune"],
        "baseline.method: 'neftune' is not one of ('none', 'noisy_embedding', 'active_forgetting')",
        error=ArgumentError,
    ),
    Refusal([*DEBUG, "--baseline.noise_alpha", "-1"], "baseline.noise_alpha:"),
    Refusal([*DEBUG, "--baseline.forget_every", "0"], "baseline.forget_every:"),
    Refusal([*DEBUG, "--baseline.embedding_lr", "0"], "baseline.embedding_lr:"),
    Refusal(
        [*DEBUG, "--baseline.method", "active_forgetting", "--optimizer.early_step_in_backward"],
        "optimizer.early_step_in_backward:",
    ),
    Refusal(
        [*DEBUG, "--baseline.method", "active_forgetting", "--baseline.forget_every", "10", "--training.steps", "10"],
        "baseline.forget_every:",
    ),  # no reset would ever happen
    Refusal(
        [*DEBUG, "--baseline.method", "active_forgetting", "--fault_tolerance.enable"],
        "fault_tolerance.enable: not supported with baseline.method = active_forgetting",
        how="is",
    ),
    Refusal(
        [*DEBUG, "--optimizer.decay_groups", "hf", "--optimizer.early_step_in_backward"],
        "optimizer.early_step_in_backward: not supported with optimizer.decay_groups = 'hf'",
        how="is",
    ),
    Refusal(
        [
            *DEBUG,
            "--dispersion.variant",
            "angular_spread",
            "--dispersion.layers",
            "early_half",
            "--model.n_layers",
            "1",
        ],
        "dispersion.layers: 'early_half' selects no block of 1",
        how="is",
    ),
    Refusal(
        [*DEBUG, "--parallelism.pipeline_parallel_degree", "2"],
        "parallelism.pipeline_parallel_degree: dispersion_titan's gpt2 supports only 1",
        how="is",
    ),
    # batch sizes, process counts and output folders, for a job of `world` processes
    Refusal(
        [*DEBUG, "--training.local_batch_size", "0", "--training.global_batch_size", "-1"],
        "training.local_batch_size: 0 (derive it) needs a training.global_batch_size > 0",
        how="is",
    ),
    Refusal(  # with data_parallel_shard_degree -1: passed the checks, then TorchTitan's ParallelDims asserted
        [*DEBUG, "--parallelism.data_parallel_replicate_degree", "2"],
        "parallelism.data_parallel_replicate_degree: 2 replicas cannot split the 3 data-parallel ranks of 3 processes",
        world=3,
    ),
    Refusal(  # passed the checks, then TorchTitan's Trainer asserted (a traceback per rank)
        [*DEBUG, "--training.local_batch_size", "4", "--training.global_batch_size", "0"],
        "training.global_batch_size: 0; give the sequences per step, or -1",
    ),
    Refusal(  # TorchTitan reads any negative as -1: the run trained on local_batch_size × the ranks
        [*DEBUG, "--training.global_batch_size", "-2"],
        "training.global_batch_size: -2; give the sequences per step, or -1",
    ),
    Refusal(
        [*DEBUG, "--validation.enable", "--validation.global_batch_size", "-8"],
        "validation.global_batch_size: -8; give the sequences per validation batch, or -1 (training's)",
    ),
    Refusal(
        [*DEBUG, "--parallelism.data_parallel_shard_degree", "2"],
        "parallelism: data_parallel_replicate_degree × data_parallel_shard_degree × tensor_parallel_degree = 2, "
        "but there are 1 processes; set data_parallel_shard_degree = -1 (the processes the others leave)",
        how="is",
    ),
    Refusal(
        [*DEBUG],
        "training.global_batch_size: 8 sequences cannot be split over 16 data-parallel ranks; use a multiple of 16",
        world=16,
    ),
    Refusal(
        [*DEBUG, "--training.local_batch_size", "3"],
        "training.local_batch_size: 3 does not divide the 4 "
        "sequences per rank (global_batch_size 8 over 2 data-parallel ranks); use one of [1, 2, 4], or 0 to "
        "derive it",
        world=2,
    ),
    Refusal(
        [*DEBUG, "--validation.local_batch_size", "4"],
        "validation.local_batch_size: 4 × 1 data-parallel "
        "ranks is not the validation global batch of 8 sequences; use 8, or 0",
        world=1,
    ),
    Refusal(
        [*DEBUG, "--parallelism.tensor_parallel_degree", "2"],
        "parallelism: 3 processes are not divisible by tensor_parallel_degree = 2; use one of [1] on 3 processes (the "
        "model alone: [1, 2, 4])",
        world=3,
    ),
    Refusal(
        [*DEBUG, "--training.loss_scale", "sum"],
        "training.loss_scale: 'sum' is not one of ('mean', 'as_released')",
        error=ArgumentError,
    ),
    Refusal(
        [*DEBUG, "--lr_scheduler.form", "as_released", "--lr_scheduler.decay_type", "linear"],
        "lr_scheduler.form: 'as_released' is transformers' cosine schedule",
        world=1,
    ),
    Refusal(
        [*DEBUG, "--lr_scheduler.form", "hf"],
        "lr_scheduler.form: 'hf' is not one of ('torchtitan', 'as_released')",
        error=ArgumentError,
    ),
    Refusal(
        [*DEBUG, "--parallelism.data_parallel_replicate_degree", "-1"],
        "parallelism.data_parallel_replicate_"
        "degree: -1 (replicate over every process) needs data_parallel_shard_degree = 1, not -1",
        world=2,
    ),
    Refusal(
        [*DEBUG, "--parallelism.data_parallel_replicate_degree", "0"],
        "parallelism.data_parallel_replicate_degree: 0; use a count >= 1, or -1",
        world=2,
    ),
    Refusal(
        [
            *DEBUG,
            "--parallelism.data_parallel_replicate_degree",
            "-1",
            "--parallelism.data_parallel_shard_degree",
            "1",
            "--parallelism.tensor_parallel_degree",
            "2",
        ],
        "parallelism.data_parallel_replicate_degree: replicated parameters (DDP) with tensor",
        world=4,
    ),
    Refusal(
        [*DEBUG, "--job.dump_folder", "/etc/hostname/run"],
        "job.dump_folder: /etc/hostname/run cannot be created: /etc/hostname is not a directory",
        world=1,
    ),
    Refusal(
        [*DEBUG, "--job.dump_folder", "{file}", "--metrics.no-enable-tensorboard"],
        "job.dump_folder: {file} exists but is not a directory",
        world=1,
    ),
    Refusal(
        [*DEBUG, "--job.dump_folder", "{dir}", "--checkpoint.folder", "f/ck"],
        "checkpoint.folder: {dir}/f/ck cannot be created: {dir}/f is not a directory",
        world=1,
    ),
    Refusal(
        [*DEBUG, "--job.dump_folder", "{dir}", "--metrics.save_tb_folder", "f"],
        "metrics.save_tb_folder: {dir}/f exists but is not a directory",
        world=1,
    ),
    Refusal(  # a folder on a read-only file system (not writable even for root)
        [*DEBUG, "--job.dump_folder", "/proc/sys"],
        "job.dump_folder: /proc/sys exists but is not writable; give a folder you can write to",
        world=1,
    ),
    Refusal(  # a TOML's "~/runs/x": was trained into ./~/runs/x
        [*DEBUG, "--job.dump_folder", "~/runs/x"],
        "job.dump_folder: ~/runs/x starts with ~, which TOML and TorchTitan do not expand (a folder named ~ would be ",
        world=1,
    ),
    Refusal(  # a newline pasted into the name: was made, listed by ls as 'x'$'\n''y'
        [*DEBUG, "--job.dump_folder", "{dir}/x\ny"],
        "job.dump_folder: '{dir}/x\\ny' holds the control character '\\n'; give a folder name without it",
        world=1,
    ),
    Refusal(
        [*DEBUG, "--job.dump_folder", "{dir}/run", "--checkpoint.folder", "ck\t1"],
        "checkpoint.folder: '{dir}/run/ck\\t1' holds the control character '\\t'; give a folder name without it",
        world=1,
    ),
    Refusal(  # a link loop: was an OSError traceback from the writer lock, after the check passed it
        [*DEBUG, "--job.dump_folder", "{dir}/loop"],
        "job.dump_folder: {dir}/loop goes through a symbolic link that loops (Too many levels of symbolic links); "
        "fix the link, or give another path",
        world=1,
        how="is",
    ),
    Refusal(
        [*DEBUG, "--job.dump_folder", ""],
        "job.dump_folder: empty; give the run's folder, e.g. --job.dump_folder outputs/my_run",
        world=1,
    ),
    # TorchTitan's decoders (qwen3, llama3): the [model] keys each family refuses, on 2 processes
    Refusal([*QWEN3_TP2, "--model.max_seq_len", "256"], "model.max_seq_len: rotary positions", world=2),
    Refusal(
        [*QWEN3_TP2, "--model.name", "llama3_dispersion", "--model.mlp_hidden_dim", "512"],
        "model.mlp_hidden_dim: llama3 derives its MLP",
        world=2,
    ),
    Refusal(
        [*QWEN3_TP2, "--model.name", "llama3_dispersion", "--model.head_dim", "32"],
        "model.head_dim: llama3's head width is dim / n_heads",
        world=2,
    ),
    Refusal(
        [*QWEN3_TP2, "--model.name", "llama3_dispersion", "--model.tie_embeddings", "True"],
        "model.tie_embeddings: TorchTitan 0.2.2's llama3",
        world=2,
    ),
    Refusal([*QWEN3_TP2, "--model.flavor", "debugmodel_moe"], "model.flavor: 'debugmodel_moe' is not one of", world=2),
    Refusal(
        [*QWEN3_TP2, "--model.name", "llama3_dispersion", "--model.flavor", "debugmodel_flex_attn"],
        "model.flavor: 'debugmodel_flex_attn'",
        world=2,
    ),
    Refusal(
        [*QWEN3_TP2, "--model.n_kv_heads", "3", "--model.n_heads", "6"],
        "model.n_kv_heads: 3 is not divisible by",
        world=2,
    ),
    Refusal(
        [*QWEN3_TP2, "--model.vocab_size", "2048"],
        "model.vocab_size: 2048 is smaller than the GPT-2 tokenizer's 50257 ids",
        world=2,
    ),
    Refusal(
        [*QWEN3_TP2, "--model.hf_assets_path", "./tests/assets/tokenizer"],
        "model.hf_assets_path: ./tests/assets/tokenizer: no such",
        world=2,
    ),
    # what TorchTitan 0.2.2 would crash on once the job runs (issue 49; the others: CRASHES)
    Refusal([*DEBUG, "--validation.steps", "0"], "validation.steps:", error=ArgumentError),  # TorchTitan's assert
    Refusal(
        [*DEBUG, "--training.predict_last", "false"],
        "--training.predict_last false: training.predict_last is a switch and takes no value; write "
        "--training.predict-last for true, --training.no-predict-last for false",
        error=ArgumentError,
        how="is",
    ),  # tyro: "Unrecognized options: false"
    # the TOML: unknown keys and sections (with the closest match), wrong types, malformed files
    Refusal(TOML, "model.flavour:", toml='[model]\nname = "gpt2"\nflavour = "debug"\n'),
    # TorchTitan's own qwen3 / llama3 would train without our data, tokenizer or dispersion term
    Refusal(
        TOML,
        "model.name: 'qwen3' is TorchTitan's own spec, which trains without dispersion_titan's data, "
        "tokenizer or dispersion term; use 'qwen3_dispersion'",
        toml='[model]\nname = "qwen3"\n',
        how="is",
    ),
    Refusal([*DEBUG, "--model.name", "llama3"], "model.name: 'llama3' is TorchTitan's own spec", how="starts"),
    Refusal(TOML, "dispersion.coef:", toml='[dispersion]\nvariant = "angular_spread"\ncoef = 0.1\n'),
    Refusal(TOML, "trainning:", toml="[trainning]\nsteps = 3\n"),
    Refusal(
        TOML, "trainning: unknown section in {toml}; did you mean training?", toml="[trainning]\nsteps = 3\n", how="is"
    ),
    Refusal(  # the sweep's TOML given as a training config (was "config: unknown section in ...")
        TOML,
        "config: a key outside any [section] in {toml}; a training config keeps its keys in sections "
        "([job], [model], [training], ...)",
        toml='config = "train_configs/debug.toml"\nwidths = [256]\n',
        how="is",
    ),
    Refusal(
        TOML,
        "model.flavour: unknown key in {toml}; did you mean model.flavor?",
        toml='[model]\nflavour = "debug"\n',
        how="is",
    ),
    Refusal(TOML, "model.mlp_hidden_dim:", toml='[model]\nmlp_hidden_dim = "wide"\n'),
    Refusal(TOML, "model.tie_embeddings:", toml='[model]\ntie_embeddings = "yes"\n'),
    Refusal(TOML, "dispersion.coeff:", toml='[dispersion]\ncoeff = "a lot"\n'),
    Refusal(TOML, "dispersion.variant:", toml="[dispersion]\nvariant = 3\n"),
    Refusal(
        TOML,
        "dispersion.variant: 'spread' is not one of ('none', 'angular_spread',",
        toml='[dispersion]\nvariant = "spread"\n',
    ),
    Refusal(
        TOML,
        "optimizer.decay_groups: 'bias' is not one of ('all', 'hf', 'as_released') (in",
        toml='[optimizer]\ndecay_groups = "bias"\n',
    ),
    Refusal(TOML, "dispersion.layers:", toml='[dispersion]\nlayers = [1, "two"]\n'),
    Refusal(TOML, "dispersion.layers:", toml="[dispersion]\nlayers = 2\n"),
    Refusal(TOML, "training.steps:", toml="[training]\nsteps = 2.5\n"),
    Refusal(TOML, "model:", toml="model = 3\n"),
    Refusal(
        ["--job.config_file", "{toml}"],
        "--job.config_file: {toml}: invalid TOML",
        toml="[model\nname = 'gpt2'\n",
        error=ArgumentError,
    ),
    Refusal(  # the value given, not 0 (was "got 0" for any value below 1)
        [*job_args(MIDTRAIN_TOML), "--profile", "cpu", "--released.train_tokens", "-1"],
        "released.train_tokens: must be >= 1 with released.per_device_train_batch_size, got -1",
        how="is",
    ),
    Refusal(
        [*job_args(MIDTRAIN_TOML), "--profile", "cpu", "--released.lr", "0"],
        "released.lr, released.warmup_ratio: need lr > 0 and a ratio in [0, 1], got 0.0, 0.2",
        how="is",
    ),
    Refusal(
        ["--job.config_file", "{dir}"],
        "--job.config_file: {dir} is a folder; give the TOML file itself",
        error=ArgumentError,
        how="is",
    ),
    Refusal(  # was an OSError traceback, from the pipe check's stat
        ["--job.config_file", "{dir}/loop"],
        "--job.config_file: {dir}/loop goes through a symbolic link that loops (Too many levels of symbolic links); "
        "fix the link, or give another path",
        error=ArgumentError,
        how="is",
    ),
    Refusal([*DEBUG, "--profile"], "--profile: missing value", error=ArgumentError, how="is"),
    Refusal(  # saved "UTF-8 with BOM" (was tomllib's "Invalid statement (at line 1, column 1)")
        ["--job.config_file", "{toml}"],
        "--job.config_file: {toml}: starts with a byte order mark (BOM), which TOML does not allow; "
        "save it as UTF-8 without BOM",
        toml="\ufeff[model]\nname = 'gpt2'\n",
        error=ArgumentError,
        how="is",
    ),
    # command-line flags: unknown, or of the wrong type
    Refusal([*DEBUG, "--training.steps", "many"], "training.steps: 'many' is not an integer", error=ArgumentError),
    Refusal([*DEBUG, "--training.stepz", "3"], "--training.stepz", error=ArgumentError, how="holds"),
    Refusal([*DEBUG, "--training.dataloader.num_workers", "2"], "training.dataloader.num_workers: must be 0"),
    Refusal([*DEBUG, "--validation.dataloader.num_workers", "2"], "validation.dataloader.num_workers: must be 0"),
    Refusal([*DEBUG, "--debug.seed=x"], "debug.seed: 'x' is not an integer", error=ArgumentError),  # int | None
    Refusal([*DEBUG, "--training.max_norm", "abc"], "training.max_norm: 'abc' is not a number", error=ArgumentError),
    Refusal(
        [*DEBUG, "--training.steps", "--checkpoint.interval", "3"],
        "training.steps: no value given; write --training.steps followed by an integer",
        error=ArgumentError,
    ),
    *(  # "$DATA" unset: was wikitext-103 from the hub instead of the local copy meant, or the embedded corpus
        Refusal(
            [*DEBUG, f"--{section}.dataset", "wikitext-103", f"--{section}.dataset_path", ""],
            f"{section}.dataset_path: empty; name the corpus's files or token store, or leave it out",
            how="is",
        )
        for section in ("training", "validation")
    ),
    Refusal(  # "$TB" unset: was TensorBoard's files beside run.json, an analysis's default --tb-dir its own --out
        [*DEBUG, "--metrics.save_tb_folder", ""],
        "metrics.save_tb_folder: '' puts the TensorBoard files in job.dump_folder ./outputs/debug itself, beside the "
        'run\'s other folders; give them a folder of their own, e.g. "tb"',
        how="is",
    ),
    Refusal(
        [*DEBUG, "--profiling.enable_profiling", "--profiling.save_traces_folder", "."],
        "profiling.save_traces_folder: '.' puts the profiler traces in job.dump_folder",
    ),
    Refusal(  # "$CKPT" unset: was a run from scratch (with initial_load_in_hf, "" is model.hf_assets_path's weights)
        [*DEBUG, "--checkpoint.initial_load_path", ""],
        "checkpoint.initial_load_path: empty; name the checkpoint to start from, or leave it out to train from scratch",
        error=ConfigError,
        how="is",
    ),
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=[f"{i}-{r.says.split(':')[0]}" for i, r in enumerate(REFUSALS)])
def test_refused_in_one_line_naming_the_field(tmp_path, refusal):
    (tmp_path / "f").write_text("")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    toml = write_toml(tmp_path, refusal.toml)
    paths = {"toml": toml, "empty": str(tmp_path / "empty.jsonl"), "file": str(tmp_path / "f"), "dir": str(tmp_path)}
    with pytest.raises(refusal.error) as err:
        validated_args([a.format(**paths) for a in refusal.args], refusal.world)
    message, says = str(err.value), refusal.says.format(**paths)
    assert "\n" not in message, message
    if refusal.how == "is":
        assert message == says
    elif refusal.how == "holds":
        assert says in message, message
    else:
        assert message.startswith(says), message


CRASHES = [
    # (settings of debug.toml changed, the line); TorchTitan 0.2.2 or torch's AdamW would assert or raise on each
    ({"checkpoint.initial_load_path": "{dir}"}, "checkpoint.initial_load_path: {dir}: no .metadata in it"),
    # the other kind of folder, or a run's: said as such (was `no .metadata in it`, `no *.safetensors in it`)
    (
        {"checkpoint.initial_load_path": "{dir}/hf"},
        "checkpoint.initial_load_path: {dir}/hf: set checkpoint.initial_load_in_hf = true: it is a Hugging Face",
    ),
    (
        {"checkpoint.initial_load_in_hf": True, "checkpoint.initial_load_path": "{dir}/a_run/checkpoint/step-2"},
        "checkpoint.initial_load_path: {dir}/a_run/checkpoint/step-2: set checkpoint.initial_load_in_hf = false: it is",
    ),
    (
        {"checkpoint.initial_load_path": "{dir}/a_run"},
        "checkpoint.initial_load_path: {dir}/a_run: a run's folder; give one of its checkpoints' step-N folders, or "
        "branch from it with --job.fork_from RUN[@STEP]",
    ),
    (
        {"checkpoint.initial_load_in_hf": True, "checkpoint.initial_load_path": "{dir}/nope"},
        "checkpoint.initial_load_path: {dir}/nope: no such folder; give a Hugging Face model's folder",
    ),
    (
        {"checkpoint.initial_load_in_hf": True, "checkpoint.initial_load_model_only": False},
        "checkpoint.initial_load_model_only: must be true with checkpoint.initial_load_in_hf",
    ),
    (
        {"checkpoint.initial_load_in_hf": True, "checkpoint.initial_load_in_hf_quantized": True},
        "checkpoint.initial_load_in_hf_quantized: gpt2 loads no quantized Hugging Face checkpoint; set it false",
    ),
    (
        {"checkpoint.last_save_in_hf": True, "checkpoint.last_save_model_only": False},
        "checkpoint.last_save_model_only: must be true with checkpoint.last_save_in_hf",
    ),
    ({"checkpoint.save_initial": False, "checkpoint.keep_latest_k": 1}, "checkpoint.keep_latest_k: 1 is refused"),
    ({"metrics.log_freq": 0}, "metrics.log_freq: must be >= 1, got 0"),
    ({"validation.freq": 0}, "validation.freq: must be >= 1, got 0"),
    ({"training.gc_freq": 0}, "training.gc_freq: must be >= 1, got 0"),
    ({"comm.init_timeout_seconds": 0}, "comm.init_timeout_seconds: must be >= 1, got 0"),
    ({"lr_scheduler.total_steps": 0}, "lr_scheduler.total_steps: must be >= 1, got 0"),
    ({"training.steps": -1}, "training.steps: must be >= 0, got -1"),
    # read silently by TorchTitan: a schedule decaying past the run, to 2× or below 0 at its end
    ({"lr_scheduler.warmup_steps": -1}, "lr_scheduler.warmup_steps: must be >= 0, got -1"),
    ({"checkpoint.keep_latest_k": -1}, "checkpoint.keep_latest_k: must be >= 0, got -1"),
    ({"lr_scheduler.min_lr_factor": 2.0}, "lr_scheduler.min_lr_factor: must be in [0, 1], got 2.0"),
    ({"lr_scheduler.min_lr_factor": -1.0}, "lr_scheduler.min_lr_factor: must be in [0, 1], got -1.0"),
    ({"lr_scheduler.decay_ratio": -0.5}, "lr_scheduler.decay_ratio: must be in [0, 1], got -0.5"),
    ({"profiling.enable_profiling": True, "profiling.profile_freq": 1}, "profiling.profile_freq: 1 is less than"),
    (
        {"activation_checkpoint.mode": "selective", "activation_checkpoint.selective_ac_option": "2x"},
        "activation_checkpoint.selective_ac_option: '2x'; use 'op' or a number of layers",
    ),
    ({"optimizer.lr": -1e-3}, "optimizer.lr: must be >= 0, got -0.001"),
    ({"optimizer.beta2": 1.0}, "optimizer.beta2: must be in [0, 1), got 1.0"),
    ({"model.converters": ["float8"]}, "model.converters: 'float8' is not one of TorchTitan 0.2.2's"),
]


def test_what_torchtitan_would_crash_on_is_refused_in_one_line(tmp_path):
    """Each value TorchTitan asserts or raises on mid-launch (a traceback of 50 to 120 lines), or after
    training (last_save_in_hf), refused by the launch checks in one line naming the key; the config
    parsed once, each case checked on a copy of it."""
    dump = ["--job.dump_folder", str(tmp_path / "run")]
    parsed = validated_args([*DEBUG, *dump])
    for file in ("hf/model.safetensors", "a_run/run.json", "a_run/checkpoint/step-2/.metadata"):
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text("")
    for changes, says in CRASHES:
        config = copy.deepcopy(parsed)
        for key, value in changes.items():
            section, name = key.split(".")
            setattr(getattr(config, section), name, value.format(dir=tmp_path) if isinstance(value, str) else value)
        with pytest.raises(ConfigError) as err:
            check_launch(config, take_lock=False)
        assert str(err.value).startswith(says.format(dir=tmp_path)) and "\n" not in str(err.value), str(err.value)
    check_launch(copy.deepcopy(parsed), take_lock=False)  # the unchanged config passes
    not_copied = [*job_args(MIDTRAIN_TOML), *dump, "--profile", "cpu", "--model.hf_assets_path", "./assets/hf/gpt2"]
    with pytest.raises(ConfigError) as err:  # a paper config pointed at a local copy not made: the offline way
        check_launch(validated_args(not_copied), take_lock=False)
    assert str(err.value) == (
        "checkpoint.initial_load_in_hf: true loads Hugging Face weights from model.hf_assets_path ./assets/hf/gpt2 "
        "when checkpoint.initial_load_path is empty (no such folder); give model.hf_assets_path the model's folder "
        "or hub id, or set initial_load_in_hf = false to train from scratch"
    )
    assert not (tmp_path / "run").exists()


def test_replicating_over_every_process_derives_the_batch_per_replica():
    """``data_parallel_replicate_degree = -1`` (the paper configs': DDP) resolves to the process count,
    and the global batch is split over the replicas as over FSDP ranks."""
    config = validated_args(
        [
            *DEBUG,
            "--parallelism.data_parallel_replicate_degree",
            "-1",
            "--parallelism.data_parallel_shard_degree",
            "1",
            "--training.max_local_batch_size",
            "2",
        ],
        4,
    )
    assert config.parallelism.data_parallel_replicate_degree == 4
    assert (config.training.global_batch_size, config.training.local_batch_size) == (8, 2)


@pytest.mark.parametrize("flag, blocks", [("3", [2]), ("1,2,4", [0, 1, 3]), (" 4 , 1", [0, 3]), ("late_half", [2, 3])])
def test_dispersion_layers_from_the_command_line(flag, blocks):
    """One index or a comma-separated list, as a user types them (the debug model has 4 blocks)."""
    config = validated_args([*DEBUG, "--dispersion.layers", flag])
    assert resolve_layers(config.dispersion.layers, 4) == blocks


def test_dispersion_layers_list_in_toml(tmp_path):
    text = open(DEBUG_TOML).read().replace('layers = "all"', "layers = [4, 2]", 1)
    assert "layers = [4, 2]" in text
    config = validated_args(job_args(write_toml(tmp_path, text)))
    assert resolve_layers(config.dispersion.layers, 4) == [1, 3]


EXTRA = "\n[extra]\nfoo = 1\n"  # appended to debug.toml: a section of nobody's


@pytest.mark.parametrize(
    "extra, args, expected",
    [
        (
            "",
            ["--parallelism.tensor_parallel_degree", "3"],
            "model.n_heads: 4 is not divisible by parallelism.tensor_parallel_degree=3; use one of [1] on 1 process "
            "(the model alone: [1, 2, 4])",
        ),
        ("", ["--training.seq_len", "300"], "training.seq_len: 300 must be in 1..256 (model.max_seq_len positions)"),
        (
            "",
            ["--training.dataset", "local", "--training.dataset_path", "missing.jsonl"],
            "training.dataset_path: no file matches 'missing.jsonl'",
        ),
        (
            "",
            ["--dispersion.variant", "angular_spread", "--dispersion.kernel", "triton"],
            "dispersion.kernel: 'triton' needs a CUDA GPU, and torch sees none here; use 'auto' "
            "(the PyTorch strips on CPU) or 'torch'",
        ),
        (EXTRA, [], "extra: unknown section in {toml}"),
        (
            "",
            ["--dispersion.variant", "angular_spread", "--dispersion.coeff", "inf"],
            "dispersion.coeff: must be a finite number, got inf",
        ),
        (
            "",
            ["--dispersion.variant", "angular_spread", "--training.seq_len", "1"],
            "training.seq_len: 1 token per sequence leaves no pair of tokens for the angular_spread term (as "
            'dispersion.max_tokens, it needs >= 2); use a longer sequence, or dispersion.variant = "none"',
        ),
        (
            "",
            ["--checkpoint.initial_load_in_hf"],
            "checkpoint.initial_load_in_hf: true loads Hugging Face weights from model.hf_assets_path . when "
            "checkpoint.initial_load_path is empty (no *.safetensors in it); give model.hf_assets_path the model's "
            "folder or hub id, or set initial_load_in_hf = false to train from scratch",
        ),  # TorchTitan's checkpointer: a 57-line [rank0] ValueError
    ],
    ids=[
        "tp-degree",
        "seq-len",
        "missing-dataset",
        "triton-on-cpu",
        "unknown-section",
        "coeff-inf",
        "seq-len-1",
        "hf-weights-from-nowhere",
    ],
)
def test_cli_exits_2_with_one_line_before_starting(tmp_path, extra, args, expected):
    """The same refusals through ``python -m dispersion_titan.train``: status 2, the one line, no dump folder."""
    config = write_toml(tmp_path, open(DEBUG_TOML).read() + extra) if extra else DEBUG_TOML
    dump = tmp_path / "run"
    proc = python_module(
        "dispersion_titan.train", "--job.config_file", config, "--job.dump_folder", str(dump), *args, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["dispersion_titan: error: " + expected.format(toml=config)]
    assert not dump.exists()


def imported_modules(stderr: str) -> set[str]:
    """The modules ``PYTHONPROFILEIMPORTTIME`` reports as imported."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_help_and_cheap_errors_come_before_torch_is_imported(tmp_path):
    """``--help`` and the errors found in the TOML alone (a missing or malformed file, an unknown
    key of a section that is ours) import neither torch nor TorchTitan."""
    unknown = write_toml(tmp_path, "[dispersion]\ncoef = 0.1\n")
    (tmp_path / "malformed.toml").write_text("[model\n")
    for args, status, message in [
        (["--help"], 0, None),
        (
            ["--job.config_file", unknown],
            2,
            f"dispersion.coef: unknown key in {unknown}; did you mean dispersion.coeff?",
        ),
        (
            ["--job.config_file", str(tmp_path / "absent.toml")],
            2,
            f"--job.config_file: {tmp_path / 'absent.toml'}: no such file",
        ),
        (["--job.config_file", str(tmp_path / "malformed.toml")], 2, "invalid TOML"),
        ([DEBUG_TOML], 2, f"{DEBUG_TOML}: give the config as --job.config_file {DEBUG_TOML}"),  # was: unknown option
    ]:
        proc = python_module(
            "dispersion_titan.train",
            *args,
            "--job.dump_folder",
            str(tmp_path / "run"),
            env={"PYTHONPROFILEIMPORTTIME": "1"},
            command_line=True,
            timeout=120,
        )
        assert proc.returncode == status, proc.stderr[-2000:]
        assert not {"torch", "torchtitan"} & imported_modules(proc.stderr)
        said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
        if message is None:
            assert (
                said == [] and "--dispersion.coeff" not in proc.stdout and "[dispersion] variant='none'" in proc.stdout
            )
        else:
            assert len(said) == 1 and said[0].startswith("dispersion_titan: error: ") and message in said[0]
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- GPU configs on a CPU: --profile cpu


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_a_gpu_config_on_a_cpu_is_refused_in_one_line_naming_the_cpu_profile(tmp_path):
    dump = tmp_path / "run"
    args = ("--check-only", "--job.config_file", GPU_CONFIG, "--job.dump_folder", str(dump))
    proc = python_module("dispersion_titan.train", *args, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "dispersion_titan: error: compile.enable: true compiles with inductor for GPUs and torch sees none here; "
        "run CPU jobs with --profile cpu (compile off, foreach AdamW: the same computation)"
    ]
    assert "\n## CPU\n" in (REPO / "docs" / "training.md").read_text()  # the anchor the line names
    proc = python_module("dispersion_titan.train", *args, "--profile", "cpu", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not dump.exists()


@pytest.mark.parametrize(
    "args, refusal",
    [
        (["--training.head_loss", "liger"], '^training.head_loss: "liger" runs Triton kernels, and torch sees no GPU'),
        (
            ["--dispersion.variant", "angular_spread", "--dispersion.kernel", "triton"],
            "^dispersion.kernel: 'triton' needs a CUDA GPU, and torch sees none here",
        ),
    ],
)
def test_triton_kernels_without_a_gpu_are_refused_at_launch_not_by_the_checks_plan_runs(monkeypatch, args, refusal):
    """Liger's and the pair loss's Triton kernels need a GPU (or Triton's interpreter, as tests/test_head_loss.py
    runs them) where the job runs, not where it is planned or submitted from (was: the Triton pair kernel refused
    by the checks ``plan`` and the sweep run, on a login node without a GPU)."""
    from dispersion_titan.job_config.titan_checks import check_runs_here

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    config = validated_args([*DEBUG, *args])  # the checks plan and the sweep run: passed
    with pytest.raises(ConfigError, match=refusal):
        check_runs_here(config)


def test_the_cpu_profile_changes_how_a_step_runs_never_what_it_computes():
    gpu = validated_args(job_args(GPU_CONFIG))
    cpu = validated_args([*job_args(GPU_CONFIG), "--profile", "cpu"])
    assert (gpu.compile.enable, gpu.optimizer.implementation) == (True, "fused")
    assert (cpu.compile.enable, cpu.optimizer.implementation, cpu.training.max_local_batch_size) == (
        False,
        "foreach",
        1,
    )
    changed = {
        f"{section}.{key}"
        for section, keys in gpu.to_dict().items()
        if isinstance(keys, dict)
        for key, value in keys.items()
        if cpu.to_dict()[section][key] != value
    }
    assert changed == {
        "compile.enable",
        "optimizer.implementation",
        "training.max_local_batch_size",
        "training.local_batch_size",
    }  # the last derived from the one before
    with pytest.raises(ArgumentError, match=r"^--profile: 'gpu' is not one of \('cpu',\)$"):
        validated_args([*job_args(GPU_CONFIG), "--profile", "gpu"])
    # A flag read before TorchTitan, given twice: refused, never the first silently kept.
    with pytest.raises(ArgumentError, match=r"^--profile: given 2 times \(cpu, gpu\); give it once$"):
        validated_args([*job_args(GPU_CONFIG), "--profile", "cpu", "--profile=gpu"])
    with pytest.raises(ArgumentError, match=rf"^--job.config_file: given 2 times \({GPU_CONFIG}, {DEBUG_TOML}\); give"):
        validated_args([*job_args(GPU_CONFIG), "--job.config-file", DEBUG_TOML])


def test_help_all_shows_the_defaults_a_profile_gives_and_refuses_an_unknown_one():
    """``train --help-all`` under ``--profile cpu`` shows the profile's values over the file's as defaults, and an
    unknown profile is refused there too (the profile is laid over the TOML after its type check, not on reading)."""
    shown = python_module("dispersion_titan.train", *job_args(GPU_CONFIG), "--profile", "cpu", "--help-all")
    assert shown.returncode == 0, shown.stderr
    assert "Whether to apply torch.compile (default: False)" in shown.stdout  # the file: true
    refused = python_module("dispersion_titan.train", *job_args(GPU_CONFIG), "--profile", "gpu", "--help-all")
    assert (
        refused.returncode == 2
        and refused.stderr.strip() == "dispersion_titan: error: --profile: 'gpu' is not one of ('cpu',)"
    )


@pytest.mark.parametrize(
    "line, typed, message",
    [
        ("enable = false ", 'enable = "false" ', "compile.enable: expected bool, got 'false'"),
        ('implementation = "foreach"', 'implementation = "fast"', "optimizer.implementation: 'fast' is not one of"),
    ],
    ids=["compile-string", "optimizer-choice"],
)
def test_a_bad_value_the_cpu_profile_overrides_is_refused_as_without_it(tmp_path, line, typed, message):
    """The file's own values are checked before ``--profile cpu`` lays its keys over them: a bad one was hidden
    (``train --check-only --profile cpu`` exit 0) where ``plan`` without the profile refused it."""
    path = write_toml(tmp_path, open(DEBUG_TOML).read().replace(f"\n{line}", f"\n{typed}", 1))
    for profile in ((), ("--profile", "cpu")):
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
            validated_args([*job_args(path), *profile])


def test_infinity_is_accepted_where_it_has_a_meaning(tmp_path):
    """``training.max_norm = inf``: no gradient clipping; a TOML ``inf`` elsewhere is refused."""
    assert validated_args([*DEBUG, "--training.max_norm", "inf"]).training.max_norm == float("inf")
    text = open(DEBUG_TOML).read().replace("\nlr = 1e-3 ", "\nlr = inf ", 1)
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError, match=r"^optimizer.lr: must be a finite number, got inf$"):
        validated_args(job_args(path))


def test_a_toml_that_is_not_utf8_or_names_no_model_is_one_line(tmp_path):
    """A byte that is not UTF-8 (once an 18-line UnicodeDecodeError traceback) and an empty TOML
    (once a message about TorchTitan's default model's model.hf_assets_path): one line naming
    the file and what to do, exit 2, nothing written."""
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(open(DEBUG_TOML, "rb").read().replace(b"# TorchTitan optimizer name", b"# caf\xe9", 1))
    empty = write_toml(tmp_path, "")
    for path, message in [
        (latin1, f"--job.config_file: {latin1}: not UTF-8 text (byte 0xe9 at offset "),
        (
            empty,
            f"model.name: no model named ({empty}); add [model] name = one of "
            "('gpt2', 'qwen3_dispersion', 'llama3_dispersion')",
        ),
    ]:
        proc = python_module(
            "dispersion_titan.train",
            "--job.config_file",
            str(path),
            "--job.dump_folder",
            str(tmp_path / "run"),
            timeout=120,
        )
        assert proc.returncode == 2
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"dispersion_titan: error: {message}"), line
    assert not (tmp_path / "run").exists()


def test_derived_values_and_a_variant_with_coeff_0_are_noted_once_at_launch(tmp_path):
    """What the checks derived (debug.toml's micro-batch: 8 sequences on 1 rank, at most 4 at a time) is said
    once; and ``coeff`` left at 0 with a variant: valid (the term is still logged), but said in one line."""
    proc = python_module(
        "dispersion_titan.train",
        "--job.config_file",
        DEBUG_TOML,
        "--job.dump_folder",
        str(tmp_path / "run"),
        "--training.seq_len",
        "64",
        "--training.steps",
        "1",
        "--checkpoint.no-enable",
        "--validation.no-enable",
        "--dispersion.variant",
        "angular_spread",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if "note:" in line]
    assert notes == [
        "dispersion_titan: note: derived: training.local_batch_size = 4",
        "dispersion_titan: note: dispersion.coeff is 0: the angular_spread term is logged but adds "
        'nothing to the loss; set dispersion.coeff > 0, or dispersion.variant = "none"',
    ]


def test_a_coeff_without_a_variant_is_noted():
    """``--dispersion.coeff 0.05`` on a config whose variant is ``none`` (the README's tour once showed it on
    debug.toml): valid, a run without the term, said in one line; a variant with its coeff, or neither, says
    nothing about the term."""
    from dispersion_titan.job_config.checks import launch_notes

    def notes(*overrides: str) -> list[str]:
        return [n for n in launch_notes(validated_args([*DEBUG, *overrides], 1), {}) if n.startswith("dispersion.")]

    assert notes("--dispersion.coeff", "0.05") == [
        "dispersion.coeff is 0.05 but dispersion.variant is 'none': no dispersion term is computed; set "
        f"dispersion.variant ({', '.join(variants.VARIANTS)})"  # every variant, a new one too (extending.md)
    ]
    assert notes() == notes("--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.05") == []


def test_analyze_texts_not_utf8_leaves_no_out_folder(tmp_path, capsys):
    texts = tmp_path / "latin1.jsonl"
    texts.write_bytes(b'{"text": "caf\xe9"}\n')
    out = tmp_path / "out"
    result = analyze(str(tmp_path / "run"), "--texts", str(texts), "--out", str(out), capsys=capsys)
    assert_one_line_error(*result[::2], f"--texts: {texts}: cannot be read", "can't decode byte 0xe9")
    assert not out.exists()


def test_gpt2_tensor_parallel_on_an_older_torch_is_refused_in_one_line(monkeypatch):
    """torch 2.11 trains GPT-2 under TP with norm updates off one process's (docs/cluster.md#offline-nodes):
    refused there, before any process starts; data parallelism and Qwen3's TP stay allowed."""
    from dispersion_titan.job_config import checks

    monkeypatch.setattr(checks, "torch_release", lambda: (2, 11))
    with pytest.raises(ConfigError) as err:
        validated_args([*DEBUG, "--parallelism.tensor_parallel_degree", "2"], 2)
    assert str(err.value) == ("parallelism.tensor_parallel_degree: GPT-2's tensor parallel needs torch 2.13 or later, "
                              "this is 2.11 (its norms' updates drift from one process's); use data parallelism or "
                              "a newer torch")  # fmt: skip
    validated_args(DEBUG, 2)
    validated_args(QWEN3_TP2, 2)
    monkeypatch.undo()
    assert checks.torch_release() >= checks.GPT2_TP_TORCH  # this machine's torch: GPT-2's TP runs in the suite


def test_the_schemas_choices_are_the_losss():
    """``config/schema.py``'s ``Literal`` choices, which the parser enforces, name what the loss implements."""
    fields = {f.name: f.type for f in dataclasses.fields(schema.Dispersion)}
    hints = typing.get_type_hints(schema.Dispersion)
    assert typing.get_args(hints["variant"]) == ("none", *variants.VARIANTS)
    assert typing.get_args(hints["kernel"]) == variants.KERNELS
    assert typing.get_args(hints["form"]) == variants.FORMS
    assert typing.get_args(hints["precision"]) == variants.PRECISIONS
    assert set(fields) >= {"variant", "kernel", "form", "points", "precision"}
    assert typing.get_args(typing.get_type_hints(schema.Baseline)["method"]) == ("none", *schema.BASELINE_METHODS)
    assert schema.BASELINE_METHODS == ("noisy_embedding", "active_forgetting")


def test_an_offline_start_of_a_hub_model_is_one_line_before_any_folder(tmp_path, monkeypatch):
    """A paper config whose model is a hub id (Qwen/Qwen3-0.6B), started where the hub cannot be reached
    (a closed local port as HF_ENDPOINT) with an empty cache: the launch check says so in one line at once
    (once 22 lines of retry warnings over 23 s), and no run folder is made."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    dump = tmp_path / "run"
    config = validated_args([*job_args(QWEN3_MIDTRAIN_TOML), "--profile", "cpu", "--job.dump_folder", str(dump)])
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        check_launch(config, take_lock=False)
    assert str(err.value) == (
        "model.hf_assets_path: Qwen/Qwen3-0.6B: not in the local Hugging Face cache, and the hub is not asked: "
        "127.0.0.1:9 is unreachable from here (Connection refused); fetch it where the hub is reachable "
        "(hf download Qwen/Qwen3-0.6B), or give a local folder"
    )
    assert time.monotonic() - started < 5 and not dump.exists()
