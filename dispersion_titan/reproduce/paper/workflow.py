"""What an artifact runs: its models and the ``analyze`` / ``evaluate`` command lines that make their results.
One workflow is printed (``--dry-run``), run here or submitted (``--slurm``: a job per step, then ``paper.sbatch``
draws the artifact once all of them succeeded), so what is shown is what runs."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from huggingface_hub import constants, list_repo_refs, try_to_load_from_cache
from tqdm import tqdm

from ...analysis import ANALYSIS_PROTOCOLS
from ...analysis.arguments import absolute, input_options
from ...analysis.condensation_schema import Condensation, read_analyses
from ...analysis.inputs import located
from ...analysis.size_series import parse_assignments
from ...config.cli import launch_args, read_toml
from ...data.corpora import corpus
from ...evaluation.runner import check_include_path, hub_model
from ...evaluation.table import arm_runs, one_seed_each
from ...run_folder.checkpoints import (
    dispersion_variant,
    find_checkpoint_folder,
    list_checkpoints,
    load_run_metadata,
    recorded_run,
    trained_to,
)
from ...run_folder.outputs import still_to_do
from ...run_folder.owners import RUN_METADATA_FILE, TABLE, refuse_unless_ours
from ...utils import records
from ...utils.devices import AUTOCAST, check_device_map, resolve_device
from ...utils.errors import ArgumentError, CheckpointError, DispersionTitanError, docs_page
from ...utils.hub import PREFIX as HF
from ...utils.hub import HFSpec, parse_spec
from ..slurm_scripts import (
    SlurmJob,
    check_train_time,
    given_option,
    gpus_asked,
    gpus_environment,
    gpus_per_node,
    job_name,
    lead_told,
    queued_jobs,
    recorded_gpus,
    refuse_environment,
    refuse_options,
    refuse_other_gpus,
    sbatch,
    sbatch_count,
    submitted_jobs,
)
from . import catalog

ANALYZE_OPTIONS = tuple(
    "texts dataset dataset_path num_sequences seq_len seed protocol batch_size device dtype device_map force".split()
)
PAPER_DEFAULTS = {"protocol": "paper", "dtype": "fp32"}  # the authors' texts and points, in fp32 as they ran
TABLE2_DEFAULTS = {"dtype": AUTOCAST}  # bf16 autocast, as LMEvalCallback in their midtrain_gpt2.py scored
EVALUATE_OPTIONS = tuple("protocol tasks include_path limit num_fewshot batch_size device dtype force".split())
PRETRAINED = "pretrained"  # table2: DIR/pretrained/MODEL, the evaluation of --pretrained hf:MODEL
ANALYSES = "analyses"  # DIR/analyses/MODEL, shared by the artifacts: a model analysed for one is reused
ARTIFACT_DEFAULTS = {
    "fig3": {"seq_len": catalog.FIG3_SEQ_LEN},
    "counteract": {"num_sequences": catalog.COUNTERACT_TEXTS, "seq_len": catalog.COUNTERACT_SEQ_LEN},
}
ENVIRONMENT = "environment.json"  # in logs/: the GPUs per node fig3's trainings were submitted for (``record_gpus``)
ONLY_FOR = {"preset": "fig3", "pick": "fig3", "rows": "fig3", "revisions": "fig4", "corpus": "robustness"}


@dataclass(frozen=True)
class PaperModel:
    target: str  # hf:MODEL[@REVS] or a run's dump folder
    out: str  # its analyze --out
    row: str | None  # the figure row it is drawn in; None: its model_type
    label: str
    size_b: float | None = None  # nominal, for the GPU check
    steps: str | None = None  # a run's --steps
    trust_remote_code: bool = False

    @property
    def spec(self) -> HFSpec | None:
        """The Hugging Face model and revisions it names, as analyze reads them (None: one of our runs)."""
        return parse_spec(self.target) if self.target.startswith(HF) else None


@dataclass(frozen=True)
class Step:
    command: str  # analyze, evaluate, paper (python -m dispersion_titan.COMMAND) or train (launch/train.sh)
    argv: list[str]
    label: str
    after: tuple[int, ...] = ()  # indices of the steps it waits for
    size_b: float | None = None  # its model's, for the GPUs its job asks for

    def shell(self) -> str:
        if self.command == "train":
            return shlex.join(["launch/train.sh", *self.argv])
        return shlex.join(["python", "-m", f"dispersion_titan.{self.command}", *self.argv])


@dataclass
class PaperWorkflow:
    artifact: str
    out: str
    steps: list[Step]
    models: list[PaperModel] = field(default_factory=list)  # fig5: the bases, then their distilled models
    runs: list[str] = field(default_factory=list)  # table2: the evaluate table specs
    left_out: list[str] = field(default_factory=list)  # the paper's models that ship code, without permission
    notes: list[str] = field(default_factory=list)  # said before it runs
    rows: tuple[str, ...] = ()  # fig3: the checkpoints drawn
    pretrained: str = "auto"  # table2: --pretrained (for hf:MODEL, the folder its evaluation writes)
    gpus: tuple[int, str] | None = None  # fig3 --slurm: its trainings' GPUs per node and where from (gpus_per_node)


def run_locally(workflow: PaperWorkflow, mains: dict[str, Callable[[list[str]], None]]) -> None:
    """Each step by its command's ``main``, in order; one that fails ends the artifact with its status."""
    with tqdm(workflow.steps, desc=workflow.artifact, unit="model", file=sys.stderr, leave=False) as bar:
        for step in bar:
            bar.set_postfix_str(step.label)
            try:
                mains[step.command](step.argv)
            except SystemExit as done:
                if done.code not in (0, None):
                    sys.exit(done.code)  # the command said why, in one line


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", text.strip("/")) or "model"


