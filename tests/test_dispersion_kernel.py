"""The fused Triton kernels (dispersion_triton.py) against dispersion_loss_reference, on CPU.

Triton decides at ``@triton.jit`` time, i.e. when dispersion_triton is first imported,
whether a kernel runs compiled or in its interpreter (TRITON_INTERPRET=1). Setting the
variable in this pytest process would make every later Triton use in it interpreted,
so the interpreted checks run in ONE child process (this file run as a script, with
TRITON_INTERPRET=1) that computes every case and prints its numbers as JSON; the
tests below assert on them. This process itself imports the kernels compiled, which
lets it check the one clear error on CPU tensors and compile the kernels for an H100
(sm_90) without a GPU, catching what the interpreter accepts but the compiler does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import dispersion_titan
from dispersion_titan.losses import VARIANTS, dispersion_loss, dispersion_loss_reference

triton = pytest.importorskip("triton", reason="the Triton kernels need the triton package")
import triton.language as tl  # noqa: E402

from dispersion_titan.losses import dispersion_triton  # noqa: E402

REPO = Path(dispersion_titan.__file__).resolve().parents[1]
BF16_ULP = 2.0**-7  # spacing of bf16 values relative to their magnitude (at most): a rounding step


def case_table() -> dict[str, dict]:
    """name -> one kernel call: shape, input dtype, inputs, tile precision and sizes, tau.

    Shapes are small, and tiles as large as still leaves several of them (partial ones
    included): the interpreter's cost is per op, not per element.
    """
    shapes = {
        # inputs     B  N    d   dtype   precision  block block_d block_out tau
        "fp32":      (3, 17, 40, "fp32", "ieee",   16, 32, 32, 0.5),  # 2 row tiles, 2 Gram steps, 2 du chunks
        "auto":      (2, 100, 64, "fp32", "auto",  64, 0, 0, 1.0),  # bf16x3 (ieee for l2_repel)
        "bf16_input": (1, 130, 40, "bf16", "auto", 64, 0, 32, 1.0),
        "condensed": (2, 33, 64, "fp32", "ieee",   16, 0, 0, 0.3),  # cosines beyond the clamp
        "degenerate": (3, 17, 40, "fp32", "ieee",  16, 0, 0, 0.5),  # identical, antipodal, zero rows
        "plain_bf16": (2, 40, 64, "fp32", "bf16",  16, 0, 0, 1.0),
    }  # fmt: skip
    keys = ("B", "N", "d", "dtype", "precision", "block", "block_d", "block_out", "tau")
    return {
        f"{variant}-{inputs}": {"variant": variant, "inputs": inputs, **dict(zip(keys, shape))}
        for variant in VARIANTS
        for inputs, shape in shapes.items()
    }


CASES = case_table()


def make_hidden(case: dict, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(case["N"])
    b, n, d = case["B"], case["N"], case["d"]
    hidden = torch.randn(b, n, d, generator=gen)
    if case["inputs"] == "condensed":
        hidden = torch.randn(1, 1, d, generator=gen) + 0.05 * hidden
    elif case["inputs"] == "degenerate":
        hidden[0] = hidden[0, :1]  # all rows identical
        hidden[1, n // 2 :] = -hidden[1, : n - n // 2]  # antipodal pairs
        hidden[2, ::5] = 0.0  # zero rows
    return hidden.to(device, {"fp32": torch.float32, "bf16": torch.bfloat16}[case["dtype"]])


def loss_and_grad(hidden: torch.Tensor, variant: str, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    x = hidden.detach().clone().requires_grad_()
    loss = (dispersion_loss if "kernel" in kw else dispersion_loss_reference)(x, variant, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad.float()


def run_case(case: dict, device: str = "cpu") -> dict[str, float]:
    """Kernel vs reference: relative value gap, max gradient gap over max |reference gradient|.

    bench/check_kernel_cuda.py runs the same cases on a GPU.
    """
    hidden = make_hidden(case, device)
    tiles = dispersion_triton.TritonTiles(case["precision"], case["block"], case["block_d"], case["block_out"])
    value, grad = loss_and_grad(hidden, case["variant"], tau=case["tau"], kernel=tiles)
    ref_value, ref_grad = loss_and_grad(hidden, case["variant"], tau=case["tau"])
    scale = ref_grad.abs().max().item()
    # bf16 gradients: each side rounds its own fp32 gradient, so allow one bf16 step per element
    rounding = BF16_ULP * ref_grad.abs() if hidden.dtype == torch.bfloat16 else 0.0
    u = torch.nn.functional.normalize(hidden.float(), dim=-1)
    return {
        "value_rel": abs(value.item() - ref_value.item()) / abs(ref_value.item()),
        "grad_rel": ((grad - ref_grad).abs() - rounding).max().item() / scale,
        "grad_scale": scale,
        "finite": bool(torch.isfinite(value) and torch.isfinite(grad).all()),
        "clamped_fraction": ((u @ u.mT).abs() > 1 - 0.1).float().mean().item(),  # the default clamp
    }


@triton.jit
def apply_arccos(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, dispersion_triton._arccos(tl.load(x_ptr + offs)))


def arccos_max_error() -> float:
    """Max |_arccos(x) - arccos(x)| (float64 reference) of the kernels' polynomial over 2^20 points of [-1, 1]."""
    x = torch.linspace(-1.0, 1.0, 2**20)
    y = torch.empty_like(x)
    apply_arccos[(1,)](x, y, BLOCK=x.numel())
    return (y.double() - x.double().arccos()).abs().max().item()


