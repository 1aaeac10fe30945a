"""A checkpoint written as a Hugging Face model directory, for ``convert to-hf`` and the evaluation;
``convert``'s help describes it."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from ..models import family
from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder, bpe_files
from ..utils.errors import WRITE_ADVICE, CheckpointError, OutputError
from ..utils.records import STAGING
from .checkpoints import (
    check_complete,
    find_checkpoint_folder,
    hf_weights,
    list_checkpoints,
    load_hf_weights,
    load_model,
    load_model_args,
    refuse_moved_aside,
    run_encoder,
    run_of,
    saved_checkpoints,
    saved_dtype,
)
from .outputs import STEP_FOLDER
from .owners import FolderOwner, owned

if TYPE_CHECKING:  # torch is imported where weights are read or written: evaluate table needs none
    import torch


CONFIG = "config.json"
"""A Hugging Face model folder's config: what tells one apart (``resolve_step_dir``), the last file an export writes."""


def resolve_step_dir(path: str) -> str:
    """``path`` when it is one checkpoint; for a run, its newest complete checkpoint."""
    path = path.rstrip("/")
    if not os.path.isdir(path):
        what = "a file, not a folder" if os.path.exists(path) else "no such folder"  # e.g. RUN/run.json
        raise CheckpointError(f"{path}: {what} (pass a run folder or one of its checkpoint/step-N)")
    refuse_moved_aside(path)
    step = STEP_FOLDER.match(os.path.basename(os.path.abspath(path)))
    if os.path.isfile(os.path.join(path, ".metadata")):
        return path  # a DCP checkpoint
    if hf_weights(path):
        if step and not os.path.isfile(os.path.join(path, CONFIG)):
            return path  # a last_save_in_hf checkpoint: TorchTitan writes no config.json
        raise CheckpointError(
            f"{path}: a Hugging Face model folder, not a run's checkpoint/step-N; transformers and lm-eval load it "
            "as it is (pass a run folder or one of its checkpoint/step-N to export)"
        )  # was named by its parent's run.json, missing
    if step:
        check_complete(path)  # one checkpoint, incomplete: said so
    folder = find_checkpoint_folder(path)
    # Listed again where none was saved: a run training under keep_latest_k may have pruned each as it was checked
    # (the first check imports torch's DCP: seconds).
    if saved := saved_checkpoints(folder) or saved_checkpoints(folder):
        return saved[-1].path
    found = list_checkpoints(folder)
    what = ", ".join(f"step-{c.step}" for c in found) + ": incomplete" if found else "none saved"
    raise CheckpointError(f"{path}: no complete checkpoint in {folder} ({what}); convert once the run has saved one")


def hf_state_dict(step_dir: str, args: Any, vocab_size: int) -> dict[str, torch.Tensor]:
    """The checkpoint's weights under the family's HF names, in the precision it holds them (``export_dtype``'s of
    a last step), rows past ``vocab_size`` (padding) cut."""
    adapter = family(args.FAMILY).get_train_spec().state_dict_adapter(args, None)
    if hf_weights(step_dir):
        state = load_hf_weights(step_dir, args)
    else:
        check_complete(step_dir)  # before its metadata is read for the precision
        state = load_model(step_dir, args, dtype=saved_dtype(step_dir)).state_dict()
    hf = adapter.to_hf(state)
    if vocab_size < args.vocab_size:
        hf = {k: v[:vocab_size] if v.shape[0] == args.vocab_size else v for k, v in hf.items()}
    return {k: v.detach().contiguous().clone() for k, v in hf.items()}


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def save_tokenizer(folder: str, max_length: int, encoder: DocumentEncoder = GPT2_BPE) -> None:
    """The run's tokenizer files: copies of the model folder's own, or GPT-2's BPE files plus those
    ``transformers`` derives from them."""
    if encoder != GPT2_BPE:
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(encoder.name, name)):
                shutil.copyfile(os.path.join(encoder.name, name), os.path.join(folder, name))
        return
    from transformers import GPT2TokenizerFast

    encoder_json, vocab_bpe = bpe_files()
    shutil.copyfile(encoder_json, os.path.join(folder, "vocab.json"))
    shutil.copyfile(vocab_bpe, os.path.join(folder, "merges.txt"))
    GPT2TokenizerFast.from_pretrained(folder, model_max_length=max_length).save_pretrained(folder)


