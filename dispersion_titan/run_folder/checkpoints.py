"""Finding, selecting (``--steps``), validating and loading TorchTitan DCP checkpoints offline (one
process, no process group), whatever parallel layout saved them, model-only or full."""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import io
import json
import os
import pickle
import re
import shlex
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..models import family
from ..models.flavors import args_from_dict
from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder, encoder_named, hf_tokenizer, hub_snapshot, local_assets
from ..utils.errors import ArgumentError, CheckpointError, ConfigError, RenamedCheckpointError, RunFinished
from .outputs import FORMAT, FORMAT_KEY, STEP_FOLDER, check_format, write_json
from .owners import RUN_ID, RUN_METADATA_FILE, is_run, read_owner, run_paths

if TYPE_CHECKING:  # torch is imported where a checkpoint is read: run.json's readers (compare, table) need none
    import torch

SAVED_KEY = "saved_checkpoints"
"""``run.json``'s mark that the run saved a checkpoint: a relaunch finding none lost them, not never made them."""
LEDGER_KEYS = ("settings", "forked_from", "started_from", SAVED_KEY, "cwd", "tokenizer_sha256")
"""``run.json`` entries that record one run's first launch, not what makes runs one configuration (``cwd``: its
working directory, which its relative paths are relative to; ``tokenizer_sha256``: its tokenizer's ``fingerprint``)."""


@dataclass(frozen=True)
class StepCheckpoint:
    step: int
    path: str


def find_checkpoint_folder(run: str, give: str = "the run folder {run} with --steps {step}") -> str:
    """``run``, a dump folder or a checkpoint folder, to its checkpoint folder (``owners.run_paths``); one
    checkpoint's step folder is refused, saying to ``give`` its run and step instead."""
    if not os.path.isdir(run):
        raise CheckpointError(f"{run}: {'not a folder' if os.path.exists(run) else 'no such folder'}")
    refuse_moved_aside(run)
    if step := STEP_FOLDER.match(os.path.basename(os.path.abspath(run))):
        dump = run_of(os.path.dirname(os.path.abspath(run)))
        raise CheckpointError(
            f"{run}: one checkpoint's folder, not a run's; give {give.format(run=dump, step=step[1])}"
        )
    if hf_weights(run):  # was `no checkpoints (no step-N folders here …)`
        raise CheckpointError(f"{run}: a Hugging Face model's folder, not a run; give it as {shlex.quote('hf:' + run)}")
    if (owner := read_owner(run)) is not None and owner.kind != "run":  # an analysis's step-N are no checkpoints
        home = f"; give the run's folder {shlex.quote(owner.run)}" if owner.run and is_run(owner.run) else ""
        raise CheckpointError(f"{run}: {owner.describe()}, not a run's checkpoints{home}")
    if any(STEP_FOLDER.match(name) for name in os.listdir(run)):
        return run
    nested = run_paths(run)["checkpoint.folder"]
    if os.path.isdir(nested):
        return nested
    raise CheckpointError(f"{run}: no checkpoints (no step-N folders here or in {nested})")


def run_of(checkpoint_folder: str) -> str:
    """The dump folder of the run whose checkpoints ``checkpoint_folder`` holds (it may lie outside it)."""
    folder = os.path.abspath(checkpoint_folder)
    holder = read_owner(folder)
    if holder is not None and holder.kind == "run" and holder.run is not None:
        return holder.run
    real = os.path.realpath(folder)
    for parent in map(str, Path(folder).parents):
        if is_run(parent) and os.path.realpath(run_paths(parent)["checkpoint.folder"]) == real:
            return parent
    return os.path.dirname(folder)


def list_checkpoints(folder: str) -> list[StepCheckpoint]:
    found = []
    for name in os.listdir(folder):
        match = STEP_FOLDER.match(name)
        if match and os.path.isdir(os.path.join(folder, name)):
            found.append(StepCheckpoint(int(match.group(1)), os.path.join(folder, name)))
    return sorted(found, key=lambda c: c.step)


