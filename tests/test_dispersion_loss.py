"""Dispersion losses: lean vs naive agreement, the formulas themselves, numerics, token subsampling."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from dispersion_titan.config.schema import Dispersion
from dispersion_titan.losses import (
    VARIANTS,
    TorchStrips,
    dispersion_loss,
    dispersion_loss_reference,
    mean_offdiag_cosine,
)
from dispersion_titan.losses.variants import TAU_MIN
from dispersion_titan.trainer.objective import DispersionObjective

IMPLS = {"lean": dispersion_loss, "reference": dispersion_loss_reference}
TOL = 1e-5


def loss_and_grad(fn, hidden: torch.Tensor, variant: str, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    x = hidden.detach().clone().requires_grad_()
    loss = fn(x, variant, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL, what: str = "") -> None:
    diff = (a.float() - b.float()).abs().max().item()
    assert diff <= tol, f"max abs diff {diff:.3g} > {tol:.1g} {what}"


# --------------------------------------------------------------------------- lean vs reference


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("tau", [1.0, 0.3])
def test_lean_matches_reference(variant: str, tau: float) -> None:
    hidden = randn(3, 17, 8, seed=1)
    hidden[0, 5] = hidden[0, 3] * 2.0  # a pair beyond the clamp (c = 1)
    hidden[1, 7] = -hidden[1, 2]  # and one below it (c = -1)
    lean_v, lean_g = loss_and_grad(dispersion_loss, hidden, variant, tau=tau)
    ref_v, ref_g = loss_and_grad(dispersion_loss_reference, hidden, variant, tau=tau)
    assert lean_v.dtype == torch.float32 and lean_v.dim() == 0
    assert_close(lean_v, ref_v)
    assert_close(lean_g, ref_g)
    assert ref_g.abs().max() > 1e-4  # the comparison is not between two near-zero gradients


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("knob", ["rows", "bytes"])
def test_lean_matches_reference_across_row_strips(variant: str, knob: str) -> None:
    b, n, d = 2, 23, 6
    if knob == "rows":
        kernel = TorchStrips(max_block_rows=4)  # 6 strips, the last one shorter
    else:
        kernel = TorchStrips(max_block_bytes=1)  # one row per strip
    strips = list(kernel.strips(n, b))
    assert len(strips) >= 6 and strips[-1][1] == n - 1
    hidden = randn(b, n, d, seed=2)
    lean_v, lean_g = loss_and_grad(dispersion_loss, hidden, variant, tau=0.5, kernel=kernel)
    ref_v, ref_g = loss_and_grad(dispersion_loss_reference, hidden, variant, tau=0.5)
    assert_close(lean_v, ref_v)
    assert_close(lean_g, ref_g)


def test_lean_saves_nothing_quadratic() -> None:
    """The point of the lean version: no [B, N, N] tensor is kept for backward."""
    b, n, d = 2, 64, 8
    hidden = randn(b, n, d, seed=3).requires_grad_()
    for variant in VARIANTS:
        saved: dict[str, list[int]] = {"lean": [], "reference": []}
        for name, fn in IMPLS.items():
            with torch.autograd.graph.saved_tensors_hooks(
                lambda t, s=saved[name]: s.append(t.numel()) or t, lambda t: t
            ):
                fn(hidden, variant)
        assert max(saved["reference"]) >= b * n * n  # the hook does see the naive matrices
        assert max(saved["lean"]) <= b * n * d, variant


# --------------------------------------------------------------------------- the formulas


def explicit_loss(hidden: torch.Tensor, variant: str, tau: float, clamp: float, lambda_norm: float) -> float:
    """The paper's equations (``form="paper"``) as Python loops over ordered pairs i != j, in float64."""
    seqs = hidden.double().tolist()
    per_seq = []
    for z in seqs:
        n, d = len(z), len(z[0])
        if variant == "decorrelation":
            rows = []
            for v in z:
                mu = sum(v) / d
                std = math.sqrt(sum((x - mu) ** 2 for x in v) / (d - 1))
                rows.append([(x - mu) / std for x in v])
            terms = [
                sum(a * b for a, b in zip(rows[i], rows[j], strict=True)) / (d - 1)
                for i in range(n)
                for j in range(n)
                if i != j
            ]
            per_seq.append(sum(t * t for t in terms) / len(terms))
            continue
        if variant == "perplexity_entropy":  # mean_i sum_j p log2 p, p_j|i = softmax_{j != i}(-D_ij / tau)
            total = 0.0
            for i in range(n):
                w = [
                    math.exp(-sum((a - b) ** 2 for a, b in zip(z[i], z[j], strict=True)) / tau)
                    for j in range(n)
                    if j != i
                ]
                total += sum(x / sum(w) * math.log2(x / sum(w)) for x in w if x > 0)
            per_seq.append(total / n)
            continue
        if variant == "l2_repel":
            dists = [
                sum((a - b) ** 2 for a, b in zip(z[i], z[j], strict=True)) for i in range(n) for j in range(n) if i != j
            ]
            mean_sq = sum(x * x for v in z for x in v) / (n * d)
            per_seq.append(math.log(sum(math.exp(-dd / tau) for dd in dists) / len(dists)) + lambda_norm * mean_sq)
            continue
        norms = [math.sqrt(sum(x * x for x in v)) for v in z]
        angles = []
        for i in range(n):
            for j in range(n):
                if i != j:
                    c = sum(a * b for a, b in zip(z[i], z[j], strict=True)) / (norms[i] * norms[j])
                    angles.append(math.acos(min(max(c, -1 + clamp), 1 - clamp)) / math.pi)
        if variant == "angular_spread":
            per_seq.append(math.log(sum(math.exp(-a / tau) for a in angles) / len(angles)))
        else:
            per_seq.append(sum(max(0.0, 0.5 - a) ** 2 for a in angles) / len(angles))
    return sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", IMPLS)
