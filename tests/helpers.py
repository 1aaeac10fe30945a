"""Shared helpers: launching real torchrun jobs and reading what they wrote."""

from __future__ import annotations

import atexit
import glob
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchtitan.components.dataloader import ParallelAwareDataloader

from dispersion_titan.utils.devices import CPU_MALLOC_ENV
from dispersion_titan.utils.preloaded import Commands

REPO = Path(__file__).resolve().parents[1]
DEBUG_TOML = str(REPO / "train_configs" / "debug.toml")


# The schedule of the session's 2-process yardstick run (conftest's ``reference_run``) and of
# every run compared with it step for step (reliability, resume).
REFERENCE_STEPS = 8
SCHEDULE = ("--lr_scheduler.total_steps", "10", "--checkpoint.interval", "2",
            "--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.3", "--dispersion.max_tokens", "64")


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**CPU_MALLOC_ENV, **os.environ}  # the quickstart's allocator settings, for every CPU job
    # The tests train on CPU on purpose: allowed even where GPUs are allocated but unusable.
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCH_CPP_LOG_LEVEL": "ERROR",
                "DISPERSION_TITAN_ALLOW_CPU": "1"})
    env.update(extra or {})
    return env


# What the session's job server imports once (and GPT-2's BPE, built once) before it forks each job.
PRELOAD = ["torch", "torchtitan.train", "torch.distributed.launcher.api", "dispersion_titan.train",
           "dispersion_titan.tokenizer.bpe:gpt2_encoding"]
_commands: Commands | None = None


def _forked(target: str, argv: list[str], env: dict[str, str], timeout: float,
            nproc: int | None = None) -> subprocess.CompletedProcess:
    """``target`` (a module or a script) forked from the session's job server, the product's
    (``dispersion_titan.utils.preloaded``), under torchrun's launcher with ``nproc`` processes
    when given; its stdout and stderr apart."""
    global _commands
    if _commands is None:
        _commands = Commands(launch_env(), PRELOAD)
        atexit.register(_commands.close)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        status = _commands.run(target, argv, str(out), errors=str(err), nproc=nproc, env=env, cwd=str(REPO),
                               timeout=timeout)
        stdout = out.read_text().split("\n", 1)[1]  # after the command line the log starts with
        return subprocess.CompletedProcess(argv, status, stdout, err.read_text())


# Debug runs train on 64-token sequences (debug.toml: 128) unless a test says otherwise: a
# step's cost is mostly the 50k-row LM head over every token, and no assertion needs more.
DEBUG_SEQ_LEN = ("--training.seq_len", "64")


def torchrun(dump: Path | str, nproc: int, *overrides: str, config: str = DEBUG_TOML,
             check: bool = True, timeout: int = 600, env: dict[str, str] | None = None,
             command_line: bool = False) -> subprocess.CompletedProcess:
    """Train with ``nproc`` processes under torchrun's launcher; return the completed process.

    By default the job is forked from the session's job server (``dispersion_titan.utils.preloaded``:
    torchrun's own ``elastic_launch``, imports paid once). ``command_line=True`` runs
    ``python -m torch.distributed.run -m dispersion_titan.train`` itself, for tests that
    look at its processes or its prefixed output."""
    argv = ["--job.config_file", config, "--job.dump_folder", str(dump), "--metrics.log_freq", "1",
            *(DEBUG_SEQ_LEN if config == DEBUG_TOML else ()), *overrides]
    if command_line:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--local-ranks-filter=0",
               "--role=rank", "--tee=3", "-m", "dispersion_titan.train", *argv]
        proc = subprocess.run(cmd, cwd=REPO, env=launch_env(env), capture_output=True, text=True, timeout=timeout)
    else:
        proc = _forked("dispersion_titan.train", argv, launch_env(env), timeout, nproc)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return proc


def torchrun_script(script: str, nproc: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node NPROC tests/dist_scripts/SCRIPT ARGS``, forked from the
    job server like ``torchrun``'s jobs (rank 0's output); never raises on failure."""
    return _forked(str(REPO / "tests" / "dist_scripts" / script), list(args), launch_env(), timeout, nproc)


def python_module(module: str, *args: str, timeout: int = 600, env: dict[str, str] | None = None,
                  command_line: bool = False) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` from the repository: forked from the job server (its
    imports already paid), or with ``command_line=True`` a fresh interpreter, for commands
    that read the environment at import time or start processes of their own."""
    if not command_line:
        return _forked(module, list(args), launch_env(env), timeout)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=launch_env(env),
                          capture_output=True, text=True, timeout=timeout)


