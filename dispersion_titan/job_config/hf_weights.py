"""A Hugging Face folder a new run loads (``checkpoint.initial_load_in_hf``) against the model its ``[model]``
keys build, before any process starts: TorchTitan's load raised a 100-line traceback from every rank for a
missing shard or another shape, and read no tensor the model has no place for (an untied ``lm_head.weight``
under a tied head) nor any value of its config.json (RoPE, the norms' ε), so such a run trained from another
model than the folder's, silently. A DCP checkpoint (``job.fork_from``, ``checkpoint.initial_load_path``) of
another shape raised TorchTitan's 70-line ``Size mismatch`` traceback, exit 1, once the job had started."""

from __future__ import annotations

import glob
import json
import os
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import torch

from ..models import FAMILIES, family
from ..models.flavors import pretrained_config
from ..run_folder.checkpoints import check_complete, dcp_metadata, is_full
from ..run_folder.settings import fork_parent
from ..utils.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from ..config.schema import RunConfig


def check_hf_weights(config: RunConfig, args: Any, key: str, path: str) -> None:
    """Every tensor the load reads is in ``path``'s safetensors in its shape, and each there is read
    (``key``: the option that named ``path``); their headers are read, not their data."""
    from safetensors import SafetensorError
    from torchtitan.protocols.train_spec import get_train_spec

    name = config.model.name
    index = os.path.join(path, "model.safetensors.index.json")
    listed = _index_files(index, key) if os.path.isfile(index) else set()
    if gone := sorted(f for f in listed if not os.path.isfile(os.path.join(path, f))):
        raise ConfigError(
            f"{key}: {path}: model.safetensors.index.json names {gone[0]}{_more(gone)}, which is not there "
            "(a copy or download cut short?); copy the model's missing files in"
        )
    spec = get_train_spec(name)
    adapter = spec.state_dict_adapter(args, None)
    try:  # the names the load reads them by (gpt2's reader: either key naming)
        metadata = adapter.get_hf_storage_reader(path).read_metadata()
    except (SafetensorError, OSError, ValueError) as e:
        _shard_keys(path, key)  # names the file cut short
        raise ConfigError(f"{key}: {path}: unreadable safetensors ({e}); copy the model's files again") from None
    twice = [  # the same slice in two files: the load reads the one listed last, in directory order
        k for k, v in metadata.state_dict_metadata.items() if len({tuple(c.offsets) for c in v.chunks}) < len(v.chunks)
    ]
    if twice:
        files = [file for file, keys in _shard_keys(path, key).items() if twice[0] in keys] or ["two of its files"]
        raise ConfigError(
            f"{key}: {path}: {twice[0]}{_more(twice)} is in {' and '.join(files)}, and the load would read either; "
            "remove the file that is not the model's (an older download's shard?)"
        )
    held = {k: list(v.size) for k, v in metadata.state_dict_metadata.items()}
    with torch.device("meta"):
        model = spec.model_cls(args)
    wanted = {k: list(v.shape) for k, v in adapter.to_hf(model.state_dict()).items()}
    problems = [
        f"{k} is {held[k]} there, {shape} here" for k, shape in wanted.items() if k in held and held[k] != shape
    ]
    problems += [f"{k} is not there" for k in wanted if k not in held]
    hf = pretrained_config(config)  # the folder's: path is the one it reads
    problems += [f"{k} there is read by no part of this model" for k in held if k not in wanted and not _spare(k, hf)]
    if problems:
        raise ConfigError(
            f"{key}: {path} does not hold this {name} model's weights: {problems[0]}{_more(problems)}; "
            + _advice(config, args, hf)
        )
    if other := _computed_otherwise(hf, args):
        raise ConfigError(
            f"{key}: {path}: its config.json computes another model than this {name} (flavor {config.model.flavor}): "
            f"{other[0]}{_more(other)}, which no [model] key sets; give model.flavor the one of its model"
        )


def check_dcp_weights(config: RunConfig, args: Any, key: str, path: str) -> None:
    """Every weight of the model the ``[model]`` keys build is in the DCP checkpoint ``path`` in its shape (its
    ``.metadata`` read, not its data), and the train state too where the load asks for it; ``key``: the option that
    named it (a fork's ``job.fork_from``)."""
    try:
        check_complete(path)
    except CheckpointError as e:
        raise ConfigError(f"{key}: {e}") from None
    if not config.checkpoint.initial_load_model_only and not is_full(path):
        raise ConfigError(
            f"checkpoint.initial_load_model_only: false loads the optimizer, schedule and data position from {path} "
            "too, and it holds weights only (a last_save_model_only step); set it true to start from its weights"
        )
    held = {k: list(v.size) for k, v in dcp_metadata(path).state_dict_metadata.items() if hasattr(v, "size")}
    with torch.device("meta"):
        model = family(config.model.name).get_train_spec().model_cls(args)
    wanted = {k: list(v.shape) for k, v in model.state_dict().items()}
    problems = [f"{k} is {held[k]} there, {shape} here" for k, shape in wanted.items() if held.get(k, shape) != shape]
    problems += [f"{k} is not there" for k in wanted if k not in held]
    if not problems:
        return
    advice = "set the [model] keys to its shape, or give a checkpoint of this model"
    if key == "job.fork_from" and (parent := fork_parent(config)) is not None:
        now = {k: json.loads(json.dumps(attrgetter(k)(config), default=str)) for k in parent if k.startswith("model.")}
        other = [f"{k} {json.dumps(parent[k])} there, {json.dumps(v)} here" for k, v in now.items() if v != parent[k]]
        advice = "a fork keeps its source's model" + (f" ({', '.join(other)})" if other else "; give its [model] keys")
    raise ConfigError(
        f"{key}: {config.job.fork_from if key == 'job.fork_from' else path} holds another model than this "
        f"{config.model.name} (flavor {config.model.flavor}): {problems[0]}{_more(problems)}; {advice}"
    )


