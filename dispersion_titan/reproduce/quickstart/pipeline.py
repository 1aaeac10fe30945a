"""The quickstart's work: the init panel, the toy sweep trained and analyzed as one-process jobs
(``jobs``), the comparisons and the summary; each step is skipped where its results exist."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ...analysis.compare import compare
from ...analysis.condensation_schema import RESULT_FILE, Condensation, read_results
from ...analysis.inputs import DEFAULT_DATASET, SPLIT, InputOptions, Sequences, select_sequences, windows
from ...analysis.measure import DecoderLayers, measure
from ...analysis.statistics import condensation
from ...config.cli import read_toml
from ...config.grid import Arm, Cell, cells
from ...models.gpt2.args import GPT2ModelArgs, gpt2_flavors
from ...run_folder.checkpoints import initialised_model, list_checkpoints, trained_to
from ...run_folder.outputs import atomic_write, read_json_object, read_result_folders, save_png, write_json
from ...run_folder.owners import FolderOwner, owned
from ...run_folder.settings import fixed
from ...tokenizer.encoders import tokenizer_folder
from ...utils.devices import ALLOW_CPU_ENV, CPU_MALLOC_ENV
from ...utils.errors import (
    WRITE_ADVICE,
    WRITE_FAILED,
    ArgumentError,
    DispersionTitanError,
    OutputError,
    fail,
    no_room,
)
from ...utils.records import differences, flatten
from . import VARIANT
from .figure import findings_figure
from .findings import InitPanel, findings, load_sweep, summary_markdown
from .jobs import Commands

OPTIONS_FILE = "quickstart.json"
INIT = re.compile(r"^w\d+(-s\d+)?$")
"""The init panel's result folders (``init_panel``)."""


@dataclass(frozen=True)
class QuickstartSetup:
    out: str
    config: str
    settings: dict  # the config's settings that change results (``run_folder.settings.fixed``), flattened
    widths: tuple[int, ...]
    coeff: float  # λ of the dispersion runs
    steps: int
    checkpoint_interval: int
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
        return Arm("none", 0.0), Arm(VARIANT, self.coeff)

    @property
    def seeds(self) -> tuple[int, ...]:
        """The main seed, then the extra ones measured at the smallest width for the seed spread."""
        return tuple(self.seed + i for i in range(self.spread_seeds + 1))

    @property
    def runs(self) -> list[Cell]:
        return cells(self.widths, self.arms, (self.seed,)) + cells(self.widths[:1], self.arms, self.seeds[1:])

    def identity(self) -> dict:
        """The options that change results (lists, as JSON reads them back): a rerun must have the same ones. The
        config by its settings, not its path: an edited one changes results, the same one elsewhere does not."""
        skipped = ("out", "jobs", "threads", "config", "settings")
        kept = {k: v for k, v in dataclasses.asdict(self).items() if k not in skipped}
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in kept.items()}
        return options | {f"config {key}": value for key, value in self.settings.items()}

    def dump(self, run: Cell) -> str:
        return os.path.join(self.out, "runs", run.name)

    def log(self, run: Cell, phase: str) -> str:
        return os.path.join(self.out, "logs", f"{run.name}.{phase}.log")


def progress(start: float) -> Callable[[str], None]:
    """Lines stamped with the time since ``start``, from several worker threads, never interleaved."""
    lock = threading.Lock()

    def say(message: str) -> None:
        minutes, seconds = divmod(int(time.monotonic() - start), 60)
        with lock:
            print(f"[{minutes:2d}:{seconds:02d}] {message}", flush=True)

    return say


def measure_at_init(args: GPT2ModelArgs, seed: int, sequences: Sequences, batch_size: int, run: str) -> Condensation:
    torch.manual_seed(seed)  # the model exactly as dispersion_titan.train initialises it with debug.seed = seed
    model = initialised_model(args).eval()
    measured = measure(DecoderLayers(model), sequences.tokens, batch_size, "cpu")
    return condensation(
        0,
        sequences,
        measured,
        dtype="fp32",
        device="cpu",
        checkpoint="initialization",
        run=run,
        model_args=dataclasses.asdict(args),
        n_params=sum(p.numel() for p in model.parameters()),
    )


