"""Analyze model states one at a time: load each once, measure, write its results; skip those
already done; report unreadable ones and go on. ``Analysis`` is what every target shares;
``RunAnalysis`` feeds it a run's checkpoints, ``HFAnalysis`` a hub model's revisions."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from ..components.tb_writer import WriterThread
from ..components.wandb_run import log_results, recorded
from ..models import family
from ..run_folder.checkpoints import (
    checkpoint_identity,
    load_model,
    load_model_args,
    run_checkpoints,
    run_encoder,
)
from ..run_folder.outputs import (
    SUMMARY_FILE,
    check_writable,
    ensure_writable,
    remove_empty,
    report_failed,
    revision_folder,
    save_png,
    still_to_do,
    write_csv,
    write_json,
)
from ..run_folder.owners import (
    TB_KEY,
    FolderOwner,
    inside,
    owned,
    owner_record,
    refuse_histograms_unless_ours,
    refuse_unless_ours,
    run_paths,
    write_record,
)
from ..run_folder.writer_lock import COMMAND, TURN_WAIT_S, refuse_if_busy, sole_writer
from ..tokenizer.encoders import DocumentEncoder
from ..utils import records
from ..utils.devices import DTYPES, resolve_device
from ..utils.errors import AnalysisError, ArgumentError, CheckpointError, OutputError, say
from ..utils.hub import parse_spec
from . import figures, hf_model
from .condensation_schema import RESULT_FILE, Condensation, read_analyses
from .inputs import Encode, InputOptions, differences, select_sequences
from .measure import DecoderLayers, Measurement, geometry_mask, measure
from .statistics import HIST_EDGES, HIST_RANGE, condensation, layer_row

LOGGED_FILE = ".histograms.json"
"""In ``--tb-dir``: the result folders whose histograms it holds, each with its checkpoint's identity."""


@dataclass(frozen=True)
class Unit:
    """One model state to measure: a checkpoint of a run, or a revision of a Hugging Face model."""

    step: int
    folder: str
    """Its result folder under the output folder: ``step-N`` or ``rev-NAME``."""
    source: str
    """The checkpoint folder, or the model id or folder (recorded as ``checkpoint``)."""
    revision: str | None = None


def fitted_inputs(options: argparse.Namespace, inputs: InputOptions, positions: int | None, where: str) -> InputOptions:
    """The inputs with S at most the model's ``positions``: the default lowered, a given one refused."""
    if positions is None or inputs.seq_len <= positions:
        return inputs
    if options.seq_len is not None:
        raise AnalysisError(f"--seq-len: {inputs.seq_len} exceeds the model's {positions} positions ({where})")
    say(f"note: --seq-len {positions} (the model's positions, {where}) instead of the default {inputs.seq_len}")
    return dataclasses.replace(inputs, seq_len=positions)


