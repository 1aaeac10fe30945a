"""Evaluate every selected checkpoint of one run with lm-eval, as ``analyze`` analyzes them, into per-step
result files, ``OUT/step-N/results.json`` (lm-eval's results of the per-task calls merged, plus our
``dispersion_titan`` entry), and the summary over steps. The tasks are resolved by lm-eval's TaskManager before
any model loads; a checkpoint is scored as HFLM sees its ``convert to-hf`` export (``lm_eval --model hf``'s scores
of that export), a Hugging Face model as it is."""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any
from unittest import mock

from ..components.wandb_run import log_results, recorded
from ..run_folder.checkpoints import (
    StepCheckpoint,
    checkpoint_identity,
    find_checkpoint_folder,
    identity_changed,
    load_run_metadata,
    run_checkpoints,
    run_of,
)
from ..run_folder.hf_export import export_checkpoint
from ..run_folder.outputs import (
    FORMAT,
    FORMAT_KEY,
    STEP_FOLDER,
    SUMMARY_FILE,
    check_format,
    read_result_folders,
    report_failed,
    still_to_do,
    write_csv,
    write_json,
)
from ..run_folder.owners import FolderOwner, owned, refuse_unless_ours
from ..run_folder.writer_lock import COMMAND, refuse_if_busy
from ..utils.devices import AUTOCAST, DTYPES, resolve_device
from ..utils.errors import (
    ArgumentError,
    CheckpointError,
    EvaluationError,
    ModelLoadError,
    cause,
    raise_no_room,
    say,
)
from ..utils.hub import PREFIX, HFSpec, hub_offline, loading, parse_spec, quiet_datasets_bars
from ..utils.records import STAGING, differences
from .protocol import mean_accuracy, run_protocol, select_tasks, task_scores

RESULT_FILE = "results.json"
OURS = "dispersion_titan"
BF16_AUTOCAST = {"mixed_precision_dtype": "bfloat16", "softmax_dtype": "float32"}
"""``--dtype autocast`` as HFLM runs it: the forward under bf16 autocast, the log-softmax of its logits in fp32,
as accelerate prepares a model for ``bf16=True`` (logits returned in fp32); the authors' LMEvalCallback scores
the model so prepared."""


def _model_name(run: str) -> str:
    """The model family of ``run``, or a hub model's ``model_type``."""
    if run.startswith(PREFIX):
        from transformers import AutoConfig

        path, revision = hub_location(run)
        with loading(run, os.path.isdir(path)):
            return AutoConfig.from_pretrained(path, revision=revision).model_type
    return load_run_metadata(run_of(find_checkpoint_folder(run)))["model_name"]


def hub_model(run: str) -> HFSpec:
    """``evaluate hf:MODEL[@REV]``: one revision of a hub model or local Hugging Face folder."""
    spec = parse_spec(run)
    if len(spec.revisions) > 1:
        raise ArgumentError(f"{run}: evaluate takes one revision of a model (hf:MODEL or hf:MODEL@REV)")
    return spec