def _is_run(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, RUN_METADATA_FILE)) or os.path.isdir(os.path.join(folder, "checkpoint"))


def run_model(run: str, analyses: str, row: str | None, label: str, steps: str) -> PaperModel:
    """One of our runs, analysed at ``steps`` into ``analyses/RUN``."""
    return PaperModel(run, os.path.join(analyses, safe_name(os.path.basename(run))), row, label, steps=steps)


def model_of(text: str, analyses: str, row: str | None = None) -> PaperModel:
    """A ``--models`` entry: a hub id, a local model folder, an ``hf:`` spec, or one of our runs."""
    if text.startswith(HF):
        target = text
    elif _is_run(text):
        run = os.path.abspath(text)
        steps = checkpoint_steps(run)
        if not steps:
            raise ArgumentError(
                f"--models: {run}: no checkpoints yet (train it: launch/train.sh CONFIG --job.dump_folder {run})"
            )
        return run_model(run, analyses, row, os.path.basename(run), str(steps[-1]))
    elif os.path.isdir(text):
        target = HF + os.path.abspath(text)
    elif os.path.exists(text) or text.startswith((".", "/")) or text.count("/") > 1:
        raise ArgumentError(f"--models: {text}: no such model folder or run")
    else:
        target = HF + text
    spec = checked(target, "--models", typed=text)
    label = os.path.basename(os.path.normpath(spec.model))
    out = os.path.join(analyses, safe_name(label if spec.local else spec.model))
    return PaperModel(target, out, row, label, catalog.size_b(spec.model))


Parsed = TypeVar("Parsed")


def checked(target: str, option: str, check: Callable[[str], Parsed] = parse_spec, typed: str | None = None) -> Parsed:
    """``target`` as its step's ``check`` reads it (analyze's: ``hf:MODEL[@REV,...]``), else refused in one line,
    naming it as ``typed`` (a folder given without the ``hf:`` it was given to the check with)."""
    try:
        return check(target)
    except DispersionTitanError as e:
        said = str(e) if typed is None else f"{typed}: {str(e).removeprefix(f'{target}: ')}"
        raise ArgumentError(f"{option}: {said}") from None


def ships_code(model: PaperModel) -> bool:
    """One of the paper's models that runs only with its own modelling code (``catalog.REMOTE_CODE``)."""
    return (spec := model.spec) is not None and spec.model in catalog.REMOTE_CODE


def with_remote_code(models: list[PaperModel], options: dict, given: bool) -> tuple[list[PaperModel], list[str]]:
    """Remote code runs only when asked: then given ``hf:`` models, or the paper's that ship code, get it.
    Without it, given models that ship code are refused; the paper's are left out (none of fig5's pairs)."""
    if options.get("trust_remote_code"):
        return [replace(m, trust_remote_code=m.target.startswith(HF) if given else ships_code(m)) for m in models], []
    needing = [m.target.removeprefix(HF) for m in models if ships_code(m)]
    if needing and given:
        raise ArgumentError(
            f"--models: {', '.join(needing)} run only with their own modelling code: add "
            "--trust-remote-code to run it, or leave them out"
        )
    return [m for m in models if not ships_code(m)], needing


def analyze_step(model: PaperModel, analyze_args: list[str]) -> Step:
    steps = ["--steps", model.steps] if model.steps else []
    remote = ["--trust-remote-code"] if model.trust_remote_code else []
    argv = [model.target, *steps, *analyze_args, *remote, "--out", model.out]
    return Step("analyze", argv, model.label, size_b=model.size_b)


def passed_on(options: dict, names: tuple[str, ...]) -> list[str]:
    """``--name value`` for each option given (not None), ``--name`` for a switch that is on."""
    given = {f"--{name.replace('_', '-')}": options[name] for name in names if options.get(name) not in (None, False)}
    return [arg for flag, value in given.items() for arg in ((flag,) if value is True else (flag, str(value)))]


