"""The main job end to end: ``bash launch/quickstart.sh`` (which sets up .venv first), or
``python -m dispersion_titan.quickstart [--out DIR] [--widths 64,256,1024] ...``.

First measures condensation at initialization for GPT-2 small's shape at four MLP widths
(the init panel: one forward pass each, no training). Then pre-trains the toy MLP-width
sweep of ``dispersion_titan/configs/quickstart.toml`` with and without the angular_spread
dispersion loss (plus a second seed at the smallest width, to measure the seed-to-seed
spread), analyzes every checkpoint (step 0 included), sets the runs side by side with
``analyze compare``, and sets each of the paper's findings against the measured numbers
(``dispersion_titan.report``): ``OUT/summary.md`` and ``OUT/summary.png``.

Runs are independent one-process jobs, ``--jobs`` of them at a time: on a few CPU cores
that beats one FSDP job over all cores, which pays for its collectives. On Linux each
job is forked from a server that imported torch and TorchTitan once
(``dispersion_titan.utils.preloaded``). A run whose
final checkpoint exists is not trained again, a run whose every checkpoint has been
analyzed with the same options is not analyzed again, and an interrupted run resumes
from its last complete checkpoint, so running the command twice only redoes what is
missing. Options that change results are recorded in ``OUT/quickstart.json``; a rerun
with other ones is refused in one line (use another ``--out``). Training and analysis
logs go to ``OUT/logs/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.resources import files

from dispersion_titan.config.cli import OneLineErrorParser, load_toml, positive_int
from dispersion_titan.config.grid import Arm, Cell, cells
from dispersion_titan.utils.devices import ALLOW_CPU_ENV, CPU_MALLOC_ENV
from dispersion_titan.utils.errors import ArgumentError, CheckpointError, DispersionTitanError, fail
from dispersion_titan.utils.preloaded import Commands

CONFIG = str(files("dispersion_titan") / "configs" / "quickstart.toml")  # package data
OUT_ENV = "QUICKSTART_OUT"
OPTIONS_FILE = "quickstart.json"
VARIANT = "angular_spread"


@dataclass(frozen=True)
class Plan:
    out: str
    config: str
    widths: tuple[int, ...]
    peak_coeff: float
    """λ of the dispersion runs (``--coeff``)."""
    steps: int
    interval: int
    num_sequences: int
    seq_len: int
    jobs: int
    threads: int  # OMP threads per job
    seed: int
    spread_seeds: int  # extra seeds at the smallest width
    init_flavor: str
    init_widths: tuple[int, ...]
    init_num_sequences: int

    @property
    def arms(self) -> tuple[Arm, Arm]:
        return Arm("none", 0.0), Arm(VARIANT, self.peak_coeff)

    @property
    def runs(self) -> list[Cell]:
        extra = tuple(self.seed + i for i in range(1, self.spread_seeds + 1))
        return (cells(self.widths, self.arms, (self.seed,))
                + cells(self.widths[:1], self.arms, extra))

    def identity(self) -> dict:
        """The options that change results: a rerun must have the same ones."""
        return {"config": self.config, "widths": list(self.widths), "coeff": self.peak_coeff, "steps": self.steps,
                "checkpoint_interval": self.interval, "num_sequences": self.num_sequences,
                "seq_len": self.seq_len, "seed": self.seed, "spread_seeds": self.spread_seeds,
                "init_flavor": self.init_flavor, "init_widths": list(self.init_widths),
                "init_num_sequences": self.init_num_sequences}

    def dump(self, run: Cell) -> str:
        return os.path.join(self.out, "runs", run.name)

    def log(self, run: Cell, phase: str) -> str:
        return os.path.join(self.out, "logs", f"{run.name}.{phase}.log")


class Progress:
    """Timestamped lines from several worker threads, never interleaved."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, message: str) -> None:
        minutes, seconds = divmod(int(self.elapsed()), 60)
        with self._lock:
            print(f"[{minutes:2d}:{seconds:02d}] {message}", flush=True)


def _widths(text: str) -> tuple[int, ...]:
    widths = tuple(positive_int(part.strip()) for part in text.split(","))
    if len(set(widths)) != len(widths):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a width")
    return tuple(sorted(widths))