def select_steps(spec: str, available: list[StepCheckpoint]) -> list[StepCheckpoint]:
    """The checkpoints ``--steps`` names: ``all``, or a comma list of steps, inclusive ranges such as
    ``0,5,10-20``, and ``first`` / ``last`` (the run's earliest and latest complete checkpoints, known only
    once it has trained). A listed step must exist, a range may be empty, the selection not."""
    if spec.strip() == "all":
        return available
    by_step = {c.step: c for c in available}
    wanted: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if part in ("first", "last") and by_step:
            ends = available if part == "first" else available[::-1]
            wanted.add(next((c for c in ends if _is_saved(c.path)), ends[0]).step)
        elif part.isdigit():
            if int(part) not in by_step:
                raise ArgumentError(f"--steps: no checkpoint for step {part} (have {sorted(by_step)})")
            wanted.add(int(part))
        elif match := re.fullmatch(r"(\d+)-(\d+)", part):
            low, high = int(match.group(1)), int(match.group(2))
            if low > high:
                raise ArgumentError(f"--steps: empty range {part!r}")
            wanted.update(s for s in by_step if low <= s <= high)
        else:
            raise ArgumentError(f"--steps: {part!r} is not a step, a range A-B, first, last, or 'all'")
    if not wanted:
        raise ArgumentError(f"--steps: {spec!r} selects no checkpoint (have {sorted(by_step)})")
    return [by_step[s] for s in sorted(wanted)]


def _is_complete(step_dir: str) -> bool:
    """Whether ``check_complete`` passes; ``RenamedCheckpointError`` for a renamed checkpoint: complete, but its name
    lies, so it is never read, resumed from, moved aside as incomplete or counted as its name's step."""
    try:
        check_complete(step_dir)
    except RenamedCheckpointError:
        raise
    except CheckpointError:
        return False
    return True


def run_checkpoints(run: str, spec: str) -> tuple[str, str, list[StepCheckpoint]]:
    """The dump and checkpoint folders of ``run`` (either of them), and the checkpoints ``spec`` selects."""
    folder = find_checkpoint_folder(run)
    checkpoints = list_checkpoints(folder)
    if not checkpoints:
        raise CheckpointError(f"{folder}: no checkpoints (no step-N folders); train the run until it saves one")
    selected = select_steps(spec, checkpoints)
    return run_of(folder), folder, selected


def check_complete(step_dir: str) -> None:
    """``CheckpointError`` unless ``.metadata`` parses and every byte range it references exists."""
    if not os.path.isdir(step_dir):  # listed, then deleted: not damaged
        raise CheckpointError(
            f"{step_dir}: removed since it was listed (a run still training deletes older steps under "
            "checkpoint.keep_latest_k); run the command again, or once it has ended"
        )
    if not os.path.isfile(os.path.join(step_dir, ".metadata")):
        if hf_weights(step_dir):  # a job.fork_from of it: TorchTitan would read it as DCP
            raise CheckpointError(
                f"{step_dir}: weights only, in safetensors (last_save_in_hf); start a run from them with "
                f"--checkpoint.initial_load_path {shlex.quote(step_dir)} --checkpoint.initial_load_in_hf"
            )
        if os.path.isfile(os.path.join(step_dir, "model.safetensors.index.json")):  # last_save_in_hf cut short
            raise CheckpointError(f"{step_dir}: its safetensors missing (partial or corrupt checkpoint)")
        raise CheckpointError(f"{step_dir}: missing .metadata (partial or corrupt checkpoint)")
    try:
        metadata = dcp_metadata(step_dir)
    except OSError as e:
        raise CheckpointError(f"{step_dir}/.metadata: unreadable ({type(e).__name__}: {e})") from None
    except Exception:  # noqa: BLE001 - whatever unpickling a damaged file raises: no detail worth showing
        raise CheckpointError(
            f"{step_dir}/.metadata: damaged (not a DCP checkpoint's metadata), so "
            f"{os.path.basename(os.path.normpath(step_dir))} cannot be read; re-copy or remove that step, "
            "or use another step (analyze, evaluate: --steps)"
        ) from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for relative, size in needed.items():
        path = os.path.join(step_dir, relative)
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: missing (partial or corrupt checkpoint)")
        if os.path.getsize(path) < size:
            raise CheckpointError(
                f"{path}: truncated ({os.path.getsize(path)} of {size} bytes; partial or corrupt checkpoint)"
            )
    name, saved = STEP_FOLDER.match(os.path.basename(os.path.normpath(step_dir))), _saved_step(step_dir, metadata)
    if name is not None and saved is not None and saved != int(name[1]):
        right = os.path.join(os.path.dirname(os.path.normpath(step_dir)), f"step-{saved}")
        way_out = (  # mv onto a step-{saved} there would move it inside that checkpoint
            f"move it out of the checkpoint folder, which holds a step-{saved}"
            if os.path.lexists(right)
            else f"name it step-{saved} again"
        )
        raise RenamedCheckpointError(
            f"{step_dir}: holds step {saved} (TorchTitan's train_state.step), not step {name[1]} as its name says; "
            + way_out
        )