def test_formula_against_explicit_loops(variant: str, name: str) -> None:
    hidden = randn(2, 5, 4, seed=4)
    hidden[0, 1] = hidden[0, 0] + 0.01  # cosine near 1: exercises the clamp
    hidden[1, 2] = 0.2 * hidden[1, 2] + 3.0  # larger norm, shifted mean
    kw = dict(tau=0.7, clamp=0.15, lambda_norm=0.3)
    expected = explicit_loss(hidden, variant, **kw)
    got = IMPLS[name](hidden, variant, form="paper", **kw)
    assert abs(got.item() - expected) <= TOL * max(1.0, abs(expected)), (got.item(), expected)


def released_dispersion_loss(z: torch.Tensor, variant: str, tau: float, clamp: float) -> torch.Tensor:
    """A transcription of the authors' ``DispersionLoss.forward`` (LM-Dispersion, lm_dispersion/dispersion.py;
    that repository is not installable offline), with epsilon = 1e-2, margin = 0.5, tau_l2 = tau_cos = tau
    and no subsampling (N <= its max_tokens = 256). Only the einops rearrange is written as transpose."""
    B, L, F = z.shape
    eps = 1e-2
    eye = torch.eye(L, dtype=torch.bool)
    if variant == "decorrelation":
        zc = (z - z.mean(dim=2, keepdim=True)) / z.std(dim=2, keepdim=True)
        cov = torch.matmul(zc, zc.transpose(1, 2)) / (F - 1)
        return cov.pow(2)[:, ~eye].mean()
    if variant in ("l2_repel", "perplexity_entropy"):
        logit = -(torch.cdist(z, z) ** 2) / tau
        if variant == "l2_repel":
            norm_regularization = (z**2).mean() * 1e-1
            constant_diff = torch.log(torch.tensor(L**2))
            return (torch.logsumexp(logit + eps, dim=(1, 2)) - constant_diff).mean() + norm_regularization
        p = torch.softmax(logit.masked_fill(eye.unsqueeze(0), float("-inf")), dim=2)
        return torch.sum(p * torch.log2(p + eps), dim=2).mean()  # -(-sum p log2(p + eps)).mean()
    z_norm = z / (torch.linalg.norm(z, dim=2, keepdim=True) + eps)
    cossim = z_norm @ z_norm.transpose(1, 2)
    cossim = cossim + (torch.clamp(cossim, -1 + clamp, 1 - clamp) - cossim).detach()
    D = torch.arccos(cossim) / torch.pi
    if variant == "angular_spread":
        logit = (-D / tau).masked_fill(eye.unsqueeze(0), float("-inf")).reshape(B, -1)
        return (torch.logsumexp(logit + eps, dim=1) - torch.log(torch.tensor(L * (L - 1)))).mean()
    return torch.clamp(0.5 - D, min=0.0).pow(2)[:, ~eye].mean()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("inputs", ["random", "condensed", "wide"])