def training_runs(artifact: str, preset: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, config, overrides) of each run ``artifact`` trains (``paper --plan``)."""
    if artifact == "fig3":
        return [(os.path.basename(r.folder), r.config, r.overrides) for r in preset_runs(preset, "runs")]
    if artifact == "table2":
        return [(f"{row.block}: {row.label}", row.config, ()) for row in catalog.TABLE2_ROWS if row.config]
    raise ArgumentError(f"--plan: {artifact} analyses released models and trains nothing; fig3 and table2 train runs")


STAGE_BRANCH = re.compile(r"^stage(\d+)-(?:.*-)?step(\d+)(?:-|$)")  # OLMo's branches: stage1-step353000-tokens1481B


def pick_revisions(branches: list[str]) -> list[str]:
    """Fig. 4's revisions: per stage ``FIG4_PER_STAGE`` branches evenly spaced by step (of a stage's
    several runs, the first named), then ``main``."""
    picked = []
    for stage in catalog.FIG4_STAGES:
        runs: dict[str, dict[int, str]] = {}  # the name before the step -> step -> branch
        for branch in sorted(branches):
            match = STAGE_BRANCH.match(branch)
            if match and int(match.group(1)) == stage:
                runs.setdefault(branch[: match.start(2)], {})[int(match.group(2))] = branch
        if runs:
            found = runs[min(runs)]
            steps = sorted(found)
            n = min(catalog.FIG4_PER_STAGE, len(steps))
            picks = sorted({round(i * (len(steps) - 1) / max(n - 1, 1)) for i in range(n)})
            picked += [found[steps[i]] for i in picks]
    picked += ["main"] if "main" in branches else []
    if len(picked) < 2:
        raise ArgumentError("fig4: the model has no stageN-stepM branches; pass --revisions REV1,REV2,...")
    return picked


def _fig4_model(options: dict, analyses: str) -> PaperModel:
    models, revisions = options.get("models") or [catalog.OLMO], options.get("revisions")
    if len(models) != 1:
        raise ArgumentError("--models: fig4 takes one model (its revisions are the panels)")
    if revisions == "":
        raise ArgumentError("--revisions: empty; give REV1,REV2,... or leave it out for the model's hub branches")
    base = model_of(models[0], analyses)
    base, spec = replace(base, row=base.label), base.spec  # one row: the model's revisions
    if spec is None:
        raise ArgumentError("--models: fig4 takes a Hugging Face model (hub id or folder), not a run")
    if spec.revisions != (None,) and not revisions:
        return base
    if not revisions:  # its hub branches
        try:
            branches = [b.name for b in list_repo_refs(spec.model).branches]
        except Exception as e:  # offline, no such model: one line either way
            raise ArgumentError(
                f"fig4: cannot list the revisions of {spec.model} ({type(e).__name__}): pass "
                "--revisions REV1,REV2,... (its hub branches), or run where the hub is reachable"
            ) from None
        revisions = ",".join(pick_revisions(branches))
    target = spec.name(revisions)
    checked(target, "--revisions")
    return replace(base, target=target)


def corpora(options: dict) -> dict[str, list[str]]:
    """robustness: corpus name -> analyze's input options for it (none for the protocol's own corpus)."""
    chosen = dict(parse_assignments(options.get("corpus") or [], "--corpus")) or catalog.ROBUSTNESS_CORPORA
    inputs = {}
    for name, source in chosen.items():
        if options.get("protocol") == "paper" and source == catalog.PAPER_CORPUS:
            inputs[name] = passed_on(options, ("dataset_path",))
        elif source is None:
            raise ArgumentError(
                f'robustness: no texts for {name} here; give --corpus {name}=FILE.jsonl (a "text" '
                f"field per line; {docs_page('reproduction.md', 'Paper artifacts')} shows how to export it "
                "with datasets)"
            )
        elif source.endswith(".jsonl") or os.path.isfile(source):
            if not os.path.isfile(source):  # here, as its analyze steps would refuse it (--texts), the dry run too
                raise ArgumentError(f"--corpus: {name}={source}: no such file")
            inputs[name] = ["--texts", source]
        else:
            corpus(source, f"--corpus: {name}")  # a registered dataset, as its --dataset must be
            inputs[name] = ["--dataset", source, *passed_on(options, ("dataset_path",))]
    return inputs


def build(artifact: str, options: dict) -> PaperWorkflow:
    """The workflow of ``artifact`` under ``options`` (the parsed command line, by dest)."""
    if options.get("slurm") and not options.get("draw_only"):  # before anything is said (fig3's layouts)
        refuse_options("--sbatch-arg", options.get("sbatch_args") or [])
        refuse_environment()
    defaults = TABLE2_DEFAULTS if artifact == "table2" else {**PAPER_DEFAULTS, **ARTIFACT_DEFAULTS.get(artifact, {})}
    options = {**options, **{k: v for k, v in defaults.items() if options.get(k) is None}}
    if options["dtype"] == AUTOCAST and artifact != "table2":
        raise ArgumentError("--dtype: autocast is for table2's evaluations; the analysing artifacts take fp32 or bf16")
    check_device_map(options.get("device_map"), options.get("device"))
    if options.get("device") and not (options.get("slurm") or options.get("draw_only")):  # its steps run here
        resolve_device(options["device"], options["dtype"])  # a device this machine lacks
    out = options["out"]
    analyses = os.path.join(out, ANALYSES)
    for option, only in ONLY_FOR.items():
        if options.get(option) and artifact != only:
            raise ArgumentError(f"--{option}: only for {only}")
    if artifact == "table2":
        if options.get("trust_remote_code"):
            raise ArgumentError("--trust-remote-code: only for the analysing artifacts (table2 evaluates our runs)")
        refuse_unless_ours(os.path.join(out, "table2"), TABLE, "--out", "use another --out")  # was: after evaluating
        check_include_path(options.get("include_path"))  # as its evaluate steps would, hours later under --slurm
        evaluate_args = passed_on(options, EVALUATE_OPTIONS)
        pretrained, first = options.get("pretrained") or "auto", []
        if pretrained.startswith(HF):  # a hub model as published (GPT2-large's row): evaluated first
            checked(pretrained, "--pretrained", hub_model)  # as its evaluate step would take it
            folder = os.path.join(out, PRETRAINED, safe_name(pretrained.removeprefix(HF)))
            first = [Step("evaluate", [pretrained, "--out", folder, *evaluate_args], pretrained)]
            pretrained = folder
        specs = options.get("models") or []
        if not specs and not first:
            raise ArgumentError(
                "table2: give the evaluated runs with --models [ARM=]RUN,... (train them from "
                "train_configs/paper/midtrain_*.toml with launch/train.sh, several seeds each), or --pretrained "
                "hf:MODEL for a block of the Pretrained row alone (GPT2-large, -xl)"
            )
        runs = [run for spec in specs for run in checked(spec, "--models", arm_runs)[1]]
        named: dict[str, str] = {}  # a run's real path -> as given: was refused by the table, after evaluating
        for run in runs:
            if not _is_run(run):
                pretrained = f"its row of Table 2: --pretrained {HF}{run.removeprefix(HF)}"  # a hub model's
                way = f"train it first: launch/train.sh CONFIG --job.dump_folder {run}"
                if run.startswith(HF):
                    way = f"a hub model; {pretrained}"
                elif not os.path.exists(run) and run.count("/") == 1 and run[0] not in "./":  # maybe a hub id
                    way += f"; a hub model: {pretrained}"
                raise ArgumentError(f"--models: {run}: not a run folder ({way})")
            if (real := os.path.realpath(run)) in named:
                raise ArgumentError(f"--models: {named[real]} and {run} are the same run ({real}); name each run once")
            named[real] = run
        try:  # a cp -a copy or a rerun: the table's rule, here before any evaluation
            one_seed_each([(run, metadata) for run in runs if (metadata := recorded_run(run)) is not None])
        except DispersionTitanError as e:
            raise ArgumentError(f"--models: {e}") from None
        steps = [Step("evaluate", [run, *evaluate_args], os.path.basename(os.path.normpath(run))) for run in runs]
        return PaperWorkflow(artifact, out, first + steps, runs=list(specs), pretrained=pretrained)
    if options["protocol"] not in ANALYSIS_PROTOCOLS:
        raise ArgumentError(
            f"--protocol: {options['protocol']!r} is analyze's paper (the default) or default for this artifact"
        )
    analyze_args = passed_on(options, ANALYZE_OPTIONS)
    if artifact == "fig3":
        return _fig3_workflow(options, analyses, analyze_args)
    if artifact == "fig4":
        models = [_fig4_model(options, analyses)]
    elif artifact == "counteract":
        models = _counteract_models(options, analyses)
    elif options.get("models"):
        models = [model_of(m, analyses) for m in options["models"]]
        outs = [m.out for m in models]  # was: drawn twice, its row's trend then undefined
        if twice := next((given for given, o in zip(options["models"], outs, strict=True) if outs.count(o) > 1), None):
            raise ArgumentError(f"--models: {twice} is named twice; name each model once")
        if artifact == "fig5":
            if len(models) % 2:
                raise ArgumentError("--models: fig5 takes bases then their distilled models (an even number)")
            models = [replace(m, row="base" if 2 * i < len(models) else "distilled") for i, m in enumerate(models)]
    else:  # the paper's: fig2 a row per family, fig5 the bases then their distilled models
        paper = {
            "fig2": [(m, series) for series, ids in catalog.SIZE_SERIES.items() for m in ids],
            "fig5": [(a, "base") for a, _ in catalog.DISTILLATION_PAIRS]
            + [(b, "distilled") for _, b in catalog.DISTILLATION_PAIRS],
            "robustness": [(m, None) for m in catalog.GPT2_HUB_IDS],
        }
        models = [model_of(m, analyses, row) for m, row in paper[artifact]]
    given = bool(options.get("models")) or artifact == "fig4"
    models, left_out = with_remote_code(models, options, given)
    if artifact == "robustness":
        if options.get("texts") or options.get("dataset"):
            raise ArgumentError("--texts/--dataset: robustness sets them per corpus; use --corpus NAME=SOURCE")
        rows, steps = [], []
        shared = passed_on({**options, "dataset_path": None}, ANALYZE_OPTIONS)  # --dataset-path: per corpus
        for name, inputs in corpora(options).items():
            for m in models:
                placed = replace(
                    m, row=name, out=os.path.join(analyses, f"corpus-{safe_name(name)}", os.path.basename(m.out))
                )
                rows.append(placed)
                steps.append(replace(analyze_step(placed, [*inputs, *shared]), label=f"{m.label} on {name}"))
        return PaperWorkflow(artifact, out, steps, rows, left_out=left_out)
    return PaperWorkflow(artifact, out, [analyze_step(m, analyze_args) for m in models], models, left_out=left_out)


@dataclass(frozen=True)
class SweepRun:
    """One of fig3's runs: a preset's MLP-width sweep, both arms per width, trained under ``DIR/runs/``."""

    width: int
    dispersion: bool
    config: str
    overrides: tuple[str, ...]
    folder: str

    @property
    def train_argv(self) -> list[str]:
        """``train.sbatch``'s (and ``launch/train.sh``'s)."""
        return [self.config, *self.overrides, "--job.dump_folder", self.folder]


def preset_runs(preset: str, runs_dir: str) -> list[SweepRun]:
    """Every run of ``preset``, by width, the cross-entropy arm first."""
    spec = catalog.FIG3_PRESETS[preset]
    per_width = "{width}" in spec.configs[0]  # one config per width, else --model.mlp_hidden_dim W
    runs = []
    for width in spec.widths:
        for dispersion, config in zip((False, True), spec.configs, strict=True):
            config = config.format(width=width)
            overrides = () if per_width else ("--model.mlp_hidden_dim", str(width))
            name = os.path.basename(config).removesuffix(".toml").replace("_angular_spread", "")
            name = (name if per_width else f"{name}_mlp{width}") + ("_angular_spread" if dispersion else "")
            runs.append(SweepRun(width, dispersion, config, overrides, os.path.join(runs_dir, name)))
    return runs


def checkpoint_steps(run: str) -> list[int]:
    """The steps of the run's checkpoints (none: not trained yet)."""
    try:
        return [c.step for c in list_checkpoints(find_checkpoint_folder(run))]
    except CheckpointError:
        return []