def _spare(key: str, hf: dict[str, Any]) -> bool:
    """A tensor transformers loads into nothing too: the head of a tied model saved beside its embeddings (some
    published tied checkpoints carry it; refused where config.json says the head is untied), and older exports'
    rotary buffers."""
    return (key == "lm_head.weight" and hf.get("tie_word_embeddings") is not False) or key.endswith(".inv_freq")


def _shard_keys(path: str, key: str) -> dict[str, set[str]]:
    """The tensors each ``*.safetensors`` file in ``path`` holds (its header), read again where the load's reader
    found a problem, to name its file; a file cut short named."""
    from safetensors import SafetensorError, safe_open

    shards = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        try:
            with safe_open(file, framework="pt") as f:
                shards[os.path.basename(file)] = set(f.keys())
        except (SafetensorError, OSError) as e:
            raise ConfigError(f"{key}: {file}: unreadable safetensors ({e}); copy the model's file again") from None
    return shards


def _index_files(index: str, key: str) -> set[str]:
    try:
        with open(index) as f:
            content = json.load(f)
    except ValueError as e:
        raise ConfigError(f"{key}: {index}: unreadable ({e}); copy the model's file again") from None
    files = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(files, dict) or not all(isinstance(file, str) for file in files.values()):
        raise ConfigError(f"{key}: {index}: holds no weight_map of tensors to files; copy the model's file again")
    return set(files.values())


def _more(items: list[str]) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def _computed_otherwise(hf: dict[str, Any], args: Any) -> list[str]:
    """config.json's values of what no tensor holds (RoPE, the norms' ε, the activation, a sliding window)
    where this model computes otherwise: loaded, its weights would compute another model, silently."""
    if not hasattr(args, "rope_theta"):  # gpt2: learned positions, its ε and activation GPT-2's
        return []
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict):  # a hand edit's: shown as the RoPE that differs (was an AttributeError traceback)
        rope = {"rope_type": rope}
    ours = args.rope_parameters()
    theirs = {k: rope.get(k) for k in ours} | {"rope_type": rope.get("rope_type", rope.get("type", "default"))}
    theirs["rope_theta"] = rope.get("rope_theta", hf.get("rope_theta"))
    ours |= {"rms_norm_eps": args.norm_eps, "hidden_act": "silu", "use_sliding_window": False}
    theirs |= {k: hf.get(k) for k in ("rms_norm_eps", "hidden_act", "use_sliding_window")}
    return [
        f"{k} = {json.dumps(theirs[k])} (this model: {json.dumps(v)})"
        for k, v in ours.items()
        if theirs[k] is not None and theirs[k] != v
    ]


def _advice(config: RunConfig, args: Any, hf: dict[str, Any]) -> str:
    """The ``[model]`` values the folder's ``config.json`` gives that differ from the run's, else what to give."""
    model_type = hf.get("model_type")
    if model_type and model_type != family(config.model.name).HF_MODEL_TYPE:
        other = next((name for name in FAMILIES if family(name).HF_MODEL_TYPE == model_type), None)
        return f"its config.json is a {model_type} model: " + (
            f"use --model.name {other}" if other else "give a folder of this family"
        )
    settable, fixed = [], []
    for field, ours in args.HF_FIELDS.items():
        here = args.value_of(ours)
        if hf.get(field) is None or hf[field] == here:
            continue
        if ours in args.OVERRIDES:
            settable.append(f"{ours} = {json.dumps(hf[field])} (here {json.dumps(here)})")
        elif ours in args.REFUSED_BECAUSE:
            why = args.REFUSED_BECAUSE[ours]
            fixed.append(f"{field} = {json.dumps(hf[field])}, which {config.model.name} cannot take ({why})")
    if settable:
        return "set [model] as its config.json says: " + ", ".join(settable)
    if fixed:
        return "its config.json has " + "; ".join(fixed)
    return "set the [model] keys to its shape, or give the folder of a model of this shape"