def _coeff(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m dispersion_titan.quickstart",
                description="Train, analyze and compare the toy MLP-width × dispersion sweep; summarize it.")
    p.add_argument("--out", default=os.environ.get(OUT_ENV, "outputs/quickstart"),
                   help=f"output folder (default: ${OUT_ENV}, else outputs/quickstart)")
    p.add_argument("--config", default=CONFIG, help="training TOML shared by every run (default: quickstart.toml)")
    p.add_argument("--widths", type=_widths, default=(64, 256, 1024), help="MLP widths (default 64,256,1024)")
    p.add_argument("--coeff", type=_coeff, default=1.0, help=f"λ of the {VARIANT} runs (default 1.0)")
    p.add_argument("--steps", type=positive_int, help="training steps (default: the TOML's)")
    p.add_argument("--checkpoint-interval", type=positive_int, help="steps between checkpoints (default: the TOML's)")
    p.add_argument("--num-sequences", type=positive_int, default=32, help="analysis: K sequences (default 32)")
    p.add_argument("--seq-len", type=positive_int, default=128, help="analysis: S tokens (default 128)")
    p.add_argument("--spread-seeds", type=int, choices=range(0, 4), default=1, metavar="N",
                   help="extra seeds at the smallest width, for the seed-to-seed spread (0-3, default 1)")
    p.add_argument("--init-flavor", default="small", help="model shape of the init panel (default small: GPT-2 small)")
    p.add_argument("--init-widths", type=_widths, default=(768, 1536, 3072, 6144),
                   help="MLP widths of the init panel (default 768,1536,3072,6144)")
    p.add_argument("--init-num-sequences", type=positive_int, default=16,
                   help="init panel: K sequences of --seq-len tokens (default 16)")
    p.add_argument("--jobs", type=positive_int, help="runs at a time (default: one per CPU core, at most all runs)")
    return p