class RunEvaluation:
    """One ``evaluate RUN``: what a user can get wrong is checked, and the tasks loaded, before
    anything is written or any model loads."""

    def __init__(self, options: argparse.Namespace):
        """``evaluate``'s command line; its protocol, unless given, the authors' for the run's family."""
        self.options = options
        self.hub = hub_model(options.run) if options.run.startswith(PREFIX) else None
        protocol, note = (options.protocol, None) if options.protocol else run_protocol(_model_name(options.run))
        if note:
            say(f"note: {note}")
        self.selection = select_tasks(options.tasks, options.num_fewshot, options.limit, protocol)
        if self.hub:  # the model as published: one result, step 0, as a run's model before training
            if not options.out:
                raise ArgumentError(f"--out: {options.run} has no run folder to write into; give --out DIR")
            if options.steps not in ("all", "0"):
                raise ArgumentError(f"--steps: {options.run} is evaluated once, as step 0 (the model as published)")
            self.selected = [StepCheckpoint(0, self.hub.name(self.hub.revisions[0]))]
            self.dump, seed = self.selected[0].path, None
        else:
            self.dump, _, self.selected = run_checkpoints(options.run, options.steps)
            seed = load_run_metadata(self.dump).get("seed")
        self.tasks = Tasks(self.selection.tasks, options.include_path)
        self.seeds = lm_eval_seeds(seed)
        self.device = resolve_device(options.device, options.dtype)
        self.settings = {**self.selection.settings(), "dtype": options.dtype}
        self.out = options.out or os.path.join(self.dump, "evaluation")
        refuse_if_busy(self.out, COMMAND)  # a busy folder's owner named first, before its results are read
        self.owner = FolderOwner("evaluation", self.dump)
        refuse_unless_ours(self.out, self.owner, "--out", "use another --out")
        self.objects = self.tasks.load(self.selection.num_fewshot) if self._pending() else {}

    def _pending(self) -> list[StepCheckpoint]:
        """Selected checkpoints still to evaluate (``outputs.still_to_do``; all with ``--force``)."""
        found = {} if self.options.force else read_evaluations(self.out)
        todo = still_to_do(
            self.out,
            {f"step-{c.step}": c.path for c in self.selected},
            {f"step-{step}": result for step, result in found.items()},
            lambda result: differences(comparable(settings(result)), comparable(self.settings)),
            lambda path, result: source_changed(result[OURS], path),
            "evaluated",
        )
        return [c for c in self.selected if f"step-{c.step}" in todo]

    def evaluate(self) -> int:
        """Evaluate pending checkpoints and refresh the summary, as ``--out``'s one writer; the count that failed."""
        if self.options.wandb:
            recorded(self.dump)  # before any model loads: a run without one fails now, in one line
        with owned(self.out, self.owner):
            todo = self._pending()  # again: another writer may have finished since __init__ looked
            if todo and not self.objects:
                self.objects = self.tasks.load(self.selection.num_fewshot)
            failed, rows = self._evaluate(todo)
        if self.options.wandb:  # each step's row of summary.csv unrounded, then the summary itself
            per_step = {row["step"]: {k: v for k, v in row.items() if k != "step" and v is not None} for row in rows}
            log_results(self.dump, "evaluate", "evaluation", per_step, self.out)
        return failed

    def _evaluate(self, todo: list[StepCheckpoint]) -> tuple[int, list[dict]]:
        """The count that failed, and the ``summary_row`` of every step in ``--out`` (those of earlier runs too)."""
        from lm_eval.utils import handle_non_serializable  # how lm-eval itself writes its results

        if skipped := len(self.selected) - len(todo):
            print(f"{skipped} step(s) already evaluated in {self.out} (--force recomputes them)")
        failed = []
        for index, checkpoint in enumerate(todo, 1):
            print(f"step {checkpoint.step} ({index} of {len(todo)} checkpoints)", flush=True)
            try:
                result = self._evaluate_step(checkpoint)
            except CheckpointError as e:
                print(f"dispersion_titan: skipped checkpoint: {e}", file=sys.stderr, flush=True)
                failed.append(checkpoint.path)
                continue
            path = os.path.join(self.out, f"step-{checkpoint.step}", RESULT_FILE)
            write_json(path, result, default=handle_non_serializable)
            mean = mean_accuracy(result_scores(result))
            print(
                f"step {checkpoint.step}: mean acc {'-' if mean is None else f'{mean:.4f}'} "
                f"({result[OURS]['seconds']:.1f} s)",
                flush=True,
            )
        results = read_evaluations(self.out)  # summary.csv over every step evaluated here, whatever its settings
        ours = comparable(self.settings)
        if other := sorted(step for step, result in results.items() if comparable(settings(result)) != ours):
            say(
                f"note: step(s) {other} in {self.out} were evaluated with other settings (kept by --force); "
                "summary.csv keeps their rows, and each step-N/results.json its settings"
            )
        rows = [summary_row(result) for _, result in sorted(results.items())]
        if rows:  # a column for every task any step was scored on
            tasks = dict.fromkeys(key for row in rows for key in row if key not in ("step", "mean_acc"))
            write_csv(
                path := os.path.join(self.out, SUMMARY_FILE),
                [{k: row.get(k) for k in ("step", *tasks, "mean_acc")} for row in rows],
            )
            print(f"results: {path}")
        return report_failed(failed, len(self.selected), "checkpoints", "evaluated"), rows

    def _evaluate_step(self, checkpoint: StepCheckpoint) -> dict:
        """lm-eval's HFLM on the exported checkpoint, one ``simple_evaluate`` per task (progress per task)."""
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM

        start = time.time()
        selection = self.selection
        merged: dict = {}
        with hflm_location(checkpoint.path, self.out) as (folder, revision), quiet_lm_eval():
            local = self.hub is not None and os.path.isdir(folder)  # a Hugging Face folder's weights: the user's
            with loading(checkpoint.path, local=True) if local else contextlib.nullcontext():  # (was a traceback)
                lm = HFLM(
                    pretrained=folder,
                    revision=revision,
                    device=str(self.device),
                    dtype=DTYPES[self.options.dtype],
                    batch_size=self.options.batch_size,
                    **(BF16_AUTOCAST if self.options.dtype == AUTOCAST else {}),
                )
            refuse_non_finite_logits(lm.model)
            identity = source_identity(checkpoint.path, folder, lm.config)
            for index, name in enumerate(selection.tasks, 1):
                task_start = time.time()
                try:
                    result = simple_evaluate(
                        model=lm,
                        tasks=self.objects[name],
                        task_manager=self.tasks.manager,
                        num_fewshot=selection.num_fewshot[name],
                        limit=selection.limit,
                        batch_size=self.options.batch_size,
                        device=str(self.device),
                        log_samples=False,
                        **self.seeds,
                    )
                except (CheckpointError, OverflowError) as e:  # OverflowError: lm-eval's exp() of a huge perplexity
                    why = e if isinstance(e, CheckpointError) else "its perplexity is past float's range"
                    raise CheckpointError(
                        f"{checkpoint.path}: task {name}: {why}; a diverged or damaged model, nothing recorded"
                    ) from None
                merge(merged, result)
                shown = [  # lm-eval's main numbers, e.g. acc 0.2500, acc_norm 0.3000
                    f"{key.split(',')[0]} {value:.4f}"
                    for key, value in result["results"].get(name, {}).items()
                    if isinstance(value, float) and "_stderr" not in key
                ]
                print(
                    f"step {checkpoint.step} [{index}/{len(selection.tasks)}] {name}: "
                    f"{', '.join(shown) or 'no metrics'} ({time.time() - task_start:.1f} s)",
                    flush=True,
                )
        merged[OURS] = {
            FORMAT_KEY: FORMAT,
            "settings": self.settings,
            "lm_eval_version": merged.get("lm_eval_version"),
            "step": checkpoint.step,
            "checkpoint": checkpoint.path if self.hub else os.path.abspath(checkpoint.path),
            "checkpoint_identity": identity,
            "run": self.dump,
            "include_path": self.tasks.include_path,
            "device": self.device.type,
            "batch_size": self.options.batch_size,
            "seeds": self.seeds,
            "seconds": time.time() - start,
        }
        return merged


