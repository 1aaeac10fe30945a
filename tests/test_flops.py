"""The FLOP count behind every MFU we print (TorchTitan's ``mfu`` log line and
bench/train_step.py's both divide ``model_args.get_nparams_and_flops``) against
``torch.utils.flop_counter.FlopCounterMode`` on the real model: one forward and backward
on the meta device (shapes only, nothing computed), at GPT-2 small's and Qwen3-0.6B's full
shapes and sequence lengths.

What both count: matmul FLOPs (2 per multiply-add) of every linear layer, the LM head
included, and of attention (SDPA decomposes to two batched matmuls on meta), in the
forward and the two matmuls per matmul of the backward (3× the forward); the full T×T
score matrix, no causal discount (PaLM's convention, TorchTitan's). Not counted by either:
norms, activations, softmax, the loss, the optimizer."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from torchtitan.protocols.train_spec import get_train_spec

from dispersion_titan.models import register_all

TOLERANCE = 1e-3  # relative; the counts differ only by norm weights (6 FLOPs each a token: 6e-5 for Qwen3, 0 for gpt2)


@pytest.mark.parametrize(
    "family, flavor, seq_len, overrides",
    [
        ("gpt2", "small", 1024, {"vocab_size": 50304, "mlp_hidden_dim": 3072}),  # gpt2_small_mlp3072.toml
        ("gpt2", "small", 1024, {"vocab_size": 50304, "mlp_hidden_dim": 768}),
        ("qwen3_dispersion", "0.6B", 4096, {}),  # midtrain_qwen3_0.6b_*.toml: tied LM head of 151936 rows
    ],
)
def test_the_mfu_flop_count_is_what_the_model_computes(family, flavor, seq_len, overrides):
    register_all()
    spec = get_train_spec(family)
    args = spec.model_args[flavor]
    for key, value in overrides.items():
        setattr(args, args.OVERRIDES.get(key, key), value)
    with torch.device("meta"):
        model = spec.model_cls(args)
        tokens = torch.zeros(1, seq_len, dtype=torch.long)
        with FlopCounterMode(display=False) as counter:
            model(tokens).sum().backward()
    counted = counter.get_total_flops() / seq_len
    matmuls = {str(op).split(".")[-1] for op in counter.get_flop_counts()["Global"]}
    assert matmuls <= {"mm", "addmm", "bmm"}, matmuls  # nothing else carries FLOPs here
    _, formula = args.get_nparams_and_flops(model, seq_len)
    assert formula == pytest.approx(counted, rel=TOLERANCE), (formula, counted)
