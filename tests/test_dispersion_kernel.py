"""The fused Triton kernels (dispersion_triton.py) on CPU: against dispersion_loss_reference,
their work against the FLOP floor, and their compiled form for an H100.

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

import contextlib
import io
import json
import math
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch

import dispersion_titan
from dispersion_titan.losses import VARIANTS, dispersion_loss, dispersion_loss_reference, precision_error

if sys.platform != "linux" or platform.machine() != "x86_64":  # where pyproject.toml does not install triton
    pytest.skip("triton is a dependency on Linux x86_64 only", allow_module_level=True)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dispersion_titan.losses import dispersion_triton  # noqa: E402
from dispersion_titan.losses.dispersion import KernelUnavailable, check_triton_kernel  # noqa: E402
from dispersion_titan.losses.dispersion_triton import TileConfig  # noqa: E402
from dispersion_titan.losses.variants import SPECS  # noqa: E402

REPO = Path(dispersion_titan.__file__).resolve().parents[1]
BF16_ULP = 2.0**-7  # spacing of bf16 values relative to their magnitude (at most): a rounding step


GPU_TILES = TileConfig(128, 64, 4, 8)  # the GPU's tiles, run by the interpreter at a non-tile N and d


def case_table() -> dict[str, dict]:
    """name -> one kernel call: shape, input dtype, inputs, precision, tiles (None: the interpreter's), tau.

    Shapes are small, and tiles as large as still leaves several of them (partial ones
    included): the interpreter's cost is per op, not per element.
    """
    shapes = {
        # inputs       B  N    d   dtype   precision tiles                        tau
        "auto":        (2, 40, 64, "fp32", "auto", None, 1.0),
        "bf16_input":  (1, 70, 40, "bf16", "auto", None, 1.0),
        "condensed":   (1, 33, 64, "fp32", "exact", None, 0.3),  # cosines beyond the clamp
        "degenerate":  (3, 17, 40, "fp32", "exact", None, 0.5),  # 2 tiles, partial K steps; identical, antipodal,
                                                                # zero rows beside random ones
        "tf32":        (1, 40, 64, "fp32", "tf32", None, 1.0),
        "gpu_tiles":   (1, 200, 200, "fp32", "auto", GPU_TILES, 1.0),
        "gpu_exact":   (1, 150, 130, "fp32", "exact", GPU_TILES, 0.5),
        "paper_form":  (1, 40, 24, "fp32", "exact", None, 4.0),  # form="paper"; the rest the released form
    }  # fmt: skip
    keys = ("B", "N", "d", "dtype", "precision", "tiles", "tau")
    return {
        f"{variant}-{inputs}": {"variant": variant, "inputs": inputs, **dict(zip(keys, shape, strict=True))}
        for variant in VARIANTS
        for inputs, shape in shapes.items()
        if not precision_error(variant, shape[4])  # refused (perplexity_entropy at tf32), as bench/ skips it
    }


CASES = case_table()


def make_hidden(case: dict, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(case["N"])
    b, n, d = case["B"], case["N"], case["d"]
    hidden = torch.randn(b, n, d, generator=gen)
    if case["inputs"] == "condensed":
        hidden = torch.randn(1, 1, d, generator=gen) + 0.05 * hidden
    elif case["inputs"].startswith("gpu"):  # a shared direction: cosines near 0.3, orthogonalization's hinge active
        hidden = hidden + 0.7 * torch.randn(1, 1, d, generator=gen)
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
    tiles = dispersion_triton.TritonTiles(case["precision"], case["tiles"])
    kw = {"tau": case["tau"], "form": "paper" if case["inputs"] == "paper_form" else "released"}
    value, grad = loss_and_grad(hidden, case["variant"], kernel=tiles, **kw)
    ref_value, ref_grad = loss_and_grad(hidden, case["variant"], **kw)
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


def bench_module(name: str):
    """A module of bench/ (its functions are the measurement these checks share)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(REPO / "bench"))