def digests(folder: Path, pattern: str = "*") -> dict[str, str]:
    """An identity of every file under ``folder`` matching ``pattern``: equal dicts mean
    nothing added, removed or changed. Small files by their SHA-256; files of 1 MiB and more
    (checkpoint shards) by size and modification time in ns, which every rewrite changes:
    hashing a sweep's checkpoints twice per test cost seconds of CPU."""
    def identity(path: Path) -> str:
        stat = path.stat()
        if stat.st_size >= 1 << 20:
            return f"{stat.st_size}@{stat.st_mtime_ns}"
        return hashlib.sha256(path.read_bytes()).hexdigest()

    return {str(p.relative_to(folder)): identity(p) for p in sorted(folder.rglob(pattern)) if p.is_file()}


def scalars(dump: Path | str) -> dict[str, dict[int, float]]:
    """TensorBoard scalars of a run: tag -> {step: value} (later files win on overlap)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted(glob.glob(os.path.join(str(dump), "tb", "*", "events.out.tfevents.*"))):
        acc = EventAccumulator(events, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


LM_EVAL_TASKS = REPO / "tests" / "lm_eval_tasks"


def absolute_lm_eval_tasks(folder: Path) -> Path:
    """The shipped offline lm-eval task YAMLs in ``folder``, their data files made absolute
    (lm-eval 0.4.13 hands ``data_files`` to ``datasets`` unchanged, which resolves it
    against the current folder)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    for path in LM_EVAL_TASKS.glob("*.yaml"):
        config = yaml.safe_load(path.read_text())
        files = config["dataset_kwargs"]["data_files"]
        config["dataset_kwargs"]["data_files"] = {split: str(LM_EVAL_TASKS / name) for split, name in files.items()}
        (folder / path.name).write_text(yaml.safe_dump(config))
    return folder


def load_weights(step_dir: Path | str) -> dict[str, torch.Tensor]:
    from dispersion_titan.run_folder.checkpoints import load_model, load_model_args

    step_dir = str(step_dir)
    args = load_model_args(os.path.dirname(step_dir))
    return {k: v.detach().clone() for k, v in load_model(step_dir, args).state_dict().items()}


def _flat(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([weights[k].flatten() for k in sorted(weights)])


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return (_flat(a) - _flat(b)).abs().max().item()


def update_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> float:
    """‖a − b‖ / ‖a − initial‖: disagreement relative to how far training moved the weights.

    Per-tensor relative errors are meaningless for parameters whose gradient is exactly
    zero in exact arithmetic (e.g. attention key biases), where Adam amplifies rounding
    noise; relative to the whole update, a layout bug still shows up at O(1).
    """
    fa, fb, f0 = _flat(a), _flat(b), _flat(initial)
    return ((fa - fb).norm() / (fa - f0).norm()).item()


def run_cli(main: Callable[[list[str]], None], *args, capsys) -> tuple[int, str, str]:
    """Run a command's ``main`` in this process (saves the imports of every call):
    exit status, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def analyze(*args: str, capsys) -> tuple[int, str, str]:
    """The analysis CLI in this process."""
    from dispersion_titan.analyze import main as analyze_main

    return run_cli(analyze_main, *args, capsys=capsys)


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("dispersion_titan: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def texts(n: int, seed: int, max_words: int = 60) -> list[str]:
    """``n`` random documents of up to ``max_words`` words, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(1, max_words))) for _ in range(n)]


def texts_jsonl(path: Path, documents: int, words: int, seed: int = 0) -> Path:
    """A ``--texts`` file of ``documents`` random documents of ``words`` words each."""
    rng = np.random.default_rng(seed)
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS, words))}) + "\n" for _ in range(documents)))
    return path


def write_parquet(folder: Path, docs: list[str], files: int, row_group: int = 17) -> list[str]:
    """``docs`` as a ``text`` column over ``files`` parquet files, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    size = math.ceil(len(docs) / files)
    paths = []
    for i in range(files):
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(pa.table({"text": docs[i * size : (i + 1) * size]}), path, row_group_size=row_group)
        paths.append(str(path))
    return paths


# ---------------------------------------------------------------- wikitext-103 local copies (data tests)

def wikitext_article(title: str, seed: int) -> list[str]:
    """Rows of one article in WikiText's raw layout: heading, blank, paragraph lines, sections."""
    body = texts(3, seed, 25)
    return ["", f" = {title} = \n", "", f" {body[0]} \n", "", f" = = Section {seed} = = \n", "",
            f" {body[1]} \n", f" {body[2]} \n"]


ARTICLES = {
    "train": [wikitext_article(f"Train article {i}", i) for i in range(6)],
    "validation": [wikitext_article(f"Held out {i}", 100 + i) for i in range(2)],
}
EXPECTED = {split: ["".join(rows).strip() for rows in arts] for split, arts in ARTICLES.items()}