def init_panel(
    out: str,
    flavor: str,
    widths: tuple[int, ...],
    seeds: Sequence[int],
    texts: InputOptions,
    say: Callable[[str], None],
) -> InitPanel:
    """Condensation at initialization, for model shapes too large to train on a laptop: the paper's "wider
    MLPs condense less" and "present from initialization" need GPT-2 small's shape, which a toy model lacks,
    and a fresh model costs one forward pass. Same statistics and ``condensation.json`` as a run's analysis
    (step 0, ``checkpoint`` = ``"initialization"``).

    Step-0 condensation of ``flavor`` at each width (``out/w{width}/``) and at the narrowest for each
    extra seed (``out/w{width}-s{seed}/``), on the sequences ``texts`` selects; a shape measured on the
    same sequences is read back (a corrupt one refused in one line before any work)."""
    begun = time.monotonic()
    extra = f"; seed {', '.join(map(str, seeds[1:]))} at {widths[0]}" if seeds[1:] else ""
    say(
        f"init     condensation at initialization, {flavor} shape, MLP width "
        f"{', '.join(map(str, widths))} at seed {seeds[0]}{extra}: one forward pass each"
    )
    stored = read_result_folders(out, RESULT_FILE, lambda data, path: (Condensation.from_json(data, path), 0), INIT)
    sequences = select_sequences(texts)
    jobs = [(w, seeds[0]) for w in widths] + [(widths[0], s) for s in seeds[1:]]
    results = {}
    for i, (width, seed) in enumerate(jobs, start=1):
        name = f"w{width}" if seed == seeds[0] else f"w{width}-s{seed}"
        folder, args = os.path.join(out, name), dataclasses.replace(gpt2_flavors[flavor], mlp_hidden_dim=width)
        start, cached = time.monotonic(), stored.get(name)
        if cached and cached.tokens_sha256 == sequences.sha256 and cached.model_args == dataclasses.asdict(args):
            results[width, seed] = cached
            say(f"init     MLP width {width}, seed {seed}: read back ({i} of {len(jobs)})")
            continue
        results[width, seed] = measure_at_init(args, seed, sequences, batch_size=4, run=folder)
        write_json(os.path.join(folder, RESULT_FILE), results[width, seed].to_json())
        took = time.monotonic() - start
        say(f"init     MLP width {width}, seed {seed}: measured in {took:.0f} s ({i} of {len(jobs)})")
    say(f"init     done in {time.monotonic() - begun:.0f} s")
    return InitPanel({w: results[w, seeds[0]] for w in widths}, {s: results[widths[0], s] for s in seeds})