def dcp_metadata(step_dir: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(step_dir).read_metadata()


def _saved_step(step_dir: str, metadata: Any) -> int | None:
    """The step TorchTitan's train state in ``step_dir`` records (None: a weights-only checkpoint), read alone."""
    info = next((v for k, v in (metadata.storage_data or {}).items() if k.fqn == "train_state.step"), None)
    if info is None or getattr(info, "transform_descriptors", None):
        return None
    import torch

    try:
        with open(os.path.join(step_dir, info.relative_path), "rb") as file:
            file.seek(info.offset)
            step = torch.load(io.BytesIO(file.read(info.length)), weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError):
        return None  # corrupt: loading it says so
    return step if isinstance(step, int) else None


def save_run_metadata(
    folder: str,
    model_name: str,
    args: Any,
    dispersion: dict[str, Any] | None = None,
    seed: int | None = None,
    baseline: dict[str, Any] | None = None,
    tokenizer: str = "gpt2",
    training_steps: int | None = None,
    settings: dict[str, Any] | None = None,
    forked_from: dict[str, Any] | None = None,
    started_from: dict[str, Any] | None = None,
    paths: dict[str, str] | None = None,
) -> None:
    """Write ``run.json``: what the analysis, the converter and the reports need to know of a run
    (head count cannot be read off weights). The ledger (``LEDGER_KEYS``) is kept from the first
    launch that saved a step; ``paths`` (``owners.outside_folders``) is added to those recorded before."""
    first = recorded_run(folder) or {}
    ledger = {} if saved_nothing(folder, first) else {key: first[key] for key in LEDGER_KEYS if key in first}
    fields = {k: v for k, v in dataclasses.asdict(args).items() if not k.startswith("_")}
    paths = {**(first.get("paths") or {}), **(paths or {})}
    metadata = {
        FORMAT_KEY: FORMAT,
        RUN_ID: first.get(RUN_ID) or uuid.uuid4().hex,  # its results' owner wherever it is moved (owners.moved_away)
        "model_name": model_name,
        "model_args": fields,
        "tokenizer": tokenizer,
        "dispersion": dispersion,
        "baseline": baseline,
        "seed": seed,
        "training_steps": training_steps,
        "forked_from": forked_from,
        "started_from": started_from,
        "settings": settings,
        "cwd": os.getcwd(),
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        **ledger,
        **({"paths": paths} if paths else {}),
    }
    write_json(os.path.join(folder, RUN_METADATA_FILE), metadata)


def tokenizer_sha256(folder: str) -> str | None:
    """The ``fingerprint`` of the tokenizer in ``folder`` (its ``tokenizer.json`` and EOS id, as a token store
    records it); None for GPT-2's BPE, the package's own. A folder replaced between a run's launches would tokenize
    its data otherwise (``settings.check_same_settings``); an edit of its chat template would not."""
    return None if folder == GPT2_BPE.name or not os.path.isdir(folder) else encoder_named(folder).fingerprint()


def record_saved(dump_folder: str) -> None:
    """Mark in ``run.json`` that the run saved a checkpoint (once: later saves leave it as it is)."""
    metadata = load_run_metadata(dump_folder)
    if not metadata.get(SAVED_KEY):
        write_json(os.path.join(dump_folder, RUN_METADATA_FILE), {**metadata, SAVED_KEY: True})


def load_run_metadata(dump_folder: str) -> dict[str, Any]:
    """The ``run.json`` of a dump folder, checked for the keys every reader uses."""
    path = os.path.join(dump_folder, RUN_METADATA_FILE)
    try:
        metadata = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; it is written by dispersion_titan.train at start") from None
    except (OSError, ValueError) as e:  # ValueError: JSON's or UTF-8's (was a traceback for a non-UTF-8 byte)
        raise CheckpointError(
            f"{path}: unreadable ({e}); restore it: it records the run's model and settings"
        ) from None
    if not isinstance(check_format(metadata, path).get("model_args"), dict):
        raise CheckpointError(f"{path}: invalid (no model_args)")
    return metadata


def run_encoder(dump_folder: str) -> DocumentEncoder:
    """The tokenizer the run trained with, as its ``run.json`` records it: GPT-2's BPE, a hub snapshot's revision
    (from this machine's cache, wherever the run's was), or a folder that has to be where it was."""
    name = load_run_metadata(dump_folder)["tokenizer"]
    if name != GPT2_BPE.name and not os.path.isdir(name):
        if snapshot := hub_snapshot(name):
            field = f"{os.path.join(dump_folder, RUN_METADATA_FILE)}: tokenizer"
            return hf_tokenizer(local_assets(snapshot[0], field, revision=snapshot[1]))
        raise ConfigError(
            f"{os.path.join(dump_folder, RUN_METADATA_FILE)}: the run's tokenizer folder {name} (its "
            "model.hf_assets_path) is gone; put it back there (a symbolic link to where it is now will do)"
        )
    return encoder_named(name)


def recorded_run(dump_folder: str) -> dict[str, Any] | None:
    """The ``run.json`` of ``dump_folder``, or None when it has none (a new run)."""
    return load_run_metadata(dump_folder) if is_run(dump_folder) else None


def saved_nothing(dump_folder: str, metadata: dict[str, Any]) -> bool:
    """Whether the run of ``metadata`` (its ``run.json``) checkpoints but its launches all ended before the first
    save (a typo met at rank start, a rank killed at step 1): nothing of it to keep, so its ledger does not bind
    the next launch, which starts it anew with its own settings."""
    if metadata.get(SAVED_KEY) or not (metadata.get("settings") or {}).get("checkpoint.enable", True):
        return False
    return not complete_checkpoints(run_paths(dump_folder)["checkpoint.folder"])


def dispersion_variant(run_dir: str) -> str | None:
    """The dispersion settings recorded in the run's ``run.json``; None when it has none."""
    try:
        dispersion = load_run_metadata(run_dir).get("dispersion")
    except CheckpointError:
        return None
    if not isinstance(dispersion, dict) or "variant" not in dispersion:
        return None
    variant = dispersion["variant"]
    return variant if variant == "none" else f"{variant} λ={dispersion.get('coeff')}"


def load_model_args(checkpoint_dir: str) -> Any:
    """The family's arguments with the shape recorded in the run's dump folder (``run_of``)."""
    dump = run_of(checkpoint_dir)
    metadata = load_run_metadata(dump)
    try:
        return args_from_dict(metadata["model_name"], metadata["model_args"])
    except (KeyError, TypeError, ValueError, ModuleNotFoundError) as e:
        raise CheckpointError(f"{os.path.join(dump, RUN_METADATA_FILE)}: invalid ({e})") from None


def hf_weights(step_dir: str) -> list[str]:
    """The safetensors files of a ``last_save_in_hf`` checkpoint; none for a DCP one (``.metadata``)."""
    if os.path.isfile(os.path.join(step_dir, ".metadata")):
        return []
    return sorted(glob.glob(os.path.join(step_dir, "*.safetensors")))


def load_hf_weights(step_dir: str, args: Any) -> dict[str, torch.Tensor]:
    """A ``last_save_in_hf`` checkpoint's weights under our names (the family's adapter), in the dtype saved."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    hf = {}
    for path in hf_weights(step_dir):
        try:
            hf.update(load_file(path))
        except SafetensorError as e:  # a file cut short by a crash or a full disk
            raise CheckpointError(f"{path}: damaged ({e}; partial or corrupt checkpoint)") from None
    try:
        return family(args.FAMILY).get_train_spec().state_dict_adapter(args, None).from_hf(hf)
    except KeyError as e:
        raise CheckpointError(f"{step_dir}: no weight {e} (partial checkpoint, or another model's)") from None


def initialised_model(args: Any) -> torch.nn.Module:
    """A plain model of ``args``' family on CPU, initialised as the trainer does (built on meta, then
    ``to_empty`` and ``init_weights``: from the seed of ``torch.manual_seed``, a shared LM head tied, buffers such
    as a RoPE table computed)."""
    import torch

    with torch.device("meta"):
        model = family(args.FAMILY).get_train_spec().model_cls(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    return model


def load_model(
    step_dir: str, args: Any, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """A plain (unsharded) model of ``args``' family holding the weights of ``step_dir`` (in ``dtype``, default
    float32); ``initialised_model`` before loading."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    in_hf = hf_weights(step_dir)
    if not in_hf:
        check_complete(step_dir)
    model = initialised_model(args)
    state = model.state_dict()
    if in_hf:
        state.update(load_hf_weights(step_dir, args))
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # DCP warns that it assumes a single process
                dcp.load(state, checkpoint_id=step_dir)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP raises many types for bad files
            # DCP wraps each rank's exception in a CheckpointException: what failed is inside.
            failure = next(iter(e.failures.values()))[0] if isinstance(e, CheckpointException) and e.failures else e
            if isinstance(failure, KeyboardInterrupt):  # a Ctrl-C or SIGTERM, which DCP wraps as a failure too
                raise KeyboardInterrupt(*failure.args) from None
            if isinstance(failure, pickle.UnpicklingError):  # torch advises weights_only=False: never on such a file
                why = "corrupt shard data: its tensor records do not unpickle"
            else:
                why = f"{type(failure).__name__}: {(str(failure).splitlines() or [''])[0]}"
            raise CheckpointError(f"{step_dir}: cannot be loaded ({why})") from None
    model.load_state_dict(state)
    model.to(device=device)
    dtype = dtype or torch.float32
    for param in model.parameters():  # not Module.to(dtype): it would drop the imaginary part of
        param.data = param.data.to(dtype)  # Llama 3's complex RoPE buffer; buffers keep their precision
    return model.eval()