CONDENSED_AUTO = (1, 33, 64)  # B, N, d of the deep-layer check under the interpreter: 3 partial pair tiles


def condensed_errors(variant: str, shape: tuple[int, int, int] = CONDENSED_AUTO, device: str = "cpu") -> dict:
    """Precision auto on condensed hidden states (bench/precision_errors.py's: a shared direction plus 5%
    noise, every cosine above 0.9 as in deep layers) against the fp64 reference, beside that bench's
    yardstick: the reference on the states rounded to bf16, what bf16 training does before any kernel.
    bench/check_kernel_cuda.py runs it at GPT-2 small's shape."""
    pe = bench_module("precision_errors")
    hidden = pe.hidden_states(shape, "condensed", device)
    ref = pe.value_and_grad(lambda x: dispersion_loss_reference(x, variant), hidden)
    yardstick = pe.gaps(pe.value_and_grad(lambda x: dispersion_loss_reference(x, variant),
                                          hidden.bfloat16().double()), ref)  # fmt: skip
    got = pe.gaps(pe.value_and_grad(lambda x: dispersion_loss(x.float(), variant, kernel=dispersion_triton.TritonTiles(
        "auto")), hidden), ref)  # fmt: skip
    u = torch.nn.functional.normalize(hidden, dim=-1)
    cos = u @ u.mT
    off_diagonal = cos[:, ~torch.eye(shape[1], dtype=torch.bool, device=device)]
    return {"value_rel": got[0], "grad_rel": got[1], "yardstick_value": yardstick[0], "yardstick_grad": yardstick[1],
            "min_cos": off_diagonal.min().item()}  # fmt: skip


def within_yardstick(got: dict) -> bool:
    """At most twice the yardstick's error, in value (plus 1e-5: a clamped loss's yardstick can be exactly 0)
    and in gradient."""
    return got["value_rel"] <= 2 * got["yardstick_value"] + 1e-5 and got["grad_rel"] <= 2 * got["yardstick_grad"]


@triton.jit
def apply_tf32_dot(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    c = dispersion_triton._dot(a, b, tl.zeros((BLOCK, BLOCK), dtype=tl.float32), "tf32", dispersion_triton.INTERPRETED)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], c)


def tf32_dot_gap() -> dict[str, float]:
    """The interpreter's plain tf32 product of positive fp32 matrices against fp64: truncated operands
    make every entry smaller, by at most two tf32 steps (2^-9) relative."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.rand(32, 32, generator=gen) + 0.5 for _ in range(2))
    c = torch.empty(32, 32)
    apply_tf32_dot[(1,)](a, b, c, BLOCK=32)
    rel = (c.double() - a.double() @ b.double()) / (a.double() @ b.double())
    return {"max": rel.max().item(), "min": rel.min().item()}


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


# The accounting shape: N and d not multiples of the tiles, whose padding is part of what is counted;
# 6 row tiles keep the triangle's diagonal tiles within the 4.5 units the GPU's shapes meet (4.46 with
# the padding), in two Gram steps: the interpreter's cost is per program and step.
ACCOUNTING = {"b": 1, "n": 190, "d": 124, "tiles": TileConfig(32, 64, 2, 1)}


def probe_passes() -> bool:
    """The once-per-process probe that kernel='auto' runs on CUDA, here on the interpreter: it agrees."""
    check_triton_kernel(torch.device("cpu"), "angular_spread", "auto")
    return True


def objective_launches(layers: str, n_layers: int = 4) -> dict[str, int]:
    """Kernel launches per kernel of one forward+backward of the training objective (dispersion on
    ``layers`` of ``n_layers`` blocks, the Triton kernel), counted under the interpreter."""
    from dispersion_titan.config.schema import Dispersion
    from dispersion_titan.trainer.objective import DispersionObjective
    from kernel_accounting import counting

    cfg = Dispersion(variant="angular_spread", coeff=1.0, layers=layers, kernel="triton")
    objective = DispersionObjective(cfg, n_layers, global_batch_size=2, seed=0, tp_group=None)
    gen = torch.Generator().manual_seed(0)
    blocks = [torch.randn(2, 20, 32, generator=gen).requires_grad_() for _ in range(n_layers)]  # 2 tiles
    with counting() as counts:
        term = objective(blocks, step=1, with_stats=False, chunk=0)
        torch.autograd.grad(term.weighted, [blocks[i] for i in objective.layers])
    return dict(counts.kernels)


def layers_match_their_concatenation(variant: str) -> bool:
    """Three layers passed as they are give bitwise the loss and gradients of their concatenation,
    with the backward's weight buffer in groups of three sequences (groups that straddle layers)."""
    gen = torch.Generator().manual_seed(1)
    layers = [torch.randn(2, 21, 24, generator=gen).requires_grad_() for _ in range(3)]
    kernel = dispersion_triton.TritonTiles("auto", max_weight_bytes=3 * 21 * 21 * 2)
    value = dispersion_loss(layers, variant, kernel=kernel)
    grads = torch.autograd.grad(value, layers)
    joined = torch.cat([layer.detach() for layer in layers]).requires_grad_()
    joined_value = dispersion_loss(joined, variant, kernel=kernel)
    (joined_grad,) = torch.autograd.grad(joined_value, joined)
    return value.item() == joined_value.item() and torch.equal(torch.cat(grads), joined_grad)


