"""Beyond TorchTitan's metrics, through its loggers: the two loss terms and each block's mean
off-diagonal cosine (a live condensation curve); the W&B run is named in the run folder."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools.logging import logger

from ..utils.errors import NOTHING_KEPT, OutputError, no_room
from . import titan_compat, wandb_run
from .tb_writer import WriterThread


class StepMetrics:
    """Per-step sums TorchTitan does not keep, on the device, reduced only at log steps."""

    def __init__(self, global_batch_size: int) -> None:
        self.global_batch_size = global_batch_size
        self.reset()

    def reset(self) -> None:
        self.ce = self.dispersion = self.loss = 0.0  # tensors once a micro-batch is added
        self.cosine_sums: torch.Tensor | None = None

    def add(
        self, ce: torch.Tensor, dispersion: torch.Tensor, loss: torch.Tensor, cosine_sums: torch.Tensor | None
    ) -> None:
        """One micro-batch: its CE, unweighted dispersion term, the loss it trains on (CE + λ·term)."""
        self.ce, self.dispersion, self.loss = self.ce + ce, self.dispersion + dispersion, self.loss + loss
        if cosine_sums is not None:
            self.cosine_sums = cosine_sums if self.cosine_sums is None else self.cosine_sums + cosine_sums


class DispersionMetricsProcessor(MetricsProcessor):
    """Logs ``ce``, ``dispersion``, each block's ``mean_cos_offdiag`` and validation perplexity."""

    def __init__(self, job_config, parallel_dims, model_args: Any = None, tag: str | None = None) -> None:
        """Every TrainSpec's ``build_metrics_processor_fn`` (``model_args``: unused, as by TorchTitan's)."""
        self.writer_thread = WriterThread()  # before TorchTitan's: its SummaryWriter writes the events file
        self.tb_folder = os.path.join(job_config.job.dump_folder, job_config.metrics.save_tb_folder)
        try:
            try:
                super().__init__(job_config, parallel_dims, tag)
            except OSError as e:  # that first write failed (a full disk): the trainer's line names the folder
                e.filename = e.filename or self.tb_folder
                raise
            if job_config.metrics.enable_wandb:
                wandb_run.record(job_config.job.dump_folder)
                # a resume from a checkpoint older than the W&B run's last step logs those steps again, the same values
                titan_compat.wandb_logs_from(self.logger, wandb_run.next_step())
        except BaseException:  # TorchTitan's __init__ or the W&B run's record failed: no close() puts the hook back
            self.writer_thread.close()
            raise
        t = job_config.training  # global_batch_size -1: one local batch per rank of the batch mesh, as TorchTitan's
        ranks = parallel_dims.dp_replicate * parallel_dims.dp_shard
        self.step_metrics = StepMetrics(t.global_batch_size if t.global_batch_size > 0 else t.local_batch_size * ranks)
        self.dump_folder = job_config.job.dump_folder
        self.checkpointing = job_config.checkpoint.enable

    @contextlib.contextmanager
    def _tensorboard_writes(self) -> Iterator[None]:
        """TensorBoard's failed write raised here (``WriterThread.writes``): a full disk's for the trainer's line
        (``write_failure``), naming the TensorBoard folder where the thread names no file; any other in one line."""
        try:
            with self.writer_thread.writes():
                yield
        except OSError as e:
            error = e
        else:
            return
        error.filename = error.filename or self.tb_folder
        if no_room(error):  # the trainer's line: the space, the last good checkpoint
            raise error
        written = f"TensorBoard could not write {os.fsdecode(error.filename)}"
        if not os.path.isdir(self.dump_folder):  # moved (mv): the same command would start a new run where it was
            raise OutputError(
                f"job.dump_folder: {self.dump_folder} was moved or removed while training ({written}); relaunch with "
                f"--job.dump_folder naming where it is now to {'resume' if self.checkpointing else 'start over'}"
            ) from None
        kept = "the checkpoints saved so far are intact" if self.checkpointing else NOTHING_KEPT
        raise OutputError(  # its folder removed or made read-only while training
            f"metrics.save_tb_folder: {written} ({(error.strerror or type(error).__name__).lower()}); {kept}; fix the "
            f"folder and relaunch the same command to {'resume' if self.checkpointing else 'start over'}"
        ) from None

    def log(
        self,
        step: int,
        global_avg_loss: float,
        global_max_loss: float,
        grad_norm: float,
        extra_metrics: dict[str, Any] | None = None,
    ) -> None:
        extra = dict(extra_metrics or {})
        m = self.step_metrics
        if torch.is_tensor(m.ce):
            sums = torch.cat([torch.stack([m.ce, m.dispersion]), *([] if m.cosine_sums is None else [m.cosine_sums])])
            mesh = self.parallel_dims.get_optional_mesh("loss")  # summed over data-parallel ranks, as the loss
            if mesh is not None:
                dist.all_reduce(sums, group=mesh.get_group())
            ce, disp, *cos = sums.tolist()
            extra["loss_metrics/ce"], extra["loss_metrics/dispersion"] = ce, disp
            line = f"ce: {ce:8.5f}  dispersion: {disp:8.5f}"
            if cos:
                cos = [value / m.global_batch_size for value in cos]
                extra.update({f"condensation/block_{i}_mean_cos_offdiag": v for i, v in enumerate(cos, start=1)})
                line += "  mean_cos_offdiag by block: " + " ".join(f"{v:.3f}" for v in cos)
            logger.info(f"step: {step:2}  {line}")
        with self._tensorboard_writes():
            super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)

    def log_validation(self, loss: float, step: int, extra_metrics: dict[str, Any] | None = None) -> None:
        extra = dict(extra_metrics or {})
        extra["validation_metrics/perplexity"] = math.exp(min(loss, 50.0))
        with self._tensorboard_writes():
            super().log_validation(loss, step, extra_metrics=extra)

    def close(self) -> None:
        """TorchTitan's, then threads' exceptions printed again as before."""
        try:
            with self._tensorboard_writes():
                super().close()
        finally:
            self.writer_thread.close()