QUARANTINE_DIR = "incomplete"


def quarantine_incomplete(folder: str) -> list[str]:
    """Move every step-N folder that fails ``check_complete`` into ``folder/incomplete/`` (never
    deleted), so TorchTitan never resumes from a half-written one; the new paths."""
    complete, moved = complete_checkpoints(folder), []
    for ckpt in list_checkpoints(folder) if os.path.isdir(folder) else []:
        if ckpt not in complete:
            target_dir = os.path.join(folder, QUARANTINE_DIR)
            os.makedirs(target_dir, exist_ok=True)
            target = os.path.join(target_dir, f"{os.path.basename(ckpt.path)}.{time.strftime('%Y%m%d-%H%M%S')}")
            os.rename(ckpt.path, target)
            moved.append(target)
    return moved


def refuse_moved_aside(path: str) -> None:
    """A step ``quarantine_incomplete`` moved aside, named as a run or a checkpoint: said so (was read as a run,
    `no checkpoints (no step-N folders …)`, or as a step whose run.json is missing)."""
    folder = os.path.abspath(path)
    parent, name = os.path.split(folder)
    if os.path.basename(parent) == QUARANTINE_DIR and re.match(r"step-\d+\.", name):
        raise CheckpointError(
            f"{path}: an incomplete checkpoint (partial or corrupt) a relaunch moved aside, never loaded; give a "
            f"complete step of run {run_of(os.path.dirname(parent))}"
        )


