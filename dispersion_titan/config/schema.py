"""Extra TOML fields, merged by TorchTitan into its JobConfig via ``job.custom_config_module``.

``[job]`` gains ``fork_from`` (branch a new run from another run's checkpoint);
``[model]`` gains shape overrides (0 or unset keeps the flavor's value; ``models.flavors``
maps them to each family's fields);
``[training]`` and ``[validation]`` the keys that derive per-rank batches from global ones,
and ``[training]`` how a micro-batch's loss is scaled, which positions it scores and what computes it;
``[compile]`` whether the whole model is one compiled region;
``[dispersion]`` configures the auxiliary loss; ``[baseline]`` the methods the paper
compares against; ``[released]`` the launch arguments of the authors' script a paper config
follows. Every field is overridable on the command line as ``--section.key value``, except
``[optimizer]`` / ``[lr_scheduler]``'s ``baseline`` (``BuilderInputs``), which the launch checks fill in.
"""

from dataclasses import dataclass, field
from typing import Literal

import tyro

Variant = Literal["none", "angular_spread", "orthogonalization", "l2_repel", "decorrelation", "perplexity_entropy"]
"""``dispersion.variant``: none, or a loss of ``losses.variants`` (tests/test_config_errors.py checks they agree)."""
Method = Literal["none", "noisy_embedding", "active_forgetting"]
"""``baseline.method``: none, or the paper's baselines."""


@dataclass
class Job:
    fork_from: str = ""
    """RUN[@STEP]: start this new, empty job.dump_folder from run folder RUN's checkpoint at STEP
    (default: its newest full checkpoint), with settings of its own; RUN is never written."""


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
    """Number of learned positions (gpt2); 0 keeps the flavor's (1024). Rotary models size their
    position table from training.seq_len and validation.seq_len."""
    tie_embeddings: bool | None = None
    """Share the LM head with the token embedding matrix; unset keeps the flavor's (gpt2 and
    qwen3 up to 4B tie, larger qwen3 and llama3 do not)."""
    attn_dropout: float | None = None
    """gpt2: dropout on the attention probabilities (Hugging Face's attn_pdrop), training only.
    Unset: the HF config.json's value when checkpoint.initial_load_in_hf loads a GPT-2 folder, else 0."""
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
    """ε in (0, 1): cosines are clamped to [−1+ε, 1−ε] before arccos (straight-through)."""
    lambda_norm: float = 0.1
    """Weight of the mean(z²) penalty of l2_repel (0.1 in the authors' lm_dispersion/dispersion.py)."""
    form: Literal["released", "paper"] = "released"
    """released | paper: the authors' lm_dispersion/dispersion.py, which made the paper's numbers
    (l2_repel's normaliser includes its N pairs i = j; z / (|z| + 1e-2); logits + 1e-2; log2(p + 1e-2)),
    or the paper's equations (pairs i ≠ j only, z / |z|). docs/training.md compares them."""
    layers: str | list[int] = "all"
    """all | last | early_half | late_half, or 1-based block indices: [1, 2, 5] in TOML, 3 or 1,2,5 on
    the command line."""
    points: Literal["blocks", "hidden_states"] = "blocks"
    """blocks | hidden_states: the n points ``layers`` indexes. blocks = every block's raw output;
    hidden_states = blocks 1..n-1 and the final norm's output, transformers' hidden_states[1:] (the
    authors' Hugging Face scripts, train_configs/paper/)."""
    max_tokens: int = 0
    """0 uses all positions (exact); else a random subset of this many (≥ 2) positions per layer and
    micro-batch, seeded; 256 is the authors' subsampling (lm_dispersion/dispersion.py)."""
    warmup_steps: int = 0
    """Ramp λ linearly from 0 over this many steps; 0 applies it in full from step 1."""
    kernel: Literal["auto", "triton", "torch"] = "auto"
    """auto | triton | torch: the pair kernel; auto = the fused Triton kernel on CUDA (probed once
    against torch at start: a disagreement or a failed build stops the run in one line), else the
    memory-lean PyTorch strips."""
    precision: Literal["auto", "bf16", "tf32", "exact"] = "auto"
    """auto | bf16 | tf32 | exact: the Triton kernel's products. auto (bf16 tensor-core products,
    fp32 accumulation; perplexity_entropy: split-precision bf16x3 logits) for training; exact (bf16x3,
    ieee fp32 for l2_repel and perplexity_entropy) equals the reference
    within 1e-4 in value. The torch strips always compute in fp32."""


METHOD_SETTINGS: dict[Method, tuple[str, ...]] = {
    "none": (),
    "noisy_embedding": ("noise_alpha",),
    "active_forgetting": ("forget_every", "embedding_lr"),
}
"""``baseline.method`` values and the ``[baseline]`` fields each one reads."""
BASELINE_METHODS = tuple(m for m in METHOD_SETTINGS if m != "none")
"""The baseline methods the paper compares against (a sweep's variants besides ``baseline``)."""


