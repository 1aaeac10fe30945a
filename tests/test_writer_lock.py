"""One writer per run folder (run_folder/writer_lock.py): a real race of two trainings on one
folder, a relaunch into a folder a live run owns, and the stale-lock and requeue rules."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dispersion_titan.run_folder import writer_lock
from dispersion_titan.run_folder.writer_lock import (
    LOCK_NAME,
    STALE_AFTER_S,
    TURN_WAIT_S,
    RunFolderBusy,
    WriterLock,
    refuse_if_busy,
    sole_writer,
)
from support.cli import file_size_limit
from support.launch import DEBUG_SEQ_LEN, DEBUG_TOML, held_by_another_command, python_module
from support.runs import digests

pytestmark = pytest.mark.slow


@pytest.fixture
def live_pid():
    """A process of this host that stays alive during the test (a stand-in for a running trainer)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def write_lock(folder: Path, host: str, pid: int, job_id: str = "", age_s: float = 0.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    owner = {"host": host, "pid": pid, "job_id": job_id, "since": time.time() - age_s, "command": ""}
    path.write_text(json.dumps(owner))
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_a_live_owner_on_this_host_is_refused_and_a_dead_one_taken_over(tmp_path, live_pid):
    path = write_lock(tmp_path, socket.gethostname(), live_pid)
    with pytest.raises(RunFolderBusy, match=f"another run is writing here \\(PID {live_pid} on "):
        WriterLock(tmp_path).acquire()
    assert json.loads(path.read_text())["pid"] == live_pid  # untouched
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_lock(tmp_path, socket.gethostname(), int(dead.stdout))
    lock = WriterLock(tmp_path)
    lock.acquire()
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert list(tmp_path.glob(f"{LOCK_NAME}.stale-*"))  # the stale lock moved aside, not deleted
    lock.release()
    assert not path.exists()


def test_a_lock_a_full_disk_cut_short_is_named_and_not_left_behind(tmp_path):
    """A full disk met writing the lock (here the file size limit at 0, as ``ulimit -f 0``: EFBIG, as ENOSPC):
    the error names the lock, for the commands' one line, and no empty lock stays (was: the line named no file,
    and the empty lock refused every rerun for STALE_AFTER_S as written by "PID 0 on unknown host")."""
    with file_size_limit(0), pytest.raises(OSError) as failed:
        WriterLock(tmp_path).acquire()
    assert (failed.value.errno, failed.value.filename) == (errno.EFBIG, str(tmp_path / LOCK_NAME))
    assert not any(tmp_path.iterdir())
    with sole_writer(tmp_path):  # with room again, the rerun's
        pass


def test_a_held_lock_removed_with_its_folder_is_named_at_its_next_touch(tmp_path):
    """``rm -rf`` of a training's run folder: its next heartbeat's error names the lock (``os.utime``'s names no
    file), for the commands' one line."""
    lock = WriterLock(tmp_path / "run")
    lock.acquire()
    shutil.rmtree(tmp_path / "run")
    with pytest.raises(FileNotFoundError) as gone:
        lock.touch()
    assert gone.value.filename == str(tmp_path / "run" / LOCK_NAME)


def test_a_copy_of_a_folder_a_live_process_holds_is_free(tmp_path):
    """``cp -a`` of a live run copies its lock: the copy was refused as written by the original's process."""
    held, copy = tmp_path / "run", tmp_path / "copy"
    with held_by_another_command(held) as pid:
        shutil.copytree(held, copy)
        with pytest.raises(RunFolderBusy, match=f"PID {pid} on "):
            refuse_if_busy(held)
        refuse_if_busy(copy)
        with sole_writer(copy):
            pass


def test_a_run_folder_linked_to_a_folder_not_made_yet_is_made_there(tmp_path):
    """``job.dump_folder`` a link to scratch space not made yet (``ln -s /scratch/me/run run``): the run's lock,
    the first thing a launch writes, makes that folder (was a ``FileExistsError: 'run'`` traceback from each rank,
    the check before it having passed the link)."""
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "scratch" / "run")
    lock = WriterLock(link)
    lock.acquire()
    assert (tmp_path / "scratch" / "run" / LOCK_NAME).is_file()
    lock.release()


