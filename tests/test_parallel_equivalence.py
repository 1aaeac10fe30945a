"""Every parallel layout trains the same model on the same global batch.

From one seed checkpoint, the total loss, CE, dispersion term and the weights after 3
steps agree within 1e-4 (relative) across: 1 process with gradient accumulation 2,
FSDP=2 (no accumulation), TP=2 (sequence parallel, loss parallel) and, for gpt2,
FSDP2×TP2 (from its own init, which is the seed's). The dispersion loss is on every block, with a token subset, so its
gathering over sequence shards and its global-batch scaling are exercised too (gpt2 at
``points = "hidden_states"``, whose last point is the final norm's sequence-sharded
output under TP; qwen3 at the blocks). The
subset is drawn per micro-batch (the authors' per call), keyed by the micro-batch's
chunk of the global batch: every layout here cuts the batch of 8 into the same two
chunks of 4, so they draw the same subsets. Both our
gpt2 and TorchTitan's own qwen3 (its debugmodel shrunk, tied LM head, GPT-2's vocabulary
padded to 50304 rows) are checked.

A paper config (replicated parameters, the authors' DDP) trains alike on 1 and 2 gloo ranks,
both under bf16 autocast, whose norms and residual stream stay fp32 (checked in process). Our configs
shard: in bf16 they compute as FSDP2 does on any number of ranks, one included (``fsdp.shards_one_rank``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from dispersion_titan.models import family
from dispersion_titan.models.gpt2.args import gpt2_flavors
from dispersion_titan.models.qwen3_dispersion import Qwen3Args
from support.launch import DEBUG_TOML, REPO, torchrun
from support.runs import load_weights, max_abs_diff, scalars, tiny_run, update_rel_diff

pytestmark = pytest.mark.slow

STEPS = 3
TAGS = ("loss_metrics/global_avg_loss", "loss_metrics/ce", "loss_metrics/dispersion")
COEFF = 0.5
WARMUP = 2  # λ's linear warm-up (dispersion.warmup_steps): λ/2 at step 1, then λ


@dataclass(frozen=True)
class Family:
    config: str
    common: tuple[str, ...]
    layouts: dict[str, tuple[int, tuple[str, ...]]]
    seed: Callable[[Path], Path] | None
    """Writes the seed checkpoint under the given folder; its step-0 folder. None: the
    session's debug.toml seed checkpoint (conftest), which the baseline runs start from too."""


QWEN3_SHAPE = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128, vocab_size=50304)


def qwen3_seed(dump: Path) -> Path:
    """TorchTitan's Qwen3 init, in this process (a launch saved)."""
    args = Qwen3Args(**QWEN3_SHAPE, max_seq_len=64, enable_weight_tying=True)
    return tiny_run(dump, steps=(0,), args=args) / "checkpoint" / "step-0"


def layouts(two_d: bool) -> dict[str, tuple[int, tuple[str, ...]]]:
    out = {
        "single_accum2": (1, ("--training.local_batch_size", "4")),
        "fsdp2": (2, ("--training.local_batch_size", "4")),
        "tp2": (2, ("--training.local_batch_size", "4", "--parallelism.tensor_parallel_degree", "2")),
    }
    if two_d:
        out["fsdp2_tp2"] = (4, ("--training.local_batch_size", "4", "--parallelism.tensor_parallel_degree", "2"))
    return out


