"""TorchTitan's Trainer with the dispersion term added to the loss.

Only ``forward_backward_step`` changes (plus a per-step reset of the accumulated
metrics); the training loop, checkpointing and logging remain TorchTitan's.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from .checkpoints import list_checkpoints, quarantine_incomplete, save_model_args, saved_data_parallel_degree
from .data.errors import DataConfigError
from .objective import DispersionObjective
from .preemption import Preemption


def _local(t: torch.Tensor) -> torch.Tensor:
    """A loss-parallel CE is a replicated DTensor; its local value is the whole value."""
    return t.to_local() if isinstance(t, DTensor) else t


class StepMetrics:
    """Per-step sums that TorchTitan's loop does not know about, reduced at log time."""

    def __init__(self, global_batch_size: int) -> None:
        self.global_batch_size = global_batch_size
        self.reset()

    def reset(self) -> None:
        self.ce = torch.zeros(())
        self.dispersion = torch.zeros(())
        self.cosine_sums: torch.Tensor | None = None

    def add(self, ce: torch.Tensor, dispersion: torch.Tensor, cosine_sums: torch.Tensor | None) -> None:
        self.ce = self.ce.to(ce.device) + ce
        self.dispersion = self.dispersion.to(dispersion.device) + dispersion
        if cosine_sums is not None:
            self.cosine_sums = cosine_sums if self.cosine_sums is None else self.cosine_sums + cosine_sums


class DispersionMetricsProcessor(MetricsProcessor):
    """Adds ``ce``, ``dispersion`` and each block's mean off-diagonal cosine (a live
    condensation curve) to the training log and TensorBoard, and perplexity to validation."""

    step_metrics: StepMetrics | None = None

    def _global_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over data-parallel ranks (the ``loss`` mesh), as TorchTitan does for the loss."""
        if not self.parallel_dims.dp_cp_enabled:
            return t
        t = t.clone()
        dist.all_reduce(t, group=self.parallel_dims.get_mesh("loss").get_group())
        return t

    def log(self, step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
            extra_metrics: dict[str, Any] | None = None) -> None:
        extra = dict(extra_metrics or {})
        m = self.step_metrics
        if m is not None:
            extra["loss_metrics/ce"] = ce = self._global_sum(m.ce).item()
            extra["loss_metrics/dispersion"] = disp = self._global_sum(m.dispersion).item()
            line = f"ce: {ce:8.5f}  dispersion: {disp:8.5f}"
            if m.cosine_sums is not None:
                cos = (self._global_sum(m.cosine_sums) / m.global_batch_size).tolist()
                for i, value in enumerate(cos, start=1):
                    extra[f"condensation/block_{i}_mean_cos"] = value
                line += "  mean_cos by block: " + " ".join(f"{v:.3f}" for v in cos)
            logger.info(f"step: {step:2}  {line}")
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)

    def log_validation(self, loss: float, step: int, extra_metrics: dict[str, Any] | None = None) -> None:
        extra = dict(extra_metrics or {})
        extra["validation_metrics/perplexity"] = math.exp(min(loss, 50.0))
        super().log_validation(loss, step, extra_metrics=extra)


def build_dispersion_metrics_processor(job_config, parallel_dims, model_args=None, tag=None) -> DispersionMetricsProcessor:
    del model_args
    return DispersionMetricsProcessor(job_config, parallel_dims, tag)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step."""