def to_hf(step_dir: str, out_dir: str, force: bool = False) -> None:
    """Export ``step_dir`` (or a run's newest complete checkpoint) into ``out_dir``: new, empty, or an interrupted
    export of this run (no ``config.json``)."""
    given, step_dir = step_dir, resolve_step_dir(step_dir)
    checkpoints = os.path.dirname(os.path.abspath(step_dir))
    dump = run_of(checkpoints)
    run_encoder(dump)  # a tokenizer folder gone: said before OUT_DIR is made
    owner = FolderOwner("HF export", dump)  # owned refuses another's OUT_DIR, or a file, before making it
    with owned(out_dir, owner, "OUT_DIR"):  # one export at a time; one that finished meanwhile is not overwritten
        if not force and os.path.isfile(os.path.join(out_dir, CONFIG)):  # a whole export; one interrupted is finished
            raise OutputError(f"OUT_DIR: {out_dir} is not empty (pass --force to overwrite its files)")
        try:
            _export_chosen(given, step_dir, out_dir)
        except CheckpointError:
            if step_dir == given.rstrip("/") or os.path.isdir(step_dir):
                raise  # the step named, or a fault of its own
            # Chosen, and pruned while read (a run still training under checkpoint.keep_latest_k): the newest, once.
            removed = f"{os.path.basename(step_dir)} removed meanwhile, under checkpoint.keep_latest_k"
            _export_chosen(given, resolve_step_dir(given), out_dir, removed)


def _export_chosen(given: str, step_dir: str, out_dir: str, why: str = "") -> None:
    """``export_checkpoint``, saying which step it converts where ``given`` is a run (``why``: of an earlier one)."""
    if step_dir != given.rstrip("/"):  # the run's newest complete checkpoint, and the newer ones passed over
        step, folder = int(STEP_FOLDER.match(os.path.basename(step_dir))[1]), os.path.dirname(os.path.abspath(step_dir))
        newer = [c.step for c in list_checkpoints(folder) if c.step > step]  # it may be gone from there now
        saved = [c.step for c in saved_checkpoints(folder) if c.step > step]  # since it was chosen (a live run's)
        groups = {"incomplete": [s for s in newer if s not in saved], "saved meanwhile": saved}
        notes = [*([why] if why else []), *(f"{', '.join(f'step-{s}' for s in steps)}: {what}, passed over"
                                            for what, steps in groups.items() if steps)]  # fmt: skip
        passed = f" ({'; '.join(notes)})" if notes else ""
        print(f"converting {os.path.basename(step_dir).replace('-', ' ', 1)}{passed}: {step_dir}", file=sys.stderr)
    export_checkpoint(step_dir, out_dir)


@contextmanager
def os_error(path: str) -> Iterator[None]:
    """An I/O error of safetensors' or tokenizers' Rust code, which names its OS code only in its text (``File too
    large (os error 27)``), made an ``OSError`` of ``path`` again: the one line of a full disk, not a traceback.
    A full disk met by ``shutil.copyfile`` names ``path`` too (it named the file copied: the package's)."""
    try:
        yield
    except OSError as e:
        if e.errno not in WRITE_ADVICE:
            raise
        raise OSError(e.errno, e.strerror, path) from e
    except Exception as e:  # noqa: BLE001 - tokenizers' errors are plain Exceptions; re-raised unless of I/O
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), path) from e


def export_checkpoint(step_dir: str, out_dir: str) -> None:
    """Write ``step_dir`` as a Hugging Face folder ``out_dir`` (made and found writable by the caller), through a
    staging folder inside it (on its file system, should it be a mount point), its files moved in one by one, an
    earlier export's ``config.json`` removed first and the new one moved in last: the file that makes a model folder
    of it to transformers and lm-eval is there only once every other file is."""
    checkpoints = os.path.dirname(os.path.abspath(step_dir))
    args = load_model_args(checkpoints)
    encoder = run_encoder(run_of(checkpoints))
    config = family(args.FAMILY).hf_config(args, encoder)
    weights = hf_state_dict(step_dir, args, config.vocab_size)
    config.dtype = next(iter(weights.values())).dtype  # transformers' dtype="auto" loads them as saved
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix=STAGING, dir=out_dir, ignore_cleanup_errors=True) as staging:
        with os_error(os.path.join(out_dir, "model.safetensors")):
            save_file(weights, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
        os.chmod(os.path.join(staging, "model.safetensors"), 0o644)  # safetensors writes it 0600
        with os_error(os.path.join(out_dir, CONFIG)):
            config.save_pretrained(staging)
        with os_error(os.path.join(out_dir, "tokenizer.json")):
            save_tokenizer(staging, args.max_seq_len, encoder)
        with suppress(FileNotFoundError):
            os.unlink(os.path.join(out_dir, CONFIG))
        for name in sorted(os.listdir(staging), key=lambda name: name == CONFIG):
            os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
