"""Commands forked from the preloaded server behave as the same command in a fresh
interpreter: exit status, output in the log (after its command line), environment."""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dispersion_titan.reproduce.quickstart.jobs import Commands
from dispersion_titan.utils.errors import DispersionTitanError
from support.cli import file_size_limit


def test_exit_status_output_and_environment_match_a_fresh_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("DISPERSION_TITAN_PROBE", "before")  # restored after the test
    with Commands({"DISPERSION_TITAN_PROBE": "set by Commands"}, preload=["dispersion_titan.analyze"]) as commands:
        _exit_status_output_and_environment(commands, tmp_path, monkeypatch)


def _exit_status_output_and_environment(commands: Commands, tmp_path, monkeypatch) -> None:
    log = tmp_path / "logs" / "job.log"
    status = commands.run("dispersion_titan.analyze", [str(tmp_path), "--num-sequences", "0"], str(log))
    assert status == 2
    assert log.read_text().splitlines() == [
        f"$ {sys.executable} -m dispersion_titan.analyze {tmp_path} --num-sequences 0",
        "dispersion_titan: error: argument --num-sequences: '0' is not a positive integer",
    ]
    # A second command appends to the same log; its module reads the environment given.
    probe = "import os, sys; sys.exit(0 if os.environ['DISPERSION_TITAN_PROBE'] == 'set by Commands' else 5)"
    (tmp_path / "probe_env.py").write_text(f"def main():\n    {probe}\n\nif __name__ == '__main__':\n    main()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert commands.run("probe_env", [], str(log)) == 0
    assert log.read_text().splitlines()[-1] == f"$ {sys.executable} -m probe_env"


def test_a_log_a_full_disk_cuts_short_is_named(tmp_path):
    """A full disk met writing a job's command line into its log (here the file size limit at 0, as ``ulimit -f
    0``: EFBIG, as ENOSPC), which fails as the file closes: the error names the log, for the quickstart's one
    line (was ``no space left on device; free space; …``, naming no file)."""
    log = tmp_path / "job.log"
    with file_size_limit(0), pytest.raises(OSError) as failed:
        Commands({}, preload=[]).run("json.tool", ["--help"], str(log))
    assert (failed.value.errno, failed.value.filename) == (errno.EFBIG, str(log))


def test_a_ctrl_c_interrupts_the_job_and_spares_its_server(tmp_path):
    """A terminal's Ctrl-C reaches the server with its jobs (the quickstart's share its process
    group): the job is interrupted, the server lives on to report its status and run the next."""
    script = tmp_path / "wait.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    log = tmp_path / "job.log"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever ran pytest
    commands = Commands({}, preload=[])
    try:
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(commands.run, str(script), [], str(log))
            deadline, lines = time.monotonic() + 30, []
            while len(lines) < 2 and time.monotonic() < deadline:  # its command line, then its pid
                time.sleep(0.05)
                lines = log.read_text().splitlines() if log.exists() else []
            for pid in (commands.server.pid, int(lines[1])):
                os.kill(pid, signal.SIGINT)
            assert job.result(timeout=30) == 1  # the status of a job that raised
        assert log.read_text().splitlines()[-1] == "KeyboardInterrupt"
        assert commands.run("json.tool", ["--help"], str(tmp_path / "next.log")) == 0
    finally:
        commands.close()
        signal.signal(signal.SIGINT, previous)


def test_a_dead_server_is_one_error_not_a_wait_forever(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    log = tmp_path / "job.log"
    with Commands({}, preload=[]) as commands, ThreadPoolExecutor(1) as pool:
        job = pool.submit(commands.run, str(script), [], str(log))
        deadline, lines = time.monotonic() + 30, []
        while len(lines) < 2 and time.monotonic() < deadline:  # its command line, then its pid
            time.sleep(0.05)
            lines = log.read_text().splitlines() if log.exists() else []
        os.kill(commands.server.pid, signal.SIGKILL)
        os.kill(int(lines[1]), signal.SIGKILL)
        with pytest.raises(DispersionTitanError, match=f"^the job server died before {log} ended; run the same"):
            job.result(timeout=30)