@functools.cache
def _env_info() -> dict:
    from lm_eval.loggers.utils import add_env_info

    info: dict = {}
    add_env_info(info)
    return info


def quiet_lm_eval() -> Any:
    """Two records lm-eval adds to every ``simple_evaluate`` result, made without their cost or noise: its environment
    (``pretty_env_info``: torch's ``collect_env``, which runs ``pip list`` and more, 0.5 s of CPU and 1 s each time)
    gathered once per process; its ``git_hash`` by lm-eval's own fallback, which reads ``.git`` quietly (the same hash
    in a checkout, else None), not ``git describe``, whose "fatal: not a git repository" outside a checkout reaches
    the console (EleutherAI/lm-evaluation-harness#1691)."""
    from lm_eval import evaluator
    from lm_eval.loggers.utils import get_commit_from_path

    return mock.patch.multiple(
        evaluator,
        add_env_info=lambda storage: storage.update(_env_info()),
        get_git_commit_hash=functools.partial(get_commit_from_path, os.getcwd()),
    )


def lm_eval_seeds(training_seed: int | None) -> dict[str, int]:
    """``simple_evaluate``'s four seeds, each the training seed as in the authors' LMEvalCallback. numpy takes
    0..2**32-1 only: the seed of a run trained before launches refused others is taken mod 2**32, in a note."""
    if training_seed is None:
        return {}
    seed = int(training_seed) % 2**32
    if seed != training_seed:
        say(f"note: run.json's seed {training_seed} is outside numpy's 0..{2**32 - 1}; lm-eval is seeded with {seed}")
    return dict.fromkeys(("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed"), seed)


def merge(merged: dict, result: dict) -> None:
    """Fold one ``simple_evaluate`` result (one task or group) into ``merged``, dict by dict but lm-eval's
    ``config``, which describes the run: the last call's wins."""
    for key, value in result.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) and key != "config" else value


def read_evaluations(out: str) -> dict[int, dict]:
    """Every step evaluated in ``out`` (``{}`` when there is none), by step; each of this ``FORMAT``."""
    found = read_result_folders(out, RESULT_FILE, _readable, STEP_FOLDER)
    return {int(STEP_FOLDER.match(name)[1]): result for name, result in found.items()}


