"""Commands forked from the preloaded server behave as the same command in a fresh
interpreter: exit status, output in the log (after its command line), environment."""

from __future__ import annotations

import sys

from dispersion_titan.reproduce.quickstart.jobs import Commands


def test_exit_status_output_and_environment_match_a_fresh_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("DISPERSION_TITAN_PROBE", "before")  # restored after the test
    commands = Commands({"DISPERSION_TITAN_PROBE": "set by Commands"}, preload=["dispersion_titan.analyze"])
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
