"""The baselines the paper compares against (``[baseline]``): NEFTune's noisy embeddings
and active forgetting.

In one process: the noise's bound, its layout invariance and its absence outside
training; a reset's fresh matrix, zeroed pad row and cleared AdamW state; the embedding
group's LR against the authors' schedule, re-implemented here from its formula. With
torchrun, from one seed checkpoint: each method gives the same losses and weights on 1
process, on FSDP2 with gradient accumulation and under TP with sequence parallel, and a
resumed active-forgetting run reproduces the uninterrupted one exactly.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from torch import nn

from dispersion_titan.components.optimizers import (
    build_dispersion_lr_schedulers,
    build_dispersion_optimizers,
)
from dispersion_titan.config.schema import Baseline
from dispersion_titan.models.gpt2 import GPT2, gpt2_flavors
from dispersion_titan.trainer.baselines import ActiveForgetting, EmbeddingNoise
from support.launch import torchrun
from support.runs import load_weights, max_abs_diff, scalars, update_rel_diff

# ---------------------------------------------------------------- in one process


def noisy_embedding(weight: torch.Tensor, alpha: float, dp_rank: int = 0, dp_degree: int = 1) -> nn.Embedding:
    embedding = nn.Embedding.from_pretrained(weight.clone(), freeze=False)
    EmbeddingNoise(embedding, alpha, seed=7, dp_rank=dp_rank, dp_degree=dp_degree, tp_group=None).begin_step(5)
    return embedding


@torch.no_grad()
def test_noise_is_bounded_layout_invariant_and_training_only():
    torch.manual_seed(0)
    weight, tokens = torch.randn(100, 64), torch.randint(0, 100, (4, 32))
    clean = nn.functional.embedding(tokens, weight)
    alpha, bound = 2.0, 2.0 / math.sqrt(32 * 64)

    single = noisy_embedding(weight, alpha)
    noise = single(tokens) - clean
    assert noise.abs().max() <= bound * (1 + 1e-5) and noise.abs().max() > 0.99 * bound
    assert abs(noise.mean()) < 0.02 * bound and noise.std() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    assert not torch.allclose(noise[0], noise[1])  # each sequence its own noise

    # Rank 1 of 2 with 2 rows per micro-batch reads the step's sequences 2 and 3, as the
    # second of two accumulation micro-batches on one rank does: both get rows 2-3's noise.
    rank1 = noisy_embedding(weight, alpha, dp_rank=1, dp_degree=2)
    torch.testing.assert_close(rank1(tokens[2:]) - clean[2:], noise[2:], rtol=0, atol=1e-6)
    accumulating = noisy_embedding(weight, alpha)
    accumulating(tokens[:2])
    torch.testing.assert_close(accumulating(tokens[2:]) - clean[2:], noise[2:], rtol=0, atol=1e-6)

    single.eval()  # validation and analysis
    assert torch.equal(single(tokens), clean)


AF = Baseline(method="active_forgetting", forget_every=25, embedding_lr=3e-4)


def checked_job_config(baseline: Baseline):
    """A job config with ``baseline`` as its ``[baseline]``, carried where the builders look, as
    the launch checks leave it."""
    from dispersion_titan.components.titan_compat import merged_job_config_class
    from dispersion_titan.config.cli import CONFIG_MODULE

    job = merged_job_config_class(CONFIG_MODULE)()
    job.baseline = job.optimizer.baseline = job.lr_scheduler.baseline = baseline
    return job


def forgetting_model_and_optimizers(baseline: Baseline = AF):
    args = gpt2_flavors["debug"]
    torch.manual_seed(1)
    model = GPT2(args)
    model.init_weights()
    section = checked_job_config(baseline).optimizer
    section.lr, section.implementation = 1e-3, "foreach"
    optimizers = build_dispersion_optimizers([model], section, None)
    return model, optimizers


def test_reset_gives_a_fresh_matrix_and_clears_its_adamw_state():
    model, optimizers = forgetting_model_and_optimizers()
    (optimizer,) = optimizers
    body, embedding = (group["params"] for group in optimizer.param_groups)
    assert embedding == [model.tok_embeddings.weight] and model.output.weight is model.tok_embeddings.weight
    assert len(body) == len(list(model.parameters())) - 1
    tokens = torch.randint(0, 1000, (2, 16))
    for _ in range(2):
        optimizers.zero_grad()
        model(tokens).logsumexp(-1).mean().backward()
        optimizers.step()

    forgetting = ActiveForgetting(model, optimizers, period=2, seed=3, tied=True, pad_id=7)
    before = model.tok_embeddings.weight.detach().clone()
    forgetting.begin_step(2)  # mid-period: nothing happens
    assert torch.equal(model.tok_embeddings.weight, before)
    forgetting.begin_step(3)  # after step 2 = K: reset before step 3
    after = model.tok_embeddings.weight.detach()
    assert after.std().item() == pytest.approx(0.02, rel=0.01) and abs(after.mean().item()) < 1e-3
    assert not after[7].any() and after[6].any() and after[8].any()  # the pad row only is zeroed
    assert abs(torch.corrcoef(torch.stack([before.flatten(), after.flatten()]))[0, 1].item()) < 0.01
    state = optimizer.state[model.tok_embeddings.weight]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq"} and all(not v.any() for v in state.values())
    assert all(optimizer.state[p]["step"].item() == 2 for p in body)  # the body's state is kept

    again = ActiveForgetting(model, optimizers, period=2, seed=3, tied=True, pad_id=7)
    again.begin_step(3)  # the same reset, as a resumed run makes it
    assert torch.equal(model.tok_embeddings.weight, after)


def plasticity_embedding_lr(step: int, peak: float, K: int, T: int) -> float:
    """The embeddings' LR at optimizer step ``step`` (1-based), written from the authors' formula
    (LM-Dispersion, lm_dispersion/midtrain_gpt2_huggingface/midtrain_gpt2_other_counter_condensation.py,
    ActiveForgettingLRScheduler.get_lr, whose last_epoch + 1 is this step): index e = (step * (T // K)) % T,
    capped at T - 1; warm-up over int(0.08 T) steps, then linear decay to 0 at T."""
    e = min((step * (T // K)) % T, T - 1)
    warmup = int(T * 0.08)
    factor = e / max(1, warmup) if e < warmup else max(0.0, (T - e) / max(1, T - warmup))
    return peak * factor


@pytest.mark.parametrize("K, T", [(25, 100), (30, 100), (1000, 191)])  # K | T: restarts at resets; else not
def test_embedding_lr_follows_the_authors_schedule_and_the_body_keeps_the_run_schedule(K, T):
    from torchtitan.components.lr_scheduler import build_lr_schedulers

    baseline = Baseline(method="active_forgetting", forget_every=K, embedding_lr=3e-4)
    schedule = checked_job_config(baseline).lr_scheduler
    schedule.warmup_steps, schedule.decay_type, schedule.min_lr_factor = 5, "cosine", 0.1
    _, optimizers = forgetting_model_and_optimizers(baseline)
    schedulers = build_dispersion_lr_schedulers(optimizers, schedule, training_steps=T)
    _, plain = forgetting_model_and_optimizers(Baseline())
    reference = build_lr_schedulers(plain, schedule, T)

    (optimizer,) = optimizers
    seen = []
    for step in range(1, T + 1):
        body_lr, embedding_lr = (group["lr"] for group in optimizer.param_groups)
        seen.append(embedding_lr)
        assert embedding_lr == pytest.approx(plasticity_embedding_lr(step, 3e-4, K, T), rel=1e-12, abs=1e-18), step
        assert body_lr == pytest.approx(reference.schedulers[0].get_last_lr()[0], rel=1e-12), step
        for s in (optimizers, plain, schedulers, reference):
            s.step()
    if K > T:  # ⌊T/K⌋ = 0, the index stays 0: the embeddings never train (the paper configs on 8 GPUs, T = 191)
        assert seen == [0.0] * T
    elif T % K == 0:  # the LR is 0 at each reset step K, 2K, ... and warms up again after it
        assert all(seen[k - 1] == 0.0 and seen[k] > 0 for k in range(K, T, K))
    else:  # e.g. K 30, T 100: speed 3, so step 34 has index 2 (3·34 = 102 mod 100): no restart at the reset
        assert seen[33] == pytest.approx(3e-4 * 2 / 8) and seen[29] == pytest.approx(3e-4 * (100 - 90) / 92)


@pytest.mark.parametrize(
    "baseline", [Baseline(), Baseline(method="active_forgetting", forget_every=25)], ids=["plain", "active_forgetting"]
)
def test_as_released_schedule_is_transformers_cosine_schedule(baseline):
    """``lr_scheduler.form = "as_released"``: every update's LR is that of transformers'
    get_cosine_schedule_with_warmup, the first at 0, over W = the run's warm-up (⌈0.2·T⌉, the Trainer's
    warmup_ratio) or, under active forgetting, ⌊0.2·T⌋ (the authors' ActiveForgettingLRScheduler)."""
    from transformers import get_cosine_schedule_with_warmup

    T = 101
    schedule = checked_job_config(baseline).lr_scheduler
    schedule.form, schedule.warmup_steps, schedule.decay_type, schedule.min_lr_factor = "as_released", 21, "cosine", 0
    _, optimizers = forgetting_model_and_optimizers(baseline)
    schedulers = build_dispersion_lr_schedulers(optimizers, schedule, training_steps=T)
    probe = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-3)
    reference = get_cosine_schedule_with_warmup(probe, 20 if baseline.method == "active_forgetting" else 21, T)
    (optimizer,) = optimizers
    assert optimizer.param_groups[0]["lr"] == 0.0  # the first update
    for step in range(T):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(probe.param_groups[0]["lr"], rel=1e-12, abs=1e-18), step
        for s in (optimizers, schedulers, probe, reference):
            s.step()


# ---------------------------------------------------------------- torchrun

STEPS = {"noisy_embedding": 3, "active_forgetting": 5}
COMMON = (
    "--training.global_batch_size",
    "8",
    "--validation.no-enable",
    "--lr_scheduler.warmup_steps",
    "1",
    "--lr_scheduler.total_steps",
    "5",
    "--checkpoint.interval",
    "100",
    "--checkpoint.no-save_initial",  # step 0 is the seed checkpoint's; no test reads a run's own copy
    "--training.seq_len",
    "32",
)
METHODS = {
    "noisy_embedding": ("--baseline.method", "noisy_embedding", "--baseline.noise_alpha", "5"),
    "active_forgetting": (
        "--baseline.method",
        "active_forgetting",
        "--baseline.forget_every",
        "2",
        "--baseline.embedding_lr",
        "1e-3",
    ),
}
LAYOUTS = {  # FSDP2 with local batch 2: two data-parallel ranks and two accumulation micro-batches
    "single": (1, ("--training.local_batch_size", "8")),
    "fsdp2_accum2": (2, ("--training.local_batch_size", "2")),
    "tp2": (2, ("--training.local_batch_size", "4", "--parallelism.tensor_parallel_degree", "2")),
}
RUNS = [(method, layout) for method in METHODS for layout in LAYOUTS]
LOSS = "loss_metrics/global_avg_loss"  # the gradient norm differs by ~1e-4 across layouts, with or without a baseline


SAVE_STEP_3 = ("--checkpoint.interval", "3", "--checkpoint.no-last-save-model-only")


def train(dump, method: str, layout: str, seed_step: str) -> str:
    """One run from the seed checkpoint; its log. Active forgetting also saves step 3 in full."""
    nproc, extra = LAYOUTS[layout]
    proc = torchrun(
        dump,
        nproc,
        *COMMON,
        *METHODS[method],
        *extra,
        "--training.steps",
        str(STEPS[method]),
        "--checkpoint.initial_load_path",
        seed_step,
        *(SAVE_STEP_3 if method == "active_forgetting" else ()),
    )
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory, debug_seed_checkpoint):
    root = tmp_path_factory.mktemp("baselines")
    seed_step = str(debug_seed_checkpoint)
    out = {"seed": debug_seed_checkpoint}
    for method, layout in RUNS:
        dump = root / f"{method}-{layout}"
        out[method, layout] = (dump, train(dump, method, layout, seed_step))
    # The single-process active forgetting run as if stopped after step 3 (one reset made,
    # one to come): its folder without what steps 4-5 wrote, resumed.
    resumed = root / "active_forgetting-resumed"
    shutil.copytree(out["active_forgetting", "single"][0], resumed, ignore=shutil.ignore_patterns("step-5", "tb"))
    assert "Training starts at step 4" in train(resumed, "active_forgetting", "single", seed_step)
    out["resumed"] = resumed
    return out