@dataclass
class Baseline:
    method: Method = "none"
    """none | noisy_embedding (NEFTune) | active_forgetting (Chen et al. 2023)"""
    noise_alpha: float = 1.0
    """noisy_embedding: α ≥ 0; uniform noise in ±α/√(S·d) on the token embeddings, training only."""
    forget_every: int = 1000
    """active_forgetting: K ≥ 1; after every K steps the token embeddings (and a tied LM head) are
    re-initialised and their AdamW state cleared."""
    embedding_lr: float = 5e-5
    """active_forgetting: peak LR > 0 of the token embeddings' own schedule (8% linear warm-up, then
    linear decay, restarting at every reset)."""


@dataclass
class Training:
    max_local_batch_size: int = 0
    """With ``local_batch_size = 0``: the largest micro-batch per rank (0: no limit); the
    derived micro-batch is the largest divisor of global_batch_size / DP degree up to it."""
    loss_scale: Literal["mean", "as_released"] = "mean"
    """mean | as_released: the gradient of the global batch's mean loss, whatever the layout; or, as the
    authors' released runs (transformers' Trainer with their compute_loss), the sum over a rank's
    micro-batches of each one's own mean, averaged over data-parallel ranks: the accumulation count
    times the mean's gradient, before clipping."""
    predict_last: bool = True
    """False: the last position of each training sequence scores nothing (its label ignored), seq_len − 1
    predictions a sequence, as transformers' shifted cross-entropy on blocks of seq_len tokens."""
    head_loss: Literal["torch", "liger"] = "torch"
    """torch | liger: the training forward's LM head and cross-entropy as two ops (the logits written whole),
    or Liger-Kernel's fused linear cross-entropy (chunks of logits, the gradient taken in the forward); gpt2,
    without tensor parallelism; Triton kernels (a GPU). Validation always computes the logits."""


@dataclass
class Compile:
    whole_model: bool = False
    """With ``enable`` and "model" in ``components`` (gpt2): compile the whole model in place, embeddings,
    blocks, final norm and head (cut where FSDP2's units begin), instead of TorchTitan's region per block."""


@dataclass
class Released:
    """The authors' script's own launch arguments (their names), from which a paper config's layout
    follows for its GPU count N, as their script computes it: per GPU ``per_device_train_batch_size``
    sequences × ``gradient_accumulation_steps`` micro-batches, so N times one GPU's global batch;
    ⌈``train_tokens`` / tokens per step⌉ steps; lr ``lr``·√N; warm-up ⌈``warmup_ratio``·T⌉;
    checkpoints and validation every ⌊T/``num_ckpt``⌋ + 1 steps; and under ``training.loss_scale =
    "as_released"`` each micro-batch's mean scaled by their accumulation count. Off while
    ``per_device_train_batch_size`` is 0. The keys it derives are refused in the TOML and on the
    command line (``job_config.released``)."""

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
    """N, the authors' GPU count whose run this one trains; 0: this run's data-parallel degree. Another N
    trains that run on this layout (the same global batch, more micro-batches per rank, the same scale)."""


@dataclass
class Validation:
    global_batch_size: int = -1
    """Sequences per validation batch over all data-parallel ranks (-1: training's global
    batch size); ``validation.steps`` counts these batches, so every layout validates on
    the same sequences. ``local_batch_size = 0`` derives the per-rank share."""


@dataclass
class Checkpoint:
    save_initial: bool = False
    """Save step 0 (the initialised weights, before any update) when a run starts fresh."""


@dataclass
class BuilderInputs:
    """``[optimizer]`` and ``[lr_scheduler]`` gain the run's ``[baseline]`` section: TorchTitan hands
    the TrainSpec's optimizer and LR-scheduler builders only their own section, and active
    forgetting gives the token embeddings a param group and schedule of their own. Not a TOML
    key or flag: the launch checks (``job_config.checks.check_job_config``) set it."""

    baseline: tyro.conf.Suppress[Baseline | None] = field(default=None, init=False, repr=False)


@dataclass
class OptimizerInputs(BuilderInputs):
    name: Literal["Adam", "AdamW"] = "AdamW"
    """Adam | AdamW: TorchTitan's optimizers (its own field, typed here as its choices)."""
    decay_groups: Literal["all", "hf", "as_released"] = "all"
    """all | hf | as_released: weight decay on every parameter; none on biases and norm weights (the
    Hugging Face Trainer's grouping, Trainer.get_decay_parameter_names, which the authors' scripts train
    with); or hf's, but under active forgetting none only on LayerNorm weights and biases (their
    active-forgetting optimizer, which decays RMSNorm weights)."""


@dataclass
class LRSchedulerInputs(BuilderInputs):
    form: Literal["torchtitan", "as_released"] = "torchtitan"
    """torchtitan | as_released: TorchTitan's warm-up ((s+1)/W at step s), or transformers'
    get_cosine_schedule_with_warmup (s/W: the first step at lr 0), the authors' schedule; under
    active forgetting with W = ⌊0.2·T⌋, as their ActiveForgettingLRScheduler."""


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