def is_full(step_dir: str) -> bool:
    """Whether a checkpoint can be resumed from: it holds the train state, not only weights."""
    keys = dcp_metadata(step_dir).state_dict_metadata
    return any(key.startswith("train_state.") for key in keys)


def saved_dtype(step_dir: str) -> torch.dtype:
    """The precision a DCP checkpoint holds its weights in: ``checkpoint.export_dtype`` where TorchTitan cast a
    weights-only last step to it (``last_save_model_only``), else float32."""
    import torch

    dtypes = {
        entry.properties.dtype
        for entry in dcp_metadata(step_dir).state_dict_metadata.values()
        if hasattr(entry, "properties") and entry.properties.dtype.is_floating_point
    }
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


def checkpoint_identity(step_dir: str, model_folder: bool = False) -> str:
    """A cheap fingerprint of a checkpoint, recorded by its results: one saved again since has another. Its
    subfolders count (a ``last_save_in_hf`` step's ``sharded/``), as in the identities its results recorded; a Hugging
    Face ``model_folder``'s do not (another revision's, or an ``--out`` made inside it, which changed with every
    result written there)."""
    metadata = b"" if model_folder or hf_weights(step_dir) else Path(step_dir, ".metadata").read_bytes()
    digest = hashlib.sha256(metadata)
    for entry in sorted(os.scandir(step_dir), key=lambda entry: entry.name):
        if not (model_folder and entry.is_dir()):
            stat = entry.stat()
            digest.update(f"{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def identity_changed(recorded: str, step_dir: str, model_folder: bool = False) -> bool:
    """Whether ``step_dir`` (a Hugging Face ``model_folder``) no longer holds the weights ``recorded`` (False if gone
    or unreadable: its load says why)."""
    try:
        return checkpoint_identity(step_dir, model_folder) != recorded
    except OSError:
        return False


def complete_checkpoints(folder: str) -> list[StepCheckpoint]:
    """The checkpoints of ``folder`` that pass ``check_complete``, oldest first (``_is_complete``)."""
    return [c for c in (list_checkpoints(folder) if os.path.isdir(folder) else []) if _is_complete(c.path)]


def _is_saved(step_dir: str) -> bool:
    """Whether a reader can load the step: a complete DCP checkpoint, or ``last_save_in_hf``'s safetensors."""
    return bool(hf_weights(step_dir)) or _is_complete(step_dir)


def saved_checkpoints(folder: str) -> list[StepCheckpoint]:
    """The checkpoints of ``folder`` a reader can load (``_is_saved``), oldest first; a ``last_save_in_hf`` one holds
    weights only."""
    return [c for c in (list_checkpoints(folder) if os.path.isdir(folder) else []) if _is_saved(c.path)]


def last_complete_step(folder: str, before: int | None = None) -> int | None:
    """The newest step of ``folder`` whose checkpoint is complete (below ``before`` if given), or None."""
    return max((c.step for c in complete_checkpoints(folder) if before is None or c.step < before), default=None)


def trained_to(folder: str, steps: int) -> bool:
    """Whether the checkpoint folder ``folder`` holds a complete checkpoint (DCP, or ``last_save_in_hf``'s
    safetensors) of step ``steps`` or later: the sweep's, the paper's and the quickstart's one notion of a run trained
    (a last checkpoint half written is not), as ``check_resume`` finds it finished."""
    return any(c.step >= steps for c in saved_checkpoints(folder))


def check_loader_layout(step_dir: str, data_parallel_degree: int) -> None:
    """Refuse to load a streamed corpus's per-rank positions on another number of data-parallel ranks."""
    keys = dcp_metadata(step_dir).state_dict_metadata
    saved = sum(1 for key in keys if key.startswith("dataloader.dp_rank_"))  # a streamed corpus's, one per rank
    if saved and saved != data_parallel_degree:
        raise CheckpointError(
            f"parallelism: {step_dir} holds the per-rank positions of a streamed corpus for {saved} "
            f"data-parallel ranks and this run has {data_parallel_degree}; resume it with {saved}, or train "
            "from a token store (python -m dispersion_titan.data), whose position any number of ranks resumes"
        )


def refuse_finished(saved: list[StepCheckpoint], steps: int, load_step: int) -> None:
    """``RunFinished`` when the newest of the ``saved`` checkpoints reached ``steps`` and no ``load_step`` is asked."""
    if load_step < 0 and saved and saved[-1].step >= steps:
        done = "finished" if saved[-1].step == steps else f"past training.steps = {steps},"
        raise RunFinished(f"run already {done} at step {saved[-1].step}; nothing to do")


def check_resume(folder: str, dump: str, steps: int, data_parallel_degree: int, load_step: int = -1) -> None:
    """Before any process group starts: ``RunFinished`` when the run ``dump`` is done, and
    ``CheckpointError`` when no checkpoint continues it or going on would save over an existing
    checkpoint (a weights-only newest one, an older ``load_step``): fork such a run on purpose."""
    saved, recorded = saved_checkpoints(folder), recorded_run(dump)
    if not saved and (recorded or {}).get(SAVED_KEY):  # TorchTitan would start again from step 0
        raise CheckpointError(
            f"{folder}: {'holds no complete checkpoint' if os.path.isdir(folder) else 'missing'}, but run {dump} "
            "saved checkpoints there (run.json); restore them, or train anew in a new --job.dump_folder"
        )
    if saved and recorded is None:  # was resumed with any settings, recorded anew as the run's from its start
        raise CheckpointError(
            f"{os.path.join(dump, RUN_METADATA_FILE)}: missing, but {folder} holds this run's checkpoints (step-"
            f"{saved[-1].step}); it records the settings they were trained with, which a relaunch keeps: restore it, "
            "or train anew in a new --job.dump_folder"
        )
    if load_step >= 0 and os.path.isdir(folder) and load_step not in [c.step for c in saved]:
        have = ", ".join(str(c.step) for c in saved) or "none"
        raise CheckpointError(
            f"checkpoint.load_step: {load_step}: {folder} holds no complete step-{load_step} (complete steps: "
            f"{have}); name one of them, or -1 for the newest"
        )
    if not saved:
        return
    newest = saved[-1]
    chosen = [c for c in saved if c.step == load_step] if load_step >= 0 else saved
    refuse_finished(saved, steps, load_step)
    for name in sorted(os.listdir(folder)):  # TorchTitan trained up to that step, then could not save it
        if STEP_FOLDER.match(name) and not os.path.isdir(path := os.path.join(folder, name)):
            if os.path.islink(path):  # its disk not mounted, its folder moved: what it named is not lost
                raise CheckpointError(
                    f"{path}: a link to {os.readlink(path)}, which is no folder (not mounted, moved or removed?), "
                    f"where the run saves its {name} checkpoint; bring that folder back, or remove the link, and "
                    "relaunch"
                )
            raise CheckpointError(
                f"{path}: not a folder, where the run saves its {name} checkpoint; move it away and relaunch"
            )
    full = [c for c in chosen if not hf_weights(c.path) and is_full(c.path)]
    dump = os.path.abspath(dump)
    if not full:
        start = (
            f"--checkpoint.initial_load_path {shlex.quote(newest.path)} --checkpoint.initial_load_in_hf"
            if hf_weights(newest.path)
            else f"--job.fork_from {shlex.quote(f'{dump}@{newest.step}')}"
        )
        raise CheckpointError(
            f"{newest.path} holds weights only (checkpoint.last_save_model_only) and no earlier checkpoint is "
            f"full, so the run cannot continue to step {steps}; start a new job.dump_folder from its weights "
            f"with {start}"
        )
    resume = full[-1]
    if resume.step < newest.step:
        why = (
            f"step-{newest.step} holds weights only"
            if load_step < 0
            else f"checkpoint.load_step = {load_step} is older than step-{newest.step}"
        )
        raise CheckpointError(
            f"{folder}: resuming from step {resume.step} ({why}) would train over step-{newest.step} and save "
            f"it again, and checkpoints are never overwritten; branch from step {resume.step} into a new folder "
            f"with --job.fork_from {shlex.quote(f'{dump}@{resume.step}')} --job.dump_folder NEW"
        )
    check_loader_layout(resume.path, data_parallel_degree)