def _readable(result: dict, path: str) -> tuple[dict, object]:
    """``result`` and its step, once its numbers read as the table and the best step read them."""
    check_format(result.get(OURS), path)
    try:
        result_scores(result)
        return result, result[OURS]["step"]
    except (KeyError, TypeError, ValueError) as e:
        raise EvaluationError(f"{path}: unreadable ({cause(e)}); restore it, or remove it and rerun") from None


def settings(result: dict) -> dict:
    return result[OURS]["settings"]


def comparable(settings: dict) -> dict:
    """``settings`` as two evaluations compare them: the tasks in any order (each scored on its own, alike)."""
    return {**settings, "tasks": sorted(settings["tasks"])}


def result_scores(result: dict) -> dict[str, float]:
    return task_scores(result["results"], settings(result)["tasks"])


def summary_row(result: dict) -> dict:
    """A step's scores and their mean accuracy (None: none is an accuracy)."""
    scores = result_scores(result)
    return {"step": result[OURS]["step"], **scores, "mean_acc": mean_accuracy(scores)}


def _not_for_us(record: logging.LogRecord) -> bool:
    """lm-eval's warnings at each task, dropped: with a ``custom_dataset`` (our offline tasks'), two lines of advice
    on its own CLI's ``--metadata``, which ``evaluate`` has not; where ``simple_evaluate``'s ``num_fewshot`` replaces
    the config's shots, which the protocol (or ``--num-fewshot``) sets on purpose and ``results.json`` records."""
    return "Custom kwargs can be passed to `--metadata`" not in record.getMessage() and (
        record.msg != "Overwriting default num_fewshot of %s from %s to %s"
    )


def unreadable_yamls(folder: str) -> str:
    """The task YAMLs under ``folder`` lm-eval 0.4.13's index skips, each with why ("" if none)."""
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    skipped = []
    for path in TaskIndex._iter_yaml_files(Path(folder)):
        try:
            TaskIndex.process_cfg(load_yaml(path, resolve_func=False, recursive=True), path, {})
        except Exception as e:  # noqa: BLE001 - what the index catches
            skipped.append(f"{path} ({type(e).__name__}: {' '.join(str(e).split()) or cause(e)})")
    return ", ".join(skipped)


def check_include_path(include_path: str | None) -> None:
    """A readable folder (or none given), or a one-line error naming it; a sweep checks its evaluate jobs' before
    the trainings."""
    if not include_path:
        return
    try:
        os.listdir(include_path)
    except OSError as e:  # none there, a file, not readable
        raise EvaluationError(
            f"--include-path: {include_path}: {(e.strerror or str(e)).lower()} "
            "(give a readable folder holding the task YAMLs)"
        ) from None


class Tasks:
    """The requested tasks in one TaskManager: only --include-path's when each is a plain task there (indexing
    lm-eval's ~14,000 built-in task YAMLs takes 5.6 s of CPU)."""

    def __init__(self, names: tuple[str, ...], include_path: str | None):
        from lm_eval.tasks import TaskManager

        self.names = names
        self.include_path = os.path.abspath(include_path) if include_path else None
        check_include_path(include_path)
        own = TaskManager(include_path=self.include_path, include_defaults=False) if include_path else None
        fits = own is not None and set(names) <= set(own.all_subtasks)
        self.manager = own if fits else TaskManager(include_path=self.include_path)
        unknown = [name for name in names if name not in self.manager.all_tasks]
        broken = unknown and self.include_path and unreadable_yamls(self.include_path)
        if broken:  # lm-eval's index skips them (logged at debug level): was `unknown task`, the YAML unnamed
            raise EvaluationError(
                f"--tasks: unknown task {', '.join(unknown)}; lm-eval skips the task YAMLs in --include-path it "
                f"cannot read: {broken}; fix them"
            )
        if unknown:
            where = f"lm-eval {version('lm_eval')}" + (f" or {self.include_path}" if self.include_path else "")
            raise EvaluationError(
                f"--tasks: unknown task {', '.join(unknown)} (not in {where}; lm-eval --tasks list shows the names)"
            )

    def load(self, shots: dict[str, int | None]) -> dict[str, list[Any]]:
        """Each name's lm-eval Task or Group objects, built once; an unreachable hub's offline mode on first,
        so missing data fail at once (not after 30 s of retries); ``shots`` (each name's) that a task has too
        few examples for are refused."""
        import datasets.config

        objects = {}
        for logger in ("lm_eval.api.task", "lm_eval.evaluator"):
            logging.getLogger(logger).addFilter(_not_for_us)  # added once, however often called
        with hub_offline() as offline, quiet_datasets_bars():
            for name in self.names:
                try:
                    loaded = self.manager.load([name])
                except Exception as e:  # noqa: BLE001 - lm-eval and datasets raise many types
                    raise_no_room(e, datasets.config.HF_DATASETS_CACHE)
                    if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.ENOTDIR) and e.filename:
                        raise EvaluationError(  # where datasets caches the tasks' data: not the task's fault
                            f"{e.filename}: {e.strerror} (datasets' cache, loading task {name}); set HF_HOME, or "
                            "HF_DATASETS_CACHE, to a writable folder with room"
                        ) from None
                    message = str(e).splitlines()[0] if str(e) else ""
                    why = (
                        f"; not in the local Hugging Face cache, and the hub is not asked: {offline}"
                        if offline and isinstance(e, ConnectionError)
                        else ""
                    )
                    raise EvaluationError(
                        f"--tasks: {name}: cannot be loaded{why} ({type(e).__name__}: {message})"
                    ) from None
                for task_name, task in loaded["tasks"].items():
                    _check_shots(task_name, task, shots.get(name))
                top = loaded["groups"].get(name) or loaded["tasks"].get(name)
                objects[name] = [top] if top is not None else list(loaded["tasks"].values())  # a tag: its tasks
        return objects