def non_finite_losses_are_nan(variant: str) -> list[bool]:
    """Whether one NaN, and one infinite, entry of the hidden states gives a NaN loss."""
    hidden = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2))
    losses = []
    for bad in (math.nan, math.inf):
        hidden[1, 3, 2] = bad
        losses.append(math.isnan(dispersion_loss(hidden, variant, kernel=dispersion_triton.TritonTiles()).item()))
    return losses


def overflowing_squares_gap(variant: str) -> float:
    """The paper form's relative value gap between tokens of norm ~1e20 (squares beyond fp32) and at scale 1."""
    hidden = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(4))
    big, one = (dispersion_loss(h, variant, kernel=dispersion_triton.TritonTiles("exact"), form="paper").item()
                for h in (hidden * 1e20, hidden))  # fmt: skip
    return abs(big - one) / abs(one)


def double_backward_error() -> str:
    """What a backward with create_graph=True through the kernels raises ("" for nothing)."""
    hidden = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(3)).requires_grad_()
    loss = dispersion_loss(hidden, "l2_repel", kernel=dispersion_triton.TritonTiles())
    try:
        torch.autograd.grad(loss, hidden, create_graph=True)
    except RuntimeError as err:
        return str(err)
    return ""


def child_main() -> None:
    """The interpreted checks (this file run as a script under TRITON_INTERPRET=1): JSON on stdout."""
    from kernel_accounting import account
    from support.interpreter import skip_idle_work

    assert dispersion_triton.INTERPRETED, "run with TRITON_INTERPRET=1"
    skip_idle_work()
    torch.set_num_threads(1)
    results = {
        "arccos_max_error": arccos_max_error(),
        "probe_passes": probe_passes(),
        "accounting": {variant: account(variant, **ACCOUNTING) for variant in VARIANTS},
        "objective_launches": {layers: objective_launches(layers) for layers in ("last", "all")},
        "layers_match": {v: layers_match_their_concatenation(v) for v in ("l2_repel", "angular_spread")},
        "cases": {name: run_case(c) for name, c in CASES.items()},
        "tf32_dot": tf32_dot_gap(),
        "condensed_auto": {variant: condensed_errors(variant) for variant in VARIANTS},
        "non_finite": {variant: non_finite_losses_are_nan(variant) for variant in VARIANTS},
        "double_backward": double_backward_error(),
        "overflowing_squares": {v: overflowing_squares_gap(v) for v in ("angular_spread", "decorrelation")},
        "torchtitan_modules": sorted(m for m in sys.modules if m.startswith("torchtitan")),
    }
    print(json.dumps(results))