def make_plan(argv: list[str]) -> Plan:
    a = parser().parse_args(argv)
    config = os.path.abspath(a.config)
    try:
        toml = load_toml(["--job.config_file", config])
    except ArgumentError as e:  # named after this command's option
        raise ArgumentError(str(e).replace("--job.config_file", "--config", 1)) from None
    try:
        steps = a.steps or toml["training"]["steps"]
        seed = toml["debug"]["seed"]
        interval = a.checkpoint_interval or toml["checkpoint"]["interval"]
    except KeyError as e:
        raise ArgumentError(
            f"--config: {config}: needs {e.args[0]!r} (training.steps, debug.seed and checkpoint.interval)"
        ) from None
    from dispersion_titan.models.gpt2.args import gpt2_flavors

    if a.init_flavor not in gpt2_flavors:
        raise ArgumentError(f"--init-flavor: {a.init_flavor!r} is not one of {sorted(gpt2_flavors)}")
    cpus = len(os.sched_getaffinity(0))
    jobs = min(a.jobs or cpus, 2 * len(a.widths) + 2 * a.spread_seeds)
    return Plan(os.path.abspath(a.out), config, a.widths, a.coeff, steps, interval, a.num_sequences, a.seq_len,
                jobs, max(1, cpus // jobs), seed, a.spread_seeds, a.init_flavor, a.init_widths, a.init_num_sequences)


def train_command(plan: Plan, run: Cell) -> tuple[str, list[str]]:
    return "dispersion_titan.train", [
        "--job.config_file", plan.config,
        "--training.steps", str(plan.steps), "--checkpoint.interval", str(plan.interval),
        "--validation.freq", str(plan.steps),  # the summary reports the final validation loss
        *run.overrides(plan.dump(run)),
    ]


def analyze_command(plan: Plan, run: Cell) -> tuple[str, list[str]]:
    return "dispersion_titan.analyze", [plan.dump(run), "--num-sequences", str(plan.num_sequences),
                                        "--seq-len", str(plan.seq_len)]


def trained(plan: Plan, run: Cell) -> bool:
    from dispersion_titan.run_folder.checkpoints import check_complete

    try:
        check_complete(os.path.join(plan.dump(run), "checkpoint", f"step-{plan.steps}"))
    except CheckpointError:
        return False
    return True


def analyzed(plan: Plan, run: Cell) -> bool:
    """Every checkpoint already analyzed on the same K×S sequences."""
    from dispersion_titan.analysis.result_files import read_results
    from dispersion_titan.run_folder.checkpoints import list_checkpoints

    results = read_results(os.path.join(plan.dump(run), "condensation"))
    return all(
        c.step in results and (results[c.step].num_sequences, results[c.step].seq_len)
        == (plan.num_sequences, plan.seq_len)
        for c in list_checkpoints(os.path.join(plan.dump(run), "checkpoint"))
    )


def job_commands(plan: Plan) -> Commands:
    """Training and analysis commands, forked from one server that imported them once."""
    # The quickstart trains on CPU by design, also on a node whose GPUs torch cannot use.
    env = {**CPU_MALLOC_ENV, **os.environ, "OMP_NUM_THREADS": str(plan.threads), "PYTHONUNBUFFERED": "1",
           ALLOW_CPU_ENV: "1"}
    return Commands(env, preload=["dispersion_titan.trainer.trainer", "dispersion_titan.analysis.runner",
                                  "dispersion_titan.tokenizer.bpe:gpt2_encoding"])


def last_error(log: str) -> str:
    """The one-line error of a failed command, else the last line of its log."""
    with open(log, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    errors = [line for line in lines if line.startswith("dispersion_titan: error:")]
    return (errors or lines or ["(empty log)"])[-1]


def process(plan: Plan, run: Cell, commands: Commands, say: Progress) -> str | None:
    """Train (unless done) then analyze (unless done) one run; an error line or None."""
    for phase, done, command in (("train", trained, train_command), ("analyze", analyzed, analyze_command)):
        if done(plan, run):
            say(f"{phase:8} {run.name}: already done, skipped")
            continue
        log = plan.log(run, phase)
        say(f"{phase:8} {run.name}: started (log: {log})")
        start = time.monotonic()
        status = commands.run(*command(plan, run), log)
        if status:
            return f"{phase} {run.name} failed (exit {status}): {last_error(log)} (log: {log})"
        say(f"{phase:8} {run.name}: done in {time.monotonic() - start:.0f} s")
    return None


def train_and_analyze(plan: Plan, say: Progress) -> None:
    with job_commands(plan) as commands, ThreadPoolExecutor(max_workers=plan.jobs) as pool:
        errors = [e for e in pool.map(lambda run: process(plan, run, commands, say), plan.runs) if e]
    for error in errors:
        print(f"dispersion_titan: error: {error}", file=sys.stderr)
    if errors:
        sys.exit(1)


def comparisons(plan: Plan) -> list[tuple[str, list[str], str]]:
    """(folder name, runs, step) of each ``analyze compare``."""
    main_seed = [r for r in plan.runs if r.seed == plan.seed]
    everything = [plan.dump(r) for r in main_seed]
    baselines = [plan.dump(r) for r in main_seed if r.arm.is_baseline]
    return [
        ("final_width_sweep", baselines, str(plan.steps)),
        ("final_baseline_vs_dispersion", everything, str(plan.steps)),
        ("init_width_sweep", baselines, "0"),
    ]


def compare_runs(plan: Plan, say: Progress) -> list[tuple[str, str]]:
    """Write every comparison; return (description, path) of its figure and table."""
    from dispersion_titan.analysis.compare import compare

    files = []
    for name, runs, step in comparisons(plan):
        out = os.path.join(plan.out, "compare", name)
        compare(runs, out, step)
        say(f"compare  {name}: {out}")
        what = name.replace("_", " ")
        files += [(f"{what}, depth profiles", os.path.join(out, "compare.png")),
                  (f"{what}, table", os.path.join(out, "compare.csv"))]
    return files


def init_sequences(plan: Plan):
    from dispersion_titan.analysis.inputs import DEFAULT_DATASET, InputOptions, select_sequences

    return select_sequences(InputOptions(DEFAULT_DATASET, None, None, plan.init_num_sequences, plan.seq_len, seed=0))


def measure_init_panel(plan: Plan, say: Progress) -> dict:
    """Condensation at initialization of ``init_flavor`` at each ``init_widths`` (cached in OUT/init_panel)."""
    from dispersion_titan.report.init_panel import init_panel

    start = time.monotonic()
    panel = init_panel(os.path.join(plan.out, "init_panel"), plan.init_flavor, plan.init_widths, plan.seed,
                       init_sequences(plan))
    say(f"init     {plan.init_flavor} shape at MLP width {', '.join(map(str, plan.init_widths))}: "
        f"done in {time.monotonic() - start:.0f} s")
    return panel


def summarize(plan: Plan, panel: dict, files: list[tuple[str, str]]) -> str:
    """Write ``summary.png`` and ``summary.md``; return the summary's text."""
    from dispersion_titan.analysis.result_files import atomic_write
    from dispersion_titan.report.document import summary_markdown
    from dispersion_titan.report.figure import save_findings_figure
    from dispersion_titan.report.paper import findings
    from dispersion_titan.report.summary import load_sweep

    runs = load_sweep([plan.dump(r) for r in plan.runs])
    found = findings(panel, runs, plan.seed)
    args = runs[0].final.model_args
    init = panel[plan.init_widths[0]].model_args
    setup = (f"Init panel: GPT-2 ({plan.init_flavor}: dim {init['dim']}, {init['n_layers']} blocks) freshly "
             f"initialised at MLP width {' / '.join(map(str, plan.init_widths))}. Trained sweep: {len(runs)} runs "
             f"of a GPT-2 with dim {args['dim']}, {args['n_layers']} blocks, {args['n_heads']} heads on the "
             f"embedded Wikipedia sample ({plan.config}): MLP width {' / '.join(map(str, plan.widths))}, each "
             f"without and with {VARIANT} λ={plan.peak_coeff}, seed {plan.seed} (and {plan.spread_seeds} more seed(s) "
             f"at width {plan.widths[0]}), {plan.steps} steps, checkpoints at step 0 and every {plan.interval} steps.")
    figure = os.path.join(plan.out, "summary.png")
    save_findings_figure(panel, runs, found, plan.seed, figure)
    per_run = os.path.join(plan.out, "runs", "*", "condensation")
    all_files = [("the paper's findings beside the measurements, one panel each", figure),
                 ("init panel, condensation.json per width", os.path.join(plan.out, "init_panel")), *files,
                 ("per run: evolution.png, heatmap_step-N.png, summary.csv", per_run),
                 ("training and analysis logs", os.path.join(plan.out, "logs"))]
    text = summary_markdown(runs, found, setup, all_files)
    atomic_write(os.path.join(plan.out, "summary.md"), lambda f: f.write(text))
    return text


def check_same_options(plan: Plan) -> None:
    """Record the options in OUT/quickstart.json, or refuse when OUT was made with others."""
    import json

    from dispersion_titan.analysis.result_files import write_json

    path = os.path.join(plan.out, OPTIONS_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            recorded = json.load(f)
        changed = [f"{key} {recorded.get(key)!r} → {value!r}" for key, value in plan.identity().items()
                   if recorded.get(key) != value]
        if changed:
            raise ArgumentError(f"--out: {plan.out} holds results made with other options ({'; '.join(changed)}); "
                                "use another --out")
    elif os.path.isdir(os.path.join(plan.out, "runs")):
        raise ArgumentError(f"--out: {plan.out} holds runs without {OPTIONS_FILE}; use another --out")
    write_json(path, plan.identity())


def main(argv: list[str] | None = None) -> None:
    try:
        plan = make_plan(sys.argv[1:] if argv is None else argv)
    except ArgumentError as e:
        fail(str(e))
    from dispersion_titan.analysis.result_files import ensure_writable  # after parsing: --help and typos answer at once

    try:
        ensure_writable(plan.out, "--out")
        check_same_options(plan)
    except DispersionTitanError as e:
        fail(str(e))
    say = Progress()
    say(f"quickstart: {len(plan.runs)} runs (MLP width {', '.join(map(str, plan.widths))} × baseline/{VARIANT} "
        f"λ={plan.peak_coeff}), {plan.steps} steps each, {plan.jobs} at a time with {plan.threads} thread(s) each; "
        f"output: {plan.out}")
    panel = measure_init_panel(plan, say)
    train_and_analyze(plan, say)
    try:
        files = compare_runs(plan, say)
        text = summarize(plan, panel, files)
    except (DispersionTitanError, OSError) as e:
        fail(str(e).splitlines()[0], status=1)
    print("\n" + text)
    minutes, seconds = divmod(round(say.elapsed()), 60)
    say(f"quickstart: finished in {minutes} min {seconds} s; summary: {os.path.join(plan.out, 'summary.md')}")


if __name__ == "__main__":
    main()
