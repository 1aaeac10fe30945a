"""TorchTitan's Trainer with the dispersion term added to the loss; its loop, checkpointing and
logging stay TorchTitan's (internals through ``titan_compat``)."""

from __future__ import annotations

import atexit
import contextlib
import copy
import dataclasses
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.profiler import record_function
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.tools.logging import init_logger, logger

from ..components import titan_compat, wandb_run
from ..config.schema import Dispersion
from ..data.packed import run_seed
from ..job_config.titan_checks import run_folders
from ..models.flavors import DROPOUT_KEYS
from ..models.fsdp import shards_one_rank, sync_last_microbatch
from ..run_folder.checkpoints import complete_checkpoints, quarantine_incomplete, record_saved, save_run_metadata
from ..run_folder.owners import outside_folders, record_run_folders
from ..run_folder.settings import fork_parent, fork_record, run_settings, same_documents, start_record
from ..run_folder.writer_lock import WriterLock
from ..tokenizer.encoders import encoder_for
from ..utils.dtensor import local_tensor
from ..utils.errors import NOTHING_KEPT, DispersionTitanError, NonFiniteLossError, say
from ..utils.records import remove_stale_writes
from .baselines import build_baseline
from .objective import BlockOutputs, DispersionObjective, mixed_seed
from .preemption import INTERRUPT_SIGNALS, Preemption, secondary_failure_status
from .save_failure import save_failure, write_failure

if TYPE_CHECKING:
    from ..config.schema import RunConfig


CHECKPOINT_KEY = "checkpoint.folder"
NO_BAD_STEP = 2**40  # trainer.bad_flag = NO_BAD_STEP - the first bad step, so MAX picks the earliest one


def released_scales(labels: torch.Tensor, dp_degree: int, global_batch: int, accumulation: int) -> torch.Tensor:
    """``training.loss_scale = "as_released"``: each micro-batch backpropagates its own mean (CE plus
    λ·term), summed over a rank's micro-batches and averaged over ranks, as transformers' Trainer does
    with the authors' ``compute_loss`` (it ignores ``num_items_in_batch``; every release from 4.46.0,
    read from each ``training_step``): A times the mean's gradient, A the authors' accumulation count
    (``released.gradient_accumulation_steps``), else the run's micro-batches per rank.

    For one micro-batch of ``labels`` on one of ``dp_degree`` summed ranks, m = G / (b × ranks)
    micro-batches standing for A = ``accumulation``: its CE sum's denominator, scored tokens × ranks
    × m / A, on the device (the b/G-weighted term takes the factor A)."""
    microbatches = global_batch / (labels.shape[0] * dp_degree)
    return (labels != IGNORE_INDEX).sum() * (dp_degree * microbatches / accumulation)


# Warnings of every run that leave the user nothing to act on: torchdata's call of a deprecated torch API, and on a
# CPU, gloo's group (torch's timeout setter names only CUDA's backends) and DTensor's RNG on a CPU mesh (a 2-rank CPU
# run's initialisation equals one rank's: test_parallel_equivalence); and torch turning off the CPU autocast to fp32
# TorchTitan builds for an fp32 run (which has none: the trainer's maybe_enable_amp is a nullcontext).
_LIBRARY_NOISE = (
    "'set_vital' is deprecated",
    "In CPU autocast, but the target dtype is not supported",
    "Set timeout is now only supported for either nccl or gloo",
    r"DTensor (random operators|manual_seed\(\)) may not have complete support on cpu device mesh",
)


