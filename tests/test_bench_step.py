"""bench/train_step.py times the trainer's own step (DispersionTrainer from a checked job config)
and bench/profile_step.py groups its profile: both run here on the debug model on a CPU, a
few steps each, through the same code a GPU run takes. bench/h100_model.py's memory estimate,
which sized the GPU configs' micro-batches, is checked against what autograd saves."""

from __future__ import annotations

import math
import re
import signal
import socket
import sys

import pytest
from support.launch import DEBUG_TOML, REPO
from torchtitan.tools.utils import get_peak_flops

from dispersion_titan.models.gpt2.args import flops_per_token, gpt2_flavors

SMALL_STEP = ["--training.global_batch_size", "4", "--training.seq_len", "64"]


@pytest.fixture
def single_process(monkeypatch):
    """The torchrun variables of a 1-process job, undone after the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    # The trainer installs its stop handlers (trainer/preemption.py) in this process: put the
    # old ones back, or a later multiprocessing.Pool's SIGTERM would no longer end its workers.
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    for name in ("train_step", "profile_step"):
        sys.modules.pop(name, None)


def test_train_step_reports_every_variant_against_ce_with_titans_mfu(single_process, capsys):
    import train_step

    results = train_step.main([DEBUG_TOML, "--steps", "2", "--warmup", "0", "--variants", "angular_spread",
                               "l2_repel", *SMALL_STEP])
    out = capsys.readouterr().out
    assert f"| {' | '.join(train_step.COLUMNS)} |" in out
    assert list(results) == ["ce", "angular_spread", "l2_repel"]
    assert "trainer steps run: 6" in out  # 2 optimizer steps per objective, interleaved on one trainer
    for key, r in results.items():
        assert r["steps"] == 2 and all(math.isfinite(v) and v > 0 for v in r.values()), (key, r)
        assert re.search(rf"^\| {key} \| {r['step_ms']:.1f} \| {r['ratio']:.3f} \|", out, re.MULTILINE), key
    assert results["ce"]["ratio"] == 1.0
    # MFU: the debug model's FLOP count (tests/test_flops.py checks the formula) over TorchTitan's peak
    args = gpt2_flavors["debug"]
    peak = get_peak_flops(re.search(r" device=(.*) model=", out).group(1))
    assert f"RESULT train_step.debug.flops_per_token={flops_per_token(args, 64)}" in out
    for r in results.values():
        assert r["mfu"] == pytest.approx(flops_per_token(args, 64) * r["tokens_per_s"] / peak, rel=1e-9)


def test_profile_step_groups_the_trainers_step(single_process, capsys):
    import profile_step

    shares = profile_step.main([DEBUG_TOML, "--steps", "1", "--warmup", "0", "--dispersion.variant", "angular_spread",
                                "--dispersion.coeff", "0.1", *SMALL_STEP])
    out = capsys.readouterr().out
    assert list(shares) == ["dispersion", "optimizer", "loss", "attention", "matmul", "elementwise"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(shares[group] > 0 for group in ("dispersion", "optimizer", "loss", "attention", "matmul")), shares
    assert re.search(r"^\| `aten::mm` \| matmul \|", out, re.MULTILINE)  # the debug model's linear layers on a CPU


def test_memory_estimate_is_above_what_autograd_saves(monkeypatch):
    """bench/h100_model.py's saved activations (which sized the configs' micro-batches) against
    the tensors autograd saves in GPT-2 small's bf16-autocast forward, counted by storage: the
    estimate may be conservative, never short; the bf16 weight copies it adds are exact."""
    import torch

    from dispersion_titan.models.gpt2.model import GPT2

    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import h100_model

    shape = next(c for c in h100_model.SHIPPED if c.name == "gpt2_small_mlp3072")
    args = gpt2_flavors["small"]
    args.vocab_size = shape.vocab
    model = GPT2(args)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {s for p in model.parameters() if p.dim() == 2 for s in (tuple(p.shape), tuple(p.t().shape))}
    activations, weight_copies = {}, {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            (weight_copies if tuple(t.shape) in weight_shapes else activations)[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = 128
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.zeros(1, tokens, dtype=torch.long))
    saved = sum(activations.values()) / tokens
    estimate = shape.layers * h100_model.saved_bytes_per_token(shape) + 2 * shape.vocab  # blocks + bf16 logits
    assert saved <= estimate <= 1.5 * saved, (saved, estimate)
    assert sum(weight_copies.values()) == 2 * h100_model.weights(shape)
    sys.modules.pop("h100_model", None)