def test_released_form_equals_the_authors_loss(variant: str, inputs: str) -> None:
    """The default form is the released code's: the value within 1e-5 of its formulas run in float64; the
    gradient within 1e-5 of its largest entry, 1e-4 for perplexity_entropy, whose near-uniform (condensed) or
    near-one-hot (wide) softmaxes give gradients that the released code's own fp32 run gets 8e-5 wrong."""
    hidden = randn(2, 40, 24, seed=8)
    if inputs == "condensed":  # one shared direction: cosines near 1, beyond the clamp; small distances
        hidden = randn(1, 1, 24, seed=9) + 0.05 * hidden
    elif inputs == "wide":  # distances >> 1 (tau 1): l2_repel's diagonal terms dominate its normaliser
        hidden = 3.0 * hidden
    kw = dict(tau=1.0 if inputs == "wide" else 4.0, clamp=0.25)
    ours_v, ours_g = loss_and_grad(dispersion_loss, hidden, variant, lambda_norm=0.1, **kw)
    theirs_v, theirs_g = loss_and_grad(released_dispersion_loss, hidden.double(), variant, **kw)
    assert abs(ours_v.item() - theirs_v.item()) <= TOL * max(1.0, abs(theirs_v.item()))
    scale = theirs_g.abs().max().item()
    grad_tol = 1e-4 if variant == "perplexity_entropy" else TOL
    assert scale > 0 and ((ours_g.double() - theirs_g).abs().max().item() <= grad_tol * scale)


@pytest.mark.parametrize("variant", ["angular_spread", "perplexity_entropy"])
def test_max_tokens_256_is_the_authors_subsampling(variant: str) -> None:
    """The released loss draws ``torch.randperm(L)[:max_tokens]`` (256 by default) once per call, for the
    whole batch; ``max_tokens = 256`` does the same with our seeded generator."""
    hidden = randn(2, 300, 8, seed=12)
    ours = dispersion_loss(hidden, variant, tau=4.0, clamp=0.25, max_tokens=256, generator=seeded(3))
    subset = hidden[:, torch.randperm(300, generator=seeded(3))[:256]]
    theirs = released_dispersion_loss(subset.double(), variant, tau=4.0, clamp=0.25)
    assert abs(ours.item() - theirs.item()) <= TOL * max(1.0, abs(theirs.item()))


def test_l2_repel_forms_differ_by_the_diagonal() -> None:
    """At distances >> tau the released normaliser is ~N exp(0): its gradient is orders of magnitude
    weaker than the paper's i != j form (docs/training.md quotes bench/l2_repel_forms.py's numbers)."""
    hidden = 3.0 * randn(2, 40, 24, seed=8)
    grads = {form: loss_and_grad(dispersion_loss, hidden, "l2_repel", lambda_norm=0.0, form=form)[1]
             for form in ("released", "paper")}  # fmt: skip
    assert grads["paper"].norm() > 1e3 * grads["released"].norm()


