"""Checks of the parsed job config before any process group starts: each failure a ``ConfigError``
naming the field (fixed choices are ``Literal`` fields the parser refuses; what TorchTitan would crash
on is ``titan_checks``). They fill in, for the trainer: a replicate degree of -1 as a count, a local
batch size of 0 from the global batches (``DERIVED``), ``[released]``'s layout and the ``[baseline]``
the optimizer builders read (``BuilderInputs``); ``launch_notes`` says the first three at launch.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import os
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..config.schema import resolve_layers
from ..data.corpora import check_dataset
from ..data.store import MANIFEST, is_store, open_store
from ..losses.variants import RANGES, VARIANTS, precision_error
from ..models.flavors import DROPOUT_KEYS, SHAPE_KEYS, pretrained_config, pretrained_folder
from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder, encoder_for, is_hub_id, tokenizer_folder
from ..utils.errors import ConfigError, DataConfigError
from ..utils.records import flatten
from . import released
from .titan_checks import check_checkpoint, check_output_folders, check_titan_settings

if TYPE_CHECKING:
    from ..config.schema import RunConfig

# torch 2.11 trains GPT-2 under TP with LayerNorm updates 7-10% off one process's; 2.13 agrees.
GPT2_TP_TORCH = (2, 13)


def torch_release() -> tuple[int, int]:
    """The installed torch's (major, minor), torch not imported."""
    major, minor = importlib.metadata.version("torch").split(".")[:2]
    return int(major), int(minor)


AT_0, AT_1 = (lambda v: v >= 0, ">= 0"), (lambda v: v >= 1, ">= 1")
BOUNDS: dict[str, tuple[Any, ...]] = {
    **dict.fromkeys(("training.steps", "training.max_local_batch_size", "released.gpus"), AT_0),
    **dict.fromkeys(("lr_scheduler.warmup_steps", "checkpoint.keep_latest_k"), AT_0),  # TorchTitan reads < 0 silently
    **dict.fromkeys(("training.local_batch_size", "validation.local_batch_size"), AT_0),  # 0 derives it
    **dict.fromkeys(("optimizer.lr", "optimizer.eps", "optimizer.weight_decay", "baseline.noise_alpha"), AT_0),
    **dict.fromkeys(("checkpoint.interval", "validation.freq", "metrics.log_freq", "training.gc_freq"), AT_1),
    **dict.fromkeys(("comm.init_timeout_seconds", "comm.train_timeout_seconds", "lr_scheduler.total_steps"), AT_1),
    **dict.fromkeys(("parallelism.tensor_parallel_degree", "baseline.forget_every"), AT_1),
    **{f"model.{key}": AT_0 for key in SHAPE_KEYS if key != "tie_embeddings"},  # 0 keeps the flavor's
    **{f"dispersion.{name}": bound for name, bound in {"coeff": AT_0, **RANGES, "warmup_steps": AT_0}.items()},
    # outside [0, 1] TorchTitan's schedule ends above the peak lr or below 0, or decays past the run
    **dict.fromkeys(("lr_scheduler.min_lr_factor", "lr_scheduler.decay_ratio"), (lambda v: 0 <= v <= 1, "in [0, 1]")),
    **dict.fromkeys(("optimizer.beta1", "optimizer.beta2"), (lambda v: 0 <= v < 1, "in [0, 1)")),
    "baseline.embedding_lr": (lambda v: v > 0, "> 0"),
    "debug.seed": (  # torch takes more, but a run's evaluation would fail
        lambda v: 0 <= v < 2**32,
        f"in 0..{2**32 - 1}",
        ": evaluate seeds numpy with it, as the authors' protocol does, and numpy takes no other",
    ),
    "training.max_norm": (  # torch scales the gradients by max_norm / norm, whatever its sign
        lambda v: v > 0,
        "> 0 (inf: no clipping)",
        ": a negative one reverses the gradients, 0 zeroes them",
    ),
}
"""Each numeric setting's valid values (None: unset): a predicate, how to say them, and why where it is not plain."""
DERIVED = ("parallelism.data_parallel_replicate_degree", "training.local_batch_size", "validation.local_batch_size")
"""The keys the checks resolve from the config's other values (-1 or 0 in it), said at launch."""


def check_numbers(config: RunConfig) -> None:
    """Every float value is finite (``training.max_norm = inf``: no clipping), each of ``BOUNDS`` in its range."""
    for key, value in flatten(dataclasses.asdict(config)).items():
        if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and key != "training.max_norm")):
            raise ConfigError(f"{key}: must be a finite number, got {value}")
    for key, (valid, text, *why) in BOUNDS.items():
        value = attrgetter(key)(config)
        if value is not None and not valid(value):
            raise ConfigError(f"{key}: must be {text}, got {value}{''.join(why)}")


