"""Analyze every selected checkpoint of one run: load it once, measure, write its
results; skip steps already done; report broken checkpoints and go on with the rest."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..errors import CheckpointError
from ..trainer.checkpoints import checkpoint_folder, list_checkpoints, load_model, load_model_args
from . import AnalysisError, figures
from .inputs import InputOptions, Sequences, differences, select_sequences
from .measure import mean_cosine_matrices
from .results import (
    SUMMARY_FILE,
    ensure_writable,
    read_results,
    result_path,
    summary_rows,
    write_csv,
    write_result,
)
from .result import Condensation
from .statistics import condensation
from .steps import select_steps
from .tensorboard import CondensationWriter

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class AnalyzeOptions:
    run: str
    steps: str
    inputs: InputOptions
    batch_size: int
    out: str | None
    tb_dir: str | None
    device: str | None
    dtype: str
    force: bool


def resolve_device(device: str | None, dtype: str) -> torch.device:
    """CUDA when available unless ``--device`` says otherwise; bf16 only where supported."""
    try:
        resolved = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise AnalysisError(f"--device: {e}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise AnalysisError(f"--device: {device}: CUDA is not available here")
    if dtype == "bf16" and resolved.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise AnalysisError(f"--dtype: bf16 is not supported by {torch.cuda.get_device_name(resolved)}")
    return resolved


def _same_analysis(result: Condensation, sequences: Sequences, dtype: str) -> bool:
    return result.tokens_sha256 == sequences.sha256 and result.dtype == dtype


def _mismatch(step: int, result: Condensation, sequences: Sequences, dtype: str) -> str:
    if result.dtype != dtype:
        return f"step {step} was analyzed in {result.dtype}, not {dtype}"
    return f"step {step} was analyzed with other inputs ({differences(result.inputs, sequences.record())})"


class RunAnalysis:
    """The state of one ``analyze RUN`` invocation."""

    def __init__(self, options: AnalyzeOptions):
        self.options = options
        folder = checkpoint_folder(options.run)
        self.checkpoints = list_checkpoints(folder)
        if not self.checkpoints:
            raise CheckpointError(f"{folder}: no checkpoints (no step-N folders)")
        self.selected = select_steps(options.steps, self.checkpoints)
        self.dump = os.path.dirname(os.path.abspath(folder))
        self.label = os.path.basename(self.dump)
        self.model_args = load_model_args(folder)
        if options.inputs.seq_len > self.model_args.max_seq_len:
            raise AnalysisError(
                f"--seq-len: {options.inputs.seq_len} exceeds the model's {self.model_args.max_seq_len} "
                f"positions (max_seq_len in {self.dump}/run.json)"
            )
        self.device = resolve_device(options.device, options.dtype)
        self.out = options.out or os.path.join(self.dump, "condensation")
        self.tb_dir = options.tb_dir or os.path.join(self.dump, "tb", "condensation")
        ensure_writable(self.out, "--out")
        ensure_writable(self.tb_dir, "--tb-dir")
        self.sequences = select_sequences(options.inputs)
        self.existing = read_results(self.out)

    def pending(self) -> list:
        """Selected checkpoints still to analyze; refuses to mix inputs unless --force."""
        if self.options.force:
            return self.selected
        todo = []
        for checkpoint in self.selected:
            result = self.existing.get(checkpoint.step)
            if result is None:
                todo.append(checkpoint)
            elif not _same_analysis(result, self.sequences, self.options.dtype):
                raise AnalysisError(
                    f"--out: {self.out}: {_mismatch(checkpoint.step, result, self.sequences, self.options.dtype)}; "
                    "use another --out, or --force to recompute"
                )
        return todo

    def _result(self, step: int, path: str, names: list[str], means: torch.Tensor) -> Condensation:
        return condensation(step, self.sequences, names, means, dtype=self.options.dtype, device=self.device.type,
                            checkpoint=os.path.abspath(path), run=self.dump,
                            model_args=dataclasses.asdict(self.model_args))

    def analyze(self) -> int:
        """Analyze pending checkpoints, then refresh the summary and evolution figure.
        Returns the number of checkpoints that could not be analyzed."""
        todo = self.pending()
        tokens = self.sequences.tokens
        per_checkpoint = math.ceil(len(tokens) / self.options.batch_size)
        skipped = len(self.selected) - len(todo)
        if skipped:
            print(f"{skipped} checkpoint(s) already analyzed in {self.out} (--force recomputes them)")
        failed = []
        writer = CondensationWriter(self.tb_dir)
        try:
            with tqdm(total=len(todo) * per_checkpoint, unit="batch", desc="condensation", file=sys.stderr) as bar:
                for checkpoint in todo:
                    bar.set_postfix(step=checkpoint.step)
                    try:
                        model = load_model(checkpoint.path, self.model_args, self.device, DTYPES[self.options.dtype])
                    except CheckpointError as e:
                        tqdm.write(f"dispersion_titan: skipped checkpoint: {e}", file=sys.stderr)
                        failed.append(checkpoint.path)
                        bar.update(per_checkpoint)
                        continue
                    names, means = mean_cosine_matrices(
                        model, tokens, self.options.batch_size, self.device, on_batch=lambda: bar.update(1)
                    )
                    del model
                    result = self._result(checkpoint.step, checkpoint.path, names, means)
                    figures.save_png(
                        figures.heatmap(result, f"{self.label}: step {checkpoint.step}"),
                        os.path.join(self.out, f"heatmap_step-{checkpoint.step}.png"),
                    )
                    writer.add_step(checkpoint.step, names, means, result.curve)
                    write_result(result_path(self.out, checkpoint.step), result)
                    tqdm.write(_one_line(result))
        finally:
            writer.close()
        self._write_summary()
        if failed:
            print(f"dispersion_titan: error: {len(failed)} of {len(self.selected)} checkpoints could not be "
                  f"analyzed: {', '.join(failed)}", file=sys.stderr)
        return len(failed)

    def _write_summary(self) -> None:
        """``summary.csv`` and ``evolution.png`` over every step analyzed with these inputs."""
        results = read_results(self.out)
        matching = [r for r in results.values() if _same_analysis(r, self.sequences, self.options.dtype)]
        if len(matching) < len(results):
            print(f"note: {len(results) - len(matching)} older analyses in {self.out} used other inputs or dtype "
                  f"and are left out of {SUMMARY_FILE} and evolution.png")
        if not matching:
            return
        write_csv(os.path.join(self.out, SUMMARY_FILE), summary_rows(matching))
        inputs = self.options.inputs
        title = f"{self.label}: K={inputs.num_sequences}, S={inputs.seq_len}"
        figures.save_png(figures.evolution(matching, title), os.path.join(self.out, "evolution.png"))
        print(f"results: {self.out} (TensorBoard histograms: {self.tb_dir})")


def _one_line(result: Condensation) -> str:
    first, last = result.layers[0], result.layers[-1]
    trend = ", ".join(f"{key} {value:.3f}" for key, value in
                      (("spearman", result.spearman), ("kendall", result.kendall)) if value is not None)
    return (f"step {result.step}: mean_cos {first.name} {first.mean_cos:.4f} -> "
            f"{last.name} {last.mean_cos:.4f}; {trend}")