@dataclass
class Analysis:
    """The state of one analysis: its units, inputs, output folders and cached results. Each target gives
    ``load(unit)``, the unit's ``DecoderLayers``, and its model's ``shape`` (``Condensation.model_args``) and
    ``n_params``; ``run``: the run's dump folder, or the Hugging Face model (its results' ``run``)."""

    options: argparse.Namespace
    units: list[Unit]
    run: str
    out: str
    tb_default: str
    inputs: InputOptions
    dtype: str
    encode: Encode | DocumentEncoder
    model: str | None = None

    skippable = ()  # load errors that skip a unit (exit status 1) rather than end the analysis
    noun = "model state"
    identity = staticmethod(checkpoint_identity)  # what a result records of the weights it measured

    def __post_init__(self) -> None:
        self.label, self.owner = os.path.basename(os.path.normpath(self.run)), FolderOwner("analysis", self.run)
        self.device = resolve_device(self.options.device, self.dtype)
        refuse_if_busy(self.out, COMMAND)  # a busy folder's owner named at once, before the inputs are read
        refuse_unless_ours(self.out, self.owner, "--out", "use another --out")
        self.sequences = select_sequences(self.inputs, self.encode)
        self.geometry_sequences = int(geometry_mask(len(self.sequences.tokens), self.options.geometry_sequences).sum())
        self.settings = hashlib.sha256(
            json.dumps([self.model, self.dtype, self.geometry_sequences, self.sequences.sha256]).encode()
        ).hexdigest()[:12]
        self.tb_dir = self._histogram_folder(self.options.tb_dir, self.tb_default)

    def _histogram_folder(self, given: str | None, default: str) -> str:
        """``--tb-dir``, else ``default`` or, where that holds other settings' histograms, ``default-SETTINGS``."""
        if given and os.path.realpath(given) == os.path.realpath(self.out):  # was refused once measured, as another's
            raise ArgumentError(
                f"--tb-dir: {given} is --out; leave --tb-dir out (its default is {default}), or give another folder"
            )
        if given:  # refused now, though made only when there is something to write
            check_writable(given, "--tb-dir")
        for folder in [given] if given else [default, f"{default}-{self.settings}"]:
            if not inside(folder, self.out):  # the output folder's owner is checked already
                refuse_histograms_unless_ours(folder, self.owner)
            try:
                recorded = (owner_record(folder) or {}).get("settings")
            except (OSError, ValueError, AttributeError):  # not a folder, or an unreadable record: written over
                recorded = None
            if recorded in (None, self.settings):
                if not given and not inside(folder, self.out):  # a colleague's read-only run, before --out is made
                    try:
                        check_writable(folder, "--tb-dir")
                    except OutputError as e:
                        raise OutputError(f"{e}; it is the default: give --tb-dir a folder you can write") from None
                return folder
        raise _other_settings(folder)

    def _differences(self, result: Condensation) -> str:
        """The settings ``result`` was measured with that differ from this analysis's ("" if none)."""
        mine = {"model": self.model, "dtype": self.dtype, "geometry_sequences": self.geometry_sequences}
        changed = [records.differences({key: getattr(result, key) for key in mine}, mine)]
        if result.tokens_sha256 != self.sequences.sha256:
            changed.append(differences(result.inputs, self.sequences.record()))
        return ", ".join(filter(None, changed))

    def analyze(self) -> int:
        """Analyze pending units and refresh the summary, as ``--out``'s one writer; the count that failed."""
        if self.options.wandb:  # a run's only: before the analysis, a run without one fails now, in one line
            recorded(self.run)
        with owned(self.out, self.owner):
            found = {} if self.options.force else read_analyses(self.out)  # --force: all units pending
            sources = {unit.folder: unit.source for unit in self.units}
            pending = still_to_do(
                self.out, sources, found, self._differences, lambda source, result: result.changed(source), "analyzed"
            )
            todo = [unit for unit in self.units if unit.folder in pending]
            per_unit = math.ceil(len(self.sequences.tokens) / self.options.batch_size)
            if skipped := len(self.units) - len(todo):
                print(f"{skipped} {self.noun}(s) already analyzed in {self.out} (--force recomputes them)")
            failed = []
            histograms = (
                Histograms(self.tb_dir, self.owner, self.settings, self.out, self.options.force) if todo else None
            )
            try:  # nothing to do: no --tb-dir made, no bar of 0 batches
                total = len(todo) * per_unit
                with tqdm(total=total, unit="batch", desc="condensation", file=sys.stderr, disable=not todo) as bar:
                    for unit in todo:
                        bar.set_postfix_str(unit.folder)
                        start = bar.n
                        try:
                            measured = self._measure(unit, lambda: bar.update(1))
                        except self.skippable as e:
                            tqdm.write(f"dispersion_titan: skipped {self.noun}: {e}", file=sys.stderr)
                            failed.append(unit.source)
                            bar.update(start + per_unit - bar.n)
                            continue
                        result = condensation(
                            unit.step,
                            self.sequences,
                            measured,
                            dtype=self.dtype,
                            device=self.device.type,
                            checkpoint=unit.source,
                            revision=unit.revision,
                            run=self.run,
                            model_args=self.shape,
                            n_params=self.n_params,
                            model=self.model,
                            checkpoint_identity=self.identity(unit.source),
                        )
                        save_png(
                            figures.heatmap(result, f"{self.label}: {result.label}"),
                            os.path.join(self.out, f"heatmap_{unit.folder}.png"),
                        )
                        histograms.add(unit, measured, result)
                        write_json(os.path.join(self.out, unit.folder, RESULT_FILE), result.to_json())
                        tqdm.write(_one_line(result))
            finally:
                if histograms is not None:
                    histograms.close()
            matching = self._write_summary()
            failed = report_failed(failed, len(self.units), f"{self.noun}s", "analyzed")
        if self.options.wandb:  # what TensorBoard got, from the results of these settings (as summary.csv)
            import wandb

            per_step = {
                result.step: {
                    **{f"cosine/{x.name}": wandb.Histogram(np_histogram=(x.hist, HIST_EDGES)) for x in result.layers},
                    **{f"mean_cos/{x.name}": x.mean_cos for x in result.layers},
                }
                for result in matching
            }
            log_results(self.run, "analyze", "analysis", per_step, self.out)
        return failed

    def _measure(self, unit: Unit, on_batch: Callable[[], None]) -> Measurement:
        """``unit`` loaded and measured; a CheckpointError naming it where its hidden states are not finite."""
        model = self.load(unit)
        try:
            return measure(
                model,
                self.sequences.tokens,
                self.options.batch_size,
                self.device,
                self.options.geometry_sequences,
                on_batch,
            )
        except CheckpointError as e:
            raise CheckpointError(f"{unit.source}: {e}; a diverged or damaged model, nothing recorded") from None

    def _write_summary(self) -> list[Condensation]:
        """``summary.csv`` and ``evolution.png`` over every state analyzed with these inputs; those states."""
        results = read_analyses(self.out)
        matching = sorted((r for r in results.values() if not self._differences(r)), key=lambda r: r.step)
        if len(matching) < len(results):
            say(
                f"note: {len(results) - len(matching)} older analyses in {self.out} used other settings (kept by "
                f"--force) and are left out of {SUMMARY_FILE} and evolution.png"
            )
        if not matching:
            return matching
        rows = [  # one per step (or revision) × layer
            {
                "step": result.step,
                **({"revision": result.revision} if result.model else {}),
                **layer_row(result, layer),
                "spearman": result.spearman,
                "kendall": result.kendall,
            }
            for result in matching
            for layer in result.layers
        ]
        write_csv(os.path.join(self.out, SUMMARY_FILE), rows)
        title = f"{self.label}: K={self.inputs.num_sequences}, S={self.inputs.seq_len}"
        save_png(figures.evolution(matching, title), os.path.join(self.out, "evolution.png"))
        histograms = f" (TensorBoard histograms: {self.tb_dir})" if os.path.isdir(self.tb_dir) else ""
        print(f"results: {self.out}{histograms}")
        return matching