def check_dispersion(config: RunConfig, n_layers: int) -> None:
    d = config.dispersion
    if problem := precision_error(d.variant, d.precision):
        raise ConfigError(f"dispersion.precision: {problem}")
    try:
        resolve_layers(d.layers, n_layers)
    except ValueError as e:
        raise ConfigError(f"dispersion.layers: {e}") from None
    if d.variant != "none" and config.training.seq_len < 2:
        raise ConfigError(
            f"training.seq_len: {config.training.seq_len} token per sequence leaves no pair of tokens "
            f"for the {d.variant} term (as dispersion.max_tokens, it needs >= 2); use a longer "
            'sequence, or dispersion.variant = "none"'
        )


def run_tokenizer(config: RunConfig) -> DocumentEncoder | None:
    """The run's tokenizer (``encoder_for``); None while ``model.hf_assets_path`` is a hub id not fetched yet."""
    folder = tokenizer_folder(config.model.name, config.model.hf_assets_path)
    if folder is None or os.path.isdir(os.path.expanduser(folder)):
        return encoder_for(config.model.name, config.model.hf_assets_path)
    if is_hub_id(folder):
        return None
    raise ConfigError(
        f"model.hf_assets_path: {folder}: no such folder; give the {config.model.name} model's "
        'Hugging Face folder or hub id (its tokenizer.json), or "" for GPT-2\'s BPE'
    )


def check_model(config: RunConfig, args: Any, world_size: int) -> None:
    """``args``: the flavor's arguments with the ``[model]`` overrides applied; ``world_size``: the processes,
    which the tensor-parallel degree divides as it divides the sizes it splits."""
    name = config.model.name
    head_loss = config.training.head_loss
    if head_loss != "torch" and (name != "gpt2" or config.parallelism.tensor_parallel_degree > 1):
        raise ConfigError(f'training.head_loss: "{head_loss}" takes gpt2 without tensor parallelism; use "torch"')
    if config.compile.whole_model and name != "gpt2":
        raise ConfigError("compile.whole_model: gpt2 only (TorchTitan compiles the other families per block)")
    ac = config.activation_checkpoint
    for key in DROPOUT_KEYS:
        value = getattr(args, key, 0.0)
        if not 0 <= value < 1:
            raise ConfigError(f"model.{key}: must be in [0, 1), got {value}")
        if value and ac.mode != "none" and not ac.preserve_rng_state:
            raise ConfigError(
                f"activation_checkpoint.preserve_rng_state: model.{key} = {value} needs it true "
                "(the recomputation must draw the same dropout masks)"
            )
    if "head_dim" not in args.OVERRIDES and args.dim % args.n_heads:  # heads of width dim / n_heads
        raise ConfigError(f"model.dim: {args.dim} is not divisible by model.n_heads={args.n_heads}")
    tp = config.parallelism.tensor_parallel_degree
    if tp > 1 and name == "gpt2" and torch_release() < GPT2_TP_TORCH:
        need, have = (".".join(map(str, v)) for v in (GPT2_TP_TORCH, torch_release()))
        raise ConfigError(
            f"parallelism.tensor_parallel_degree: GPT-2's tensor parallel needs torch {need} or later, this is "
            f"{have} (its norms' updates drift from one process's); use data parallelism or a newer torch"
        )
    sections = ("training", "validation") if config.validation.enable else ("training",)
    for section in sections:
        seq_len = getattr(config, section).seq_len
        if not 0 < seq_len <= (args.positions or seq_len):
            raise ConfigError(
                f"{section}.seq_len: {seq_len} must be in 1..{args.positions} (model.max_seq_len positions)"
            )
    split = {
        **{f"model.{key}": args.value_of(key) for key in ("n_heads", "n_kv_heads", "mlp_hidden_dim")},
        "model.max_seq_len": args.positions or 0,  # None: rotary, no table of positions
        **{f"{section}.seq_len": getattr(config, section).seq_len for section in sections},
    }
    # the advice: the degrees that divide every split size and world_size, and the model's alone where more allow more
    model = divisors(math.gcd(*split.values()))
    here = [d for d in model if world_size % d == 0]
    more = f" (the model alone: {model})" if here != model else ""
    fits = f"use one of {here} on {world_size} process{'es' if world_size > 1 else ''}{more}"
    for key, value in split.items():
        if value % tp:
            raise ConfigError(f"{key}: {value} is not divisible by parallelism.tensor_parallel_degree={tp}; {fits}")
    if world_size % tp:
        raise ConfigError(
            f"parallelism: {world_size} processes are not divisible by tensor_parallel_degree = {tp}; {fits}"
        )
    tokenizer = run_tokenizer(config)
    if tokenizer is not None and args.vocab_size < tokenizer.vocab_size:
        which = "GPT-2" if tokenizer is GPT2_BPE else config.model.hf_assets_path
        raise ConfigError(
            f"model.vocab_size: {args.vocab_size} is smaller than the {which} tokenizer's {tokenizer.vocab_size} ids"
        )
    for key in ("pipeline_parallel_degree", "context_parallel_degree"):
        if getattr(config.parallelism, key) != 1:
            raise ConfigError(f"parallelism.{key}: dispersion_titan's {name} supports only 1")