# --------------------------------------------------------------------------- straight-through clamp


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_straight_through_clamp_gradient(name: str, sign: float) -> None:
    """Two tokens at angle 0.1 (c = 0.995, or c = -0.995 if flipped): c lies outside
    [-0.9, 0.9], so the value uses the clamped c, yet the gradient is arccos'(clamped c)
    passed through unchanged, not 0 (a plain clamp) nor arccos'(0.995)."""
    theta, eps = 0.1, 0.1
    hidden = torch.tensor([[[1.0, 0.0], [sign * math.cos(theta), sign * math.sin(theta)]]])
    cc = sign * (1 - eps)
    slope = 1.0 / (math.pi * math.sqrt(1 - cc * cc))  # -dD/dc at the clamped c
    # dc/dz_0 = u_1 - c u_0 = sign * (0, sin(theta)) for |z_0| = 1
    dc_dz0 = torch.tensor([0.0, sign * math.sin(theta)])

    value, grad = loss_and_grad(IMPLS[name], hidden, "angular_spread", tau=1.0, clamp=eps, form="paper")
    d = math.acos(cc) / math.pi
    assert value.item() == pytest.approx(-d, abs=1e-6)  # N = 2: L = -D
    assert_close(grad[0, 0], slope * dc_dz0, tol=1e-6)  # dL/dc = -dD/dc / tau

    value, grad = loss_and_grad(IMPLS[name], hidden, "orthogonalization", clamp=eps, form="paper")
    assert value.item() == pytest.approx(max(0.0, 0.5 - d) ** 2, abs=1e-6)
    assert_close(grad[0, 0], 2 * max(0.0, 0.5 - d) * slope * dc_dz0, tol=1e-6)
    if sign > 0:
        assert grad[0, 0, 1].item() > 0.05  # nonzero: the clamp did not stop the gradient


@pytest.mark.parametrize("name", IMPLS)
def test_identical_tokens_use_clamped_arccos(name: str) -> None:
    hidden = torch.tensor([[[0.3, -1.2, 2.0]] * 2])
    value, grad = loss_and_grad(IMPLS[name], hidden, "angular_spread", tau=0.5, form="paper")
    assert value.item() == pytest.approx(-math.acos(0.9) / math.pi / 0.5, abs=1e-6)
    assert torch.isfinite(grad).all() and grad.abs().max() < 1e-5  # dc/dz vanishes at c = 1
    _, grad = loss_and_grad(IMPLS[name], hidden, "angular_spread", clamp=1e-6, form="paper")  # the smallest clamp
    assert torch.isfinite(grad).all()  # (1e-9 rounded 1 - clamp to 1: 0 * inf, a NaN gradient)


# --------------------------------------------------------------------------- numerics


def special_inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    base = randn(2, 6, 5, seed=5)
    identical = base[:, :1].expand(2, 6, 5).clone()
    antipodal = torch.cat([base[:, :3], -base[:, :3]], dim=1)
    zeros = base.clone()
    zeros[0] = 0.0
    zeros[1, 2] = 0.0
    tiny = base.clone()
    tiny[:, 1] *= 1e-8  # nonzero, but |z| below the normalisation guard
    constant = torch.full((2, 6, 5), 2.5)  # zero std: the decorrelation guard
    return {
        name: t.to(dtype)
        for name, t in {
            "random": base, "identical": identical, "antipodal": antipodal, "zeros": zeros,
            "tiny": tiny, "constant": constant, "n1": base[:, :1], "n2": base[:, :2],
        }.items()
    }  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", IMPLS)
def test_finite_on_degenerate_inputs(name: str, variant: str, dtype: torch.dtype) -> None:
    for case, hidden in special_inputs(dtype).items():
        value, grad = loss_and_grad(IMPLS[name], hidden, variant, tau=0.1)
        assert value.dtype == torch.float32 and torch.isfinite(value), (case, value)
        assert grad.dtype == dtype and torch.isfinite(grad).all(), case