@pytest.fixture(scope="module", autouse=True)
def interpreter_child() -> Iterator[subprocess.Popen]:
    """Start the interpreted checks with the module's first test, so they run while this process compiles."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-W", "ignore", __file__]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:  # no test of this run needed its results
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def interpreted(interpreter_child: subprocess.Popen) -> dict:
    out, err = interpreter_child.communicate(timeout=900)
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


HOPPER_SHARED_BYTES = 227 * 1024  # the most shared memory one block may use on sm_90
SHIPPED_D = (768, 1024, 2048)  # GPT-2 small, Qwen3-0.6B's 1024, Qwen3-1.7B's 2048
SM90_SHAPES = ((2, 1024, 768), (1, 4096, 2048))  # GPT-2 small's, Qwen3-1.7B's: N and d divisible by 16


@contextlib.contextmanager
def recorded_launches() -> Iterator[list[tuple[object, tuple, dict, list]]]:
    """Every kernel launch of the host code, recorded instead of run: (kernel, args, keyword
    arguments, the configurations a launch may build: autotune's, or its own warps and stages)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    launches = []

    def jit_run(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs, [{}]))

    def tuned_run(self, *args, grid=None, warmup=False, **kwargs):
        launches.append((self.fn, args, kwargs, [c.all_kwargs() for c in self.configs]))

    def product(a, b):  # cuBLAS's W U, not a launch of ours: its result's shape only
        return torch.empty(a.shape[0], a.shape[1], b.shape[2])

    with (
        mock.patch.object(JITFunction, "run", jit_run),
        mock.patch.object(Autotuner, "run", tuned_run),
        mock.patch.object(dispersion_triton, "_check_device", lambda device: None),
        mock.patch.object(dispersion_triton, "_product", product),
    ):
        yield launches


def sm90_builds(variant: str, hidden_dtype: torch.dtype, shape: tuple[int, int, int], precision: str = "auto"
                ) -> dict[str, tuple]:  # fmt: skip
    """What one forward+backward of ``variant`` at precision auto launches on a GPU, as Triton's launch
    binds it (runtime/jit.py, JITFunction.run): each argument's type and its specialisation (pointers
    and integers divisible by 16 marked so), constexprs, and options; by a readable name, one per build."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    hidden = torch.randn(*shape, dtype=hidden_dtype, requires_grad=True)
    with recorded_launches() as launches:
        loss = dispersion_loss(hidden, variant, kernel=dispersion_triton.TritonTiles(precision), precision=precision)
        torch.autograd.grad(loss, hidden)
    builds = {}
    for kernel, args, kwargs, configs in launches:
        for config in configs:
            kw = {"num_warps": 4, "num_stages": 3, **kwargs, **config}
            bound, specialization, options = create_function_from_signature(kernel.signature, kernel.params,
                                                                             backend)(*args, **kw)  # fmt: skip
            options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, specialization, options)
            parts = [kernel.__name__.strip("_").removesuffix("_kernel"),
                     "x".join(str(kw[k]) for k in ("BLOCK", "BLOCK_K", "BLOCK_D") if k in kw),
                     f"w{options.num_warps}s{options.num_stages}" + (f"r{options.maxnreg}" if options.maxnreg else ""),
                     kw.get("DOT"), kw.get("STORE"), kw.get("U_PARTS") and f"parts{kw['U_PARTS']}",
                     kw.get("VARIANT") or (kw["ROWS"] if isinstance(kw.get("ROWS"), str) else None),
                     signature.get("u_ptr", "")[1:] and f"u-{signature['u_ptr'][1:]}",
                     signature.get("z_ptr", "")[1:] and f"hidden-{signature['z_ptr'][1:]}"]  # fmt: skip
            # the integers a launch marks divisible by 16 (not those it must not specialise): another build
            ints = enumerate(signature.items())
            by16 = [arg for i, (arg, kind) in ints if kind in ("i32", "i64") and attrs.get((i,))]
            parts.append(by16 and f"by16_{'_'.join(by16)}")
            builds["-".join(p for p in parts if p)] = (kernel, signature, constexprs, attrs, options)
    return builds


def _compile_sm90(kernel, signature: dict, constexprs: dict, attrs: dict, options) -> dict:
    """Compile one launch's build for sm_90 (no GPU needed): whether it uses wgmma, its TMA copies,
    ptxas's registers and spills, and the shared memory. A fresh Triton cache makes ptxas run, so its
    log can be read."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    log = io.StringIO()
    with mock.patch.object(knobs.nvidia, "dump_ptxas_log", True), contextlib.redirect_stdout(log):
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                                  options=options.__dict__)  # fmt: skip
    text = log.getvalue()
    number = lambda pattern: sum(int(v) for v in re.findall(pattern, text))  # noqa: E731
    assert "Used" in text, f"no ptxas log captured: {text[:500]}"
    ptx = compiled.asm["ptx"]
    return {
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "tma": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
        "registers": max(int(v) for v in re.findall(r"Used (\d+) registers", text)),
        "spill_bytes": number(r"(\d+) bytes spill stores") + number(r"(\d+) bytes spill loads"),
        "shared": compiled.metadata.shared,
    }


