"""A launch server for the tests: imports torch, TorchTitan and dispersion_titan once,
then runs each requested training job by forking, so no launch pays those imports again
(about 5 s of CPU per process on the test machine, most of a short test run), nor
builds GPT-2's BPE again.

Each job is a forked child that runs torchrun's own launcher (``elastic_launch``, what
``torchrun`` calls: c10d rendezvous, one agent, real worker processes) with
``dispersion_titan.train.main`` (or, with ``script``, a script of ``tests/dist_scripts``)
as the entry point and forked workers. Its stdout and
stderr go to the files the request names; its exit status (0, or 1 when a worker failed,
as torchrun's) to ``<stdout>.rc``.

A request with ``module`` instead of ``nproc`` runs ``python -m MODULE ARGV`` in the forked
child (``runpy``, exit status as the interpreter's): the command-line tests of bad input,
which stop before any training, then pay no imports either.

Protocol: one JSON request per line on stdin ``{"nproc" [, "script"] | "module", "argv",
"env", "cwd", "stdout", "stderr"}``; the answer is the job's pid on one stdout line. The tests' ``helpers.torchrun``
is the client; tests of the command line itself (launch scripts, Slurm, signals) use the
real ``python -m torch.distributed.run`` instead.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import traceback
import warnings

import torch  # noqa: F401  (imported here once, for every job)
import torchtitan.train  # noqa: F401
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

import dispersion_titan.train
from dispersion_titan.tokenizer.bpe import gpt2_encoding

gpt2_encoding()  # GPT-2's BPE ranks (about 1 s to build), as an import: once, shared by every fork


def worker(argv: list[str], script: str | None) -> None:
    """One rank: exactly what ``python -m dispersion_titan.train ARGV`` (or ``python SCRIPT
    ARGV``) runs. Only local rank 0 writes to the job's output, as with ``torchrun
    --local-ranks-filter=0``."""
    if os.environ["LOCAL_RANK"] != "0":
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    if script:
        sys.argv = [script, *argv]
        runpy.run_path(script, run_name="__main__")
    else:
        sys.argv = ["dispersion_titan.train", *argv]
        dispersion_titan.train.main()


def run_module(module: str, argv: list[str]) -> int:
    """``python -m MODULE ARGV`` in this process: its exit status as the interpreter's."""
    sys.argv = [module, *argv]
    # The module was imported here beforehand, which a fresh ``python -m`` never warns about.
    warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0


def run_job(request: dict) -> int:
    """A training job under torchrun's launcher, or (``module``) one ``python -m`` command."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if "module" in request:
        return run_module(request["module"], request["argv"])
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=request["nproc"], run_id="test",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=0.1, start_method="fork")
    try:
        elastic_launch(config, worker)(request["argv"], request.get("script"))
        return 0
    except ChildFailedError as e:  # torchrun prints the same summary and exits 1
        print(e.format_msg(), file=sys.stderr, flush=True)
        return 1


def serve() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # finished jobs are reaped by the kernel
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid:
            print(pid, flush=True)
            continue
        status = 1
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setpgid(0, 0)  # the client can stop the job with all its workers
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            sys.stdin.close()
            status = run_job(request)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            # Written whole, then renamed: the client never reads a half-written status.
            with open(request["stdout"] + ".rc.tmp", "w") as f:
                f.write(str(status))
            os.replace(request["stdout"] + ".rc.tmp", request["stdout"] + ".rc")
            os._exit(status)


if __name__ == "__main__":
    serve()