@pytest.mark.parametrize("variant", VARIANTS)
def test_degenerate_inputs_lean_matches_reference(variant: str) -> None:
    for case, hidden in special_inputs(torch.float32).items():
        lean_v, lean_g = loss_and_grad(dispersion_loss, hidden, variant, tau=0.1)
        ref_v, ref_g = loss_and_grad(dispersion_loss_reference, hidden, variant, tau=0.1)
        # zero rows have gradients ~1/NORM_EPS through the normalisation guard
        scale = max(1.0, ref_g.abs().max().item())
        assert_close(lean_v, ref_v, what=case)
        assert_close(lean_g / scale, ref_g / scale, what=case)


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", IMPLS)
def test_a_non_finite_hidden_state_gives_a_nan_loss(name: str, variant: str, bad: float) -> None:
    """One NaN or infinite entry (a diverged block) is a NaN loss, never a finite one that hides it (the
    lean perplexity_entropy took its row's NaN probabilities for zeros and returned a finite value)."""
    hidden = randn(2, 6, 8, seed=14)
    hidden[1, 3, 2] = bad
    assert torch.isnan(IMPLS[name](hidden, variant))


@pytest.mark.parametrize("variant", ["angular_spread", "orthogonalization", "decorrelation"])
@pytest.mark.parametrize("name", IMPLS)
def test_direction_variants_hold_where_squares_overflow(name: str, variant: str) -> None:
    """Tokens of norm ~1e20, whose squared norms overflow fp32: the paper form's value is that of the same
    directions at scale 1, its gradient 1e20 times smaller (such tokens were taken for zero vectors: a constant
    loss with NaN or zero gradients). The cosine probe logged every step keeps torch's normalize: the scaled norm
    cost 3.6 ms of GPT-2 small's 126 ms roofline step on an H100, for a run that diverged anyway."""
    hidden = randn(2, 6, 8, seed=16)
    big, big_grad = loss_and_grad(IMPLS[name], hidden * 1e20, variant, form="paper")
    one, one_grad = loss_and_grad(IMPLS[name], hidden, variant, form="paper")
    assert big.item() == pytest.approx(one.item(), rel=1e-5)
    scale = one_grad.abs().max()
    assert_close(big_grad * 1e20 / scale, one_grad / scale, tol=1e-3)  # the reference's std backward: 5e-4 off


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_second_derivative_is_refused_in_one_line(variant: str) -> None:
    """The analytic backward builds no graph, so a gradient penalty through it lacked the loss's second
    derivative in silence (once_differentiable let create_graph=True through where the loss's own gradient
    needs none); it is refused, and the reference, which autograd differentiates, gives it."""
    hidden = randn(2, 6, 8, seed=15).requires_grad_()
    loss = dispersion_loss(hidden, variant, kernel="torch") + hidden.pow(3).sum()
    with pytest.raises(RuntimeError, match="^dispersion_loss is differentiable once: .*reference") as err:
        torch.autograd.grad(loss, hidden, create_graph=True)
    assert "\n" not in str(err.value)
    (grad,) = torch.autograd.grad(dispersion_loss_reference(hidden, variant), hidden, create_graph=True)
    (second,) = torch.autograd.grad(grad.square().sum(), hidden)
    assert second.abs().sum() > 0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", IMPLS)