def test_shipped_configurations_compile_for_h100_without_spills() -> None:
    """Every kernel build a GPU launch makes at precision auto (each autotune configuration), bound
    as Triton's launch binds it at a shipped shape (descriptors, pointers and integers divisible by 16
    marked so), with fp32 hidden states (one GPU, autocast) and bf16 (FSDP's bf16 parameters), compiles
    to sm_90 machine code: the pair products on Hopper's tensor cores (wgmma) fed by TMA, 128 x 128
    tiles, no register spills, shared memory within the limit."""
    dt = dispersion_triton
    if dt.INTERPRETED:
        pytest.skip("this pytest process itself runs with TRITON_INTERPRET=1")
    assert all(d % 16 == 0 for d in SHIPPED_D)  # one specialisation of the runtime d for all three
    builds = {name: build for variant in VARIANTS for dtype in (torch.float32, torch.bfloat16) for shape in SM90_SHAPES
              for name, build in sm90_builds(variant, dtype, shape).items()}  # fmt: skip
    report = {}
    with mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": str(Path(os.environ.get("TMPDIR", "/tmp"))
                                                               / f"triton-sm90-{os.getpid()}")}):  # fmt: skip
        for name, build in builds.items():
            try:
                report[name] = _compile_sm90(*build)
            except RuntimeError as err:  # no ptxas/LLVM for CUDA in this triton build
                if "ptxas" in str(err).lower():
                    pytest.skip(f"cannot assemble for sm_90 here: {err}")
                raise
    print(json.dumps(report, indent=1))
    kernels = {name.split("-")[0] for name in report}
    assert kernels == {"rows", "pairs_forward", "pairs_backward", "radial", "pair_logits", "row_entropy"}, kernels
    products = [name for name in report if name.startswith("pair")]
    # forward (or logits) and backward per variant and configuration (W U is cuBLAS's)
    kinds = {name.split("-by16_")[0] for name in products}
    assert len(kinds) == len(VARIANTS) * 2 * len(dt.PAIR_CONFIGS), sorted(report)
    # one build of each for both shapes, though one's tile-pair count is divisible by 16 and the other's not
    items = [b * math.comb(-(-n // dt.GPU_BLOCK) + 1, 2) for b, n, _ in SM90_SHAPES]
    assert {count % 16 == 0 for count in items} == {True, False}, items
    assert len(products) == len(kinds), sorted(products)
    for name, got in report.items():
        assert got["spill_bytes"] == 0, (name, got)
        assert got["shared"] <= HOPPER_SHARED_BYTES, (name, got)
    for name in products:  # every product kernel, perplexity_entropy's included
        assert name.startswith(f"{name.split('-')[0]}-{dt.GPU_BLOCK}x"), name
        assert report[name]["wgmma"] and report[name]["tma"], (name, report[name])  # pipelined tensor cores


def test_autotune_is_keyed_on_the_variant_and_the_products() -> None:
    """A pair kernel's tuned configuration is found per shape, variant and products (the precision):
    one variant's or precision's never serves another's launch."""
    for name, tuner in dispersion_triton._TUNED.items():
        assert {"n", "d", "VARIANT", "ROWS", "DOT"} <= set(tuner.keys), (name, tuner.keys)
    assert "SPLIT_WEIGHTS" in dispersion_triton._TUNED["backward"].keys


def test_gpu_acceptance_without_cuda_exits_2_with_one_line(script_python: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is visible: the script would run the whole acceptance")
    env = {**os.environ, "PYTHON": str(script_python)}
    script = REPO / "bench" / "gpu_acceptance.sh"
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "CUDA" in lines[0], lines


def test_acceptance_table_reads_canned_bench_and_titan_lines(tmp_path: Path) -> None:
    """bench/gpu_acceptance.sh's parsing, fed what the benches and TorchTitan print."""
    sys.path.insert(0, str(REPO / "bench"))
    import acceptance_table as at

    bench_log = (
        "| table | row |\nRESULT a.s=0.013 a.ratio=1.054\nnoise RESULT b=2\nRESULT train_step.implicit_syncs=0\n"
    )
    assert at.result_lines(bench_log) == ["a.s=0.013 a.ratio=1.054", "train_step.implicit_syncs=0"]
    titan = ("[rank0]:[titan] 2026-11-25 10:14:21,574 - root - INFO - step: 20  ce: 10.22044  dispersion: -0.29168  "
             "mean_cos_offdiag by block: 0.061 0.337\n"
             "[rank0]:[titan] 2026-11-25 10:14:21,575 - root - INFO - step: 20  loss: 10.19128  grad_norm:  0.8804  "
             "memory:  0.54GiB(0.68%)  tps: 24,751  tflops: 0.52  mfu: 0.05%\n")  # fmt: skip
    assert at.train_lines(titan) == [
        "train.step=20 train.loss=10.19128 train.memory_gib=0.54 train.tps_per_gpu=24751 train.mfu_pct=0.05",
        "train.ce=10.22044 train.dispersion=-0.29168",
    ]
    assert at.train_lines("no step logged") == []
    results = tmp_path / "results.txt"
    results.write_text("device=H100x1 torch=2.11\nkernel_check.exit=1\n")
    at.main(["table", str(results), str(tmp_path / "t.md"), "1"])
    assert (tmp_path / "t.md").read_text().splitlines() == [
        "| quantity | value |",
        "|---|---|",
        "| device | H100x1 |",
        "| torch | 2.11 |",
        "| kernel_check.exit | 1 |",
        "| all steps passed | no |",
    ]


# --------------------------------------------------------------------------- interpreted kernels


def tolerances(case: dict) -> tuple[float, float]:
    """(value, gradient) relative tolerances: exact 1e-4 and 2e-3, as the reference; tensor-core
    precisions within what a bf16 rounding of the rows does (l2_repel's raw rows: more)."""
    precision = case["precision"]
    if precision == "exact":
        return 1e-4, 2e-3
    if precision == "tf32":  # truncated 10-bit operands: 1.4e-3 in value on an H100, as in the interpreter
        return 5e-3, 1e-2
    return (1e-3, 5e-2) if case["variant"] == "l2_repel" else (1e-3, 1e-2)


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


@pytest.mark.parametrize("variant", VARIANTS)
def test_auto_on_condensed_inputs_is_within_the_bf16_yardstick(interpreted: dict, variant: str) -> None:
    """Deep layers' tokens point nearly one way, where ``dz = du - u r`` cancels: precision auto, with
    tensor-core rounding emulated (bf16 rows, bf16x3 for perplexity_entropy), stays within twice what bf16
    training's own rounding of the hidden states moves the loss and its gradient."""
    got = interpreted["condensed_auto"][variant]
    assert got["min_cos"] >= 0.9, got
    assert got["yardstick_grad"] > 1e-4, got  # the yardstick measures something
    assert within_yardstick(got), got


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_non_finite_hidden_state_gives_a_nan_loss(interpreted: dict, variant: str) -> None:
    """A NaN or infinite entry is a NaN loss, as in torch (the kernels' clamp and orthogonalization's hinge
    dropped NaN cosines, and perplexity_entropy took NaN probabilities for zeros: finite losses)."""
    assert interpreted["non_finite"][variant] == [True, True]


@pytest.mark.parametrize("variant", ["angular_spread", "decorrelation"])
def test_direction_variants_hold_where_squares_overflow(interpreted: dict, variant: str) -> None:
    """As the torch path's (test_dispersion_loss.py): the rows kernel's norms do not overflow (its rows were zero)."""
    assert interpreted["overflowing_squares"][variant] < 1e-5


def test_a_second_derivative_is_refused_in_one_line(interpreted: dict) -> None:
    """As the torch path's (test_dispersion_loss.py): the kernels' gradient has no graph to differentiate."""
    assert re.fullmatch("dispersion_loss is differentiable once: [^\n]*reference[^\n]*", interpreted["double_backward"])


def test_interpreter_truncates_tf32_operands_as_the_tensor_cores_do(interpreted: dict) -> None:
    """Plain tf32 drops each fp32 operand's 13 low mantissa bits (tl.dot's documentation; an H100 showed
    the resulting 1.4e-3 value error of the tf32 case): every product of positive operands comes out
    smaller, never larger, by at most 2^-9."""
    gap = interpreted["tf32_dot"]
    assert -(2.0**-9) <= gap["min"] <= gap["max"] < 0, gap
    assert gap["min"] < -(2.0**-13), gap  # not fp32's rounding


@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_work_is_at_the_floor(interpreted: dict, variant: str) -> None:
    """One forward+backward at the default precision, counted where it executes: products of at
    most 4.5·B·N²·d FLOPs at this padded test shape (the floor is 4: Gram triangle, its recompute,
    W U; the rest is the triangle's diagonal tiles and padding; perplexity_entropy's bf16x3 pair
    products issue three tensor-core dots each, see below), W U one unpadded torch (cuBLAS) product,
    and at most 12·B·N·d fp32 elements of torch glue."""
    got = interpreted["accounting"][variant]
    assert 4.0 <= got["product_flops"] <= 4.5, got
    assert got["torch_matmul_flops"] == pytest.approx(2.0), got
    assert got["glue_traffic"] <= 12.0, got


def _pair_dots(variant: str) -> int:
    """Tensor-core dots per pair product at the default precision: 3 for a split-precision product."""
    return 3 if dispersion_triton.products("auto", SPECS[variant]).dot == "bf16x3" else 1


def test_cost_model_counts_what_the_interpreter_counts(interpreted: dict) -> None:
    """bench/h100_model.py predicts from kernel_accounting.issued (launch geometry); it must be the count,
    the products and the tensor-core dots that issue them (a split-precision product: three)."""
    from kernel_accounting import issued

    t = ACCOUNTING["tiles"]
    for variant in VARIANTS:
        counted = interpreted["accounting"][variant]
        predicted = issued(ACCOUNTING["b"], ACCOUNTING["n"], ACCOUNTING["d"], t.block, t.block_k,
                           pair_dots=_pair_dots(variant))  # fmt: skip
        assert counted["matmul_flops"] == pytest.approx(predicted["matmul_flops"], rel=1e-9), variant
        assert counted["product_flops"] == pytest.approx(predicted["product_flops"], rel=1e-9), variant


@pytest.mark.parametrize("b, n, d", [(16, 1024, 768), (1, 4096, 2048)])  # GPT-2 small, Qwen3-1.7B
def test_work_at_the_shipped_shapes_is_within_4_5_units(b: int, n: int, d: int) -> None:
    """At the GPU's tiles (GPU_BLOCK, a 128-byte Gram step of bf16), the products of one forward+backward
    stay within 4.5·B·N²·d FLOPs: the geometry the interpreter's count checks above."""
    from kernel_accounting import issued

    block_k = dispersion_triton.STEP_BYTES // 2
    assert 4.0 <= issued(b, n, d, dispersion_triton.GPU_BLOCK, block_k)["product_flops"] <= 4.5


def test_layers_go_through_the_pair_kernels_as_one_batch_where_they_lie(interpreted: dict) -> None:
    """The chosen blocks go through the pair kernels as one batch: a step's dispersion on 4 blocks
    issues the pair-kernel launches of one block (forward and backward), and reads each block where it
    lies (no concatenated copy): the per-token kernels run once per block (rows: forward and backward),
    and the loss and gradients equal bitwise those of the blocks' concatenation (l2_repel: its token
    mean and norm penalty read from each block)."""
    last, every = interpreted["objective_launches"]["last"], interpreted["objective_launches"]["all"]
    assert last == {"rows_kernel": 2, "pairs_forward_kernel": 1, "pairs_backward_kernel": 1, "radial_kernel": 1}, last
    assert every == {**last, "rows_kernel": 4 * 2, "radial_kernel": 4}, every
    assert all(interpreted["layers_match"].values()), interpreted["layers_match"]


def test_the_objective_runs_without_torchtitan(interpreted: dict) -> None:
    """The training objective and the kernels import no TorchTitan (about 1.5 s of CPU in every process that
    needs only the loss, as this child)."""
    assert interpreted["torchtitan_modules"] == []


def test_auto_probe_agrees_on_the_interpreter(interpreted: dict) -> None:
    assert interpreted["probe_passes"]


def test_probe_refuses_a_disagreeing_kernel_in_one_line() -> None:
    check_triton_kernel.cache_clear()

    def one_percent_off(self, hidden, spec, hp, lambda_norm):  # 5x the value's tolerance at auto, not 50x
        return dispersion_loss(hidden, spec.name, kernel="torch") * 1.01

    with (
        mock.patch.object(dispersion_triton.TritonTiles, "loss", one_percent_off),
        pytest.raises(KernelUnavailable, match="disagrees with the torch path.*dispersion.kernel = 'torch'") as err,
    ):
        check_triton_kernel(torch.device("cpu"), "orthogonalization", "auto")
    assert "\n" not in str(err.value)
    check_triton_kernel.cache_clear()


def test_probe_names_a_failed_build_and_the_way_out() -> None:
    check_triton_kernel.cache_clear()
    broken = mock.Mock(side_effect=RuntimeError("Failed to compile.\nfatal error: Python.h: No such file or directory"))
    with (
        mock.patch.object(dispersion_triton.TritonTiles, "loss", broken),
        pytest.raises(KernelUnavailable, match="does not build or run.*Python.h.*dispersion.kernel = 'torch'"),
    ):
        check_triton_kernel(torch.device("cpu"), "l2_repel", "auto")
    check_triton_kernel.cache_clear()


def test_arccos_polynomial_error(interpreted: dict) -> None:
    """The bound stated in dispersion_triton._arccos's docstring."""
    assert interpreted["arccos_max_error"] < 5e-7


if __name__ == "__main__":
    child_main()
