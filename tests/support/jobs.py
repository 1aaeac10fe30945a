"""The tests' job server: the product's (``dispersion_titan.reproduce.quickstart.jobs``) with what
only the tests need. Each job runs in its own process group (so that a timeout stops it with all its
workers), with its stderr apart; a job of ``nproc`` processes is torchrun's own launcher with forked
workers. Run as a script (``python tests/support/jobs.py PRELOAD...``), as ``Jobs`` starts it."""

from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import huggingface_hub.constants
import psutil

from dispersion_titan.reproduce.quickstart.jobs import Commands, _run, exit_status, serve


class Jobs(Commands):
    """The product's ``Commands`` with this script as its server."""

    server_args = [__file__]

    def run_apart(
        self,
        target: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        timeout: float,
        nproc: int | None = None,
        stdout: Path | None = None,
        file_limit: int | None = None,
        nodes: tuple[int, str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """``target`` (a module or a script) with ``argv`` in ``env`` and ``cwd``, under torchrun's
        launcher with ``nproc`` processes when given (on one of ``nodes``: their count, rendezvous endpoint and
        id, when given); its stdout (into the file ``stdout`` when given, for a test to watch while it runs) and
        stderr apart; ``file_limit``: its file size limit in bytes from the start, as ``ulimit -f`` sets a
        command's. After ``timeout`` seconds it is killed with every process it started and
        ``subprocess.TimeoutExpired`` is raised."""
        with tempfile.TemporaryDirectory() as tmp:
            out, err = stdout or Path(tmp, "stdout"), Path(tmp, "stderr")
            out.touch()
            request = {"target": target, "argv": argv, "env": env, "cwd": cwd, "log": str(out), "errors": str(err)}
            request["nproc"], request["file_limit"], request["nodes"] = nproc, file_limit, nodes
            pid = self.start(request)
            deadline = time.monotonic() + timeout
            while not os.path.exists(request["status"]):  # renamed into place once the output is flushed
                if time.monotonic() > deadline:
                    os.killpg(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired([target, *argv], timeout)
                time.sleep(0.05)
            status = int(Path(request["status"]).read_text())
            return subprocess.CompletedProcess(argv, status, out.read_text(), err.read_text())


def _rank(target: str, argv: list[str]) -> None:
    """One forked worker of a torchrun job; only local rank 0 writes to the job's output. It starts once the
    launcher has forked all its ranks: the launcher's store thread looks up the name of each rank that connects
    (``LibUVStoreDaemon::onConnect``: ``getnameinfo``, under glibc's resolver lock), and a rank forked at that
    moment inherits the lock held and hangs at its own first lookup, its peers waiting for it at the store."""
    launcher = psutil.Process(os.getppid())
    while len(launcher.children()) < int(os.environ["LOCAL_WORLD_SIZE"]):
        time.sleep(0.005)
    if os.environ["LOCAL_RANK"] != "0":
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    _run(target, argv)


CPU_LOG = "SUITE_CPU_LOG"
"""A file to which each test's CPU, and each forked job's, is appended (``bench/suite_cpu.py`` sums it)."""


def log_cpu(test: str, kind: str, seconds: float) -> None:
    """One line of ``CPU_LOG``, where it is set: the CPU (user + system) ``test`` spent as ``kind``."""
    if path := os.environ.get(CPU_LOG):
        with open(path, "a") as f:
            f.write(json.dumps({"test": test.split(" (")[0], "kind": kind, "cpu": seconds}) + "\n")


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _logged(request: dict) -> int:
    """``_exit_status``, the job's CPU and that of the processes it waited for logged under its test."""
    try:
        return _exit_status(request)
    finally:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]  # a job's file size limit is for its files, not the log's
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        seconds = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN)
        log_cpu(request["env"].get("PYTEST_CURRENT_TEST", ""), "job", seconds)


def _exit_status(request: dict) -> int:
    """The forked job's exit status as the interpreter's or torchrun's."""
    os.setpgid(0, 0)  # the client can stop the job with all its workers
    tempfile.tempdir = None  # read from the job's TMPDIR, as at a fresh start (the server's is cached)
    importlib.reload(huggingface_hub.constants)  # its cache and offline switch, read at import: the job's, as fresh
    os.dup2(os.open(request["errors"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 2)
    if request["file_limit"] is not None:  # a write past it fails with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (request["file_limit"], resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    if request["nproc"] is None:
        return exit_status(request)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    nodes, endpoint, run_id = request["nodes"] or (1, "localhost:0", "preloaded")
    config = LaunchConfig(
        min_nodes=nodes,
        max_nodes=nodes,
        nproc_per_node=request["nproc"],
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        max_restarts=0,
        monitor_interval=0.1,
        start_method="fork",
    )
    try:
        elastic_launch(config, _rank)(request["target"], request["argv"])
        return 0
    except ChildFailedError as e:  # torchrun prints the same summary and exits 1
        print(e.format_msg(), file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    serve(sys.argv[1:], _logged if os.environ.get(CPU_LOG) else _exit_status)