def test_single_token_has_no_pairs(name: str, variant: str) -> None:
    hidden = randn(3, 1, 4, seed=6)
    value, grad = loss_and_grad(IMPLS[name], hidden, variant, lambda_norm=0.25)
    if variant == "l2_repel":  # only the norm penalty: 0.25 * mean(z^2), gradient 0.25 * 2 z / (B N d)
        assert value.item() == pytest.approx(0.25 * hidden.square().mean().item(), rel=1e-6)
        assert_close(grad, 0.25 * 2 * hidden / hidden.numel(), tol=1e-7)
    else:
        assert value.item() == 0.0
        assert (grad == 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", IMPLS)
def test_bf16_computes_in_fp32(name: str, variant: str) -> None:
    hidden = randn(2, 9, 16, seed=7, dtype=torch.bfloat16)
    v16, g16 = loss_and_grad(IMPLS[name], hidden, variant, tau=0.5)
    v32, g32 = loss_and_grad(IMPLS[name], hidden.float(), variant, tau=0.5)
    assert v16.dtype == torch.float32 and g16.dtype == torch.bfloat16
    assert_close(v16, v32, tol=1e-6)  # same upcast values, same fp32 arithmetic
    scale = g32.abs().max().item()
    assert_close(g16.float() / scale, g32 / scale, tol=1e-2)  # bf16 rounding of the gradient only


@pytest.mark.parametrize("variant", VARIANTS)
def test_autocast_does_not_reach_the_loss(variant: str) -> None:
    """Under bf16 autocast (TorchTitan's one-GPU/DDP setting, forward and backward inside
    it) the lean loss computes exactly what it computes in fp32; the reference's value too (its matmuls
    ran in bf16 under it: 0.0095 off for angular_spread here), its gradient where backward runs outside it."""
    hidden = randn(2, 19, 16, seed=13)
    kw = dict(tau=0.5, form="paper")
    v32, g32 = loss_and_grad(dispersion_loss, hidden, variant, **kw)
    ref_v32, ref_g32 = loss_and_grad(dispersion_loss_reference, hidden, variant, **kw)
    x = hidden.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        v16, g16 = loss_and_grad(dispersion_loss, hidden, variant, **kw)
        ref_v16 = dispersion_loss_reference(x, variant, **kw)
        assert (hidden @ hidden.mT).dtype == torch.bfloat16  # the test does reach autocast
    assert v16.dtype == torch.float32 and g16.dtype == torch.float32
    assert_close(v16, v32, tol=0)
    assert_close(g16, g32, tol=0)
    assert_close(ref_v16, ref_v32, tol=0)
    assert_close(torch.autograd.grad(ref_v16, x)[0], ref_g32, tol=0)


# --------------------------------------------------------------------------- max_tokens


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", IMPLS)
def test_max_tokens_draws_one_subset_for_the_batch(name: str, variant: str) -> None:
    fn = IMPLS[name]
    seq = randn(1, 40, 6, seed=8)
    # The batch mean of two copies equals one copy only if both copies keep the same positions.
    pair = fn(seq.expand(2, -1, -1), variant, max_tokens=7, generator=seeded(3))
    single = fn(seq, variant, max_tokens=7, generator=seeded(3))
    assert_close(pair, single, tol=1e-6)
    # ... and those positions are randperm(N, generator)[:max_tokens].
    idx = torch.randperm(40, generator=seeded(3))[:7]
    assert_close(single, fn(seq[:, idx], variant), tol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", IMPLS)
def test_max_tokens_is_reproducible_and_seed_dependent(name: str, variant: str) -> None:
    fn = IMPLS[name]
    hidden = randn(3, 30, 5, seed=9)
    values = [fn(hidden, variant, max_tokens=6, generator=seeded(s)).item() for s in (0, 0, 1, 2)]
    assert values[0] == values[1]
    assert len({values[0], values[2], values[3]}) == 3
    assert fn(hidden, variant, max_tokens=30).item() == fn(hidden, variant).item()
    assert fn(hidden, variant, max_tokens=500, generator=seeded(0)).item() == fn(hidden, variant).item()


def test_max_tokens_gradient_reaches_only_the_subset() -> None:
    hidden = randn(2, 25, 4, seed=10).requires_grad_()
    dispersion_loss(hidden, "angular_spread", max_tokens=5, generator=seeded(4)).backward()
    touched = (hidden.grad.abs().sum(dim=(0, 2)) > 0).nonzero().flatten()
    assert sorted(touched.tolist()) == sorted(torch.randperm(25, generator=seeded(4))[:5].tolist())


# --------------------------------------------------------------------------- condensation probe


def test_mean_offdiag_cosine_matches_explicit_mean() -> None:
    hidden = randn(3, 11, 7, seed=11) + 0.5  # positive mean cosine
    hidden[1, 4] = 0.0  # a zero vector: cosine 0 with everyone
    u = torch.nn.functional.normalize(hidden.double(), dim=-1)
    cos = u @ u.transpose(1, 2)
    off = ~torch.eye(11, dtype=torch.bool)
    expected = statistics.fmean(cos[b][off].mean().item() for b in range(3))
    got = mean_offdiag_cosine(hidden.requires_grad_())
    assert got.dtype == torch.float32 and got.dim() == 0 and not got.requires_grad
    assert got.item() == pytest.approx(expected, abs=1e-6)
    assert expected > 0.1


def test_mean_offdiag_cosine_bf16_and_single_token() -> None:
    hidden = randn(2, 8, 5, seed=12)
    assert mean_offdiag_cosine(hidden.bfloat16()).dtype == torch.float32
    assert_close(mean_offdiag_cosine(hidden.bfloat16()), mean_offdiag_cosine(hidden.bfloat16().float()), tol=0)
    assert mean_offdiag_cosine(hidden[:, :1]).item() == 0.0


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"variant": "spread"}, "variant"),
        ({"tau": 0.0}, "tau"),
        ({"tau": -1.0}, "tau"),
        ({"tau": float("nan")}, "tau"),
        ({"tau": 1e-39}, "tau"),
        ({"clamp": 0.0}, "clamp"),
        ({"clamp": 1.0}, "clamp"),
        ({"clamp": -0.2}, "clamp"),
        ({"clamp": 1e-9}, "clamp"),
        ({"max_tokens": 1}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": 3, "generator": 123}, "generator"),
        ({"tau": "1"}, "tau"),
        ({"lambda_norm": float("nan"), "variant": "l2_repel"}, "lambda_norm"),
        ({"lambda_norm": -1.0, "variant": "l2_repel"}, "lambda_norm"),
        ({"lambda_norm": float("inf")}, "lambda_norm"),
        ({"hidden": torch.zeros(0, 4, 8)}, "hidden"),
        ({"hidden": torch.zeros(2, 4, 0), "variant": "l2_repel"}, "hidden"),
        ({"hidden": None}, "hidden"),
        ({"hidden": torch.zeros(4, 8)}, "hidden"),
        ({"hidden": torch.zeros(1, 2, 4, 8)}, "hidden"),
        ({"hidden": torch.zeros(2, 4, 8, dtype=torch.long)}, "hidden"),
        ({"hidden": torch.zeros(2, 4, 1), "variant": "decorrelation"}, "hidden"),
        ({"form": "loops"}, "form"),
    ],
)
@pytest.mark.parametrize("name", IMPLS)
def test_bad_arguments_name_the_parameter(name: str, kwargs: dict, param: str) -> None:
    args = {"hidden": torch.zeros(2, 4, 8), "variant": "angular_spread", **kwargs}
    with pytest.raises(ValueError, match=f"^{param} ") as err:
        IMPLS[name](args.pop("hidden"), args.pop("variant"), **args)
    assert "\n" not in str(err.value)
    if param == "variant":
        assert all(v in str(err.value) for v in VARIANTS)