def is_trained(run: SweepRun) -> bool:
    """Whether the run holds its last step's complete checkpoint (``run.json``'s ``training_steps``)."""
    try:
        folder = find_checkpoint_folder(run.folder)
    except CheckpointError:  # not started, or no checkpoint yet
        return False
    steps = load_run_metadata(run.folder).get("training_steps")
    return steps is not None and trained_to(folder, steps)


def mlp_width(run: str) -> int:
    """The run's MLP width, from its ``run.json`` (GPT-2's 4·dim when unset)."""
    args = load_run_metadata(run)["model_args"]
    return args.get("mlp_hidden_dim") or 4 * args["dim"]


def _authors_key(run: str) -> tuple:
    """``plot_heatmaps.py``'s ``sort_key``: (dispersion run, −seed, −last step, path); the largest wins."""
    seed, steps = load_run_metadata(run).get("seed"), checkpoint_steps(run)
    dispersion = dispersion_variant(run) not in (None, "none")
    return (dispersion, -(seed if isinstance(seed, int) else -1), -(max(steps) if steps else -1), run)


def pick_per_width(runs: list[str], rule: str) -> dict[int, tuple[str, str | None]]:
    """Width -> (the run drawn under ``rule``, what ``paper fig3`` says of a width with several runs), widths
    ascending."""
    by_width: dict[int, list[str]] = {}
    for run in runs:
        by_width.setdefault(mlp_width(run), []).append(run)
    why = (
        "--pick ce: the cross-entropy run, then the lowest seed, the fewest steps"
        if rule == "ce"
        else "as the authors' plot_heatmaps.py: a dispersion run first, then the lowest seed, the fewest steps"
    )
    picked = {}
    for width in sorted(by_width):
        ordered = sorted(by_width[width], key=_authors_key)  # the cross-entropy runs first
        ce = [run for run in ordered if not _authors_key(run)[0]]
        if rule == "ce" and not ce:
            raise ArgumentError(
                f"fig3: MLP {width}: no cross-entropy-only run among {', '.join(ordered)}; give one, or "
                "--pick authors to draw a dispersion run as plot_heatmaps.py does"
            )
        taken = ce[-1] if rule == "ce" else ordered[-1]
        others = ", ".join(run for run in ordered if run != taken)
        arm = "a dispersion run" if _authors_key(taken)[0] else "a cross-entropy-only run"
        picked[width] = (taken, f"fig3: MLP {width}: takes {taken} ({arm}) over {others}, {why}" if others else None)
    return picked