def test_a_zombie_owner_is_dead(tmp_path):
    """An owner that exited and was never reaped (a container whose PID 1 does not reap) is a
    zombie: ``kill(pid, 0)`` still finds it, but its lock is stale and the next run takes it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once; not waited for
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rpartition(")")[2].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stat.read_text().rpartition(")")[2].split()[0] == "Z"
    os.kill(child.pid, 0)  # what the old liveness test saw: no error, "alive"
    write_lock(tmp_path, socket.gethostname(), child.pid)
    refuse_if_busy(tmp_path)  # free
    lock = WriterLock(tmp_path)
    lock.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert list(tmp_path.glob(f"{LOCK_NAME}.stale-*"))
    lock.release()
    child.wait()


def test_another_hosts_lock_is_live_until_it_stops_being_touched(tmp_path):
    write_lock(tmp_path, "other-node", 12345)
    with pytest.raises(RunFolderBusy, match="PID 12345 on other-node"):
        refuse_if_busy(tmp_path)
    write_lock(tmp_path, "other-node", 12345, age_s=STALE_AFTER_S + 60)
    refuse_if_busy(tmp_path)  # abandoned: free
    # A lock still being written by a launch racing ours: live unless as old.
    old = time.time() - STALE_AFTER_S - 60
    (tmp_path / LOCK_NAME).write_text('{"host": "other-no')
    with pytest.raises(RunFolderBusy, match="PID 0 on unknown host"):
        refuse_if_busy(tmp_path)
    os.utime(tmp_path / LOCK_NAME, (old, old))
    refuse_if_busy(tmp_path)
    # A --tb-dir shared by analyses: the next one waits its turn while the other holds it.
    write_lock(tmp_path, "other-node", 12345)
    turn = threading.Timer(0.3, os.utime, (tmp_path / LOCK_NAME, (old, old)))  # the other stops touching it
    turn.start()
    start = time.monotonic()
    with sole_writer(tmp_path, ("command", "use another --tb-dir"), TURN_WAIT_S):
        assert time.monotonic() - start >= 0.3 and json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    turn.join()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_requeued_slurm_job_takes_its_own_lock_over(tmp_path, live_pid, monkeypatch):
    write_lock(tmp_path, "other-node", live_pid, job_id="4242")
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job: refused
    with pytest.raises(RunFolderBusy, match="Slurm job 4242"):
        refuse_if_busy(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # the same job, requeued on any node: takes it over
    lock = WriterLock(tmp_path)
    lock.acquire()
    owner = json.loads((tmp_path / LOCK_NAME).read_text())
    assert (owner["job_id"], owner["pid"]) == ("4242", os.getpid())
    lock.release()


def test_a_commands_lock_names_its_command_and_stays_fresh_for_other_hosts(tmp_path, monkeypatch):
    """``sole_writer`` (analyze's, evaluate's, the tables' --out): the owner's command line is
    recorded; the lock is touched while held, so a long command on one node is never taken
    for abandoned by another; it is gone afterwards."""
    monkeypatch.setattr(writer_lock, "HEARTBEAT_S", 0.05)
    # as typed, less the interpreter: python -m (its options dropped), and the console script (not the
    # module its dispatcher hands sys.argv to)
    monkeypatch.setattr(sys, "orig_argv", ["/usr/bin/python3", "-u", "-m", "dispersion_titan.analyze", "RUN"])
    assert writer_lock.this_command() == "python -m dispersion_titan.analyze RUN"
    monkeypatch.setattr(sys, "argv", ["dispersion_titan.data.__main__", "prepare", "x"])
    monkeypatch.setattr(sys, "orig_argv", ["/v/bin/python", "/v/bin/dispersion-titan", "data", "prepare", "x"])
    assert writer_lock.this_command() == "dispersion-titan data prepare x"
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-c", "import sys\nlock()", "/out"])
    assert writer_lock.this_command() == "python -c ... /out"
    monkeypatch.setattr(sys, "orig_argv", ["python", "/somewhere/analyze.py", "RUN", "--num-sequences", "40"])
    with sole_writer(tmp_path):
        path = tmp_path / LOCK_NAME
        assert json.loads(path.read_text())["command"] == "analyze.py RUN --num-sequences 40"
        old = time.time() - STALE_AFTER_S - 60
        os.utime(path, (old, old))
        time.sleep(0.5)
        assert path.stat().st_mtime > old + 60  # the heartbeat touched it
    assert not path.exists()


def test_a_relaunch_into_a_busy_folder_is_one_line_and_changes_nothing(tmp_path, live_pid):
    run = tmp_path / "run"
    first = python_module("dispersion_titan.train", "--job.config_file", DEBUG_TOML, "--job.dump_folder", str(run),
                          "--training.steps", "2", *DEBUG_SEQ_LEN, timeout=300)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (run / LOCK_NAME).exists()  # released at exit
    write_lock(run, socket.gethostname(), live_pid)
    before = digests(run)
    again = python_module("dispersion_titan.train", "--job.config_file", DEBUG_TOML, "--job.dump_folder", str(run),
                          "--training.steps", "4", *DEBUG_SEQ_LEN, timeout=300)  # fmt: skip
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"dispersion_titan: error: {run}: another run is writing here ({_described(run)}); wait for it to end, "
        "or give this run its own --job.dump_folder"
    ]
    assert digests(run) == before


def _described(run: Path) -> str:
    owner = json.loads((run / LOCK_NAME).read_text())
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["since"]))
    return f"PID {owner['pid']} on {owner['host']}, since {since}"


def test_two_trainings_launched_at_once_into_one_folder_one_wins(tmp_path):
    """A real race: two processes, one folder. One trains to the end; the other exits 2 with the
    owner named, having written nothing (one TensorBoard file, the winner's run.json). Both forked from
    the job server at once (a fresh interpreter each paid 6 s of CPU on imports before its first file)."""
    run = tmp_path / "run"
    argv = ["--job.config_file", DEBUG_TOML, "--job.dump_folder", str(run), "--training.steps", "3", *DEBUG_SEQ_LEN]
    variants = (("none", "0"), ("angular_spread", "0.5"))
    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(python_module, "dispersion_titan.train", *argv, "--dispersion.variant", variant,
                            "--dispersion.coeff", coeff, timeout=300) for variant, coeff in variants]  # fmt: skip
    results = [job.result() for job in jobs]
    codes = sorted(proc.returncode for proc in results)
    assert codes == [0, 2], [(proc.returncode, proc.stderr[-2000:]) for proc in results]
    (winner_index,) = [i for i, proc in enumerate(results) if proc.returncode == 0]
    loser_err = results[1 - winner_index].stderr.strip().splitlines()[-1]
    assert loser_err.startswith(f"dispersion_titan: error: {run}: another run is writing here (PID ")
    assert len(list(run.rglob("events.out.tfevents.*"))) == 1
    recorded = json.loads((run / "run.json").read_text())["dispersion"]["variant"]
    assert recorded == variants[winner_index][0]
    assert not (run / LOCK_NAME).exists()
