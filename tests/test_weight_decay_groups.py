"""``[optimizer] decay_groups = "hf"``: biases and norm weights without weight decay, exactly
the parameters transformers' ``Trainer.get_decay_parameter_names`` exempts on the same
model in Hugging Face form (mapped through our GPT-2 adapter), and the optimizer built
with those groups; ``"all"`` keeps TorchTitan's one group; ``"as_released"`` under active
forgetting exempts what the authors' active-forgetting optimizer does, on GPT-2 and Qwen3."""

from __future__ import annotations

import pytest
import torch
import transformers
from torchtitan.models.qwen3 import Qwen3Model

from dispersion_titan.components.optimizers import build_dispersion_optimizers, no_decay_parameter_names
from dispersion_titan.components.titan_compat import merged_job_config_class
from dispersion_titan.config.cli import CONFIG_MODULE
from dispersion_titan.config.schema import Baseline
from dispersion_titan.job_config.parse import validated_args
from dispersion_titan.models.gpt2 import GPT2, GPT2ModelArgs
from dispersion_titan.models.gpt2.state_dict_adapter import GPT2StateDictAdapter
from dispersion_titan.models.qwen3_dispersion import Qwen3Args
from dispersion_titan.utils.errors import ArgumentError
from support.launch import job_args

ARGS = GPT2ModelArgs(dim=32, n_layers=2, n_heads=2, max_seq_len=16, vocab_size=128)


def hf_decayed_in_our_names(args: GPT2ModelArgs) -> set[str]:
    """Our parameter names whose Hugging Face counterparts the HF Trainer decays: each HF tensor
    marked 1 (decayed) or 0 (exempt), carried over by the adapter."""
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=args.vocab_size,
            n_positions=args.max_seq_len,
            n_embd=args.dim,
            n_layer=args.n_layers,
            n_head=args.n_heads,
        )
    )
    decayed = set(transformers.Trainer.get_decay_parameter_names(None, hf))
    marked = {name: torch.full_like(t, float(name in decayed)) for name, t in hf.state_dict().items()}
    ours = GPT2StateDictAdapter(args, None).from_hf(marked)
    assert all(torch.all(t == t.flatten()[0]) for t in ours.values())  # no tensor mixes the two
    return {name for name, t in ours.items() if t.flatten()[0] == 1}


def optimizer_section(decay_groups: str):
    section = merged_job_config_class(CONFIG_MODULE)().optimizer
    section.lr, section.weight_decay, section.implementation = 1e-3, 0.1, "foreach"
    section.decay_groups = decay_groups
    return section


def test_hf_grouping_exempts_what_the_hf_trainer_exempts():
    model = GPT2(ARGS)
    names = {name for name, _ in model.named_parameters()}
    decayed = hf_decayed_in_our_names(ARGS) & names
    assert names - no_decay_parameter_names(model) == decayed
    assert "tok_embeddings.weight" in decayed and "layers.0.attention.wq.bias" not in decayed  # sanity
    (optimizer,) = build_dispersion_optimizers([model], optimizer_section("hf"), None)
    by_id = {id(p): name for name, p in model.named_parameters()}
    body, exempt = optimizer.param_groups
    assert {by_id[id(p)] for p in body["params"]} == decayed and body["weight_decay"] == 0.1
    assert {by_id[id(p)] for p in exempt["params"]} == names - decayed and exempt["weight_decay"] == 0.0
    assert exempt["lr"] == body["lr"] == 1e-3
    ((everything,),) = (
        o.param_groups for o in build_dispersion_optimizers([GPT2(ARGS)], optimizer_section("all"), None)
    )
    assert len(everything["params"]) == len(names) and everything["weight_decay"] == 0.1


@pytest.mark.parametrize(
    "model",
    [
        GPT2(ARGS),
        Qwen3Model(Qwen3Args(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, hidden_dim=64, vocab_size=128)),
    ],
    ids=["gpt2", "qwen3"],
)
def test_as_released_under_active_forgetting_exempts_layernorms_and_biases_only(model):
    """The authors' midtrain_*_other_counter_condensation.py (PerturbationTrainer.create_optimizer): decay
    on get_parameter_names(model, ALL_LAYERNORM_LAYERS) less names with "bias" (transformers' own function,
    nn.LayerNorm its only such layer): Qwen3's RMSNorm weights are decayed there, not under "hf"."""
    from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
    from transformers.trainer_pt_utils import get_parameter_names

    names = {name for name, _ in model.named_parameters()}
    decayed = {n for n in get_parameter_names(model, ALL_LAYERNORM_LAYERS) if "bias" not in n} & names
    section = optimizer_section("as_released")
    section.baseline = Baseline(method="active_forgetting")
    (optimizer,) = build_dispersion_optimizers([model], section, None)
    by_id = {id(p): name for name, p in model.named_parameters()}
    body, embedding, exempt = ({by_id[id(p)] for p in g["params"]} for g in optimizer.param_groups)
    assert body | embedding == decayed and exempt == names - decayed and optimizer.param_groups[2]["weight_decay"] == 0
    if isinstance(model, Qwen3Model):
        assert not exempt and "norm.weight" in decayed  # under "hf" every norm weight is exempt
        assert "norm.weight" in no_decay_parameter_names(model)
    else:
        assert exempt == no_decay_parameter_names(model)  # GPT-2: LayerNorms and biases, as "hf"


def test_an_unknown_grouping_is_refused_in_one_line():
    """The parser refuses it, with the choices (``config/schema.py``'s ``Literal``)."""
    with pytest.raises(
        ArgumentError,
        match=r"^optimizer.decay_groups: 'bias' is not one of \('all', 'hf', "
        r"'as_released'\)$",
    ):
        validated_args([*job_args(), "--optimizer.decay_groups", "bias"])