def _fig3_workflow(options: dict, analyses: str, analyze_args: list[str]) -> PaperWorkflow:
    """fig3: per MLP width the ``--pick`` run, analysed at its first and last checkpoints; with
    ``--slurm`` the preset's runs not trained yet are trained first."""
    out, preset = options["out"], options.get("preset") or "paper"
    rule, rows = options.get("pick") or "ce", catalog.FIG3_ROWS[options.get("rows") or "last"]
    sweep, train = preset_runs(preset, os.path.join(out, "runs")), []
    if options.get("models"):
        runs = [model_of(m, analyses).target for m in options["models"]]
        for run in runs:
            if not checkpoint_steps(run):
                raise ArgumentError(f"--models: {run}: not a run with checkpoints")
        chosen = pick_per_width(runs, rule)
    elif options.get("slurm") and not options.get("draw_only"):
        train = [Step("train", run.train_argv, os.path.basename(run.folder)) for run in sweep if not is_trained(run)]
        for step in train:
            if not os.path.isfile(step.argv[0]):
                raise ArgumentError(
                    f"fig3: {step.argv[0]}: not here; run from the repository's root, which holds the preset's configs"
                )
        chosen = {run.width: (run.folder, None) for run in sweep if run.dispersion == (rule == "authors")}
    else:
        found = [run.folder for run in sweep if checkpoint_steps(run.folder)]
        if missing := sorted({run.width for run in sweep} - {mlp_width(run) for run in found}):
            run = next(run for run in sweep if run.width == missing[0])
            raise ArgumentError(
                f"fig3: no run of MLP width {missing[0]} in {os.path.dirname(run.folder)}: add --slurm to "
                f"train the preset first, or train it: {Step('train', run.train_argv, '').shell()} "
                "(or give runs with --models)"
            )
        chosen = pick_per_width(found, rule)
    trained_by = {step.argv[-1]: i for i, step in enumerate(train)}  # a run folder -> its training step
    models = [run_model(run, analyses, None, f"MLP {width}", "first,last") for width, (run, _) in chosen.items()]
    steps = [
        replace(analyze_step(m, analyze_args), after=(trained_by[m.target],) if m.target in trained_by else ())
        for m in models
    ]
    sbatch_args, gpus = options.get("sbatch_args") or [], None
    if train:  # refused here, as by the sweep, not by each training job as it starts
        check_train_time(sbatch_args, "--sbatch-arg", "--sbatch-arg")
        if (asked := gpus_asked(sbatch_args)) is not None:
            raise ArgumentError(f"--sbatch-arg: {asked}: {TRAINING_GPUS}")
        gpus = gpus_per_node(sbatch_args, "--sbatch-arg", 1, TRAINS_ON_GPUS)
        try:  # the arms of one figure on one layout, as the sweep's cells
            recorded = json.loads(Path(out, "logs", ENVIRONMENT).read_text())
        except (OSError, ValueError):  # none yet, or cut short: nothing to compare with
            recorded = None
        then = recorded_gpus(recorded, given_option(sbatch_args, "--gpus-per-node"))
        refuse_other_gpus(then, gpus, f"{out} holds a paper fig3", "use another --out")
    notes = [note for _, note in chosen.values() if note] + training_layouts(train, sbatch_args, gpus)
    return PaperWorkflow("fig3", out, train + steps, models, notes=notes, rows=rows, gpus=gpus)


