"""``training.head_loss = "liger"``: GPT-2's LM head and cross-entropy by Liger-Kernel's fused linear
cross-entropy (``GPT2.forward(tokens, labels)``) against the torch path (logits, then the CE sum).

Liger's kernels are Triton's: on a CPU they run in Triton's interpreter, which must be on before
Triton is first imported, so the comparison runs as this file's script in a fresh process under
TRITON_INTERPRET=1 and prints its numbers as JSON. The interpreter rounds bf16 by truncation (a GPU
rounds to nearest), which biases every bf16 store by about -0.2%: the bf16 case is held to the bf16
yardstick, the torch path's own error against an fp64 reference, not to the torch path itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

VOCAB, TOKENS = 1000, (2, 32)


def gradients(dtype, liger: bool) -> tuple[float, dict]:
    """(loss, {name: gradient in fp64}) of one backward of the CE sum / 50 of a 2-block GPT-2 in ``dtype``."""
    import torch
    import torch.nn.functional as F

    from dispersion_titan.models.gpt2.args import GPT2ModelArgs
    from dispersion_titan.models.gpt2.model import GPT2

    torch.manual_seed(0)
    with torch.device("meta"):
        model = GPT2(GPT2ModelArgs(dim=64, n_layers=2, n_heads=4, max_seq_len=32, vocab_size=VOCAB))
    model.to_empty(device="cpu")
    model.init_weights()
    model.to(dtype)
    tokens = torch.randint(0, VOCAB, TOKENS, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, VOCAB, TOKENS, generator=torch.Generator().manual_seed(2))
    labels[0, :5] = -100  # ignored positions, as a sequence's padding
    if liger:
        loss = model(tokens, labels=labels)
    else:
        loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), labels.flatten(), reduction="sum")
    (loss / 50).backward()
    return loss.item(), {n: p.grad.double() for n, p in model.named_parameters()}


def error(got: dict, want: dict) -> float:
    """The gradient's error: ‖got − want‖ / ‖want‖ over every parameter at once."""

    gap = sum((got[n] - want[n]).square().sum() for n in want) / sum(w.square().sum() for w in want.values())
    return gap.sqrt().item()


def compare() -> dict[str, float]:
    import torch

    ref_loss, ref = gradients(torch.float64, liger=False)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        torch_loss, torch_grads = gradients(dtype, liger=False)
        liger_loss, liger_grads = gradients(dtype, liger=True)
        out |= {
            f"{name}.loss_gap": abs(liger_loss - torch_loss) / torch_loss,
            f"{name}.liger_vs_torch": error(liger_grads, torch_grads),
            f"{name}.liger_vs_fp64": error(liger_grads, ref),
            f"{name}.torch_vs_fp64": error(torch_grads, ref),
        }
    return out | {"fp64_loss": ref_loss}


def test_liger_head_loss_equals_the_torch_path():
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["fp64_loss"] > 0
    assert got["fp32.loss_gap"] < 1e-6 and got["fp32.liger_vs_torch"] < 1e-5, got
    assert got["bf16.loss_gap"] < 1e-5, got
    assert got["bf16.liger_vs_fp64"] < 3 * got["bf16.torch_vs_fp64"], got  # within the bf16 yardstick


if __name__ == "__main__":
    from support.interpreter import skip_idle_work  # triton: here, not in the pytest process

    skip_idle_work()
    print(json.dumps(compare()))
