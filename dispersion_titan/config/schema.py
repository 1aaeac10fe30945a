"""Our TOML sections and keys, merged by TorchTitan into its JobConfig (``job.custom_config_module``);
each is ``--section.key value`` on the command line, except ``BuilderInputs.baseline``.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

import tyro

Variant = Literal["none", "angular_spread", "orthogonalization", "l2_repel", "decorrelation", "perplexity_entropy"]
"""``dispersion.variant``: none, or a loss of ``losses.variants`` (tests/test_config_errors.py checks they agree)."""
Method = Literal["none", "noisy_embedding", "active_forgetting"]
"""``baseline.method``: none, or the paper's baselines."""


@dataclass
class Job:
    fork_from: str = ""
    """RUN[@STEP]: start this new job.dump_folder from run RUN's checkpoint at STEP (default: its newest);
    RUN is never written."""


@dataclass
class Model:
    dim: int = 0
    """Residual width; 0 keeps the flavor's."""
    n_layers: int = 0
    """Number of blocks; 0 keeps the flavor's."""
    n_heads: int = 0
    """Attention heads; 0 keeps the flavor's."""
    n_kv_heads: int = 0
    """Key/value heads (qwen3, llama3: grouped-query attention); 0 keeps the flavor's."""
    head_dim: int = 0
    """Width of one attention head (qwen3; gpt2 and llama3 use dim / n_heads); 0 keeps the flavor's."""
    mlp_hidden_dim: int = 0
    """MLP hidden width (gpt2, qwen3); 0 keeps the flavor's (4·dim for every gpt2 flavor)."""
    vocab_size: int = 0
    """Vocabulary size (embedding rows); 0 keeps the flavor's. At least the tokenizer's ids."""
    max_seq_len: int = 0
    """Number of learned positions (gpt2); 0 keeps the flavor's (1024)."""
    tie_embeddings: bool | None = None
    """Share the LM head with the token embeddings; unset keeps the flavor's."""
    attn_dropout: float | None = None
    """gpt2: dropout on the attention probabilities (attn_pdrop); unset: a loaded GPT-2 folder's, else 0."""
    resid_dropout: float | None = None
    """gpt2: dropout after each block's attention and MLP output projections (resid_pdrop); unset as above."""
    embd_dropout: float | None = None
    """gpt2: dropout on the token + position embeddings (embd_pdrop); unset as above."""


@dataclass
class Dispersion:
    variant: Variant = "none"
    """none (cross-entropy only), or the term's variant."""
    coeff: float = 0.0
    """λ, the weight of the dispersion term in L = L_CE + λ·mean_ℓ L_disp(Z_ℓ); ≥ 0."""
    tau: float = 1.0
    """Temperature τ > 0 of the log-sum-exp variants; σ² of perplexity_entropy."""
    clamp: float = 0.1
    """ε in [1e-6, 1): cosines are clamped to [−1+ε, 1−ε] before arccos (straight-through)."""
    lambda_norm: float = 0.1
    """Weight of the mean(z²) penalty of l2_repel (0.1 in the authors' lm_dispersion/dispersion.py)."""
    form: Literal["released", "paper"] = "released"
    """released | paper: the authors' lm_dispersion/dispersion.py, which made the paper's numbers, or the
    paper's equations (pairs i ≠ j only, z / |z|); docs/training.md compares them."""
    layers: str | list[int] = "all"
    """all | last | early_half | late_half, or 1-based block indices ([1, 2, 5]; 1,2,5 on the CLI)."""
    points: Literal["blocks", "hidden_states"] = "blocks"
    """blocks | hidden_states: the points ``layers`` indexes: every block's output, or blocks 1..n-1 and
    the final norm's, transformers' hidden_states[1:] (the authors' Hugging Face scripts)."""
    max_tokens: int = 0
    """0 uses all positions; else a seeded random subset of this many (≥ 2) per layer and micro-batch
    (the authors': 256)."""
    warmup_steps: int = 0
    """Ramp λ linearly from 0 over this many steps; 0 applies it in full from step 1."""
    kernel: Literal["auto", "triton", "torch"] = "auto"
    """auto | triton | torch: the pair kernel; auto = the fused Triton kernel on CUDA (probed at start),
    else the memory-lean PyTorch strips."""
    precision: Literal["auto", "bf16", "tf32", "exact"] = "auto"
    """auto | bf16 | tf32 | exact: the Triton kernel's products (auto: bf16 tensor cores, fp32
    accumulation; exact: within 1e-4 of the reference); the torch strips compute in fp32."""


def resolve_layers(spec: str | list[int], n_layers: int) -> list[int]:
    """0-based block indices selected by ``dispersion.layers`` (keywords, a list of 1-based indices, or
    ``"3"`` / ``"1,2,5"`` as typed on a command line); ValueError naming what is wrong."""
    parts = spec if isinstance(spec, list) else [p.strip() for p in spec.split(",")]
    if not isinstance(spec, list) and not all(p.isdigit() for p in parts):
        half = n_layers // 2
        table = {
            "all": range(n_layers),
            "last": range(n_layers - 1, n_layers),
            "early_half": range(half),
            "late_half": range(half, n_layers),
        }
        if spec not in table:
            raise ValueError(f"{spec!r} is not one of {tuple(table)} or block indices such as 3 or 1,2,5")
        chosen = list(table[spec])
    else:
        indices = [int(p) for p in parts]
        bad = [i for i in indices if not 1 <= i <= n_layers]
        if bad or not indices:
            raise ValueError(f"block indices must be 1..{n_layers} (1-based), got {spec}")
        if twice := sorted({i for i in indices if indices.count(i) > 1}):
            raise ValueError(f"block {', '.join(map(str, twice))} named twice in {spec}; name each block once")
        chosen = sorted({i - 1 for i in indices})
    if not chosen:
        raise ValueError(f"{spec!r} selects no block of {n_layers}")
    return chosen


