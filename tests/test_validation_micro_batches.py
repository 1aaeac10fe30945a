"""Validation runs in training's micro-batches, so its memory is bounded by the training
micro-batch, and its loss is the unsplit one (issue 25 item 5)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torchtitan.components.loss import IGNORE_INDEX, cross_entropy_loss
from torchtitan.distributed.parallel_dims import ParallelDims

from dispersion_titan.components.validate import PackedValidator
from dispersion_titan.data.packed import build_packed_validation_dataloader
from dispersion_titan.job_config.parse import setup_torchtitan, validated_args
from dispersion_titan.models import family
from dispersion_titan.models.gpt2.args import gpt2_flavors
from support.launch import job_args

BASE = job_args()
BATCH, STEPS = 6, 2  # validation: 2 global batches of 6 sequences, on 1 process


class LoggedValidation:
    """What the validator hands TorchTitan's metrics processor: the tokens seen and the loss."""

    ntokens_since_last_log = 0

    def log_validation(self, loss: float, step: int) -> None:
        self.loss, self.step = loss, step


def test_validation_is_micro_batched_like_training_with_the_unsplit_loss():
    setup_torchtitan()
    config = validated_args(
        [
            *BASE,
            "--training.global_batch_size",
            "8",
            "--training.max_local_batch_size",
            "4",
            "--validation.global_batch_size",
            str(BATCH),
            "--validation.steps",
            str(STEPS),
            "--validation.seq_len",
            "32",
        ]
    )
    assert config.training.local_batch_size == 4 and config.validation.local_batch_size == BATCH
    torch.manual_seed(0)
    model = family("gpt2").get_train_spec().model_cls(gpt2_flavors["debug"])
    model.init_weights()
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))

    logged = LoggedValidation()
    validator = PackedValidator(
        job_config=config,
        dp_world_size=1,
        dp_rank=0,
        tokenizer=None,
        parallel_dims=ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1),
        loss_fn=cross_entropy_loss,
        validation_context=contextlib.nullcontext,
        maybe_enable_amp=contextlib.nullcontext(),
        metrics_processor=logged,
        pp_schedule=None,  # as Trainer hands them without pipeline parallelism
        pp_has_first_stage=None,
        pp_has_last_stage=None,
    )
    validator.validate([model], step=7)
    assert seen == [4, 2] * STEPS  # micro-batches of the training micro-batch, never the whole batch
    assert model.training and logged.step == 7

    # The unsplit computation: each whole batch through the model, its token-mean loss, averaged.
    batches = iter(build_packed_validation_dataloader(1, 0, config))
    means = []
    with torch.no_grad():
        for _ in range(STEPS):
            inputs, labels = next(batches)
            logits = model(inputs["input"])
            assert logits.shape[0] == BATCH
            means.append(cross_entropy_loss(logits, labels) / (labels != IGNORE_INDEX).sum())
    assert logged.loss == pytest.approx(torch.stack(means).mean().item(), rel=1e-6)
