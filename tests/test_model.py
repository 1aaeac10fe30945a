"""The GPT-2 model: parameter counts, FLOPs, equivalence with transformers, weight tying."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from dispersion_titan.analysis.measure import DecoderLayers
from dispersion_titan.models.gpt2.args import GPT2ModelArgs, flops_per_token, gpt2_flavors
from dispersion_titan.models.gpt2.model import GPT2
from dispersion_titan.models.gpt2.state_dict_adapter import GPT2StateDictAdapter


def build(args: GPT2ModelArgs, seed: int = 0) -> GPT2:
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = GPT2(args)
    model.to_empty(device="cpu")
    model.init_weights()
    return model


def hf_config(args: GPT2ModelArgs):
    return transformers.GPT2Config(
        vocab_size=args.vocab_size,
        n_positions=args.max_seq_len,
        n_embd=args.dim,
        n_layer=args.n_layers,
        n_head=args.n_heads,
        n_inner=args.mlp_hidden_dim or None,
        activation_function="gelu_new",
        layer_norm_epsilon=args.norm_eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=args.tie_embeddings,
    )


def hf_param_count(args: GPT2ModelArgs) -> int:
    with torch.device("meta"):
        hf = transformers.GPT2LMHeadModel(hf_config(args))
    return sum(p.numel() for p in hf.parameters())


def test_gpt2_small_has_published_parameter_count():
    with torch.device("meta"):
        model = GPT2(gpt2_flavors["small"])
    assert sum(p.numel() for p in model.parameters()) == 124_439_808


@pytest.mark.parametrize("flavor", ["debug", "small", "medium", "large", "xl"])
@pytest.mark.parametrize("mlp", [0, 1536])
def test_parameter_counts_match_transformers(flavor, mlp):
    args = gpt2_flavors[flavor]
    args.mlp_hidden_dim = mlp
    with torch.device("meta"):
        model = GPT2(args)
    assert sum(p.numel() for p in model.parameters()) == hf_param_count(args)


def test_untied_head_adds_one_embedding_matrix():
    args = gpt2_flavors["debug"]
    with torch.device("meta"):
        tied = sum(p.numel() for p in GPT2(args).parameters())
        args.tie_embeddings = False
        untied = sum(p.numel() for p in GPT2(args).parameters())
    assert untied - tied == args.vocab_size * args.dim


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("mlp", [0, 96])
def test_logits_match_transformers_gpt2(tie, mlp):
    args = GPT2ModelArgs(dim=64, n_layers=3, n_heads=4, mlp_hidden_dim=mlp, max_seq_len=64, tie_embeddings=tie)
    ours = build(args, seed=1).eval()
    draws = torch.Generator().manual_seed(2)
    with torch.no_grad():  # off GPT-2's init (std 0.02: near-linear blocks, GELU's tanh form 1.3e-5 off, not 1e-3)
        for parameter in ours.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=draws))
    hf = transformers.GPT2LMHeadModel(hf_config(args)).eval()
    adapter = GPT2StateDictAdapter(args, None)
    missing, unexpected = hf.load_state_dict(adapter.to_hf(ours.state_dict()), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    tokens = torch.randint(0, args.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours(tokens)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


def test_attention_projects_q_k_v_in_one_gemm():
    """One linear for q, k and v (HF's c_attn, of the wq, wk, wv rows), one for the output projection."""
    shapes = []

    class Linears(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.nn.functional.linear:
                shapes.append(tuple(args[1].shape))
            return func(*args, **(kwargs or {}))

    model = build(GPT2ModelArgs(dim=64, n_layers=1, n_heads=4, max_seq_len=16, vocab_size=100))
    with Linears():
        model.layers["0"].attention(torch.randn(2, 16, 64))
    assert shapes == [(192, 64), (64, 64)]


def test_analysis_layers_are_embedding_blocks_and_final_norm():
    """The analysis' hooks (``DecoderLayers``) on GPT-2, against transformers' hidden states."""
    args = gpt2_flavors["debug"]
    model = build(args).eval()
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    reported = []
    with torch.no_grad():
        DecoderLayers(model).run(tokens, lambda name, hidden: reported.append((name, hidden)))
        names, states = zip(*reported, strict=True)
        hf = transformers.GPT2LMHeadModel(hf_config(args)).eval()
        hf.load_state_dict(GPT2StateDictAdapter(args, None).to_hf(model.state_dict()), strict=False)
        reference = hf(tokens, output_hidden_states=True).hidden_states
    assert names == ("embedding", *(f"block_{i}" for i in range(1, args.n_layers + 1)), "final_norm")
    # transformers' last hidden state is after ln_f; the others are block inputs/outputs.
    for ours, theirs in zip(states[:-2], reference[:-1], strict=True):
        assert torch.allclose(ours, theirs, atol=1e-5)
    assert torch.allclose(states[-1], reference[-1], atol=1e-5)


def test_tied_weights_are_one_parameter_with_summed_gradients():
    args = gpt2_flavors["debug"]
    model = build(args)
    assert model.output.weight is model.tok_embeddings.weight
    names = [n for n, _ in model.named_parameters()]
    assert "output.weight" not in names and "tok_embeddings.weight" in names

    # An untied twin with identical values: the tied gradient must be the sum of the
    # embedding gradient and the head gradient.
    args_untied = gpt2_flavors["debug"]
    args_untied.tie_embeddings = False
    twin = build(args_untied)
    twin.load_state_dict({**model.state_dict(), "output.weight": model.tok_embeddings.weight.detach().clone()})
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    for m in (model, twin):
        m(tokens).float().logsumexp(-1).sum().backward()
    expected = twin.tok_embeddings.weight.grad + twin.output.weight.grad
    assert torch.allclose(model.tok_embeddings.weight.grad, expected, atol=1e-6)
    assert twin.output.weight.grad.abs().sum() > 0 and twin.tok_embeddings.weight.grad.abs().sum() > 0


def test_init_follows_gpt2_and_reties_after_to_empty():
    args = gpt2_flavors["debug"]
    model = build(args)
    residual = model.layers["0"].attention.wo.weight
    assert abs(residual.std().item() - 0.02 / (2 * args.n_layers) ** 0.5) < 2e-3
    assert abs(model.layers["0"].attention.wq.weight.std().item() - 0.02) < 2e-3
    assert torch.all(model.layers["0"].attention.wq.bias == 0)
    assert torch.all(model.norm.weight == 1) and torch.all(model.norm.bias == 0)
    assert model.output.weight is model.tok_embeddings.weight


def test_flops_per_token_matches_flop_counter():
    """Our closed form against PyTorch's FLOP counter on a real forward+backward."""
    args = GPT2ModelArgs(dim=64, n_layers=2, n_heads=4, mlp_hidden_dim=160, vocab_size=1000, max_seq_len=128)
    model = build(args)
    batch, seq_len = 2, 128
    tokens = torch.randint(0, args.vocab_size, (batch, seq_len))
    # The math backend runs attention as bmm, which the counter sees (fused CPU kernels it does not).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens).sum().backward()
    measured = counter.get_total_flops() / (batch * seq_len)
    assert flops_per_token(args, seq_len) == measured


DROPOUT = dict(attn_dropout=0.1, resid_dropout=0.2, embd_dropout=0.3)


def test_dropout_is_off_in_eval_and_on_in_training():
    """Eval: deterministic and equal to the same weights without dropout. Train: different
    draw to draw, reproducible from the seed."""
    shape = dict(dim=64, n_layers=2, n_heads=4, max_seq_len=64, vocab_size=512)
    with_dropout, without = build(GPT2ModelArgs(**shape, **DROPOUT)), build(GPT2ModelArgs(**shape))
    assert with_dropout.state_dict().keys() == without.state_dict().keys()
    with_dropout.load_state_dict(without.state_dict())
    tokens = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with_dropout.eval(), without.eval()
        assert torch.equal(with_dropout(tokens), without(tokens)) and torch.equal(
            with_dropout(tokens), with_dropout(tokens)
        )
        with_dropout.train(), without.train()
        torch.manual_seed(5)
        first = with_dropout(tokens)
        second = with_dropout(tokens)
        torch.manual_seed(5)
        again = with_dropout(tokens)
        assert torch.equal(without(tokens), without.eval()(tokens))  # no dropout: train = eval
    assert not torch.equal(first, second) and torch.equal(first, again)


def test_embedding_and_residual_dropout_are_inverted_dropout():
    """Each entry is 0 or 1/(1-p) times its eval value (HF's nn.Dropout), with about p zeros."""
    args = GPT2ModelArgs(dim=64, n_layers=1, n_heads=4, max_seq_len=256, vocab_size=512, **DROPOUT)
    model = build(args)
    tokens = torch.randint(0, 512, (8, 256), generator=torch.Generator().manual_seed(1))
    x = torch.randn(8, 256, 64, generator=torch.Generator().manual_seed(2))
    block = model.layers["0"]
    with torch.no_grad():
        pairs = {
            "embd_dropout": (model.eval().embed(tokens), model.train().embed(tokens)),
            "resid_dropout": (block.feed_forward.eval()(x), block.feed_forward.train()(x)),
        }
    for key, (reference, dropped) in pairs.items():
        p = DROPOUT[key]
        kept = dropped != 0
        assert torch.allclose(dropped[kept], reference[kept] / (1 - p), rtol=1e-6, atol=0), key
        assert abs((~kept).float().mean().item() - p) < 0.01, key


def test_attention_dropout_keeps_the_expected_output():
    """Dropout on the attention probabilities (SDPA's dropout_p): inverted, so the mean over
    draws is the eval output, while single draws differ from it."""
    args = GPT2ModelArgs(dim=16, n_layers=1, n_heads=2, max_seq_len=32, vocab_size=64, attn_dropout=0.3)
    attention = build(args).layers["0"].attention
    x = torch.randn(1, 12, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = attention.eval()(x)
        attention.train()
        torch.manual_seed(0)
        draws = attention(x.expand(4000, -1, -1))  # one mask per batch row: 4000 draws in one call
    scale = reference.abs().max()
    assert (draws[0] - reference).abs().max() > 0.1 * scale
    error = (draws.mean(0) - reference).abs().max()
    assert error < 0.02 * scale, (error, scale)
