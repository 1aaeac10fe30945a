"""The blocks' outputs reach the dispersion loss through forward hooks (``BlockOutputs``),
one code path for gpt2, qwen3 and llama3, registered after each family's own
``parallelize_fn`` has applied activation checkpointing (full, per-op selective) or
``torch.compile``: every hook fires exactly once per block and micro-batch (never during
the recomputation in backward, never under ``no_grad``), and the dispersion gradient
reaches every block's parameters (λ > 0 and λ = 0 differ after one step).

In process, on the models TorchTitan's trainer builds (meta device, ``parallelize_fn``,
``init_weights``), as ``DispersionTrainer`` then uses them: the multi-process runs are
in ``test_parallel_equivalence``. Compile uses the ``aot_eager`` backend: dynamo and AOT
autograd wrap the blocks exactly as with inductor (what the hooks' placement depends on),
without inductor's minute of C++ compilation per family on a CPU
(``test_training_features`` trains with inductor).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchtitan.distributed import ParallelDims
from torchtitan.protocols.train_spec import get_train_spec

from dispersion_titan.config.schema import Dispersion
from dispersion_titan.job_config.parse import validated_args
from dispersion_titan.models import register_all
from dispersion_titan.trainer.objective import BlockOutputs, DispersionObjective
from support.launch import REPO

QWEN3_TOML = str(REPO / "train_configs" / "debug_qwen3_angular_spread.toml")
TINY = {  # two blocks of each family, small enough for a CPU test
    "gpt2": ["--job.config_file", str(REPO / "train_configs" / "debug_angular_spread.toml"), "--model.n_layers", "2"],
    "qwen3": [
        "--job.config_file",
        QWEN3_TOML,
        "--model.dim",
        "32",
        "--model.n_layers",
        "2",
        "--model.n_heads",
        "2",
        "--model.n_kv_heads",
        "1",
        "--model.head_dim",
        "16",
        "--model.mlp_hidden_dim",
        "64",
    ],
    "llama3": [
        "--job.config_file",
        QWEN3_TOML,
        "--model.name",
        "llama3_dispersion",
        "--model.dim",
        "32",
        "--model.n_layers",
        "2",
        "--model.n_heads",
        "2",
        "--model.n_kv_heads",
        "1",
    ],
}
WRAPPING = {
    "plain": [],
    "full_ac": ["--activation_checkpoint.mode", "full"],
    "selective_ac": ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"],
    "compile": ["--compile.enable", "--compile.backend", "aot_eager"],
}
WRAPPER = {"full_ac": "CheckpointWrapper", "selective_ac": "CheckpointWrapper", "compile": "OptimizedModule"}
MICROBATCHES, BATCH, SEQ = 2, 2, 16


def built(family: str, wrapping: str, *extra: str) -> torch.nn.Module:
    """The family's tiny model as the trainer builds it on one process, seeded."""
    job = validated_args(
        [
            *TINY[family],
            "--job.custom_config_module",
            "dispersion_titan.config",
            "--training.seq_len",
            str(SEQ),
            "--validation.no-enable",
            *WRAPPING[wrapping],
            *extra,
        ]
    )
    register_all()
    spec = get_train_spec(job.model.name)
    args = spec.model_args[job.model.flavor]
    args.update_from_config(job)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = spec.model_cls(args)
    world = ParallelDims(dp_shard=1, dp_replicate=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    model = spec.parallelize_fn(model, world, job)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model.train()


def one_step(model: torch.nn.Module, coeff: float) -> dict[str, torch.Tensor]:
    """One optimizer step of CE + λ·dispersion over two micro-batches, as the trainer runs
    it; the weights after it. Checks the hooks' counts on the way."""
    blocks = BlockOutputs(model, "blocks")
    cfg = Dispersion(variant="angular_spread", coeff=coeff)
    objective = DispersionObjective(cfg, blocks.count, MICROBATCHES * BATCH, seed=0, tp_group=None)
    tokens = torch.randint(0, 50257, (MICROBATCHES, BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    for chunk, micro in enumerate(tokens):
        logits = model(micro[:, :-1])
        outputs = blocks.take()  # every block exactly once: a second firing raises in the hook
        assert len(outputs) == blocks.count and all(o.requires_grad for o in outputs)
        ce = F.cross_entropy(logits.flatten(0, 1).float(), micro[:, 1:].flatten()) / MICROBATCHES
        torch.autograd.backward([ce, objective(outputs, step=1, with_stats=False, chunk=chunk).weighted])
        with pytest.raises(RuntimeError, match=f"captured 0 of {blocks.count}"):
            blocks.take()  # the recomputation in backward fired no hook
    with torch.no_grad():
        model(tokens[0, :, :-1])
    with pytest.raises(RuntimeError, match=f"captured 0 of {blocks.count}"):
        blocks.take()  # nothing is kept under no_grad (validation)
    optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("wrapping", list(WRAPPING))
@pytest.mark.parametrize("family", list(TINY))
def test_hooks_fire_once_per_block_and_the_dispersion_gradient_reaches_every_block(family, wrapping):
    model = built(family, wrapping)
    assert type(model.layers["0"]).__name__ == WRAPPER.get(wrapping, type(model.layers["1"]).__name__)
    without = one_step(model, coeff=0.0)
    with_dispersion = one_step(built(family, wrapping), coeff=0.5)
    assert without.keys() == with_dispersion.keys()
    for block in range(2):
        inside = [name for name in without if f"layers.{block}." in name]
        assert inside and any(not torch.equal(without[n], with_dispersion[n]) for n in inside), (family, block)


def test_whole_model_compile_trains_as_eager_with_every_hook_once():
    """``compile.whole_model``: gpt2 compiled in place as one region (its blocks not wrapped, the state dict's
    keys unchanged); the hooks fire once per block and micro-batch, and a step with the dispersion term
    updates the weights as the eager model does."""
    model = built("gpt2", "compile", "--compile.whole_model")
    assert model._compiled_call_impl is not None and type(model.layers["0"]).__name__ == "TransformerBlock"
    eager = built("gpt2", "plain")
    assert model.state_dict().keys() == eager.state_dict().keys()
    compiled, reference = one_step(model, coeff=0.5), one_step(eager, coeff=0.5)
    for name, weight in reference.items():
        torch.testing.assert_close(compiled[name], weight, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", list(TINY))
def test_hidden_states_points_are_the_blocks_then_the_final_norm(family):
    """``points = "hidden_states"``: blocks 1..n-1 and the final norm's output (transformers'
    hidden_states[1:]), with grad; ``blocks``: every block's raw output."""
    model = built(family, "plain")
    tokens = torch.randint(0, 50257, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    hidden = BlockOutputs(model, "hidden_states")
    model(tokens)
    points = hidden.take()
    raw = BlockOutputs(model, "blocks")
    model(tokens)
    blocks = raw.take()
    hidden.take()  # the second forward's hidden_states points, not compared
    assert len(points) == len(blocks) == 2 and all(p.requires_grad for p in points)
    assert torch.equal(points[0], blocks[0])
    assert torch.allclose(points[1], model.norm(blocks[1]), atol=1e-6) and not torch.allclose(points[1], blocks[1])