def check_data(config: RunConfig) -> None:
    tokenizer = run_tokenizer(config)
    for section in ("training", "validation") if config.validation.enable else ("training",):
        cfg = getattr(config, section)
        if cfg.dataset_path == "":  # an unset shell variable: was the corpus from the hub, or the embedded one
            raise ConfigError(f"{section}.dataset_path: empty; name the corpus's files or token store, or leave it out")
        try:
            if is_store(cfg.dataset_path):  # a stale or damaged token store fails here, before any rank starts
                if tokenizer is not None:
                    split = "train" if section == "training" else "validation"
                    open_store(cfg.dataset_path, cfg.dataset, split, f"{section}.dataset_path", tokenizer)
            else:
                check_dataset(cfg.dataset, cfg.dataset_path, f"{section}.dataset")  # never contacts the hub
        except DataConfigError as e:
            folder = os.path.expanduser(cfg.dataset_path or "")
            if os.path.isdir(folder) and not is_store(folder):  # a store meant: one killed before its first shard, say
                raise ConfigError(f"{e}; nor is {cfg.dataset_path!r} a token store (no {MANIFEST} in it)") from None
            raise ConfigError(str(e)) from None
    for section in ("training", "validation"):
        if getattr(config, section).dataloader.num_workers != 0:
            raise ConfigError(f"{section}.dataloader.num_workers: must be 0 (the packed stream is stateful)")


def check_methods(config: RunConfig) -> None:
    """The ``[baseline]`` method and the optimizer and schedule options, together."""
    b = config.baseline
    if b.method == "active_forgetting":
        # Both replace the per-model-part optimizer in which the embeddings get their own group.
        if config.optimizer.early_step_in_backward:
            raise ConfigError(
                "optimizer.early_step_in_backward: not supported with baseline.method = active_forgetting"
            )
        if config.fault_tolerance.enable:
            raise ConfigError("fault_tolerance.enable: not supported with baseline.method = active_forgetting")
        if b.forget_every >= config.training.steps and not released.is_on(config):  # theirs: a note
            raise ConfigError(
                f"baseline.forget_every: {b.forget_every} >= training.steps ({config.training.steps}): "
                "no reset would ever happen; make it smaller or use baseline.method = none"
            )
    o = config.optimizer
    if o.decay_groups != "all" and o.early_step_in_backward:  # one optimizer per parameter: no groups to split
        raise ConfigError(
            f"optimizer.early_step_in_backward: not supported with optimizer.decay_groups = {o.decay_groups!r}"
        )
    lr = config.lr_scheduler
    if lr.form == "as_released" and (lr.decay_type != "cosine" or lr.decay_ratio is not None):
        raise ConfigError(
            f"lr_scheduler.form: 'as_released' is transformers' cosine schedule, decaying over every "
            f"step after the warm-up; set decay_type = 'cosine' (not {lr.decay_type!r}) and leave "
            "decay_ratio unset"
        )


def launch_notes(config: RunConfig, parsed: dict[str, Any]) -> list[str]:
    """Said once at launch: the values derived (``parsed``: ``DERIVED``'s values before the checks), [released]'s
    layout, and valid settings probably not meant."""
    derived = [f"{key} = {now}" for key, value in parsed.items() if (now := attrgetter(key)(config)) != value]
    notes = [f"derived: {', '.join(derived)}"] if derived else []
    notes += [released.summary(config)] if released.is_on(config) else []
    notes += _beyond_pretrained_positions(config)
    d, b = config.dispersion, config.baseline
    if d.variant != "none" and d.coeff == 0:
        notes.append(
            f"dispersion.coeff is 0: the {d.variant} term is logged but adds nothing to the loss; "
            'set dispersion.coeff > 0, or dispersion.variant = "none"'
        )
    if d.variant == "none" and d.coeff != 0:
        notes.append(
            f"dispersion.coeff is {d.coeff:g} but dispersion.variant is 'none': no dispersion term is computed; "
            f"set dispersion.variant ({', '.join(VARIANTS)})"
        )
    if b.method == "active_forgetting" and b.forget_every >= config.training.steps:
        notes.append(
            f"baseline.forget_every: {b.forget_every} >= the {config.training.steps} steps of [released]'s layout: "
            "no reset happens and the token embeddings (with a head tied to them) keep lr 0 throughout (the "
            "schedule's index (g·⌊T/K⌋) mod T stays 0), as in the authors' script at this GPU count (their K is fixed)"
        )
    return notes