def _check_shots(name: str, task: Any, shots: int | None) -> None:
    """lm-eval draws a task's shots from its few-shot examples, less the one asked about where they are its
    test split; more shots than that end the evaluation mid-way in a traceback. A task whose config says 0
    shots keeps them (lm-eval's ``simple_evaluate``)."""
    sampler = getattr(task, "sampler", None)  # a task from a YAML's: what lm-eval draws the shots with
    if not shots or sampler is None or task.get_config("num_fewshot") == 0:
        return
    pool = len(sampler.fewshot_docs()) - (task.fewshot_cfg.split == task.config.test_split)
    if shots > pool:
        raise EvaluationError(
            f"--num-fewshot: {shots} is more than the {pool} few-shot examples of task {name}; give at most {pool}"
        )


def refuse_non_finite_logits(model: Any) -> None:
    """Stop the evaluation at the first forward whose logits are not finite: lm-eval would score NaN
    log-likelihoods (a checkpoint saved where training diverged, e.g. ``--optimizer.lr 1e30``), its accuracies
    as if they were numbers."""
    import torch

    def check(_module: Any, _args: Any, output: Any) -> None:
        if not torch.isfinite(output.logits).all():
            raise CheckpointError("its logits hold NaN or infinite values")

    model.register_forward_hook(check)


@contextmanager
def hflm_location(source: str, parent: str) -> Iterator[tuple[str, str]]:
    """HFLM's ``pretrained`` and ``revision`` for ``source``: ``hf:MODEL[@REV]`` as it is; a checkpoint folder
    exported into a ``STAGING`` folder inside ``parent`` (no small /tmp has to hold GPT-2 xl), which the next
    command owning ``parent`` removes if this one dies (SIGKILL, OOM): ``owned``'s ``remove_stale_writes``."""
    if source.startswith(PREFIX):
        path, revision = hub_location(source)
        yield path, revision or "main"
        return
    prefix = f"{STAGING}hf-{os.path.basename(source.rstrip('/'))}."
    with tempfile.TemporaryDirectory(prefix=prefix, dir=parent, ignore_cleanup_errors=True) as folder:
        export_checkpoint(source, folder)
        yield folder, "main"


def hub_location(source: str) -> tuple[str, str | None]:
    """``from_pretrained``'s path or id, and revision, of ``hf:MODEL[@REV]``."""
    spec = parse_spec(source)
    return spec.location(spec.revisions[0])


def source_identity(source: str, pretrained: str, config) -> str | None:
    """What a result records of the weights it scored: their identity, or a hub model's commit."""
    if not source.startswith(PREFIX):
        return checkpoint_identity(source)
    if os.path.isdir(pretrained):
        return checkpoint_identity(pretrained, model_folder=True)
    return getattr(config, "_commit_hash", None)


def source_changed(record: dict, source: str) -> bool:
    """Whether ``source`` now holds other weights than the result ``record`` scored (a hub revision is
    taken as it was: pin one with ``hf:MODEL@COMMIT``)."""
    if not source.startswith(PREFIX):
        return identity_changed(record["checkpoint_identity"], source)
    try:
        path = hub_location(source)[0]
    except ModelLoadError:  # a local folder gone: it cannot be read, and its load says why
        return False
    return identity_changed(record["checkpoint_identity"], path, model_folder=True)