class RunAnalysis(Analysis):
    """``analyze RUN``: the selected checkpoints of one of our runs."""

    skippable = (CheckpointError,)
    noun = "checkpoint"

    def __init__(self, options: argparse.Namespace, inputs: InputOptions):
        self.dump, folder, selected = run_checkpoints(options.run, "all" if options.steps is None else options.steps)
        self.model_args = load_model_args(folder)
        inputs = fitted_inputs(options, inputs, self.model_args.positions, f"max_seq_len in {self.dump}/run.json")
        if self.model_args.positions is None:  # rotary: a RoPE table for the analysed length
            self.model_args.max_seq_len = inputs.seq_len
        self.shape = {  # the run's arguments, its family and MLP width under the keys Hugging Face analyses use
            **dataclasses.asdict(self.model_args),
            "model_type": self.model_args.FAMILY,
            "mlp_hidden_dim": self.model_args.hidden_dim,
        }
        units = [Unit(c.step, f"step-{c.step}", os.path.abspath(c.path)) for c in selected]
        super().__init__(
            options,
            units,
            self.dump,
            options.out or os.path.join(self.dump, "condensation"),
            os.path.join(run_paths(self.dump)[TB_KEY], "condensation"),
            inputs,
            options.dtype or "fp32",
            encode=run_encoder(self.dump),
        )
        with torch.device("meta"):  # the family's model of this shape, for its parameter count (tied: once)
            model = family(self.model_args.FAMILY).get_train_spec().model_cls(self.model_args)
        self.n_params = sum(p.numel() for p in model.parameters())

    def load(self, unit: Unit) -> DecoderLayers:
        return DecoderLayers(load_model(unit.source, self.model_args, self.device, getattr(torch, DTYPES[self.dtype])))