class DispersionTrainer(Trainer):
    def __init__(self, job_config) -> None:
        super().__init__(job_config)
        self._set_aside_incomplete_checkpoints()
        self._check_resume_layout()
        batch_degree = self.parallel_dims.get_mesh("batch").size() if self.parallel_dims.dp_enabled else 1
        global_batch = job_config.training.global_batch_size
        if global_batch < 0:
            global_batch = job_config.training.local_batch_size * batch_degree
        tp_group = self.parallel_dims.get_mesh("tp").get_group() if self.parallel_dims.tp_enabled else None
        seed = job_config.debug.seed if job_config.debug.seed is not None else 0
        self.dispersion = DispersionObjective(
            job_config.dispersion, self.model_args.n_layers, global_batch, seed, tp_group
        )
        self.step_metrics = StepMetrics(global_batch)
        self.metrics_processor.step_metrics = self.step_metrics
        self.preemption = Preemption()  # SIGUSR1 (Slurm's time-limit warning): save, exit, requeue
        if dist.get_rank() == 0:
            # In the dump folder, not the checkpoint folder: TorchTitan decides whether to
            # resume by whether that folder exists, and every rank must see the same answer.
            save_model_args(job_config.job.dump_folder, self.model_args)

    def _set_aside_incomplete_checkpoints(self) -> None:
        """Before TorchTitan picks a checkpoint to resume from (in ``train()``), rank 0
        moves half-written ones aside; the barrier keeps other ranks from looking earlier."""
        if self.checkpointer.enable and dist.get_rank() == 0:
            for path in quarantine_incomplete(self.checkpointer.folder):
                logger.warning(f"Incomplete checkpoint moved aside, not loaded: {path}")
        dist.barrier()

    def _check_resume_layout(self) -> None:
        """The data order is layout-invariant, but TorchTitan stores the loader state per
        data-parallel rank: resuming a full checkpoint needs the same DP degree. Say so in
        one line instead of DCP's missing-key traceback."""
        if not self.checkpointer.enable or not os.path.isdir(self.checkpointer.folder):
            return  # a disabled CheckpointManager has no folder attribute at all
        load_step = self.job_config.checkpoint.load_step
        steps = list_checkpoints(self.checkpointer.folder)
        if load_step >= 0:
            steps = [c for c in steps if c.step == load_step]
        if not steps:
            return
        saved = saved_data_parallel_degree(steps[-1].path)
        current = self.parallel_dims.get_mesh("batch").size() if self.parallel_dims.dp_enabled else 1
        if saved is not None and saved != current:
            raise DataConfigError(
                f"parallelism: {steps[-1].path} was saved by {saved} data-parallel ranks and this run has "
                f"{current}; resume it with {saved} (or start a new dump_folder from it via "
                f"checkpoint.initial_load_path, which loads the weights only)"
            )

    def should_continue_training(self) -> bool:
        """Also the first point after TorchTitan loads (or does not find) a checkpoint:
        a fresh run saves its initialisation as step 0 here, before any update."""
        if self.step == 0 and self.job_config.checkpoint.save_initial:
            self._save_initial_checkpoint()
        return super().should_continue_training()

    def _save_initial_checkpoint(self) -> None:
        ckpt = self.checkpointer
        if not ckpt.enable:
            return
        # Every rank must take the same decision, and all must look before any rank's
        # save creates the folder: agree on it with a collective first.
        missing = torch.tensor(int(not os.path.exists(os.path.join(ckpt.folder, "step-0"))), device=self.device)
        dist.all_reduce(missing, op=dist.ReduceOp.MIN)
        if missing.item():
            ckpt.save(curr_step=0)

    def train_step(self, data_iterator) -> None:
        self.step_metrics.reset()
        super().train_step(data_iterator)
        self._stop_if_loss_not_finite()
        self.preemption.stop_if_signalled(self)  # collective; saves and exits when signalled

    def _stop_if_loss_not_finite(self) -> None:
        """Stop every rank at the first non-finite loss, before TorchTitan saves this step,
        so the last checkpoint on disk is the last good one."""
        local = self.step_metrics.ce + self.step_metrics.dispersion
        bad = torch.tensor(float(not torch.isfinite(local).all()), device=self.device)
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item():
            where = f" in {self.checkpointer.folder}" if self.checkpointer.enable else ""
            raise NonFiniteLossError(
                f"loss is not finite at step {self.step}; training stopped before saving step {self.step}, "
                f"earlier checkpoints{where} are intact"
            )

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens) -> torch.Tensor:
        inputs, labels, extra_inputs, extra_kwargs = self.post_dataloading_process(input_dict, labels)
        model = self.model_parts[0]
        with_stats = self.metrics_processor.should_log(self.step)
        with self.train_context():
            with self.maybe_enable_amp:
                logits, block_outputs = model(inputs, return_block_outputs=True, **extra_inputs, **extra_kwargs)
                ce = self.loss_fn(logits, labels) / global_valid_tokens
                del logits
                term = self.dispersion(block_outputs, self.step, with_stats)
            # Backward through both terms without adding them: a loss-parallel CE is a
            # DTensor and cannot be summed with a plain tensor.
            torch.autograd.backward([ce] if term.weighted is None else [ce, term.weighted])
        ce_value = _local(ce.detach())
        self.step_metrics.add(ce_value, term.unweighted, term.block_cosine_sums)
        coeff = self.dispersion.coeff(self.step) if self.dispersion.active else 0.0
        return ce_value + coeff * term.unweighted