TRAINS_ON_GPUS = "fig3 trains on GPUs; give a count of at least 1"
TRAINING_GPUS = (  # why paper fig3 --slurm refuses a --sbatch-arg=--gpus (or a --gres of GPUs) while it trains
    # (sbatch 22.05 refused train.sbatch under --gpus=1 on launch/local_slurm.sh)
    "fig3's training jobs would get it too, over the GPUs per node their layout is checked for (train.sbatch's "
    "--gpus-per-node; sbatch refuses a --gpus below it: Failed to ensure --gpus >= --gres=gpu/--gpus-per-node); give "
    "the trainings' GPUs as --sbatch-arg=--gpus-per-node=N (each analysis asks its own), and a --gpus for the "
    "analyses once the runs are trained (the same command then trains none)"
)


def _counteract_models(options: dict, analyses: str) -> list[PaperModel]:
    """``--models BASE DISPERSION``, or the dump folders of ``catalog.COUNTERACT_CONFIGS``: each run analysed
    at every checkpoint, its row named by its loss."""
    runs = options.get("models") or []
    if runs and len(runs) != 2:
        raise ArgumentError("--models: counteract takes two runs, the default loss's and the dispersion run")
    for config in () if runs else catalog.COUNTERACT_CONFIGS:
        if not os.path.isfile(config):
            raise ArgumentError(f"counteract: {config}: not here; run from the repository's root, or give --models")
        run = read_toml(config, "counteract")["job"]["dump_folder"]
        if not checkpoint_steps(run):
            raise ArgumentError(
                f"counteract: no checkpoints in {run}: train it first (launch/train.sh {config}), or give "
                "--models BASE_RUN DISPERSION_RUN"
            )
        runs.append(run)
    models = []
    for run in runs:
        if not checkpoint_steps(run):
            raise ArgumentError(f"--models: {run}: not a run with checkpoints")
        variant = dispersion_variant(run)
        row = "default loss" if variant in (None, "none") else variant
        models.append(run_model(os.path.abspath(run), analyses, row, row, "all"))
    return models