def make_setup(a: argparse.Namespace) -> QuickstartSetup:
    config = os.path.abspath(a.config)
    toml = read_toml(config, "--config")
    try:
        steps = a.steps or toml["training"]["steps"]
        seed = toml["debug"]["seed"]
        interval = a.checkpoint_interval or toml["checkpoint"]["interval"]
    except (KeyError, TypeError) as e:  # TypeError: a section no table (training = 3), was a traceback
        needs = repr(e.args[0]) if isinstance(e, KeyError) else "tables"
        raise ArgumentError(
            f"--config: {config}: needs {needs} (training.steps, debug.seed and checkpoint.interval)"
        ) from None
    if a.init_flavor not in gpt2_flavors:
        raise ArgumentError(f"--init-flavor: {a.init_flavor!r} is not one of {sorted(gpt2_flavors)}")
    model = toml.get("model", {})
    trained = model.get("max_seq_len") or getattr(gpt2_flavors.get(model.get("flavor")), "positions", None)
    for positions, whose in (
        (gpt2_flavors[a.init_flavor].positions, f"the init panel's {a.init_flavor} shape (--init-flavor)"),
        (trained, f"the trained model ({config})"),
    ):  # longer: a traceback, or every analysis refusing it once every run has trained
        if positions and a.seq_len > positions:
            raise ArgumentError(f"--seq-len: {a.seq_len} exceeds the {positions} positions of {whose}")
    check_windows(a, runs_count=tokenizer_folder(model.get("name"), model.get("hf_assets_path")) is None)
    cpus = len(os.sched_getaffinity(0))
    jobs = min(a.jobs or cpus, 2 * len(a.widths) + 2 * a.spread_seeds)
    given = {f.name: getattr(a, f.name) for f in dataclasses.fields(QuickstartSetup) if hasattr(a, f.name)}
    derived = {"steps": steps, "checkpoint_interval": interval, "jobs": jobs, "threads": max(1, cpus // jobs)}
    settings = {key: value for key, value in flatten(toml).items() if fixed(key)}
    paths = {"out": os.path.abspath(a.out), "config": config, "settings": settings}
    return QuickstartSetup(**{**given, **derived, **paths, "seed": seed})


def check_windows(a: argparse.Namespace, runs_count: bool) -> None:
    """``--num-sequences`` and ``--init-num-sequences`` within the windows of ``--seq-len`` tokens the analyses draw
    from, before any work (was: every run trained, then every analysis refusing it). The init panel's tokenizer is
    GPT-2's BPE; the runs' count only where theirs is too (``runs_count``), else their analyses say it."""
    available = len(windows(InputOptions(DEFAULT_DATASET, None, None, 1, a.seq_len, seed=0)))
    wanted = (("--num-sequences", a.num_sequences),) if runs_count else ()
    for option, count in (*wanted, ("--init-num-sequences", a.init_num_sequences)):
        if count > available:
            raise ArgumentError(
                f"{option}: {count} exceeds the {available} windows of {a.seq_len} tokens (--seq-len) in "
                f"{DEFAULT_DATASET}'s {SPLIT} split, which the analyses draw their sequences from; "
                "lower it or --seq-len"
            )


def train_command(setup: QuickstartSetup, run: Cell) -> tuple[str, list[str]]:
    # --profile cpu: a CPU product (docs/training.md#cpu); every checkpoint from step 0 on, where trained() and the
    # analysis look, whatever the config says; validation at the last step: the summary reports its loss
    options = (
        f"--profile cpu --training.steps {setup.steps} --checkpoint.interval {setup.checkpoint_interval} "
        "--checkpoint.enable --checkpoint.save_initial --checkpoint.keep_latest_k 0 --checkpoint.folder checkpoint "
        f"--validation.freq {setup.steps}"
    )
    config = ["--job.config_file", setup.config]
    return "dispersion_titan.train", [*config, *options.split(), *run.overrides(setup.dump(run))]


def analyze_command(setup: QuickstartSetup, run: Cell) -> tuple[str, list[str]]:
    """``--force`` where a result is of a checkpoint saved since, which analyze refuses: a ``cp -r`` of OUT (without
    ``-p``) gives every file new times, which checkpoint identities record; its analyses are measured again (was:
    skipped, then every comparison refused them, exit 1)."""
    results = read_results(os.path.join(setup.dump(run), "condensation"))
    checkpoints = list_checkpoints(os.path.join(setup.dump(run), "checkpoint"))
    sizes = f"--num-sequences {setup.num_sequences} --seq-len {setup.seq_len}"
    force = ["--force"] if any(c.step in results and results[c.step].changed(c.path) for c in checkpoints) else []
    return "dispersion_titan.analyze", [setup.dump(run), *sizes.split(), *force]


def trained(setup: QuickstartSetup, run: Cell) -> bool:
    return trained_to(os.path.join(setup.dump(run), "checkpoint"), setup.steps)


def analyzed(setup: QuickstartSetup, run: Cell) -> bool:
    """Every checkpoint already analyzed on the same K×S sequences, as it is now."""
    results = read_results(os.path.join(setup.dump(run), "condensation"))
    return all(
        (r := results.get(c.step))
        and (r.num_sequences, r.seq_len) == (setup.num_sequences, setup.seq_len)
        and not r.changed(c.path)
        for c in list_checkpoints(os.path.join(setup.dump(run), "checkpoint"))
    )


ERROR = "dispersion_titan: error: "


def last_error(log: str) -> str:
    """The one-line error of a failed command, else the last line of its log."""
    try:
        with open(log, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        lines = ["(its log is gone)"]
    errors = [line.removeprefix(ERROR) for line in lines if line.startswith(ERROR)]
    return (errors or lines or ["(empty log)"])[-1]


# A job's out-of-room line as the commands (utils.errors.command) and the trainer (trainer.save_failure) say it:
# what filled up, then the file or checkpoint it was writing where it names one, up to the free space or what to do.
ROOM = {os.strerror(code).lower(): code for code in WRITE_ADVICE} | {"file size limit exceeded": errno.EFBIG}
ROOM_LINE = re.compile(
    rf"({'|'.join(map(re.escape, ROOM))})"
    r"(?:[^;]*? (?:writing|saving step-\d+ to) (.+?)(?: \((?:needs about|[\d.]+ MB free)|;))?"
)


def out_of_room(status: int, error: str) -> OSError | None:
    """The full disk, quota or file size limit a job failed for (its exit status and error line), if that."""
    found = ROOM_LINE.match(error) if status == WRITE_FAILED else None
    return OSError(ROOM[found[1]], os.strerror(ROOM[found[1]]), found[2]) if found else None


# TorchTitan's log line of a training step, "step: 30  loss: 4.1234 ...", not of a validation.
STEP_LINE = re.compile(rb"(?<!validate )step:\s*(\d+)\s+loss:")


def last_step(log: str, offset: int) -> int | None:
    """The last logged step in ``log`` from byte ``offset`` on (None: none yet); a line still being written names
    none before its ``loss:``."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            steps = STEP_LINE.findall(f.read())
    except FileNotFoundError:
        return None
    return int(steps[-1]) if steps else None


@contextlib.contextmanager
def step_progress(log: str, steps: int, name: str, say: Callable[[str], None], every_s: float = 15.0) -> Iterator[None]:
    """While the ``with`` block runs, says every ``every_s`` seconds how far ``log``'s training got, as
    ``train    NAME: step 30/60, ~40 s left`` (the time left at the rate since the first step seen), so
    the quickstart is not silent for minutes."""
    stop = threading.Event()
    # the steps of an earlier attempt, which a relaunch appends to, are not this one's
    start = os.path.getsize(log) if os.path.exists(log) else 0

    def watch() -> None:
        first, said = None, None
        while not stop.wait(every_s):
            step = last_step(log, start)
            if step is None or step == said:
                continue
            first = first or (step, time.monotonic())
            line = f"train    {name}: step {step}/{steps}"
            first_step, since = first
            if step > first_step:
                left = (time.monotonic() - since) / (step - first_step) * (steps - step)
                line += f", ~{left:.0f} s left"
            say(line)
            said = step

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def folder_id(path: str) -> tuple[int, int] | None:
    """Which folder ``path`` names now (device, inode); None when it names none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def process(
    setup: QuickstartSetup,
    run: Cell,
    commands: Commands,
    say: Callable[[str], None],
    out_id: tuple[int, int] | None,
    full: threading.Event,
) -> str | OSError | None:
    """Train (unless done) then analyze (unless done) one run; an error line, the out-of-room error a job failed
    with, or None. Nothing starts once OUT is no longer the folder ``out_id`` (moved or removed): its jobs would
    write a new one; nor once ``full`` is set, by a job that failed for want of room: the next would meet it too."""
    for phase, done, command in (("train", trained, train_command), ("analyze", analyzed, analyze_command)):
        if folder_id(setup.out) != out_id or full.is_set():
            return None
        if done(setup, run):
            say(f"{phase:8} {run.name}: already done, skipped")
            continue
        log = setup.log(run, phase)
        say(f"{phase:8} {run.name}: started (log: {log})")
        start = time.monotonic()
        with step_progress(log, setup.steps, run.name, say) if phase == "train" else contextlib.nullcontext():
            status = commands.run(*command(setup, run), log)
        if status < 0:  # its log's last line says where it was, not why
            return (
                f"{phase} {run.name} was killed by signal {-status} ({signal.strsignal(-status)}; log: {log}); "
                "the same command goes on from what it saved"
            )
        if status:
            error = last_error(log)
            if room := out_of_room(status, error):
                full.set()
                return room
            return f"{phase} {run.name} failed (exit {status}): {error} (log: {log})"
        say(f"{phase:8} {run.name}: done in {time.monotonic() - start:.0f} s")
    return None


def train_and_analyze(setup: QuickstartSetup, say: Callable[[str], None]) -> None:
    """Every run, ``setup.jobs`` at a time, forked from one server that imported the commands once."""
    # The quickstart trains on CPU by design, also on a node whose GPUs torch cannot use.
    env = {
        **CPU_MALLOC_ENV,
        **os.environ,
        "OMP_NUM_THREADS": str(setup.threads),
        "PYTHONUNBUFFERED": "1",
        ALLOW_CPU_ENV: "1",
    }
    preload = [
        "dispersion_titan.trainer.trainer",
        "dispersion_titan.analysis.runner",
        "scipy.stats",  # each analysis's rank correlations: 0.8 s of CPU per job when imported there
        "dispersion_titan.tokenizer.encoders:gpt2_encoding",
        "dispersion_titan.job_config.parse:warm",
    ]
    # Interrupted, the server stops the jobs (as it closes) before the pool waits for them
    out_id, full = folder_id(setup.out), threading.Event()
    with ThreadPoolExecutor(max_workers=setup.jobs) as pool, Commands(env, preload) as commands:
        ended = list(pool.map(lambda run: process(setup, run, commands, say, out_id, full), setup.runs))
    if (now := folder_id(setup.out)) != out_id:  # what failed, failed for that
        strays = f"; what its running jobs wrote after that is in a new {setup.out}" if now else ""
        fail(
            f"--out: {setup.out} was moved or removed while the quickstart ran; what it finished went with it: "
            f"rerun the same command with --out naming where it is now{strays}",
            status=1,
        )
    errors = [e for e in ended if isinstance(e, str)]
    for error in errors:
        print(f"dispersion_titan: error: {error}", file=sys.stderr)
    if room := next((e for e in ended if isinstance(e, OSError)), None):
        raise room  # the commands' line, last: what filled up, and what to do
    if errors:
        sys.exit(1)


def compare_runs(setup: QuickstartSetup, say: Callable[[str], None]) -> list[tuple[str, str]]:
    """Write every ``analyze compare``; return (description, path) of its figure and table."""
    main_seed = [r for r in setup.runs if r.seed == setup.seed]
    everything = [setup.dump(r) for r in main_seed]
    baselines = [setup.dump(r) for r in main_seed if r.arm.name == r.arm.method == "none"]
    files = []
    for name, runs, step in (
        ("final_width_sweep", baselines, str(setup.steps)),
        ("final_baseline_vs_dispersion", everything, str(setup.steps)),
        ("init_width_sweep", baselines, "0"),
    ):
        out = os.path.join(setup.out, "compare", name)
        compare(runs, out, step)
        say(f"compare  {name}: {out}")
        what = name.replace("_", " ")
        files += [
            (f"{what}, depth profiles", os.path.join(out, "compare.png")),
            (f"{what}, table", os.path.join(out, "compare.csv")),
        ]
    return files


def summarize(setup: QuickstartSetup, panel: InitPanel, files: list[tuple[str, str]]) -> str:
    runs = load_sweep([setup.dump(r) for r in setup.runs])
    found = findings(panel, runs, setup.seed)
    args = runs[0].final.model_args
    init = panel.widths[setup.init_widths[0]].model_args
    described = (
        f"Init panel: GPT-2 ({setup.init_flavor}: dim {init['dim']}, {init['n_layers']} blocks) freshly "
        f"initialised at MLP width {' / '.join(map(str, setup.init_widths))} (and {setup.spread_seeds} more "
        f"seed(s) at {setup.init_widths[0]}). Trained sweep: {len(runs)} runs "
        f"of a GPT-2 with dim {args['dim']}, {args['n_layers']} blocks, {args['n_heads']} heads on the "
        f"embedded Wikipedia sample ({setup.config}): MLP width {' / '.join(map(str, setup.widths))}, each "
        f"without and with {VARIANT} λ={setup.coeff}, seed {setup.seed} (and {setup.spread_seeds} more seed(s) "
        f"at width {setup.widths[0]}), {setup.steps} steps, checkpoints at step 0 and every "
        f"{setup.checkpoint_interval} steps."
    )
    figure = os.path.join(setup.out, "summary.png")
    save_png(findings_figure(panel, runs, found, setup.seed), figure)
    per_run = os.path.join(setup.out, "runs", "*", "condensation")
    all_files = [
        ("the paper's findings beside the measurements, one panel each", figure),
        ("init panel, condensation.json per width", os.path.join(setup.out, "init_panel")),
        *files,
        ("per run: evolution.png, heatmap_step-N.png, summary.csv", per_run),
        ("training and analysis logs", os.path.join(setup.out, "logs")),
    ]
    text = summary_markdown(runs, found, described, all_files)
    atomic_write(os.path.join(setup.out, "summary.md"), lambda f: f.write(text))
    return text


def check_same_options(setup: QuickstartSetup) -> None:
    """Record the options in OUT/quickstart.json, or refuse when OUT was made with others."""
    path = os.path.join(setup.out, OPTIONS_FILE)
    if os.path.isfile(path):
        try:
            recorded = read_json_object(
                path, "it records the options of the results there: restore it, or use another --out"
            )
        except OutputError as e:
            raise ArgumentError(f"--out: {e}") from None
        if "config" in recorded:  # before the config was recorded by its settings: its path alone
            raise ArgumentError(
                f"--out: {path} was written by an earlier dispersion_titan (it names the config by its path, not its "
                "settings, so whether its results are this config's is unknown); use another --out"
            )
        if changed := differences(recorded, setup.identity()):
            raise ArgumentError(
                f"--out: {setup.out} holds results made with other options (recorded vs given: {changed}); "
                "use another --out"
            )
    elif os.path.isdir(os.path.join(setup.out, "runs")):
        raise ArgumentError(f"--out: {setup.out} holds runs without {OPTIONS_FILE}; use another --out")
    write_json(path, setup.identity())


def run(setup: QuickstartSetup) -> None:
    """Everything the quickstart does for ``setup``, as the one writer of OUT; each step skipped where its results
    exist."""
    with owned(setup.out, FolderOwner("quickstart")):
        check_same_options(setup)
        begun = time.monotonic()
        say = progress(begun)
        say(
            f"quickstart: {len(setup.runs)} runs (MLP width {', '.join(map(str, setup.widths))} × "
            f"baseline/{VARIANT} λ={setup.coeff}), {setup.steps} steps each, {setup.jobs} at a time with "
            f"{setup.threads} thread(s) each; output: {setup.out}"
        )
        texts = InputOptions(DEFAULT_DATASET, None, None, setup.init_num_sequences, setup.seq_len, seed=0)
        folder = os.path.join(setup.out, "init_panel")
        panel = init_panel(folder, setup.init_flavor, setup.init_widths, setup.seeds, texts, say)
        train_and_analyze(setup, say)
        try:
            text = summarize(setup, panel, compare_runs(setup, say))
        except (DispersionTitanError, OSError) as e:
            if no_room(e):
                raise  # the command's own line: what filled up, and what to do
            fail(str(e).splitlines()[0], status=1)
        print("\n" + text)
        minutes, seconds = divmod(round(time.monotonic() - begun), 60)
        summary = os.path.join(setup.out, "summary.md")
        say(f"quickstart: finished in {minutes} min {seconds} s; summary: {summary}")
