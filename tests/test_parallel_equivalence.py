"""Every parallel layout trains the same model on the same global batch.

From one seed checkpoint, the total loss, CE, dispersion term and the weights after 3
steps agree within 1e-4 (relative) across: 1 process with gradient accumulation 2,
FSDP=2 (no accumulation), TP=2 (sequence parallel, loss parallel) and, for gpt2,
FSDP2×TP2. The dispersion loss is on every block, with a token subset, so its
gathering over sequence shards and its global-batch scaling are exercised too (gpt2 at
``points = "hidden_states"``, whose last point is the final norm's sequence-sharded
output under TP; qwen3 at the blocks). The
subset is drawn per micro-batch (the authors' per call), keyed by the micro-batch's
chunk of the global batch: every layout here cuts the batch of 8 into the same two
chunks of 4, so they draw the same subsets. Both our
gpt2 and TorchTitan's own qwen3 (its debugmodel shrunk, tied LM head, GPT-2's vocabulary
padded to 50304 rows) are checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dispersion_titan.models.qwen3 import Qwen3Args
from support.launch import DEBUG_TOML, REPO, torchrun
from support.runs import load_weights, max_abs_diff, scalars, tiny_run, update_rel_diff

pytestmark = pytest.mark.slow

STEPS = 3
TAGS = ("loss_metrics/global_avg_loss", "loss_metrics/ce", "loss_metrics/dispersion")
COEFF = 0.5


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


SHARED = ("--training.steps", str(STEPS), "--training.global_batch_size", "8", "--validation.no-enable",
          "--checkpoint.interval", "100", "--dispersion.variant", "angular_spread", "--dispersion.layers", "all",
          "--dispersion.coeff", str(COEFF), "--lr_scheduler.warmup_steps", "1")
FAMILIES = {
    # gpt2 takes the loss on hidden_states (the final norm's output under FSDP and TP), qwen3 on the blocks.
    "gpt2": Family(DEBUG_TOML, (*SHARED, "--dispersion.max_tokens", "96", "--dispersion.points", "hidden_states"),
                   layouts(two_d=True), None),
    "qwen3": Family(
        str(REPO / "train_configs" / "debug_qwen3_angular_spread.toml"),
        (*SHARED, "--dispersion.max_tokens", "48", "--training.seq_len", "64",
         *(arg for key, value in QWEN3_SHAPE.items()
           for arg in (f"--model.{'mlp_hidden_dim' if key == 'hidden_dim' else key}", str(value)))),
        layouts(two_d=False), qwen3_seed),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def runs(request, tmp_path_factory):
    family = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(f"layouts-{request.param}")
    seed_step = request.getfixturevalue("debug_seed_checkpoint") if family.seed is None else family.seed(root / "seed")
    out = {"family": family, "seed": seed_step}
    for name, (nproc, extra) in family.layouts.items():
        torchrun(root / name, nproc, *family.common, *extra, "--checkpoint.initial_load_path", str(seed_step),
                 config=family.config)
        out[name] = root / name
    if request.param == "gpt2":
        # A fresh 2-D run with no seed checkpoint: its step 0 must equal the 1-process init
        # (our GPT-2 draws its init layout-invariantly; TorchTitan's Qwen3 does not).
        torchrun(root / "fresh_2d", 4, "--training.steps", "1", "--validation.no-enable",
                 "--parallelism.tensor_parallel_degree", "2")
        out["fresh_2d"] = root / "fresh_2d"
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
        total = s["loss_metrics/ce"][step] + COEFF * s["loss_metrics/dispersion"][step]
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
    for name in (*runs["family"].layouts, *(["fresh_2d"] if "fresh_2d" in runs else [])):
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
        torchrun(tmp_path / name, nproc, *family.common, *extra, *DROPOUT, "--checkpoint.initial_load_path",
                 str(runs["seed"]), config=family.config)
    one, two, plain = scalars(tmp_path / "single_accum2"), scalars(tmp_path / "fsdp2"), scalars(runs["single_accum2"])
    assert one["loss_metrics/ce"][1] != plain["loss_metrics/ce"][1]  # the masks changed the loss
    for tag in TAGS:
        for step in range(1, STEPS + 1):
            want, have = one[tag][step], two[tag][step]
            assert abs(have - want) <= 1e-4 * abs(want), (tag, step, have, want)
    final = f"step-{STEPS}"
    assert update_rel_diff(load_weights(tmp_path / "fsdp2" / "checkpoint" / final),
                           load_weights(tmp_path / "single_accum2" / "checkpoint" / final),
                           load_weights(runs["seed"])) <= 1e-4