def check_devices(workflow: PaperWorkflow, options: dict, cuda: bool) -> None:
    """The paper's large models refuse to start on a machine without a GPU unless asked."""
    if cuda or options.get("device") == "cpu":
        return
    if big := [m for m in workflow.models if m.size_b is not None and m.size_b > 2]:
        names = ", ".join(f"{m.label} ({m.size_b:g}B)" for m in big[:3]) + (" ..." if len(big) > 3 else "")
        raise ArgumentError(
            f"{workflow.artifact}: {names} need a GPU and there is none here: add --slurm (a cluster), "
            "or --device cpu to run on CPU anyway"
        )


def check_hub(workflow: PaperWorkflow) -> None:
    """With the hub offline (HF_HUB_OFFLINE), every hub model must already be in the cache."""
    if not constants.HF_HUB_OFFLINE:
        return
    for spec in filter(None, (m.spec for m in workflow.models)):
        for revision in () if spec.local else spec.revisions:
            if not isinstance(try_to_load_from_cache(spec.model, "config.json", revision=revision), str):
                get = f"hf download {spec.model}" + (f" --revision {revision}" if revision else "")
                raise ArgumentError(
                    f"{workflow.artifact}: {spec.name(revision).removeprefix(HF)} is not in the Hugging Face cache and "
                    f"the hub is offline (HF_HUB_OFFLINE): run `{get}` where the hub is reachable, then again here"
                )


def slurm_jobs(workflow: PaperWorkflow, draw_argv: list[str], sbatch_args: list[str]) -> list[SlurmJob]:
    """The steps' jobs, then the drawing job, which waits for them all (``sbatch_args`` as ``build`` checked them)."""
    logs = os.path.join(workflow.out, "logs")
    # a --gpus-per-node given here lays out the trainings (fig3): the other jobs keep their own --gpus (sbatch refuses
    # a --gpus=1 under more GPUs per node, and gives a --gpus=0 job those)
    alone = ["--gpus-per-node=0"] if given_option(sbatch_args, "--gpus-per-node") else []
    lines = []
    for i, step in enumerate(workflow.steps, start=1):
        # a model too large for one GPU in its --dtype gets the GPUs its weights need and --device-map auto
        # (a later --sbatch-arg=--gpus=N wins; refused where fig3 trains: TRAINING_GPUS)
        dtype, device = (step.argv[step.argv.index(o) + 1] if o in step.argv else None for o in ("--dtype", "--device"))
        gpus = 1 if step.size_b is None or device == "cpu" else catalog.gpus_needed(step.size_b, dtype or "fp32")
        spread = [] if gpus == 1 else [f"--gpus={gpus}"]
        argv = step.argv if gpus == 1 or "--device-map" in step.argv else [*step.argv, "--device-map", "auto"]
        name = f"paper-{workflow.artifact}-{i}"
        told, own = (lead_told(sbatch_args), []) if step.command == "train" else ([], alone)  # told: as the sweep's
        command = sbatch(name, logs, [*spread, *told, *sbatch_args, *own], step.command, argv)
        lines.append(SlurmJob(f"job_{i}", name, command, [f"job_{j + 1}" for j in step.after]))
    name = f"paper-{workflow.artifact}-draw"
    draw = sbatch(name, logs, ["--gpus=0", *sbatch_args, *alone], "paper", draw_argv)
    return [*lines, SlurmJob("", name, draw, [job.key for job in lines])]


def record_gpus(workflow: PaperWorkflow) -> None:
    """fig3 --slurm: the GPUs per node its trainings are submitted for and where from (``logs/environment.json``),
    which a submission again into --out compares (``_fig3_workflow``)."""
    if workflow.gpus:
        count, source = workflow.gpus
        write = json.dumps({**gpus_environment(), "gpus_per_node": count, "from": source}) + "\n"
        records.atomic_write(os.path.join(workflow.out, "logs", ENVIRONMENT), lambda f: f.write(write))


