"""l2_repel's two forms side by side: the released code's (its normaliser over all N² pairs, the N
diagonal terms exp(0) included) against the paper's (pairs i ≠ j only), on token clouds whose
pairwise squared distances range from ≪ τ to ≫ τ. Prints the value and the gradient norm of each
(λ_norm = 0, so only the pair term is compared) and their ratio. CPU, a few seconds:

    python bench/l2_repel_forms.py
"""

from __future__ import annotations

import torch

from dispersion_titan.losses import dispersion_loss


def main() -> None:
    torch.manual_seed(0)
    base = torch.randn(4, 256, 64) / 64**0.5  # unit-norm-ish tokens: squared distances ~2 at scale 1
    print(
        "| scale | median D_ij/τ | released value | paper value | released |grad| | paper |grad| | paper / released |"
    )
    print("|---|---|---|---|---|---|---|")
    for scale in (0.1, 0.5, 1.0, 2.0, 4.0, 8.0):
        z = scale * base
        dist = torch.cdist(z, z).square()
        off = dist[:, ~torch.eye(z.shape[1], dtype=torch.bool)].median().item()
        row = []
        for form in ("released", "paper"):
            x = z.clone().requires_grad_()
            loss = dispersion_loss(x, "l2_repel", lambda_norm=0.0, form=form, kernel="torch")
            (grad,) = torch.autograd.grad(loss, x)
            row.append((loss.item(), grad.norm().item()))
        (rv, rg), (pv, pg) = row
        ratio = f"{pg / rg:.3g}" if rg > 0 else "∞ (fp32 underflow: exp(-D/τ) = 0 for every pair i ≠ j)"
        print(f"| {scale} | {off:.3g} | {rv:.4f} | {pv:.4f} | {rg:.3g} | {pg:.3g} | {ratio} |")


if __name__ == "__main__":
    main()
