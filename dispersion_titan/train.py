"""``torchrun … -m dispersion_titan.train --job.config_file X.toml``: the config parsed and checked once
(bad input in one line before any process group starts), then trained on.

``--check-only`` (``launch/train.sh``, before torchrun) stops after the checks: exit 0 to go on, 2 for
bad input, ``NOTHING_TO_DO`` when the run already reached ``training.steps``.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import socket
import sys
from operator import attrgetter

from dispersion_titan.config.cli import (
    HELP_ALL_FLAG,
    HELP_FLAGS,
    check_toml_types,
    config_file,
    load_toml,
    train_usage,
    with_config_module,
    with_profile,
    without_profile,
)
from dispersion_titan.config.schema import JobConfig
from dispersion_titan.utils.errors import (
    ArgumentError,
    RunFinished,
    command,
    fail,
    run_command,
    say,
)

CHECK_ONLY = "--check-only"
CHECKED = "DISPERSION_TITAN_CHECKED"  # set by launch/train.sh for its ranks: its --check-only said the launch notes
NOTHING_TO_DO = 10
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def default_to_single_process() -> None:
    """Without torchrun, run as a 1-process job instead of failing on missing env vars."""
    if "LOCAL_RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        os.environ.setdefault(key, value)


def refuse_a_world_without_torchrun() -> None:
    """``WORLD_SIZE`` or ``RANK`` of a job of several processes left in the environment (exported for another
    tool, a job script's) where no torchrun started this one: no rank would join it, and the process group waited
    5 minutes for them, then exited 1 with no word."""
    if "LOCAL_RANK" in os.environ:
        return
    for name, alone in (("WORLD_SIZE", "1"), ("RANK", "0")):
        if os.environ.get(name, alone) not in ("", alone):
            raise ArgumentError(
                f"{name}={os.environ[name]} is set, but no torchrun started this process (LOCAL_RANK is unset), so "
                f"no other rank will join it; unset {name} to train in one process, or start several with "
                "launch/train.sh (NPROC=N)"
            )


def end_with_launcher() -> None:
    """In a torchrun rank on Linux: be killed when the launcher is. Killed by SIGKILL, torchrun cannot stop
    its ranks (their own sessions), which would train on as orphans; so each asks Linux for SIGKILL."""
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # not allowed here (a sandbox): the rank still stops when its collectives fail
    if os.getppid() == 1:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


@command("nothing saved", when="before training started")  # the trainer's handlers say the step once it has one
def main() -> None:
    end_with_launcher()  # a rank never outlives torchrun's launcher
    argv = sys.argv[1:]
    check_only = CHECK_ONLY in argv
    if any(a in HELP_FLAGS for a in argv):
        print(train_usage())
        return
    if argv and not argv[0].startswith("-"):  # CONFIG first, as launch/train.sh and plan take it
        raise ArgumentError(f"{argv[0]}: give the config as --job.config_file {shlex.quote(argv[0])}")
    if not check_only:
        refuse_a_world_without_torchrun()
    # what needs no TorchTitan is checked before it is imported (seconds)
    toml = load_toml(argv)
    args = with_config_module([a for a in argv if a not in (CHECK_ONLY, HELP_ALL_FLAG)], toml)
    own = {k: v for k, v in toml.items() if k in ("dispersion", "baseline")}  # sections TorchTitan does not have
    check_toml_types(JobConfig, own, config_file(argv))
    from dispersion_titan.components import titan_compat
    from dispersion_titan.job_config import checks, parse  # TorchTitan's import

    parse.setup_torchtitan()
    if HELP_ALL_FLAG in argv:  # TorchTitan's help of every section, ours included; exits
        sys.argv[0] = "python -m dispersion_titan.train"  # tyro's prog: python -m passes train.py's path
        titan_compat.config_manager_parse([*without_profile(args), "--help"], with_profile(argv, toml))
    try:
        job_config = parse.parse_job_config(args, toml)
        parsed = {key: attrgetter(key)(job_config) for key in checks.DERIVED}  # before the checks derive them
        # The lock is taken by the one process that checks a launch before its ranks start: not by a rank (rank
        # 0 takes it itself), not on one node of several (another's rank 0 may own the folder).
        one_node = os.environ.get("NNODES", "1") in ("", "1")
        job_config = parse.check_launch(job_config, take_lock="RANK" not in os.environ and one_node)
    except RunFinished as e:
        print(f"dispersion_titan: {e}", file=sys.stderr, flush=True)
        sys.exit(NOTHING_TO_DO if check_only else e.status)
    except ValueError as e:  # a DispersionTitanError among them
        fail(str(e).splitlines()[0])
    # Once per launch: by the check before it on one node (launch/train.sh's, or by hand), else by rank 0.
    if one_node if check_only else not (one_node and os.environ.get(CHECKED) == "1"):
        for note in checks.launch_notes(job_config, parsed):
            say(f"note: {note}")
    if check_only:
        return
    from dispersion_titan.trainer.trainer import train  # the ranks only: --check-only never builds it

    default_to_single_process()
    train(job_config)  # a DispersionTitanError (e.g. a hub dataset unreachable once the job runs): one line


if __name__ == "__main__":
    run_command(main)