class HFAnalysis(Analysis):
    """``analyze hf:MODEL[@REV1,REV2,...] --out DIR``: the revisions of a Hugging Face model, measured like
    a run's checkpoints, each in ``OUT/rev-NAME/`` (``rev-default``: the default revision)."""

    noun = "revision"
    # a local folder's identity too, as ``evaluate hf:`` records it (a hub revision is taken as it was)
    identity = staticmethod(
        lambda source: checkpoint_identity(source, model_folder=True) if os.path.isdir(source) else None
    )

    def __init__(self, options: argparse.Namespace, inputs: InputOptions):
        self.spec = parse_spec(options.run, options.trust_remote_code)  # first: a run's folder given with hf:
        if options.steps is not None:
            raise ArgumentError("--steps: not used with hf: models (list revisions: hf:MODEL@REV1,REV2)")
        if not options.out:
            raise ArgumentError("--out: required with hf: models")
        first = self.spec.revisions[0]
        config = hf_model.load_config(self.spec, first)
        self.shape = hf_model.model_args(config)
        for revision in self.spec.revisions[1:]:  # each result records the first's shape, one evolution plots them
            other = hf_model.model_args(hf_model.load_config(self.spec, revision))
            if other != self.shape:
                differ = ", ".join(
                    f"{key} {self.shape[key]} vs {other[key]}" for key in other if other[key] != self.shape[key]
                )
                raise ArgumentError(
                    f"{options.run}: revisions {first} and {revision} are different models ({differ}); analyze "
                    "each into its own --out (analyze family compares models)"
                )
        self.n_params = hf_model.count_parameters(self.spec, config)
        dtype = options.dtype or ("bf16" if self.n_params > hf_model.BF16_ABOVE_PARAMS else "fp32")
        inputs = fitted_inputs(
            options, inputs, self.shape["max_seq_len"], f"max_position_embeddings of {self.spec.model}"
        )
        units = [  # a revision's step: the number after ``step`` in its name, else its position
            Unit(
                int(m.group(1)) if (m := re.search(r"step(\d+)", rev or "")) else i,
                revision_folder(rev),
                self.spec.location(rev)[0],
                rev,
            )
            for i, rev in enumerate(self.spec.revisions)
        ]
        super().__init__(
            options,
            units,
            self.spec.model,
            options.out,
            os.path.join(options.out, "tb"),
            inputs,
            dtype,
            model=self.spec.model,
            encode=hf_model.load_encoder(self.spec, first, inputs.seq_len if inputs.protocol == "paper" else None),
        )

    def load(self, unit: Unit) -> DecoderLayers:
        return hf_model.load_pretrained(
            self.spec, unit.revision, getattr(torch, DTYPES[self.dtype]), self.device, self.options.device_map
        )


