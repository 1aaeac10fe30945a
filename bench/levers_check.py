"""Two of issue 48's levers measured outside the trainer (bench/gpu_levers.sh runs both):

``qkv``: GPT-2 small's q, k, v projections of one micro-batch (32 × 1024 tokens, bf16), forward and
backward: three GEMMs (the model before issue 48) against one over the concatenated weights (the model
now, ``models.gpt2.model.Attention``), the weight copy included; median times.

``sdpa-pin``: Qwen3-0.6B's attention (16 query heads, 8 key/value heads, head dim 128, 4096 tokens,
causal, bf16) under TorchTitan's backend list (cuDNN, flash, math, as its wrapper sets it) and pinned to
one backend: output and gradients of each against an fp32 math reference, ‖Δ‖ / ‖ref‖.

    python bench/levers_check.py qkv
    python bench/levers_check.py sdpa-pin --backend cudnn
    python bench/levers_check.py qkv --tokens 2x64 --dim 64 && python bench/levers_check.py sdpa-pin \
        --backend math --seq 128 --head-dim 16      # CPU: the plumbing, in seconds

Prints ``RESULT key=value`` lines for bench/gpu_levers.sh.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
TITAN_LIST = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]  # its wrapper's


def median_ms(fn: Callable[[], None], device: torch.device, repeats: int = 20) -> float:
    """The median of ``repeats`` timed calls after 3 warm-ups, the device synchronised around each."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for i in range(3 + repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def qkv(batch: int, seq: int, dim: int, device: torch.device) -> list[str]:
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(batch, seq, dim, device=device, dtype=torch.bfloat16, generator=generator, requires_grad=True)
    ws = [(torch.randn(dim, dim, device=device, generator=generator) * 0.02).bfloat16().requires_grad_() for _ in "qkv"]
    bs = [torch.zeros(dim, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in "qkv"]
    grad = torch.randn(batch, seq, 3 * dim, device=device, dtype=torch.bfloat16, generator=generator)

    def three() -> None:
        out = torch.cat([F.linear(x, w, b) for w, b in zip(ws, bs)], dim=-1)  # cat: one gradient to feed
        out.backward(grad)

    def one() -> None:
        F.linear(x, torch.cat(ws), torch.cat(bs)).backward(grad)

    separate, fused = median_ms(three, device), median_ms(one, device)
    print(
        f"q, k, v projections fwd+bwd, {batch} x {seq} x {dim} bf16: three GEMMs {separate:.3f} ms, one {fused:.3f} ms"
    )
    return [f"qkv.three_gemms_ms={separate:.4g} qkv.one_gemm_ms={fused:.4g} qkv.saved_ms={separate - fused:.4g}"]


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


def sdpa_pin(backend: str, heads: int, kv_heads: int, seq: int, head_dim: int, device: torch.device) -> list[str]:
    generator = torch.Generator(device).manual_seed(0)

    def rand(h: int) -> torch.Tensor:
        return torch.randn(1, h, seq, head_dim, device=device, generator=generator)

    q, k, v = rand(heads), rand(kv_heads), rand(kv_heads)
    grad = torch.randn(1, heads, seq, head_dim, device=device, generator=generator)

    def attend(dtype: torch.dtype, backends: list[SDPBackend], priority: bool) -> list[torch.Tensor]:
        inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(backends, set_priority=priority):
            out = F.scaled_dot_product_attention(*inputs, is_causal=True, enable_gqa=True)
        out.backward(grad.to(dtype))
        return [out.detach(), *(t.grad for t in inputs)]

    reference = attend(torch.float32, [SDPBackend.MATH], False)
    lines = []
    for name, backends, priority in (("titan_list", TITAN_LIST, True), (backend, [BACKENDS[backend]], False)):
        errors = [relative(got, want) for got, want in zip(attend(torch.bfloat16, backends, priority), reference)]
        print(f"SDPA {name}: out / dq / dk / dv relative to fp32 math " + " / ".join(f"{e:.2e}" for e in errors))
        lines.append(" ".join(f"sdpa.{name}.{part}_err={e:.3g}" for part, e in zip(("out", "dq", "dk", "dv"), errors)))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["qkv", "sdpa-pin"])
    parser.add_argument("--tokens", default="32x1024", help="qkv: micro-batch x sequence (default 32x1024)")
    parser.add_argument("--dim", type=int, default=768, help="qkv: model width (default 768)")
    parser.add_argument("--backend", choices=list(BACKENDS), default="cudnn", help="sdpa-pin: the pinned backend")
    parser.add_argument("--seq", type=int, default=4096, help="sdpa-pin: tokens (default 4096)")
    parser.add_argument("--head-dim", type=int, default=128, help="sdpa-pin: head width (default 128)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.check == "qkv":
        batch, seq = map(int, args.tokens.split("x"))
        lines = qkv(batch, seq, args.dim, device)
    else:
        lines = sdpa_pin(args.backend, 16, 8, args.seq, args.head_dim, device)
    print("\n".join(f"RESULT {line}" for line in lines))


if __name__ == "__main__":
    main()