@pytest.mark.parametrize("name", IMPLS)
def test_the_smallest_tau_gives_a_finite_loss_and_gradient(name: str) -> None:
    """At ``TAU_MIN`` every variant stays finite (below about 1e-37 some gave NaN: 1/tau is infinite in fp32)."""
    hidden = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0), requires_grad=True)
    for variant in VARIANTS:
        loss = IMPLS[name](hidden, variant, tau=TAU_MIN)
        (grad,) = torch.autograd.grad(loss, hidden)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), variant


@pytest.mark.parametrize("kernel", [5, None])
def test_a_kernel_that_is_no_kernel_is_named(kernel: object) -> None:
    """Neither a name from KERNELS nor an object with ``loss``: one line (was ``'int' object has no attribute
    'loss'``)."""
    with pytest.raises(ValueError, match="^kernel must be one of") as err:
        dispersion_loss(torch.randn(2, 6, 8), "angular_spread", kernel=kernel)
    assert "\n" not in str(err.value)


def test_layers_give_the_loss_of_their_concatenation_with_one_token_subset() -> None:
    """A sequence of blocks' outputs is the loss of their concatenation along the batch, value and each
    block's gradient, max_tokens drawing one subset for all; blocks of different shapes, or none, are
    refused in one line."""
    layers = [randn(2, 12, 6, seed=s).requires_grad_() for s in range(3)]
    value = dispersion_loss(layers, "l2_repel", max_tokens=7, generator=seeded(3))
    grads = torch.autograd.grad(value, layers)
    joined = torch.cat([layer.detach() for layer in layers]).requires_grad_()
    joined_value = dispersion_loss(joined, "l2_repel", max_tokens=7, generator=seeded(3))
    (joined_grad,) = torch.autograd.grad(joined_value, joined)
    assert value.item() == joined_value.item()
    assert torch.equal(torch.cat(grads), joined_grad)
    assert (joined_grad != 0).any(dim=2).sum().item() == 6 * 7  # 7 positions of each of the 6 sequences
    for bad, says in (([layers[0], randn(2, 11, 6)], "share shape"), ([], "non-empty sequence")):
        with pytest.raises(ValueError, match=says) as err:
            dispersion_loss(bad, "l2_repel")
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_perplexity_entropy_refuses_low_precision_products(precision: str) -> None:
    """Its sharp row softmaxes need fp32 logits: bf16/tf32 products were 22% / 7% off on an H200."""
    with pytest.raises(ValueError, match=f"precision perplexity_entropy runs at auto or exact only.*{precision}"):
        dispersion_loss(torch.zeros(2, 4, 8), "perplexity_entropy", precision=precision)
    with pytest.raises(ValueError, match=r"^precision must be one of \('auto', 'bf16', 'tf32', 'exact'\), got 'fp8'$"):
        dispersion_loss(torch.zeros(2, 4, 8), "l2_repel", precision="fp8")
    triton_kernel = pytest.importorskip("dispersion_titan.losses.dispersion_triton")
    with pytest.raises(ValueError, match=f"precision perplexity_entropy runs at auto or exact only.*{precision}"):
        dispersion_loss(torch.zeros(2, 4, 8), "perplexity_entropy", kernel=triton_kernel.TritonTiles(precision))
    dispersion_loss(torch.randn(2, 4, 8), "perplexity_entropy", precision="exact")  # the others run


