"""Condensation computed independently of the package, from transformers models (analysis tests)."""

from __future__ import annotations

from pathlib import Path

import torch

# Where each family keeps its decoder layers: spelled out here, found generically by the code.
LAYERS = {
    "gpt2": "transformer.h",
    "llama": "model.layers",
    "qwen3": "model.layers",
    "bloom": "transformer.h",
    "neox": "gpt_neox.layers",
}


def plain_mean_cos(states: list[torch.Tensor]) -> list[tuple[float, float]]:
    """(mean, off-diagonal mean) of the sequence-averaged cosine matrix, layer by layer."""
    out = []
    for h in states:
        h = h.double()
        u = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-3)
        m = (u @ u.mT).clamp(-1, 1).mean(dim=0)
        n = m.shape[0]
        out.append((m.sum().item() / n**2, (m.sum() - m.trace()).item() / (n * n - n)))
    return out


def independent_states(folder: Path, family: str, tokens: torch.Tensor) -> list[torch.Tensor]:
    """embedding = hidden_states[0]; block_i = hidden_states[i] for i < n; block_n = the
    last decoder layer's own output (hooked); final_norm = hidden_states[-1]."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    layers = model
    for name in LAYERS[family].split("."):
        layers = getattr(layers, name)
    captured = []
    hook = layers[-1].register_forward_hook(
        lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        hidden = model(tokens, output_hidden_states=True).hidden_states
    hook.remove()
    n = len(layers)
    assert len(hidden) == n + 1
    return [*hidden[:n], captured[0], hidden[n]]
