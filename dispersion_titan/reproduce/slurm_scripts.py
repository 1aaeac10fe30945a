"""The sbatch scripts the sweep and ``paper --slurm`` submit, and their submission with
dependencies. The scripts ship inside the package (``launch_scripts/slurm/``), so an
installed package finds them as a checkout does, and their jobs run this very interpreter."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from ..utils.errors import ArgumentError, DispersionTitanError, interruptible
from ..utils.records import atomic_write

SLURM_SCRIPTS = Path(str(files("dispersion_titan") / "launch_scripts" / "slurm"))  # package data
SBATCH_GPUS_PER_NODE = 8  # train.sbatch's request
SBATCH_SIGNAL_LEAD_S = 300  # train.sbatch's --signal=B:USR1@300: its warning before the time limit


def job_python() -> str:
    """The interpreter the jobs run (``common.sh``'s ``PYTHON``): the user's, else this one."""
    return os.environ.get("PYTHON") or sys.executable


def sbatch(name: str, logs: str | Path, options: list[str], script: str, args: Iterable[object]) -> list[str]:
    """A job's sbatch command line: sbatch's ``options``, then the package's ``script.sbatch`` with its ``args``."""
    start = ["sbatch", "--parsable", f"--job-name={name}", f"--output={logs}/%x-%j.out", "--kill-on-invalid-dep=yes"]
    # SBATCH_GPUS_PER_NODE, read for train.sbatch's nodes, is every job's: sbatch 22.05 refuses it over the others'
    # --gpus=1 (Failed to ensure --gpus >= --gres=gpu/--gpus-per-node) and gives a --gpus=0 job its GPUs
    alone = ["--gpus-per-node=0"] if script != "train" and GPUS_VARIABLE in os.environ else []
    return [*start, *alone, *options, str(SLURM_SCRIPTS / f"{script}.sbatch"), *map(str, args)]


SBATCH_OPTIONS = {  # each sbatch option read here: its short form ("": none), its shortest abbreviation that
    # sbatch 22.05 (getopt_long) takes as it, and its input environment variable ("": none; man sbatch), which it
    # reads over its script's #SBATCH lines, and its command line's options over it. Shorter abbreviations it calls
    # ambiguous: --a (--account --acctg-freq --array), --de (--deadline --delay-boot --dependency), --s (--signal
    # --sockets-per-node ...), --gpus-per (-node -socket -task), --node (--nodefile ...), --gre (--gres-flags).
    # SBATCH_CHDIR, SBATCH_NODES ...: ignored, tried on launch/local_slurm.sh
    "--array": ("-a", "--ar", "SBATCH_ARRAY_INX"),
    "--chdir": ("-D", "--ch", ""),
    "--dependency": ("-d", "--dep", ""),
    "--error": ("-e", "--er", ""),
    "--export": ("", "--export", "SBATCH_EXPORT"),  # --expor: --export or --export-file
    "--export-file": ("", "--export-", ""),
    "--gpus": ("-G", "--gpus", "SBATCH_GPUS"),
    "--gpus-per-node": ("", "--gpus-per-n", "SBATCH_GPUS_PER_NODE"),
    "--gpus-per-socket": ("", "--gpus-per-s", "SBATCH_GPUS_PER_SOCKET"),
    "--gpus-per-task": ("", "--gpus-per-t", "SBATCH_GPUS_PER_TASK"),
    "--gres": ("", "--gres", "SBATCH_GRES"),
    "--input": ("-i", "--in", ""),
    "--kill-on-invalid-dep": ("", "--k", ""),
    "--nodefile": ("-F", "--nodef", ""),
    "--nodes": ("-N", "--nodes", ""),
    "--output": ("-o", "--ou", ""),
    "--signal": ("", "--si", "SBATCH_SIGNAL"),
    "--time": ("-t", "--time", "SBATCH_TIMELIMIT"),  # --tim: --time or --time-min
}
GPUS_VARIABLE = SBATCH_OPTIONS["--gpus-per-node"][2]  # SBATCH_GPUS_PER_NODE, which sbatch reads for the trainings


NO_ARGUMENT = "HOQsvW"  # sbatch 22.05's short options that take no argument and submit (-h -V print and exit;
# -k's argument is optional: -kd is -k d): getopt reads them bundled before another, -Hd X as -H -d X


def option_values(args: list[str], long: str) -> list[tuple[str, str]]:
    """Each time ``args`` give sbatch's option ``long`` (``SBATCH_OPTIONS``), in any of its spellings (``-dX``,
    ``-d X``, after flags bundled with it, ``-Hd X``, ``--dependency=X``, ``--dependency X``, or an abbreviation
    sbatch takes, ``--dep=X``): the argument as given, and its value."""
    short, shortest, _ = SBATCH_OPTIONS[long]
    found = []
    for arg, after in itertools.pairwise([*args, ""]):
        name, eq, value = arg.partition("=")
        if name.startswith("--") and long.startswith(name) and len(name) >= len(shortest):
            found.append((arg, value if eq else after))
        elif short and (given := re.fullmatch(f"-[{NO_ARGUMENT}]*{short[1:]}(.*)", arg, re.DOTALL)):
            found.append((arg, given[1] or after))
    return found


def given_option(args: list[str], long: str) -> str | None:
    """The first of ``args`` that gives sbatch's option ``long``, in any of its spellings."""
    return next((given for given, _ in option_values(args, long)), None)


def environment_options() -> dict[str, str]:
    """The options sbatch reads from its environment (``SBATCH_OPTIONS``), each as an argument (``--signal=X``) with
    the variable giving it."""
    return {f"{option}={os.environ[var]}": var for option, (*_, var) in SBATCH_OPTIONS.items() if var in os.environ}


def sbatch_reads(args: list[str], option: str, where: str) -> tuple[str, str, str] | None:
    """What sbatch reads for ``option``: the last of ``args`` giving it, else its environment's (None: neither), as
    where it is given (``where``: the key of ``args``; else the variable), the argument and its value."""
    environment = environment_options()
    given_here = option_values(args, option)
    if not (found := given_here or option_values(list(environment), option)):
        return None
    given, value = found[-1]
    return (where if given_here else environment[given]), given, value


def sbatch_count(args: list[str], option: str, default: int, where: str, least: int, why: str) -> int:
    """The count sbatch reads for ``option`` (``--nodes``, ``--gpus-per-node``, ``sbatch_reads``), a GPU type's too
    (``h100:4``), else ``default``; refused (``where``: the key of ``args``) below ``least`` (``why``), or not one
    count: a node range (``--nodes=2-4``) leaves the training's layout, checked here for its GPUs, to the nodes
    Slurm grants."""
    where, given, value = sbatch_reads(args, option, where) or (where, "", str(default))
    shown = given if given.endswith(value) else f"{given} {value}"  # -N0, --nodes=0; --nodes 0
    count = value.rpartition(":")[2] if option == "--gpus-per-node" else value
    if not count.isdigit():
        raise DispersionTitanError(
            f"{where}: {shown}: not one count, which the training's layout is checked for; give one, as {option}=N"
        )
    if int(count) < least:
        raise DispersionTitanError(f"{where}: {shown}: {why}")
    return int(count)


def signal_lead(sbatch_args: list[str]) -> int:
    """Seconds from train.sbatch's preemption signal to the time limit: the last --signal given (among
    ``sbatch_args``, else the environment's ``SBATCH_SIGNAL``), else its own."""
    lead = SBATCH_SIGNAL_LEAD_S
    for _, value in option_values([*environment_options(), *sbatch_args], "--signal"):
        seconds = value.rpartition("@")[2] if "@" in value else "60"  # sbatch's default lead
        lead = int(seconds) if seconds.isdigit() else lead
    return lead


# sbatch --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or no limit
SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|INFINITE|UNLIMITED", re.IGNORECASE)


def _seconds(limit: str) -> float:
    """An sbatch --time (as ``SLURM_TIME`` reads it) in seconds; no limit (0, INFINITE) is inf."""
    if not limit[0].isdigit():
        return math.inf
    days, dash, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if dash:  # D-H, D-H:M, D-H:M:S
        h, m, s = [*parts, 0, 0][:3]
    else:  # M, M:S, H:M:S
        h, m, s = parts if len(parts) == 3 else [0, *parts, 0][:3]
    return (int(days or 0) * 86400 + h * 3600 + m * 60 + s) or math.inf


def check_train_time(args: list[str], where: str, option: str, own: tuple[str, str] | None = None) -> None:
    """A training's time limit within the signal's lead would checkpoint and requeue every attempt at its first
    steps: the one sbatch reads for it, the last --time among its sbatch ``args`` (``where``: their key; ``option``
    gives them), else ``own`` (the key and value of a --time before them), else ``SBATCH_TIMELIMIT``."""
    where, _, limit = sbatch_reads(args, "--time", where) or ("", "", "")
    if own and not option_values(args, "--time"):
        where, limit = own
    if not SLURM_TIME.fullmatch(limit):  # none, or one sbatch refuses itself
        return
    lead = signal_lead(args)
    least = lead + 60  # sbatch --signal: "may be sent up to 60 seconds earlier than specified"
    if _seconds(limit) <= least:
        raise ArgumentError(
            f"{where}: {limit!r} leaves no time to train: train.sbatch is signalled {lead} s before the limit "
            "(Slurm may signal 60 s sooner) to checkpoint and requeue, so every attempt would stop at its first "
            f"steps; give more than {least // 3600:02d}:{least % 3600 // 60:02d}:{least % 60:02d}, or signal later "
            f"with {option}=--signal=B:USR1@60"
        )


def gpus_environment() -> dict[str, str | None]:
    """What a submission of trainings records of its environment, for ``refuse_other_gpus`` to compare."""
    return {GPUS_VARIABLE: os.environ.get(GPUS_VARIABLE)}


def _variable_source(value: str | None) -> str:
    """Where trainings whose sbatch options give no --gpus-per-node get theirs: ``value``, or train.sbatch's own."""
    return f"{GPUS_VARIABLE}={value}" if value is not None else f"{GPUS_VARIABLE} unset"


def gpus_per_node(args: list[str], where: str, least: int, why: str) -> tuple[int, str]:
    """The GPUs per node a training submitted with sbatch ``args`` gets (``sbatch_count``: the last of them giving
    --gpus-per-node, else SBATCH_GPUS_PER_NODE, else train.sbatch's own), and where from, as a submission gives it
    (``where``: the key of ``args``)."""
    count = sbatch_count(args, "--gpus-per-node", SBATCH_GPUS_PER_NODE, where, least, why)
    source, given, value = sbatch_reads(args, "--gpus-per-node", where) or (GPUS_VARIABLE, "", "")
    if source == GPUS_VARIABLE:
        return count, _variable_source(os.environ.get(GPUS_VARIABLE))
    return count, f"{where}={given}" if given.endswith(value) else f"{where}={given} {where}={value}"


def recorded_gpus(recorded: object, given: str | None) -> tuple[object, str] | None:
    """The GPUs per node trainings were submitted for, and where from, as ``recorded`` (``gpus_per_node``'s, with
    ``gpus_environment``); a record of ``gpus_environment`` alone (the sweep's, whose commands record its own
    --gpus-per-node; an earlier version's paper fig3) gives SBATCH_GPUS_PER_NODE's, compared only where no
    --gpus-per-node is ``given`` now. None: nothing to compare with (none recorded)."""
    if not isinstance(recorded, dict):
        return None
    if "gpus_per_node" in recorded:
        return recorded["gpus_per_node"], str(recorded.get("from"))
    value = recorded.get(GPUS_VARIABLE)
    return None if given else (str(value or SBATCH_GPUS_PER_NODE).rpartition(":")[2], _variable_source(value))


def refuse_other_gpus(then: tuple[object, str] | None, now: tuple[object, str], holds: str, elsewhere: str) -> None:
    """Trainings submitted again to go on on another number of GPUs per node (``now``: the count and where from)
    than they were submitted for (``then``: ``recorded_gpus``). ``holds``: what the folder holds; ``elsewhere``: the
    other way out."""
    if then is None or str(then[0]) == str(now[0]):
        return
    (count, was), (counted, is_) = then, now
    # an sbatch option giving them now wins over the variable then
    again = f"{was} and without {is_}" if was.startswith(GPUS_VARIABLE) and not is_.startswith(GPUS_VARIABLE) else was
    raise ArgumentError(
        f"{is_}: {holds} submitted with {was}: its trainings would go on on {counted} GPUs per node, not the "
        f"{count} they were submitted for; submit it again with {again}, or {elsewhere}"
    )


def lead_told(sbatch_args: list[str]) -> list[str]:
    """train.sbatch's sbatch option telling it the lead of a ``--signal`` among ``sbatch_args`` not its own, which
    its check of the time limit reads (``PREEMPT_LEAD``)."""
    lead = signal_lead(sbatch_args)
    return [f"--export=ALL,PREEMPT_LEAD={lead}"] if lead != SBATCH_SIGNAL_LEAD_S else []


EXPORTED = (  # why --export is refused: what these jobs need of their environment
    "these jobs read the environment they are submitted with: PYTHON, the interpreter they run (--export=NONE would "
    "drop it), and a training job the lead of a --signal given here, told with --export=ALL,PREEMPT_LEAD=N "
    "(train.sbatch checks its time limit against it)"
)
EXPORT_ALL = (
    "the jobs get the environment of the shell you submit from (sbatch's --export=ALL), so export what they need there"
)
REFUSED = {  # sbatch options these jobs cannot take, and why (paper --sbatch-arg refuses each, in this order)
    "--dependency": (
        "these jobs wait for the ones before them with a --dependency of their own, which sbatch would replace with "
        "this one (it keeps the last given); leave it out (to wait for a job of yours, submit once it ended, or hold "
        "them with --begin)"
    ),
    "--array": "the tasks of an array job would each run the same command, into the same folders; leave it out",
    "--chdir": (
        "these jobs run in the folder this command runs in, where the relative paths they are given (a config's, "
        "--texts ...) were checked; leave it out, and run the command from the folder you meant"
    ),
    "--kill-on-invalid-dep": (
        "these jobs are submitted with --kill-on-invalid-dep=yes: one whose dependency failed is cancelled, and "
        "the same command again submits it anew (with no it would wait forever, counted as queued); leave it out"
    ),
    "--export": (
        f"{EXPORTED}, which sbatch would replace with this one (it keeps the last given); leave it out: {EXPORT_ALL}"
    ),
}
OWN_GPUS = (  # why sbatch's environment asks no job for GPUs (sbatch 22.05 on launch/local_slurm.sh, Gres=gpu:8)
    "each job asks for the GPUs it needs (a training train.sbatch's --gpus-per-node, the others their own --gpus), "
    "which sbatch would read this variable"
)
GPU_REFUSED = "(Failed to ensure --gpus >= --gres=gpu/--gpus-per-node); leave it out"
REFUSED_ENVIRONMENT = {  # where ``REFUSED``'s reason fits the option alone, and options refused only here: sbatch
    # reads its command line over these
    "--export": (
        f"{EXPORTED}, which sbatch reads over this variable: such a job would not get what it gives the others; "
        f"leave it out: {EXPORT_ALL}"
    ),
    "--gpus": (
        f"{OWN_GPUS} with: it gives its count to every job asking none, and refuses a training asking more on a "
        f"node {GPU_REFUSED}"
    ),
    "--gres": (
        f"{OWN_GPUS}'s GPUs with: a training gets these per node, not those its layout was checked for, and a job "
        f"asking fewer is refused {GPU_REFUSED}"
    ),
    **dict.fromkeys(
        ("--gpus-per-socket", "--gpus-per-task"), f"{OWN_GPUS} with: every job would ask these GPUs too; leave it out"
    ),
}
GPU_GRES = re.compile(r"(^|,)(gres:)?gpu(:|,|$)")  # a --gres asking for GPUs (gpu, gpu:2, gpu:a100:2, gres:gpu:2)


WAITING = ("--dependency", "--kill-on-invalid-dep")  # of ``REFUSED``: a job that waits for none keeps them


def refuse_options(option: str, args: list[str], waits: bool = True) -> None:
    """Each of ``REFUSED`` (but ``WAITING`` for jobs that wait for none: not ``waits``) among the sbatch arguments
    ``option`` gives, in any of its spellings."""
    for name in (name for name in REFUSED if waits or name not in WAITING):
        if (given := given_option(args, name)) is not None:
            raise DispersionTitanError(f"{option}: {given}: {REFUSED[name]}")


GPU_OPTIONS = ("--gpus", "--gpus-per-socket", "--gpus-per-task", "--gres")  # sbatch's, beside --gpus-per-node


def asks_gpus(option: str, value: str) -> bool:
    """Whether sbatch's ``option`` with ``value`` asks for GPUs beside ``--gpus-per-node``."""
    return bool(GPU_GRES.search(value)) if option == "--gres" else option in GPU_OPTIONS


def gpus_asked(args: list[str]) -> str | None:
    """The first of ``args`` asking sbatch for GPUs beside ``--gpus-per-node`` (``asks_gpus``)."""
    found = (
        given for option in GPU_OPTIONS for given, value in option_values(args, option) if asks_gpus(option, value)
    )
    return next(found, None)


def refuse_environment() -> None:
    """Each of ``REFUSED`` given by sbatch's environment (``SBATCH_OPTIONS``), and GPUs it asks for, before any job."""
    for given, var in environment_options().items():
        option, _, value = given.partition("=")
        if option in REFUSED or asks_gpus(option, value):
            raise DispersionTitanError(
                f"{var}={value}: sbatch reads it as {option}: "
                f"{REFUSED_ENVIRONMENT.get(option) or REFUSED[option]} (here: unset {var})"
            )


DEPENDENCY_AT = 2
"""Where ``SlurmJob.command`` puts a job's ``--dependency``: after ``sbatch --parsable``, before the user's options."""


@dataclass
class SlurmJob:
    key: str  # shell variable holding its id in the dry-run script ("": none)
    label: str
    argv: list[str]  # the sbatch command, without its --dependency
    after: list[str] = field(default_factory=list)  # keys of the jobs it waits for

    def command(self, ids: dict[str, str]) -> list[str]:
        if not self.after:
            return self.argv
        after = f"--dependency=afterok:{':'.join(ids[k] for k in self.after)}"
        return [*self.argv[:DEPENDENCY_AT], after, *self.argv[DEPENDENCY_AT:]]


ALONE_AT = 5  # where ``sbatch`` puts SBATCH_GPUS_PER_NODE's --gpus-per-node=0: after its own options


def compared(argv: list[str]) -> list[str]:
    """A job's sbatch command as a submission again compares it with the one recorded: without the ``--dependency``
    ``SlurmJob.command`` put in (a user's own, further on, kept), nor the ``--gpus-per-node=0`` ``sbatch`` gives a job
    but a training under ``SBATCH_GPUS_PER_NODE``, which asks what the job asks without the variable (set for one
    submission, not the other, the jobs are the same)."""
    argv = [a for i, a in enumerate(argv) if not (i == DEPENDENCY_AT and a.startswith("--dependency="))]
    training = any(str(a).endswith(f"{os.sep}train.sbatch") for a in argv)
    added = argv[ALONE_AT : ALONE_AT + 1] == ["--gpus-per-node=0"] and not training
    return [a for i, a in enumerate(argv) if not (added and i == ALONE_AT)]


def script(header: list[str], jobs: list[SlurmJob], logs: str | Path, kept: dict[str, str] | None = None) -> str:
    """``--dry-run``: the submission as a bash script, each job id in a variable for its dependants (``kept``: the
    ids of the jobs submitted before that they wait for)."""
    lines = [*header, f"export PYTHON={shlex.quote(job_python())}  # the jobs' interpreter (launch_scripts/common.sh)"]
    lines.append(f"mkdir -p {shlex.quote(str(logs))}")
    ids = {**(kept or {}), **{job.key: f"${job.key}" for job in jobs}}
    for job in jobs:
        cmd = " ".join(a if a.startswith("--dependency=") else shlex.quote(a) for a in job.command(ids))
        lines.append(f"{job.key}=$({cmd})  # {job.label}" if job.key else cmd)
    return "\n".join(lines)


def queued_jobs(ids: list[str]) -> dict[str, str]:
    """Those of ``ids`` Slurm still holds, pending, running or completing (``squeue``'s default states), each with
    its working directory, where its command's relative paths lead ("": not said). An array job's tasks (its %i:
    ID_[1-2], ID_1) are the job ID sbatch printed (%F)."""
    if not ids:  # squeue --jobs= lists every job
        return {}
    try:
        proc = subprocess.run(
            ["squeue", "--noheader", "--format=%F %Z", f"--jobs={','.join(ids)}"], capture_output=True, text=True
        )
    except FileNotFoundError:
        raise DispersionTitanError(
            "squeue: not found (no Slurm here), so which jobs are still queued is unknown; run this on a login node"
        ) from None
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:  # (one id, gone from Slurm's memory)
        raise DispersionTitanError(f"squeue: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
    lines = (line.strip().partition(" ") for line in proc.stdout.splitlines())
    return {job_id: work_dir for job_id, _, work_dir in lines if job_id}


def require_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise DispersionTitanError("sbatch: not found (no Slurm here); submit from a login node, or see --dry-run")


def submitted_jobs(record: Path) -> dict[str, list[str]]:
    """The jobs submitted with these logs before (id: sbatch command), as ``record`` (``submitted.json``) holds them."""
    try:
        submitted = json.loads(record.read_text())
    except (FileNotFoundError, ValueError):  # none yet, or cut short: nothing to compare with
        submitted = {}
    return submitted if isinstance(submitted, dict) else {}


def _refuse_queued_twice(jobs: list[SlurmJob], record: Path) -> dict[str, list[str]]:
    """The jobs submitted with these logs before (id: sbatch command); refused if one of ``jobs`` is still queued."""
    submitted = submitted_jobs(record)
    queued = queued_jobs(list(submitted))
    for job in jobs:
        named = [i for i in sorted(queued) if job_name(submitted[i]) == job_name(job.argv)]
        same = next((i for i in named if compared(submitted[i]) == compared(job.argv)), None)
        if same:  # e.g. paper --slurm run twice: two analyses of one model, one refused by the other's lock
            raise DispersionTitanError(
                f"sbatch ({job.label}): the same job is queued or running as {same}; wait for it to end, or "
                f"scancel {same}, then submit again"
            )
        if named:  # other settings into the same folders: one of the two refused by their owner, hours from now
            raise DispersionTitanError(
                f"sbatch ({job.label}): job {named[0]} of this name is queued or running with other settings, and "
                f"writes where this one would; wait for it to end, or scancel {named[0]}, then submit again"
            )
    return submitted


def job_name(argv: object) -> str | None:
    """The ``--job-name=`` of an sbatch command (as ``submitted.json`` holds it; None: none, or not a command)."""
    args = argv if isinstance(argv, list) else []
    return next(
        (a.removeprefix("--job-name=") for a in args if isinstance(a, str) and a.startswith("--job-name=")), None
    )


def submit(
    jobs: list[SlurmJob],
    logs: str | Path,
    ids: dict[str, str] | None = None,
    then: str = "",
    recorded: Callable[[], object] = lambda: None,
) -> dict[str, str]:
    """Submit in order, after the jobs they name in ``ids`` (key: id; queued before), adding each one submitted there
    and recording it at once (``logs/submitted.json``, and the caller's ``recorded``: a submission killed midway
    leaves its queued jobs known); none that is still queued from an earlier submission; a refused submission
    ends it naming what was already submitted, and ``then``."""
    require_sbatch()
    os.makedirs(logs, exist_ok=True)
    record = Path(logs, "submitted.json")
    submitted = _refuse_queued_twice(jobs, record)
    ids = {} if ids is None else ids
    env = {**os.environ, "PYTHON": job_python()}  # sbatch hands its environment to the jobs
    for job in jobs:
        # Ctrl-C and SIGTERM held, raised once recorded: an sbatch cut short may have queued a job whose id nobody
        # read (sbatch in a session of its own: a terminal's Ctrl-C waits for its id)
        received: list[int] = []
        with interruptible(lambda signum, _: received.append(signum)):
            proc = subprocess.run(job.command(ids), capture_output=True, text=True, env=env, start_new_session=True)
            job_id = proc.stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"; none: --test-only
            if proc.returncode != 0 or not job_id:
                done = " ".join(ids[j.key] for j in jobs if j.key in ids)
                fallback = f"exit status {proc.returncode}" if proc.returncode else "nothing"
                said = (proc.stderr.strip().splitlines() or [fallback])[-1]
                reason = said if proc.returncode else f"submitted no job (it said: {said})"
                hint = f"; submitted so far: {done} (scancel {done})" if done else ""
                raise DispersionTitanError(f"sbatch ({job.label}): {reason}{hint}{then}")
            ids[job.key] = job_id
            print(f"{job_id:>10}  {job.label}", flush=True)  # said first: a record that cannot be written names it
            submitted[job_id] = job.argv
            atomic_write(str(record), lambda f: f.write(json.dumps(submitted, indent=1) + "\n"))
            recorded()
        if received:
            raise KeyboardInterrupt(received[0])
    return ids
