"""The data-parallel degree and per-rank batches of a job of N processes (``checks.DERIVED``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..utils.errors import ConfigError

if TYPE_CHECKING:
    from ..config.run_config import RunConfig


def resolve_replicate_degree(config: RunConfig, world_size: int) -> None:
    """``data_parallel_replicate_degree = -1`` (DDP over every process) as a count, which TorchTitan
    needs; DDP with TP is refused (TorchTitan then turns autocast off)."""
    p = config.parallelism
    if p.data_parallel_replicate_degree == -1:
        if p.data_parallel_shard_degree != 1:
            raise ConfigError(
                f"parallelism.data_parallel_replicate_degree: -1 (replicate over every process) "
                f"needs data_parallel_shard_degree = 1, not {p.data_parallel_shard_degree}"
            )
        p.data_parallel_replicate_degree = data_parallel_degree(config, world_size)
    elif p.data_parallel_replicate_degree < 1:
        raise ConfigError(
            f"parallelism.data_parallel_replicate_degree: {p.data_parallel_replicate_degree}; "
            "use a count >= 1, or -1 for every process"
        )
    if p.data_parallel_replicate_degree > 1 and p.data_parallel_shard_degree == 1 and p.tensor_parallel_degree > 1:
        raise ConfigError(
            "parallelism.data_parallel_replicate_degree: replicated parameters (DDP) with tensor "
            "parallelism train without mixed precision in TorchTitan 0.2.2; "
            "shard instead (data_parallel_shard_degree = -1)"
        )


def data_parallel_degree(config: RunConfig, world_size: int) -> int:
    """The DP degree TorchTitan's ParallelDims will build from ``world_size`` processes."""
    p = config.parallelism
    tp = p.tensor_parallel_degree
    if p.data_parallel_shard_degree == -1 or p.data_parallel_replicate_degree == -1:
        if world_size % tp:
            raise ConfigError(f"parallelism: {world_size} processes are not divisible by tensor_parallel_degree = {tp}")
        return world_size // tp
    dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    if dp * tp != world_size:
        raise ConfigError(
            f"parallelism: data_parallel_replicate_degree × data_parallel_shard_degree × tensor_parallel_degree "
            f"= {dp * tp}, but there are {world_size} processes"
        )
    return dp


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def resolve_batch_sizes(config: RunConfig, dp: int) -> None:
    """Check the batches against ``dp`` ranks and derive ``local_batch_size = 0``: training's the
    largest divisor of global/dp up to ``max_local_batch_size``, validation's global/dp."""
    t = config.training
    if t.global_batch_size > 0:
        size = t.global_batch_size
    elif t.local_batch_size > 0:
        size = t.local_batch_size * dp
    else:
        raise ConfigError("training.local_batch_size: 0 (derive it) needs a training.global_batch_size > 0")
    if size % dp:
        raise ConfigError(
            f"training.global_batch_size: {size} sequences cannot be split over {dp} "
            f"data-parallel ranks; use a multiple of {dp}"
        )
    share = size // dp
    if t.local_batch_size == 0:
        t.local_batch_size = max(d for d in _divisors(share) if d <= (t.max_local_batch_size or share))
    elif share % t.local_batch_size:
        raise ConfigError(
            f"training.local_batch_size: {t.local_batch_size} does not divide the {share} sequences per rank "
            f"(global_batch_size {size} over {dp} data-parallel ranks); use one of {_divisors(share)}, "
            "or 0 to derive it"
        )
    v = config.validation
    if not v.enable:
        return
    size = v.global_batch_size if v.global_batch_size > 0 else size
    if size % dp:
        raise ConfigError(
            f"validation.global_batch_size: {size} sequences cannot be split over {dp} "
            f"data-parallel ranks; use a multiple of {dp}"
        )
    if v.local_batch_size == 0:
        v.local_batch_size = size // dp
    elif v.local_batch_size * dp != size:
        raise ConfigError(
            f"validation.local_batch_size: {v.local_batch_size} × {dp} data-parallel ranks is not the "
            f"validation global batch of {size} sequences; use {size // dp}, or 0 to derive it"
        )