def _in(work_dir: str, path: str | None) -> str | None:
    """``path`` as a job working in ``work_dir`` reads it."""
    return path and os.path.join(work_dir, os.path.expanduser(path))


def refuse_other_settings(workflow: PaperWorkflow, analyze: argparse.ArgumentParser, queued: bool = False) -> None:
    """--slurm: an analysis folder that holds results of other inputs (another artifact's, of another --seq-len)
    refused at submission, by the check its analyze job would apply hours later (``still_to_do``); ``queued``: or
    that another artifact's analyze job still queued (``logs/submitted.json``) would write so."""
    jobs = submitted_jobs(Path(workflow.out, "logs", "submitted.json")) if queued else {}
    others = {}  # job id: (the folder it analyzes into, its inputs); this artifact's own: _refuse_queued_twice
    for job_id, work_dir in sorted(queued_jobs(list(jobs)).items()):
        argv = [str(a) for a in jobs[job_id]] if isinstance(jobs[job_id], list) else []  # a hand edit's: none
        script = next((i for i, a in enumerate(argv) if a.endswith("/analyze.sbatch")), None)
        if script is None or (job_name(argv) or "").startswith(f"paper-{workflow.artifact}-"):
            continue
        # its paths as the job reads them, from its working directory; one this version cannot read (another
        # version's options, its texts gone since) is left to its own job's check
        with suppress(SystemExit, DispersionTitanError), redirect_stderr(io.StringIO()):
            theirs = analyze.parse_args(argv[script + 1 :])
            theirs.out, theirs.texts = _in(work_dir, theirs.out), _in(work_dir, theirs.texts)
            theirs.dataset_path = absolute(theirs.dataset_path, work_dir)
            if theirs.out and not theirs.force:
                others[job_id] = os.path.realpath(theirs.out), asdict(input_options(theirs))
    for step in workflow.steps:
        if step.command != "analyze" or "--force" in step.argv:
            continue
        given = analyze.parse_args(step.argv)
        mine = located(asdict(input_options(given)))  # its files as ``located_inputs`` names the recorded ones

        def differs(result: Condensation, lowered: bool = given.seq_len is None) -> str:
            inputs = result.located_inputs(given.out)
            recorded = {key: inputs.get(key) for key in mine}
            if lowered and (recorded["seq_len"] or 0) < mine["seq_len"]:  # the default, fitted to the model's length
                recorded["seq_len"] = mine["seq_len"]
            return records.differences(recorded, mine)

        still_to_do(given.out, {}, read_analyses(given.out), differs, lambda *_: False, "analyzed")
        for job_id, (folder, inputs) in others.items():  # one folder by any path: relative, through a link
            if folder == os.path.realpath(given.out) and (diff := records.differences(inputs, mine)):
                raise ArgumentError(
                    f"--out: {given.out}: job {job_id}, queued or running, analyzes into it with other settings "
                    f"({diff}); wait for it to end, or scancel {job_id}, then submit again"
                )


def training_layouts(train: list[Step], sbatch_args: list[str], per_node: tuple[int, str] | None) -> list[str]:
    """fig3 --slurm: a paper config's ``[released]`` layout on the GPUs ``train.sbatch`` gets (``per_node``:
    ``gpus_per_node``, None where it trains none), per training job."""
    if per_node is None:
        return []
    gpus = per_node[0] * sbatch_count(sbatch_args, "--nodes", 1, "--sbatch-arg", 1, TRAINS_ON_GPUS)
    from ...job_config import parse, released  # TorchTitan (3 s of CPU): only where fig3 trains

    configs = [(step.label, parse.validated_args(launch_args(*step.argv), gpus)) for step in train]
    return [f"fig3: {label}: {released.summary(config)}" for label, config in configs if released.is_on(config)]


def draw_argv(argv: list[str], workflow: PaperWorkflow, options: dict) -> list[str]:
    """The drawing job's command line: this one without --slurm/--dry-run/--sbatch-arg, its --out
    absolute, --draw-only once, with the revisions fig4 listed from the hub."""
    dropped = argparse.ArgumentParser(add_help=False)
    for flag in ("--slurm", "--dry-run", "--draw-only"):
        dropped.add_argument(flag, action="store_true")
    for option in ("--sbatch-arg", "--out"):
        dropped.add_argument(option, action="append")
    kept = dropped.parse_known_args(argv)[1]  # the rest, in order
    if workflow.artifact == "fig4" and not options["revisions"]:
        kept += ["--revisions", workflow.models[0].target.rpartition("@")[2]]
    return [*kept, "--out", options["out"], "--draw-only"]