_TITAN_NOISE = (
    "ENV[TORCH_NCCL_ASYNC_ERROR_HANDLING] = 1 will be overridden to 3",
    "model.safetensors.index.json not found",
    "checkpoint.initial_load_path is provided but the checkpoint.folder exists",
    "checkpoint.initial_load_in_hf is True but the checkpoint.folder exists",
)
"""TorchTitan's log warnings that say nothing to act on: torchrun's default TORCH_NCCL_ASYNC_ERROR_HANDLING=1, which
TorchTitan sets to 3 (for its flight recorder); no HF index in ``model.hf_assets_path`` to shard a ``last_save_in_hf``
step by (a model from scratch has none: one safetensors file, which transformers loads as well); on every relaunch of
a fork or a mid-training run, that it resumes from the run's own checkpoints rather than the weights it started from:
what the same command is for (a relaunch whose folder holds none is refused at launch, ``check_initial_load``). Also
``_CPU_NOISE`` on a CPU, and (``_SAME_ENV``) any variable it "overrides" with the value it already has (a launch from
a shell where an earlier run set it)."""
_CPU_NOISE = ("Error running lspci", "Peak flops undefined for: CPU")
"""Its GPU lookup for MFU, twice per run (lspci missing, no peak FLOPS; its next line, ``Peak FLOPS used for
computing MFU``, still says what it used)."""
_SAME_ENV = re.compile(r"ENV\[\w+\] = (.*) will be overridden to \1 based on job config$")


def configured_rates(optimizers: list[torch.optim.Optimizer], schedulers: list[Any]) -> Callable[[], None]:
    """What puts back each optimizer's param-group settings (lr, weight decay, betas, eps, …) and each LR schedule's
    peaks as this launch's config builds them, each group's lr its peak at the loaded step of its schedule, as
    ``LambdaLR`` sets it. A full checkpoint loaded restores its own (torch's optimizer and ``LambdaLR`` states hold
    them): a fork with another ``optimizer.lr`` or ``weight_decay`` trained with its parent's, silently. A relaunch's
    are its recorded ones (``run_folder.settings``), so restoring them changes nothing there."""
    settings = [
        [{k: copy.deepcopy(v) for k, v in g.items() if k not in ("params", "lr")} for g in o.param_groups]
        for o in optimizers
    ]
    peaks = [list(scheduler.base_lrs) for scheduler in schedulers]

    def restore() -> None:
        for optimizer, configured in zip(optimizers, settings, strict=True):
            for group, values in zip(optimizer.param_groups, configured, strict=True):
                group.update(values)
        for scheduler, base_lrs in zip(schedulers, peaks, strict=True):
            scheduler.base_lrs = base_lrs
            groups = scheduler.optimizer.param_groups
            for group, peak, factor in zip(groups, base_lrs, scheduler.lr_lambdas, strict=True):
                group["lr"] = peak * factor(scheduler.last_epoch)
            scheduler._last_lr = [group["lr"] for group in groups]

    return restore