def _beyond_pretrained_positions(config: RunConfig) -> list[str]:
    """A RoPE model loaded from a Hugging Face folder trained on sequences longer than its config.json's
    positions: extrapolation, which a context extension does on purpose (GPT-2's learned positions are refused by
    ``check_model``, its folder's table by ``hf_weights``)."""
    positions = pretrained_config(config).get("max_position_embeddings")
    sections = ("training", "validation") if config.validation.enable else ("training",)
    lengths = {f"{s}.seq_len": getattr(config, s).seq_len for s in sections}
    beyond = [f"{key} {n}" for key, n in lengths.items() if isinstance(positions, int) and n > positions]
    if not beyond:
        return []
    _, folder = pretrained_folder(config) or ("", "")
    return [
        f"{', '.join(beyond)} {'is' if len(beyond) == 1 else 'are'} beyond the {positions} positions of {folder} "
        "(its config.json's max_position_embeddings): RoPE extrapolates past them, as a context extension does; "
        f"lower {'it' if len(beyond) == 1 else 'them'} to {positions} unless that is meant"
    ]


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
    if p.data_parallel_shard_degree == -1 or p.data_parallel_replicate_degree == -1:  # check_model: tp divides it
        if (world_size // tp) % (replicas := max(p.data_parallel_replicate_degree, 1)):  # TorchTitan asserted
            raise ConfigError(
                f"parallelism.data_parallel_replicate_degree: {replicas} replicas cannot split the "
                f"{world_size // tp} data-parallel ranks of {world_size} processes; use a divisor of {world_size // tp}"
            )
        return world_size // tp
    dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    if dp * tp != world_size:
        raise ConfigError(
            f"parallelism: data_parallel_replicate_degree × data_parallel_shard_degree × tensor_parallel_degree "
            f"= {dp * tp}, but there are {world_size} processes; set data_parallel_shard_degree = -1 (the processes "
            "the others leave)"
        )
    return dp


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def resolve_batch_sizes(config: RunConfig, dp: int) -> None:
    """Check the batches against ``dp`` ranks and derive ``local_batch_size = 0``: training's the
    largest divisor of global/dp up to ``max_local_batch_size``, validation's global/dp."""
    t = config.training
    if t.global_batch_size == 0 or t.global_batch_size < -1:  # TorchTitan asserts 0, reads any other < 0 as -1
        raise ConfigError(
            f"training.global_batch_size: {t.global_batch_size}; give the sequences per step, or -1 "
            "(local_batch_size × the data-parallel ranks)"
        )
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
        t.local_batch_size = max(d for d in divisors(share) if d <= (t.max_local_batch_size or share))
    elif share % t.local_batch_size:
        raise ConfigError(
            f"training.local_batch_size: {t.local_batch_size} does not divide the {share} sequences per rank "
            f"(global_batch_size {size} over {dp} data-parallel ranks); use one of {divisors(share)}, "
            "or 0 to derive it"
        )
    v = config.validation
    if not v.enable:
        return
    if v.global_batch_size < -1 or v.global_batch_size == 0:  # read as -1 below
        raise ConfigError(
            f"validation.global_batch_size: {v.global_batch_size}; give the sequences per validation batch, "
            "or -1 (training's)"
        )
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


def check_job_config(config: RunConfig, args: Any, world_size: int = 1) -> None:
    """Everything about ``config`` knowable before a job of ``world_size`` processes starts, derived
    values filled in. ``args``: the flavor with the ``[model]`` overrides applied."""
    check_numbers(config)
    check_model(config, args, world_size)
    check_dispersion(config, args.n_layers)
    resolve_replicate_degree(config, world_size)
    dp = data_parallel_degree(config, world_size)
    released.resolve(config, dp)  # before what reads the steps
    check_methods(config)
    config.optimizer.baseline = config.lr_scheduler.baseline = config.baseline  # where the builders look
    check_data(config)
    check_checkpoint(config, world_size)
    check_titan_settings(config)
    resolve_batch_sizes(config, dp)
    check_output_folders(config)
