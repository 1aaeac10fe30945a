"""Reading what a run wrote (files, TensorBoard scalars, checkpoint weights) and making run
folders without training."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
from pathlib import Path

import torch


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


def logged(folder: Path | str, tag: str) -> list[tuple[int, float]]:
    """Every (step, value) of scalar ``tag`` in the event files of ``folder`` as TensorBoard plots them: a step
    written twice, twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for events in sorted(glob.glob(os.path.join(str(folder), "events.out.tfevents.*"))):
        acc = EventAccumulator(events, size_guidance={"scalars": 0})
        acc.Reload()
        out += [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []
    return sorted(out)


def load_weights(step_dir: Path | str) -> dict[str, torch.Tensor]:
    from dispersion_titan.run_folder.checkpoints import load_model, load_model_args

    step_dir = str(step_dir)
    args = load_model_args(os.path.dirname(step_dir))
    return {k: v.detach().clone() for k, v in load_model(step_dir, args).state_dict().items()}


def scale_weights(step_dir: Path, factor: float, prefix: str = "") -> None:
    """Rewrite the single-process checkpoint ``step_dir`` with its weights whose name starts with ``prefix`` times
    ``factor``: ``factor`` 1e30 leaves weights as one step of ``--optimizer.lr 1e30`` does (finite, of 1e30)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    weights = load_weights(step_dir)
    shutil.rmtree(step_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that it assumes a single process
        scaled = {k: w * factor if k.startswith(prefix) else w for k, w in weights.items()}
        dcp.save(scaled, checkpoint_id=str(step_dir))


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


def tiny_run(
    dump: Path, steps: tuple[int, ...] = (0,), flavor: str = "debug", args=None, tokenizer: str = "gpt2"
) -> Path:
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
    start = {"pretrained": False, "source": "init", "path": None}
    save_run_metadata(str(dump), args.FAMILY, args, tokenizer=tokenizer, training_steps=max(steps), started_from=start)
    return dump


def tiny_hub_model(folder: Path) -> Path:
    """A random-init GPT-2 built with transformers (no weight of it made by our code) and GPT-2's BPE from
    the offline package: a Hugging Face folder as the hub serves one."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from dispersion_titan.tokenizer.encoders import bpe_files

    torch.manual_seed(3)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=128)).save_pretrained(folder)
    encoder_json, vocab_bpe = bpe_files()
    shutil.copyfile(encoder_json, folder / "vocab.json")  # the hub's gpt2 files, by other names
    shutil.copyfile(vocab_bpe, folder / "merges.txt")
    GPT2TokenizerFast.from_pretrained(folder, model_max_length=128).save_pretrained(folder)
    return folder


def hub_cache(cache: Path, repo: str, revision: str, files: Path) -> Path:
    """``files`` as revision ``revision`` of the hub model ``repo`` in a Hugging Face cache, its main now."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(files, folder / "snapshots" / revision)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    return folder / "snapshots" / revision