SHARED = (
    "--training.steps",
    str(STEPS),
    "--training.global_batch_size",
    "8",
    "--validation.no-enable",
    "--checkpoint.interval",
    "100",
    "--dispersion.variant",
    "angular_spread",
    "--dispersion.layers",
    "all",
    "--dispersion.coeff",
    str(COEFF),
    "--dispersion.warmup_steps",
    str(WARMUP),
    "--lr_scheduler.warmup_steps",
    "1",
)
FAMILIES = {
    # gpt2 takes the loss on hidden_states (the final norm's output under FSDP and TP), qwen3 on the blocks.
    "gpt2": Family(
        DEBUG_TOML,
        (*SHARED, "--dispersion.max_tokens", "96", "--dispersion.points", "hidden_states"),
        layouts(two_d=True),
        None,
    ),
    "qwen3": Family(
        str(REPO / "train_configs" / "debug_qwen3_angular_spread.toml"),
        (
            *SHARED,
            "--dispersion.max_tokens",
            "48",
            "--training.seq_len",
            "64",
            *(
                arg
                for key, value in QWEN3_SHAPE.items()
                for arg in (f"--model.{'mlp_hidden_dim' if key == 'hidden_dim' else key}", str(value))
            ),
        ),
        layouts(two_d=False),
        qwen3_seed,
    ),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def runs(request, tmp_path_factory):
    family = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(f"layouts-{request.param}")
    seed_step = request.getfixturevalue("debug_seed_checkpoint") if family.seed is None else family.seed(root / "seed")
    out = {"family": family, "seed": seed_step}
    for name, (nproc, extra) in family.layouts.items():
        # gpt2's 2-D run loads no seed checkpoint: our GPT-2 draws its init layout-invariantly, so its step 0
        # (saved before any step) must equal the 1-process init, and it trains as the others (TorchTitan's
        # Qwen3 does not draw so: its runs all load the seed).
        fresh = name == "fsdp2_tp2"
        start = () if fresh else ("--checkpoint.initial_load_path", str(seed_step))
        torchrun(root / name, nproc, *family.common, *extra, *start, config=family.config)
        out[name] = root / name
    return out


def test_losses_agree_across_layouts(runs):
    reference = scalars(runs["single_accum2"])
    for tag in TAGS:
        assert sorted(reference[tag]) == list(range(1, STEPS + 1))
    assert reference["loss_metrics/dispersion"][1] != 0.0
    for name in runs["family"].layouts:
        got = scalars(runs[name])
        for tag in TAGS:
            for step in range(1, STEPS + 1):
                want, have = reference[tag][step], got[tag][step]
                assert abs(have - want) <= 1e-4 * abs(want), (name, tag, step, have, want)


def test_total_is_ce_plus_weighted_dispersion(runs):
    s = scalars(runs[list(runs["family"].layouts)[-1]])  # the most parallel layout
    for step in range(1, STEPS + 1):
        total = s["loss_metrics/ce"][step] + COEFF * min(1.0, step / WARMUP) * s["loss_metrics/dispersion"][step]
        assert abs(s["loss_metrics/global_avg_loss"][step] - total) < 1e-5


def test_weights_after_training_agree_across_layouts(runs):
    reference = load_weights(runs["single_accum2"] / "checkpoint" / f"step-{STEPS}")
    initial = load_weights(runs["seed"])
    assert max_abs_diff(reference, initial) > 1e-3  # training moved the weights
    for name in runs["family"].layouts:
        got = load_weights(runs[name] / "checkpoint" / f"step-{STEPS}")
        assert update_rel_diff(got, reference, initial) <= 1e-4, name


def test_step0_is_the_initialisation_under_every_layout(runs):
    initial = load_weights(runs["seed"])
    for name in runs["family"].layouts:
        step0 = load_weights(runs[name] / "checkpoint" / "step-0")
        assert max_abs_diff(step0, initial) == 0.0, name


DROPOUT = ("--model.attn_dropout", "0.1", "--model.resid_dropout", "0.1", "--model.embd_dropout", "0.1")


def test_dropout_masks_agree_between_one_process_and_fsdp2(runs, tmp_path):
    """gpt2 with dropout: 1 process (accumulation 2) and FSDP=2 cut the batch into the same two
    chunks and seed each chunk's masks alike, so losses and weights agree as without dropout
    (other layouts draw other masks from the same distribution: TP ranks, other chunkings)."""
    family = runs["family"]
    if family.config != DEBUG_TOML:
        pytest.skip("dropout is a gpt2 setting")
    for name in ("single_accum2", "fsdp2"):
        nproc, extra = family.layouts[name]
        torchrun(
            tmp_path / name,
            nproc,
            *family.common,
            *extra,
            *DROPOUT,
            "--checkpoint.initial_load_path",
            str(runs["seed"]),
            config=family.config,
        )
    one, two, plain = scalars(tmp_path / "single_accum2"), scalars(tmp_path / "fsdp2"), scalars(runs["single_accum2"])
    assert one["loss_metrics/ce"][1] != plain["loss_metrics/ce"][1]  # the masks changed the loss
    for tag in TAGS:
        for step in range(1, STEPS + 1):
            want, have = one[tag][step], two[tag][step]
            assert abs(have - want) <= 1e-4 * abs(want), (tag, step, have, want)
    final = f"step-{STEPS}"
    assert (
        update_rel_diff(
            load_weights(tmp_path / "fsdp2" / "checkpoint" / final),
            load_weights(tmp_path / "single_accum2" / "checkpoint" / final),
            load_weights(runs["seed"]),
        )
        <= 1e-4
    )


def test_one_rank_computes_with_fsdp2s_bf16_parameters_as_two_ranks_do(tmp_path):
    """Our sharding config in bf16: one process (FSDP2 on a one-rank mesh, accumulation 2) and FSDP=2 train
    alike within the layout tolerance; the same process under autocast (replicated parameters, fp32 norms
    and residual stream) computes other numbers from the first step on."""
    common = ("--training.steps", str(STEPS), "--training.global_batch_size", "8", "--training.local_batch_size",
              "4", "--validation.no-enable", "--checkpoint.no-enable", "--training.mixed_precision_param",
              "bfloat16", "--dispersion.variant", "angular_spread", "--dispersion.coeff", str(COEFF))  # fmt: skip
    runs = {"one": (1, ()), "two": (2, ()), "autocast": (1, ("--parallelism.data_parallel_shard_degree", "1"))}
    logs = {name: torchrun(tmp_path / name, n, *common, *extra) for name, (n, extra) in runs.items()}
    assert "Applied FSDP2 on one rank" in logs["one"].stdout + logs["one"].stderr
    one, two, autocast = (scalars(tmp_path / name) for name in runs)
    for tag in TAGS:
        for step in range(1, STEPS + 1):
            assert abs(one[tag][step] - two[tag][step]) <= 1e-4 * abs(two[tag][step]), (tag, step)
    assert autocast[TAGS[0]][1] != two[TAGS[0]][1] == one[TAGS[0]][1]


PAPER_GPT2 = str(REPO / "train_configs" / "paper" / "midtrain_gpt2_wikitext103_dispersion.toml")
ACCUMULATION = 2
MEAN = ("--released.gpus", "2", "--training.loss_scale", "mean", "--checkpoint.no-enable")
PAPER_SHRUNK = (
    "--profile",
    "cpu",
    "--model.flavor",
    "debug",
    "--model.hf_assets_path",
    ".",
    "--checkpoint.no-initial_load_in_hf",
    "--training.dataset",
    "enwiki_sample",
    "--validation.no-enable",
    "--training.seq_len",
    "64",
    "--training.max_local_batch_size",
    "2",
    "--released.per_device_train_batch_size",
    "2",
    "--released.gradient_accumulation_steps",
    str(ACCUMULATION),
    "--released.train_tokens",
    str(STEPS * 2 * 2 * ACCUMULATION * 64 - 100),
    "--released.lr",
    "1e-3",
)
"""midtrain_gpt2_wikitext103_dispersion.toml on the debug shape, from our layout-invariant init (with
its dropout, λ and token subsets), its parallelism as shipped: replicated over every rank. Its [released]
layout shrunk: 2 sequences per GPU and micro-batch, accumulation 2, a token budget of 3 steps on 2 GPUs."""


def test_paper_config_replicates_under_autocast_and_matches_one_process(tmp_path):
    """On 2 ranks TorchTitan applies DDP (gradients summed, all-reduced at the last micro-batch) and
    bf16 autocast. One process training the authors' 2-GPU run (``released.gpus = 2``: twice the
    accumulation) gets the same layout, the same gradients before clipping (A = 2 times the mean's: a
    third run with ``training.loss_scale = "mean"``) and the same losses every step; the weights after
    the first update agree within 1e-4 (the as_released schedule makes step 1 at lr 0). Later weights
    drift further apart: a weight an fp32 rounding apart can round to another bf16 value (in fp32 a
    whole 3-step run agreed within 4e-7)."""
    runs = {"ranks1": (1, ("--released.gpus", "2")), "ranks2": (2, ()), "mean": (1, MEAN)}
    logs = {
        name: torchrun(tmp_path / name, n, *PAPER_SHRUNK, *extra, config=PAPER_GPT2)
        for name, (n, extra) in runs.items()
    }
    for log in (logs["ranks1"].stdout + logs["ranks1"].stderr, logs["ranks2"].stdout + logs["ranks2"].stderr):
        assert "Mixed precision training is handled by AMP" in log and "handled by fully_shard" not in log
        assert f"[released] on 2 GPUs: 2 × {ACCUMULATION} sequences per GPU, global batch 8, {STEPS} steps" in log
    assert "Applied DDP" in logs["ranks2"].stdout + logs["ranks2"].stderr
    # The authors' T and W for 2 GPUs, recomputed here as their script computes them.
    saved = json.loads((tmp_path / "ranks2" / "job_config.json").read_text())
    tokens = STEPS * 2 * 2 * ACCUMULATION * 64 - 100
    steps = math.ceil(tokens / (2 * 64 * ACCUMULATION * 2))
    assert (saved["training"]["steps"], saved["lr_scheduler"]["warmup_steps"]) == (steps, math.ceil(0.2 * steps))
    assert saved["optimizer"]["lr"] == pytest.approx(1e-3 * math.sqrt(2)) and steps == STEPS
    one, two, mean = scalars(tmp_path / "ranks1"), scalars(tmp_path / "ranks2"), scalars(tmp_path / "mean")
    for tag in (*TAGS, "grad_norm"):
        for step in range(1, STEPS + 1):
            assert abs(two[tag][step] - one[tag][step]) <= 1e-4 * abs(one[tag][step]), (tag, step)
    assert one["grad_norm"][1] == pytest.approx(ACCUMULATION * mean["grad_norm"][1], rel=1e-4)
    initial = load_weights(tmp_path / "ranks1" / "checkpoint" / "step-0")
    for n in (1, 2):
        assert max_abs_diff(load_weights(tmp_path / f"ranks{n}" / "checkpoint" / "step-1"), initial) == 0.0
    assert (
        update_rel_diff(
            load_weights(tmp_path / "ranks2" / "checkpoint" / "step-2"),
            load_weights(tmp_path / "ranks1" / "checkpoint" / "step-2"),
            initial,
        )
        <= 1e-4
    )


@pytest.mark.parametrize(
    "args", [gpt2_flavors["debug"], Qwen3Args(**QWEN3_SHAPE, max_seq_len=64)], ids=["gpt2", "qwen3"]
)
def test_autocast_keeps_norms_and_the_residual_stream_fp32(args):
    """Under the bf16 autocast of replicated parameters, matmuls run in bf16 while the norms of the
    residual stream and every block's output (the residual stream) are fp32, as under the authors' bf16
    Trainer; Qwen3's per-head q/k norms take the bf16 projections, as in transformers' Qwen3."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = family(args.FAMILY).get_train_spec().model_cls(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()
    dtypes: dict[str, set[torch.dtype]] = {"norm": set(), "head_norm": set(), "block": set(), "linear": set()}

    def record(kind: str):
        return lambda module, inputs, output: dtypes[kind].add(output.dtype)

    for name, module in model.named_modules():
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            module.register_forward_hook(record("head_norm" if name.endswith(("q_norm", "k_norm")) else "norm"))
        elif isinstance(module, nn.Linear):
            module.register_forward_hook(record("linear"))
    for block in model.layers.values():
        block.register_forward_hook(record("block"))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        model(torch.randint(0, 1000, (2, 16)))
    heads = {torch.bfloat16} if args.FAMILY == "qwen3_dispersion" else set()
    assert dtypes == {"norm": {torch.float32}, "head_norm": heads, "block": {torch.float32}, "linear": {torch.bfloat16}}
