"""TorchTitan's Trainer with the dispersion term added to the loss.

Only the model's forward/backward changes (plus per-step bookkeeping); the training
loop, checkpointing and logging remain TorchTitan's. Every reliance on how TorchTitan
works inside goes through ``titan_compat``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torchtitan.tools.logging import logger

from ..errors import DataConfigError, NonFiniteLossError
from . import titan_compat
from .baselines import build_baseline
from .checkpoints import list_checkpoints, quarantine_incomplete, save_run_metadata, saved_data_parallel_degree
from .objective import DispersionObjective
from .optimizers import baseline_settings
from .preemption import Preemption


def _local(t: torch.Tensor) -> torch.Tensor:
    """A loss-parallel CE is a replicated DTensor; its local value is the whole value."""
    return t.to_local() if isinstance(t, DTensor) else t


class DispersionTrainer(titan_compat.trainer_class()):
    def __init__(self, job_config) -> None:
        with baseline_settings(job_config.baseline):  # active forgetting's embedding param group
            super().__init__(job_config)
        self.checkpoint_folder = titan_compat.checkpoint_folder(self.checkpointer)
        self._set_aside_incomplete_checkpoints()
        self._check_resume_layout()
        tp_group = self.parallel_dims.get_mesh("tp").get_group() if self.parallel_dims.tp_enabled else None
        seed = job_config.debug.seed if job_config.debug.seed is not None else 0
        self.step_metrics = self.metrics_processor.step_metrics
        self.dispersion = DispersionObjective(
            job_config.dispersion, self.model_args.n_layers, self.step_metrics.global_batch_size, seed, tp_group
        )
        (model,) = self.model_parts
        self.baseline = build_baseline(job_config.baseline, model, self.optimizers, self.parallel_dims, seed,
                                       self.model_args.tie_embeddings)
        self.preemption = Preemption()  # SIGUSR1 (Slurm's time-limit warning): save, exit, requeue
        if dist.get_rank() == 0:
            # In the dump folder, not the checkpoint folder: TorchTitan decides whether to
            # resume by whether that folder exists, and every rank must see the same answer.
            save_run_metadata(job_config.job.dump_folder, job_config.model.name, self.model_args,
                              dataclasses.asdict(job_config.dispersion), seed,
                              baseline=dataclasses.asdict(job_config.baseline))

    def _set_aside_incomplete_checkpoints(self) -> None:
        """Before TorchTitan picks a checkpoint to resume from (in ``train()``), rank 0
        moves half-written ones aside; the barrier keeps other ranks from looking earlier."""
        if self.checkpoint_folder is not None and dist.get_rank() == 0:
            for path in quarantine_incomplete(self.checkpoint_folder):
                logger.warning(f"Incomplete checkpoint moved aside, not loaded: {path}")
        dist.barrier()

    def _check_resume_layout(self) -> None:
        """The data order is layout-invariant, but TorchTitan stores the loader state per
        data-parallel rank: resuming a full checkpoint needs the same DP degree. Say so in
        one line instead of DCP's missing-key traceback."""
        if self.checkpoint_folder is None or not os.path.isdir(self.checkpoint_folder):
            return
        load_step = self.job_config.checkpoint.load_step
        steps = list_checkpoints(self.checkpoint_folder)
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

    def on_checkpoint_loaded(self) -> None:
        """A fresh run saves its initialisation as step 0 here, before any update."""
        if self.step == 0 and self.job_config.checkpoint.save_initial and self.checkpoint_folder is not None:
            # Every rank must take the same decision, and all must look before any rank's
            # save creates the folder: agree on it with a collective first.
            missing = torch.tensor(int(not os.path.exists(os.path.join(self.checkpoint_folder, "step-0"))),
                                   device=self.device)
            dist.all_reduce(missing, op=dist.ReduceOp.MIN)
            if missing.item():
                self.checkpointer.save(curr_step=0)

    def train_step(self, data_iterator) -> None:
        self.step_metrics.reset()
        self.baseline.begin_step(self.step)
        super().train_step(data_iterator)
        self._stop_if_loss_not_finite()
        self.preemption.stop_if_signalled(self)  # collective; saves and exits when signalled

    def _stop_if_loss_not_finite(self) -> None:
        """Stop every rank at the first non-finite loss, before TorchTitan saves this step,
        so the last checkpoint on disk is the last good one."""
        local = self.step_metrics.local_loss()
        bad = torch.tensor(float(not torch.isfinite(local).all()), device=self.device)
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item():
            where = f" in {self.checkpoint_folder}" if self.checkpoint_folder is not None else ""
            raise NonFiniteLossError(
                f"loss is not finite at step {self.step}; training stopped before saving step {self.step}, "
                f"earlier checkpoints{where} are intact"
            )

    def model_forward_backward(self, model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                               global_valid_tokens: torch.Tensor, model_kwargs: dict[str, Any]) -> torch.Tensor:
        with_stats = self.metrics_processor.should_log(self.step)
        with self.maybe_enable_amp:
            logits, block_outputs = model(inputs, return_block_outputs=True, **model_kwargs)
            ce = self.loss_fn(logits, labels) / global_valid_tokens
            del logits
            term = self.dispersion(block_outputs, self.step, with_stats)
        # Backward through both terms without adding them: a loss-parallel CE is a
        # DTensor and cannot be summed with a plain tensor.
        torch.autograd.backward([ce] if term.weighted is None else [ce, term.weighted])
        ce_value = _local(ce.detach())
        self.step_metrics.add(ce_value, term.unweighted, term.block_cosine_sums)
        return ce_value + term.coeff * term.unweighted