@pytest.mark.parametrize(
    "hidden",
    [torch.zeros(4, 8), torch.zeros(0, 4, 8), torch.zeros(2, 4, 0), [torch.zeros(2, 4, 8)]],
    ids=["2d", "B0", "d0", "list"],
)
def test_mean_offdiag_cosine_rejects_what_has_no_mean(hidden: torch.Tensor) -> None:
    """Not [B, N, d], no sequence (its mean was NaN), no feature, or not a tensor: one line naming hidden."""
    with pytest.raises(ValueError, match="^hidden must be") as err:
        mean_offdiag_cosine(hidden)
    assert "\n" not in str(err.value)


def test_objective_max_tokens_draws_a_fresh_subset_per_layer_and_micro_batch() -> None:
    """As the authors' DispersionLoss (a fresh randperm per call, so per layer and micro-batch):
    the same hidden states give another value in another layer or micro-batch (chunk), and
    the same one again for the same (seed, step, chunk, layer); max_tokens = 0 is exact."""
    hidden = randn(2, 64, 8, seed=11)
    blocks = [hidden, hidden]

    def per_layer(max_tokens: int, chunk: int, step: int = 1, seed: int = 0) -> list[float]:
        cfg = Dispersion(variant="angular_spread", coeff=1.0, max_tokens=max_tokens, layers=[1])
        values = []
        for layer in (1, 2):
            cfg.layers = [layer]
            objective = DispersionObjective(cfg, 2, global_batch_size=2, seed=seed, tp_group=None)
            values.append(objective(blocks, step, with_stats=False, chunk=chunk).unweighted.item())
        return values

    a = per_layer(8, chunk=0)
    assert a == per_layer(8, chunk=0)  # reproducible
    assert a[0] != a[1]  # fresh per layer
    assert len({a[0], *per_layer(8, chunk=1), *per_layer(8, chunk=0, step=2), *per_layer(8, chunk=0, seed=1)}) == 7
    exact = per_layer(0, chunk=0)
    assert exact[0] == exact[1] == per_layer(0, chunk=5)[0] == dispersion_loss(hidden, "angular_spread").item()