@pytest.mark.slow
def test_each_baseline_trains_the_same_under_every_layout(runs):
    initial = load_weights(runs["seed"])
    for method, layout in RUNS:
        steps = STEPS[method]
        dump, log = runs[method, layout]
        reference, _ = runs[method, "single"]
        want, got = scalars(reference)[LOSS], scalars(dump)[LOSS]
        assert sorted(got) == list(range(1, steps + 1))
        for step in got:
            assert got[step] == pytest.approx(want[step], rel=1e-4), (method, layout, step)
        final = load_weights(dump / "checkpoint" / f"step-{steps}")
        assert update_rel_diff(final, load_weights(reference / "checkpoint" / f"step-{steps}"), initial) <= 1e-4
        if method == "active_forgetting":
            resets = [line for line in log.splitlines() if "active forgetting: before step" in line]
            assert len(resets) == 2 and "before step 3:" in resets[0] and "before step 5:" in resets[1], log[-3000:]
            assert "LM head tied to them" in resets[0]


@pytest.mark.slow
def test_noise_changes_training_and_forgetting_resets_the_embeddings(runs):
    """The runs above differ from plain training: a no-op baseline would pass them too."""
    noisy, _ = runs["noisy_embedding", "single"]
    forgetting, _ = runs["active_forgetting", "single"]
    initial = load_weights(runs["seed"])
    # Reset before step 5, then one small step: the embeddings are close to a fresh N(0, 0.02) draw.
    embedding = load_weights(forgetting / "checkpoint" / "step-5")["tok_embeddings.weight"]
    assert embedding.std().item() == pytest.approx(0.02, rel=0.05)
    corr = torch.corrcoef(torch.stack([embedding.flatten(), initial["tok_embeddings.weight"].flatten()]))[0, 1]
    assert abs(corr.item()) < 0.05
    # Step 1 of active forgetting is plain training: the noise changed the loss.
    assert scalars(noisy)[LOSS][1] != scalars(forgetting)[LOSS][1]


@pytest.mark.slow
def test_resumed_active_forgetting_run_reproduces_the_uninterrupted_one(runs):
    straight, _ = runs["active_forgetting", "single"]
    want, got = scalars(straight), scalars(runs["resumed"])
    for tag in (LOSS, "grad_norm"):
        assert sorted(got[tag]) == [4, 5]
        for step in (4, 5):
            assert got[tag][step] == want[tag][step], (tag, step)
    assert (
        max_abs_diff(
            load_weights(runs["resumed"] / "checkpoint" / "step-5"), load_weights(straight / "checkpoint" / "step-5")
        )
        == 0.0
    )