class DispersionTrainer(titan_compat.TrainerHooks):
    def __init__(self, job_config: RunConfig) -> None:
        """``job_config``: as ``dispersion_titan.train`` checked it, derived values filled in."""
        self.settings = run_settings(job_config)  # as the launch check saw them, before TorchTitan's own
        self.folders = folders = run_folders(job_config)
        dump = job_config.job.dump_folder
        self.outside_folders = outside_folders(dump, folders)
        # Global rank 0 owns the run folder (and records it owner of its folders) before TorchTitan writes, until
        # this process exits; a live owner ends this run in one line, nothing written. TorchTitan loads a fork's
        # checkpoint only where the checkpoint folder does not exist yet: one outside the run is recorded (and
        # so created) once it has loaded (on_checkpoint_loaded).
        self.writer_lock = WriterLock(dump) if os.environ.get("RANK", "0") == "0" else None
        if self.writer_lock is not None:
            self.writer_lock.acquire()
            remove_stale_writes(dump)  # run.json's or .owner.json's temporary file of a launch killed writing it
            atexit.register(self.writer_lock.release)
            record_run_folders(dump, {k: v for k, v in folders.items() if k != CHECKPOINT_KEY})
        resumes = CHECKPOINT_KEY in folders and complete_checkpoints(folders[CHECKPOINT_KEY])
        if job_config.metrics.enable_wandb and resumes:  # its W&B run too (not a fork's first launch, nor a new run)
            wandb_run.continue_recorded(dump)
        for message in _LIBRARY_NOISE:
            warnings.filterwarnings("ignore", message)
        noise = _TITAN_NOISE
        if titan_compat.uses_cpu():
            noise += _CPU_NOISE
            job_config.comm.trace_buf_size = 0  # no flight recorder, nor its folder: gloo writes no traces
        logger.addFilter(lambda record: not (m := record.getMessage()).startswith(noise) and not _SAME_ENV.match(m))
        try:
            super().__init__(job_config)
        except BaseException:
            self._release_writer_lock()
            raise
        # FSDP2 casts (autocast would recast norms to fp32); an autocast to fp32 has nothing to do
        if job_config.training.mixed_precision_param == "float32" or shards_one_rank(self.parallel_dims, job_config):
            self.maybe_enable_amp = contextlib.nullcontext()
            if job_config.validation.enable:
                self.validator.maybe_enable_amp = self.maybe_enable_amp
        self.restore_configured = configured_rates(self.optimizers.optimizers, self.lr_schedulers.schedulers)
        self.checkpoint_folder = titan_compat.checkpointer_folder(self.checkpointer)
        self.saved_marked = False
        if self.checkpoint_folder is not None:  # a failed write ends the run in one line
            titan_compat.on_save_error(self.checkpointer, self._save_failed, self._save_returned)
            if dist.get_rank() == 0:  # half-written checkpoints moved aside before TorchTitan picks one to resume
                for path in quarantine_incomplete(self.checkpoint_folder):
                    logger.warning(f"Incomplete checkpoint moved aside, not loaded: {path}")
        dist.barrier()
        # A non-finite loss flagged on the device every step, all-reduced with the preemption signal only at log
        # steps and before saves (no other synchronisation).
        self.bad_flag = torch.zeros((), dtype=torch.int64, device=self.device)
        self.seed = run_seed(job_config)
        self.step_metrics = self.metrics_processor.step_metrics
        self.tp_group = self.parallel_dims.get_mesh("tp").get_group() if self.parallel_dims.tp_enabled else None
        self.tp_rank = dist.get_rank(self.tp_group) if self.tp_group is not None else 0
        self.dispersion = self.dispersion_objective(job_config.dispersion)
        # Micro-batch m of this rank is chunk m·W + r of the global batch (data.packed.RankSlice).
        self.chunk_stride, self.chunk_offset = self.dataloader.dp_world_size, self.dataloader.dp_rank
        self.microbatch = 0
        # as_released: each micro-batch's mean scaled as by the authors' accumulation count (``released_scales``)
        self.released_accumulation = job_config.released.gradient_accumulation_steps or self.gradient_accumulation_steps
        self.has_dropout = any(getattr(self.model_args, key, 0.0) > 0 for key in DROPOUT_KEYS)
        (model,) = self.model_parts
        encoder = encoder_for(job_config.model.name, job_config.model.hf_assets_path)
        # after parallelize_fn: outside AC and compile
        self.block_outputs = BlockOutputs(model, job_config.dispersion.points)
        self.baseline = build_baseline(
            job_config.baseline,
            model,
            self.optimizers,
            self.seed,
            self.model_args.tie_embeddings,
            encoder.pad_id,
            self.chunk_offset,
            self.chunk_stride,
            self.tp_group,
        )
        # SIGUSR1 (Slurm's time-limit warning): save, exit, requeue; SIGINT, SIGTERM: save, exit.
        self.preemption = Preemption()
        if dist.get_rank() == 0:
            # In the dump folder, not the checkpoint folder: TorchTitan decides whether to
            # resume by whether that folder exists, and every rank must see the same answer.
            save_run_metadata(
                job_config.job.dump_folder,
                job_config.model.name,
                self.model_args,
                dataclasses.asdict(job_config.dispersion),
                self.seed,
                baseline=dataclasses.asdict(job_config.baseline),
                tokenizer=encoder.name,
                training_steps=job_config.training.steps,
                settings=self.settings,
                forked_from=fork_record(job_config),
                started_from=start_record(job_config),
                paths=self.outside_folders,
            )

    def dispersion_objective(self, cfg: Dispersion) -> DispersionObjective:
        """The term of ``cfg`` for this trainer, its kernel checked (bench/train_step.py swaps them)."""
        objective = DispersionObjective(
            cfg,
            self.model_args.n_layers,
            self.step_metrics.global_batch_size,
            self.seed,
            self.tp_group,
        )
        objective.check_kernel(self.device)
        return objective

    def _save_failed(self, step: int, error: BaseException) -> None:
        raise save_failure(self.checkpoint_folder, step, error, self.model_parts[0]) from error

    def _save_returned(self, step: int) -> None:
        """Rank 0 marks in ``run.json`` the first complete checkpoint it sees (an async save's once written): a
        relaunch finding none knows they were lost."""
        if self.saved_marked or dist.get_rank() != 0:
            return
        if complete_checkpoints(self.checkpoint_folder):
            record_saved(self.job_config.job.dump_folder)
            self.saved_marked = True

    def on_checkpoint_loaded(self) -> None:
        """This launch's optimizer settings over a loaded training state's; record a checkpoint folder outside the
        run once every rank loaded; save step 0 if asked."""
        self.restore_configured()  # a fork's step 0 too
        self._refit_fork_data()
        if CHECKPOINT_KEY in self.outside_folders:
            dist.barrier()  # every rank has looked whether the folder exists
            if dist.get_rank() == 0:
                record_run_folders(self.job_config.job.dump_folder, {CHECKPOINT_KEY: self.folders[CHECKPOINT_KEY]})
        if self.step == 0 and self.job_config.checkpoint.save_initial and self.checkpoint_folder is not None:
            # all ranks look before any rank's save creates the folder
            missing = torch.tensor(
                int(not os.path.exists(os.path.join(self.checkpoint_folder, "step-0"))), device=self.device
            )
            dist.all_reduce(missing, op=dist.ReduceOp.MIN)
            if missing.item():
                self.checkpointer.save(curr_step=0)

    def _refit_fork_data(self) -> None:
        """A fork's loaded data position counts its parent's sequences of its parent's documents: onto other
        documents it starts them from their beginning, with another ``seq_len`` it goes on from the same token
        position (``PackedDataloader.refit``), said in one line."""
        parent = fork_parent(self.job_config)
        if parent is None or self.checkpoint_folder is None or complete_checkpoints(self.checkpoint_folder):
            return  # not a fork, or one that loaded its own checkpoint (its position refitted when it was saved)
        seq_len = self.job_config.training.seq_len
        parent_seq_len = parent.get("training.seq_len", seq_len)
        other_documents = not same_documents(parent, self.settings)
        if not other_documents and seq_len == parent_seq_len:
            return
        loader = self.dataloader
        consumed = loader.dataset.samples_yielded * loader.dp_world_size
        start = loader.refit(None if other_documents else parent_seq_len, self.step_metrics.global_batch_size)
        said = f"note: the fork from {self.job_config.job.fork_from}"
        if other_documents:
            say(f"{said} trains on other documents than its parent: its data starts from their beginning")
        elif start is None:
            say(f"{said} has training.seq_len {seq_len}, its parent {parent_seq_len}: its streamed data starts over")
        else:
            say(
                f"{said} has training.seq_len {seq_len}, its parent {parent_seq_len}: its data goes on from the same "
                f"number of tokens: sequence {start}, the parent's {consumed} × {parent_seq_len} / {seq_len} rounded "
                "down to a whole global batch"
            )

    def close(self) -> None:
        """TorchTitan's close (checkpointer, metrics), then the run folder is free for the next launch."""
        try:
            super().close()
        finally:
            self._release_writer_lock()

    def _release_writer_lock(self) -> None:
        if self.writer_lock is not None:
            self.writer_lock.release()

    def train_step(self, data_iterator) -> None:
        if self.writer_lock is not None:
            self.writer_lock.touch()
        self.step_metrics.reset()
        self.microbatch = 0
        self.baseline.begin_step(self.step)
        super().train_step(data_iterator)
        not_finite = (~torch.isfinite(self.step_metrics.loss).all()).long()  # CE + λ·term: an infinite term too
        self.bad_flag = torch.maximum(self.bad_flag, not_finite * (NO_BAD_STEP - self.step))
        last = self.step == self.job_config.training.steps
        if (
            last
            or self.metrics_processor.should_log(self.step)
            or titan_compat.will_save(self.checkpointer, self.step, last_step=last)
        ):
            self._check_health()

    def _check_health(self) -> None:
        """Stop every rank at a non-finite loss before this step is saved; save and exit on a signal."""
        flags = torch.stack([self.bad_flag, self.bad_flag.new_full((), int(self.preemption.received or 0))])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # the first bad step on any rank, the largest signal received
        bad, signum = flags.tolist()
        if bad:
            # Ignored from now: torchrun's SIGTERM would kill a rank shutting down (-15), and the launcher print its
            # report, not our line.
            for interrupt in INTERRUPT_SIGNALS:
                signal.signal(interrupt, signal.SIG_IGN)
            if self.checkpoint_folder is None:
                stopped = f"training stopped at step {self.step}; {NOTHING_KEPT}: a relaunch starts over"
            else:
                stopped = (
                    f"training stopped before saving step {self.step}, earlier checkpoints in {self.checkpoint_folder} "
                    "are intact"
                )
            raise NonFiniteLossError(f"loss is not finite at step {NO_BAD_STEP - bad}; {stopped}")
        if signum:
            self.preemption.stop(self, signum)  # saves this step and exits, unless it is the last one

    def model_forward_backward(
        self,
        model: torch.nn.Module,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor,
        model_kwargs: dict[str, Any],
    ) -> torch.Tensor:
        """Forward (under ``self.maybe_enable_amp``), loss sum / ``global_valid_tokens``, backward."""
        with_stats = self.metrics_processor.should_log(self.step)
        chunk = self.microbatch * self.chunk_stride + self.chunk_offset
        self.microbatch += 1
        sync_last_microbatch(model, self.microbatch, self.gradient_accumulation_steps)
        if self.has_dropout:  # masks from the global RNG seeded host-side by (seed, step, chunk, TP rank): the same
            # chunks draw the same masks whatever the layout (AC recomputes them: ``preserve_rng_state``)
            torch.manual_seed(mixed_seed(self.seed, self.step, chunk, self.tp_rank))
        with self.maybe_enable_amp:
            if self.job_config.training.head_loss == "torch":
                logits = model(inputs, **model_kwargs)
                ce_sum = self.loss_fn(logits, labels)
                del logits
            else:  # the head and the CE fused in the model (GPT2.forward)
                ce_sum = model(inputs, labels=labels, **model_kwargs)
            ce = ce_sum / global_valid_tokens
            with record_function("dispersion_titan.dispersion"):  # bench/profile_step.py's group
                term = self.dispersion(self.block_outputs.take(), self.step, with_stats, chunk)
        # L = CE + λ·L_disp (the objective's ``weighted``), backpropagated as its two addends without adding
        # them: a loss-parallel CE is a DTensor and cannot be summed with a plain tensor.
        if self.job_config.training.loss_scale == "as_released":  # logged as the mean all the same
            a = self.released_accumulation
            tokens = released_scales(labels, self.chunk_stride, self.step_metrics.global_batch_size, a)
            terms = [ce_sum / tokens] + ([] if term.weighted is None else [term.weighted * float(a)])
        else:
            terms = [ce] + ([] if term.weighted is None else [term.weighted])
        torch.autograd.backward(terms)
        ce_value = local_tensor(ce.detach())  # a loss-parallel CE: replicated, its local value whole
        loss = ce_value + term.weighted_value  # L from the addends above (as_released: its mean all the same)
        self.step_metrics.add(ce_value, term.unweighted, loss, term.block_cosine_sums)
        return loss


def train(job_config: RunConfig) -> None:
    """``torchtitan.train.main(DispersionTrainer)`` on the checked ``job_config`` (its ``main`` would parse
    ``sys.argv`` again); a rank failing only because another did, or the job is stopping, exits without
    a traceback."""
    try:
        init_logger()
        trainer = DispersionTrainer(job_config)
        try:
            if job_config.checkpoint.create_seed_checkpoint:  # titan_checks.check_checkpoint: one process, enabled
                trainer.checkpointer.save(curr_step=0, last_step=True)
                logger.info("Created seed checkpoint")
            else:
                trainer.train()
        finally:
            trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    except DispersionTitanError:  # said in one line by the command
        raise
    except Exception as e:
        dump = job_config.job.dump_folder
        failure = write_failure(e, dump, os.path.join(dump, job_config.checkpoint.folder))
        if failure is not None:
            raise failure from None
        status = secondary_failure_status(e)
        if status is None:
            raise
        sys.exit(status)