BASELINE_METHODS = get_args(Method)[1:]
"""The baseline methods the paper compares against (a sweep's variants besides ``baseline``)."""


@dataclass
class Baseline:
    method: Method = "none"
    """none | noisy_embedding (NEFTune) | active_forgetting (Chen et al. 2023)"""
    noise_alpha: float = 1.0
    """noisy_embedding: α ≥ 0; uniform noise in ±α/√(S·d) on the token embeddings, training only."""
    forget_every: int = 1000
    """active_forgetting: K ≥ 1; the token embeddings are re-initialised after every K steps."""
    embedding_lr: float = 5e-5
    """active_forgetting: peak LR > 0 of the token embeddings' own schedule."""


@dataclass
class Training:
    max_local_batch_size: int = 0
    """With ``local_batch_size = 0``: the largest micro-batch per rank (0: no limit)."""
    loss_scale: Literal["mean", "as_released"] = "mean"
    """mean | as_released: the gradient of the global batch's mean loss, whatever the layout; or, as the
    authors' runs, each micro-batch's own mean summed per rank: the accumulation count times that."""
    predict_last: bool = True
    """False: the last position of each sequence scores nothing, as transformers' shifted cross-entropy."""
    head_loss: Literal["torch", "liger"] = "torch"
    """torch | liger: the training LM head and cross-entropy as two ops, or Liger-Kernel's fused linear
    cross-entropy (logits in chunks; gpt2 without TP, on a GPU)."""


@dataclass
class Compile:
    whole_model: bool = False
    """gpt2, with ``enable``: compile the whole model in place, not TorchTitan's region per block."""


@dataclass
class Released:
    """The authors' script's launch arguments, from which a paper config's layout follows for N GPUs as
    their script computes it: a global batch of N × b × A, ⌈tokens / tokens per step⌉ steps, lr·√N,
    warm-up ⌈ratio·T⌉, checkpoints every ⌊T/num_ckpt⌋ + 1 steps (``job_config.released``)."""

    per_device_train_batch_size: int = 0
    """Sequences per GPU and micro-batch in the authors' run; 0: no released layout (the config's own keys)."""
    gradient_accumulation_steps: int = 0
    """Their accumulation count A: micro-batches per GPU and step."""
    train_tokens: int = 0
    """Their token budget, which fixes the step count for N GPUs."""
    lr: float = 0.0
    """Their base learning rate; the run's peak lr is lr·√N."""
    warmup_ratio: float = 0.2
    """transformers' TrainingArguments.warmup_ratio: ⌈ratio·T⌉ warm-up steps."""
    num_ckpt: int = 0
    """Their ``--num_ckpt``: checkpoints (and validation) every ⌊T/num_ckpt⌋ + 1 steps and at the last."""
    gpus: int = 0
    """N, the authors' GPU count whose run this one trains (0: this run's data-parallel degree)."""


@dataclass
class Validation:
    global_batch_size: int = -1
    """Sequences per validation batch over all ranks (-1: training's), so every layout validates on the
    same sequences; ``local_batch_size = 0`` derives the per-rank share."""


@dataclass
class Checkpoint:
    save_initial: bool = False
    """Save step 0 (the initialised weights, before any update) when a run starts fresh."""


@dataclass
class BuilderInputs:
    """The run's ``[baseline]`` for the optimizer and LR-scheduler builders, which TorchTitan hands only
    their own section; set by the launch checks, not a key."""

    baseline: tyro.conf.Suppress[Baseline | None] = field(default=None, init=False, repr=False)


@dataclass
class OptimizerInputs(BuilderInputs):
    name: Literal["Adam", "AdamW"] = "AdamW"
    """Adam | AdamW: TorchTitan's optimizers (its own field, typed here as its choices)."""
    decay_groups: Literal["all", "hf", "as_released"] = "all"
    """all | hf | as_released: weight decay on every parameter; none on biases and norm weights (the
    Hugging Face Trainer's); or hf's, but under active forgetting none only on LayerNorm's and biases."""


@dataclass
class LRSchedulerInputs(BuilderInputs):
    form: Literal["torchtitan", "as_released"] = "torchtitan"
    """torchtitan | as_released: TorchTitan's schedule, or the authors' (transformers' cosine with
    warm-up, the first step at lr 0; W = ⌊0.2·T⌋ under active forgetting)."""


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    validation: Validation = field(default_factory=Validation)
    compile: Compile = field(default_factory=Compile)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    dispersion: Dispersion = field(default_factory=Dispersion)
    baseline: Baseline = field(default_factory=Baseline)
    released: Released = field(default_factory=Released)
    optimizer: OptimizerInputs = field(default_factory=OptimizerInputs)
    lr_scheduler: LRSchedulerInputs = field(default_factory=LRSchedulerInputs)


if TYPE_CHECKING:
    from torchtitan.config import JobConfig as TitanJobConfig

    class RunConfig(JobConfig, TitanJobConfig):
        """TorchTitan's ``JobConfig`` with our sections, for annotations only (TorchTitan builds the merged
        class at run time): every section and key of TorchTitan's, and ours."""