class Histograms:
    """An analysis's TensorBoard histograms and curves in ``--tb-dir``, once per checkpoint: an analysis of the same
    settings into another ``--out`` adds no second copy, which TensorBoard would plot twice; ``--force``, or a
    checkpoint rewritten since, replaces the step's events (a Hugging Face revision's values may change with it). The
    folder is recorded as these settings' on the first write; one this made and wrote nothing in is removed. Analyses
    into other ``--out``s share it: each writes there holding its lock in turn (``sole_writer``), and then removes
    what one killed mid-write left there (``remove_stale_writes``). Each unit's events are a file of their own, closed
    within its turn: one rewritten by another's ``_drop`` is never open."""

    def __init__(self, folder: str, owner: FolderOwner, settings: str, out: str, force: bool = False):
        self.folder, self.owner, self.settings, self.force = folder, owner, settings, force
        self.made = ensure_writable(folder, "--tb-dir")
        self.index = os.path.join(folder, LOGGED_FILE)
        self.held = inside(folder, out)  # in --out, held with it
        self.wrote = False

    def add(self, unit: Unit, measured: Measurement, result: Condensation) -> None:
        """``unit``'s histograms, unless this folder holds those of the same checkpoint."""
        turn = sole_writer(self.folder, ("command", "use another --tb-dir"), TURN_WAIT_S)
        with contextlib.nullcontext() if self.held else turn:
            records.remove_stale_writes(self.folder)
            try:
                with open(self.index) as f:
                    logged = dict(json.load(f))
            except (OSError, ValueError, TypeError):  # none yet, or damaged: rewritten whole
                logged = {}
            if unit.folder in logged:
                if logged[unit.folder] == result.checkpoint_identity and not self.force:
                    return
                self._drop(unit.step)
            if not self.wrote:
                recorded = write_record(self.folder, self.owner, settings=self.settings)  # for the next to find
                if not recorded and (owner_record(self.folder) or {}).get("settings") != self.settings:
                    raise _other_settings(self.folder)  # an analysis of other settings, started alongside, came first
            from torch.utils.tensorboard import SummaryWriter

            with _whole_events(self.folder), SummaryWriter(log_dir=self.folder) as writer:
                for name, matrix, value in zip(measured.names, measured.means.cpu().numpy(), result.curve):
                    writer.add_histogram(
                        f"analysis/cosine/{name}", matrix.clip(*HIST_RANGE), unit.step, bins=HIST_EDGES
                    )
                    writer.add_scalar(f"analysis/mean_cos/{name}", value, unit.step)
            self.wrote = True
            write_json(self.index, {**logged, unit.folder: result.checkpoint_identity})

    def _drop(self, step: int) -> None:
        """Remove this folder's analysis events of ``step``, each event file that has some rewritten whole in place
        (training's events beside them kept)."""
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter

        for name in sorted(os.listdir(self.folder)):
            if not name.startswith("events.out.tfevents."):
                continue
            path = os.path.join(self.folder, name)
            events = [Event.FromString(e) for e in RawEventFileLoader(path).Load()]
            kept = [e for e in events if not (e.step == step and _ours(e))]
            if len(kept) == len(events):
                continue
            if not any(e.HasField("summary") for e in kept):  # nothing left but its header
                os.unlink(path)
            else:

                def rewrite(f: Any, kept: list[Event] = kept) -> None:
                    writer = RecordWriter(f)
                    for event in kept:
                        writer.write(event.SerializeToString())

                records.atomic_write(path, rewrite, binary=True)

    def close(self) -> None:
        if self.made and not self.wrote:  # no histogram written (a failure, every unit skipped): no empty folder left
            remove_empty(self.made)


@contextlib.contextmanager
def _whole_events(folder: str) -> Iterator[None]:
    """The events file a ``SummaryWriter`` writes in ``folder`` whole or not at all: one a full disk cut short is
    removed (the rerun logs its step again: twice, beside it) and named in the line, its writer thread's failure
    raised here (``WriterThread``), not printed as a traceback."""
    before = set(os.listdir(folder))
    try:
        with contextlib.closing(WriterThread()) as thread, thread.writes():
            yield
    except BaseException as e:
        new = sorted(os.path.join(folder, name) for name in set(os.listdir(folder)) - before)
        for path in new:
            os.unlink(path)
        if isinstance(e, OSError) and e.errno and e.filename is None and new:
            raise OSError(e.errno, e.strerror, new[0]) from e
        raise


def _ours(event: Any) -> bool:
    """Whether a TensorBoard event is an analysis's (``Histograms.add``'s tags), not training's beside it."""
    return event.HasField("summary") and all(v.tag.startswith("analysis/") for v in event.summary.value)


def _other_settings(folder: str) -> OutputError:
    return OutputError(
        f"--tb-dir: {folder} holds the histograms of an analysis with other settings; use another "
        "--tb-dir, or leave it out (each analysis's settings get a folder of their own)"
    )


def _one_line(result: Condensation) -> str:
    first, last = result.layers[0], result.layers[-1]
    trend = ", ".join(
        f"{key} {value:.3f}"
        for key, value in (("spearman", result.spearman), ("kendall", result.kendall))
        if value is not None
    )
    return f"{result.label}: mean_cos {first.name} {first.mean_cos:.4f} -> {last.name} {last.mean_cos:.4f}; {trend}"