def wikitext_rows(split: str) -> list[str]:
    return [row for article in ARTICLES[split] for row in article]


def wikitext_parquet_dir(root: Path) -> Path:
    """The layout of ``hf download Salesforce/wikitext``'s ``wikitext-103-raw-v1`` folder."""
    folder = root / "wikitext-103-raw-v1"
    folder.mkdir(parents=True)
    for split in ("train", "validation"):
        pq.write_table(pa.table({"text": wikitext_rows(split)}), folder / f"{split}-00000-of-00001.parquet")
    return folder


def wikitext_saved_dir(root: Path) -> Path:
    folder = root / "saved"
    datasets.DatasetDict(
        {split: datasets.Dataset.from_dict({"text": wikitext_rows(split)}) for split in ARTICLES}
    ).save_to_disk(str(folder))
    return folder


def wikitext_cache_dir(root: Path) -> Path:
    """A ``datasets`` cache holding Salesforce/wikitext: prepared from a local copy of the
    repo (README configs), then placed where datasets keeps hub datasets (owner___name)."""
    repo = root / "repo" / "wikitext"
    shutil.copytree(wikitext_parquet_dir(root / "src"), repo / "wikitext-103-raw-v1")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: wikitext-103-raw-v1\n  data_files:\n"
        "  - split: train\n    path: wikitext-103-raw-v1/train-*\n"
        "  - split: validation\n    path: wikitext-103-raw-v1/validation-*\n---\n"
    )
    cache = root / "cache"
    datasets.load_dataset_builder(str(repo), "wikitext-103-raw-v1", cache_dir=str(cache)).download_and_prepare()
    (cache / "wikitext").rename(cache / "Salesforce___wikitext")
    return cache


def tiny_run(dump: Path, steps: tuple[int, ...] = (0,), flavor: str = "debug", args=None,
             tokenizer: str = "gpt2") -> Path:
    """A run folder without training: ``run.json`` and one single-process DCP checkpoint of
    seeded random weights per step (seconds, where a torchrun job takes a minute); of the
    gpt2 ``flavor``, or of any family's ``args``."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from dispersion_titan.models import family
    from dispersion_titan.models.gpt2.args import gpt2_flavors
    from dispersion_titan.run_folder.checkpoints import save_run_metadata

    args = args if args is not None else gpt2_flavors[flavor]
    for step in steps:
        torch.manual_seed(step)
        with torch.device("meta"):
            model = family(args.FAMILY).get_train_spec().model_cls(args)
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP warns that it assumes a single process
            dcp.save(model.state_dict(), checkpoint_id=str(dump / "checkpoint" / f"step-{step}"))
    save_run_metadata(str(dump), args.FAMILY, args, tokenizer=tokenizer)
    return dump


# ---------------------------------------------------------------- packed loaders (data tests)

def loader(dataset, rank: int, world: int) -> ParallelAwareDataloader:
    return ParallelAwareDataloader(dataset, dp_rank=rank, dp_world_size=world, batch_size=dataset.local_batch_size)


def global_batches(make, world: int, accum: int, local: int, steps: int) -> list[torch.Tensor]:
    """What each optimizer step trains on: every rank's micro-batches, in sequence order."""
    iters = [iter(loader(make(local, r, world), r, world)) for r in range(world)]
    out = []
    for _ in range(steps):
        micro = [[next(it)[0]["input"] for it in iters] for _ in range(accum)]
        out.append(torch.cat([b for m in micro for b in m]))
    return out


def resumed_equals_uninterrupted(make, world: int, stop: int, more: int) -> None:
    for rank in range(world):
        uninterrupted = iter(loader(make(2, rank, world), rank, world))
        expected = [next(uninterrupted) for _ in range(stop + more)][stop:]
        first = loader(make(2, rank, world), rank, world)
        it = iter(first)
        for _ in range(stop):
            next(it)
        state = first.state_dict()
        resumed = loader(make(2, rank, world), rank, world)
        resumed.load_state_dict(state)
        for (x, y), (ex, ey) in zip(resumed, expected, strict=False):  # resumed never ends
            assert torch.equal(x["input"], ex["input"]) and torch.equal(y, ey)


# ---------------------------------------------------------------- condensation, computed independently

# Where each family keeps its decoder layers: spelled out here, found generically by the code.
LAYERS = {"gpt2": "transformer.h", "llama": "model.layers", "qwen3": "model.layers", "bloom": "transformer.h",
          "neox": "gpt_neox.layers"}


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
    hook = layers[-1].register_forward_hook(lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple)
                                                                                else out))
    with torch.no_grad():
        hidden = model(tokens, output_hidden_states=True).hidden_states
    hook.remove()
    n = len(layers)
    assert len(hidden) == n + 1
    return [*hidden[:n], captured[0], hidden[n]]