def child_main() -> None:
    """The interpreted checks (this file run as a script under TRITON_INTERPRET=1): JSON on stdout."""
    assert dispersion_triton.INTERPRETED, "run with TRITON_INTERPRET=1"
    torch.set_num_threads(1)
    results = {"arccos_max_error": arccos_max_error(), "cases": {name: run_case(c) for name, c in CASES.items()}}
    print(json.dumps(results))


@pytest.fixture(scope="module", autouse=True)
def interpreter_child() -> Iterator[subprocess.Popen]:
    """Start the interpreted checks with the module's first test, so they run while this process compiles."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-W", "ignore", __file__]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:  # no test of this run needed its results
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def interpreted(interpreter_child: subprocess.Popen) -> dict:
    out, err = interpreter_child.communicate(timeout=600)
    assert interpreter_child.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


# --------------------------------------------------------------------------- this process: compiled kernels


def test_bogus_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="kernel must be one of"):
        dispersion_loss(torch.randn(2, 5, 4), "angular_spread", kernel="bogus")


def test_triton_on_cpu_without_interpreter_says_how() -> None:
    if dispersion_triton.INTERPRETED:
        pytest.skip("this pytest process itself runs with TRITON_INTERPRET=1")
    for kernel in ("triton", dispersion_triton.TritonTiles()):
        with pytest.raises(ValueError, match="need a CUDA tensor.*TRITON_INTERPRET=1"):
            dispersion_loss(torch.randn(2, 5, 4), "angular_spread", kernel=kernel)


def test_auto_uses_torch_on_cpu() -> None:
    hidden = torch.randn(2, 9, 8)
    assert dispersion_loss(hidden, "l2_repel").item() == dispersion_loss(hidden, "l2_repel", kernel="torch").item()


@pytest.mark.parametrize(("variant", "precision"), [("angular_spread", "bf16x3"), ("l2_repel", "ieee")])
def test_kernels_compile_for_h100(variant: str, precision: str) -> None:
    """Both kernels compile to sm_90 machine code with the GPU defaults (no GPU needed).

    The two default precisions, and between them every variant branch but the two
    simplest (orthogonalization's hinge, decorrelation's square). About 10 s per
    kernel on this CPU when Triton's cache is cold.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dispersion_titan.losses.dispersion import _SPECS

    dt = dispersion_triton
    if dt.INTERPRETED:
        pytest.skip("this pytest process itself runs with TRITON_INTERPRET=1")
    tiles = dt.TritonTiles(precision)
    options = tiles.launch_options(768, _SPECS[variant])
    num_warps = options.pop("num_warps")
    floats = {"tau", "clamp", "pair_scale"}
    for kernel, extra in ((dt._forward_kernel, {}), (dt._backward_kernel, {"BLOCK_OUT": tiles.block_out_for(768)})):
        names = kernel.arg_names
        constexprs = {**options, **extra}
        signature = {
            a: "constexpr" if a in constexprs else "fp32" if a in floats else "i32" if a in ("n", "d") else "*fp32"
            for a in names
        }
        try:
            compiled = triton.compile(
                ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": num_warps},
            )
        except RuntimeError as err:  # no ptxas/LLVM for CUDA in this triton build
            if "ptxas" in str(err).lower():
                pytest.skip(f"cannot assemble for sm_90 here: {err}")
            raise
        assert "cubin" in compiled.asm
        if precision != "ieee":
            assert "wgmma" in compiled.asm["ptx"]  # Hopper tensor cores


def test_gpu_acceptance_without_cuda_exits_2_with_one_line() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is visible: the script would run the whole acceptance")
    env = {**os.environ, "PYTHON": sys.executable}
    script = REPO / "bench" / "gpu_acceptance.sh"
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "CUDA" in lines[0], lines


# --------------------------------------------------------------------------- interpreted kernels


def precision_of(case: dict) -> str:
    """The tile precision the case runs with ("auto" resolved as TritonTiles does)."""
    if case["precision"] != "auto":
        return case["precision"]
    return "ieee" if case["variant"] == "l2_repel" else "bf16x3"


def tolerances(case: dict) -> tuple[float, float]:
    """(value, gradient) relative tolerances: 1e-4 for fp32 tiles, 1e-3 gradients for bf16x3, more for plain bf16."""
    precision = precision_of(case)
    if precision == "bf16" and case["variant"] == "l2_repel":
        return 1e-3, 5e-2  # raw z: D = |z_i|^2 + |z_j|^2 - 2 z_i.z_j cancels the bf16 rounding's scale |z|^2
    return {"ieee": (1e-4, 1e-4), "bf16x3": (1e-4, 1e-3), "bf16": (1e-3, 1e-2)}[precision]


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_reference(interpreted: dict, name: str) -> None:
    case, got = CASES[name], interpreted["cases"][name]
    value_tol, grad_tol = tolerances(case)
    assert got["finite"]
    assert got["value_rel"] <= value_tol, got
    assert got["grad_rel"] <= grad_tol, got
    assert got["grad_scale"] > 1e-6  # not a comparison of two vanishing gradients
    if case["inputs"] == "condensed":
        assert got["clamped_fraction"] > 0.5  # most pairs lie beyond the clamp


def test_arccos_polynomial_error(interpreted: dict) -> None:
    """The bound stated in dispersion_triton._arccos's docstring."""
    assert interpreted["arccos_max_error"] < 5e-7


if __name__ == "__main__":
    child_main()
