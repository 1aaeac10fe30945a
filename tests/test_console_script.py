"""``dispersion-titan COMMAND`` runs the same ``main`` as ``python -m dispersion_titan.COMMAND``."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dispersion_titan.__main__ import COMMANDS, USAGE, main
from dispersion_titan.utils.errors import docs_page
from support.launch import python_module

REPO = Path(__file__).resolve().parents[1]


def test_every_command_at_the_package_root_is_a_subcommand():
    commands = {p.stem for p in (REPO / "dispersion_titan").glob("*.py")} - {"__init__", "__main__"}
    launched = {"torchrun"}  # run by launch/train.sh, not a command
    assert set(COMMANDS) | launched == commands | {"data"}


@pytest.mark.parametrize(
    "command, module, flag",
    [
        ("data", "dispersion_titan.data", "--help"),
        ("sweep", "dispersion_titan.sweep", "--help"),
        ("train", "dispersion_titan.train", "--help-all"),  # its usage line named train.py's path
    ],
)
def test_a_subcommand_answers_as_python_m(command, module, flag):
    """The console script, a fresh process, against ``python -m MODULE`` as the job server runs it (runpy, as
    ``-m`` does: its usage line names the same ``sys.argv[0]``), for which train's ``--help-all`` imports
    TorchTitan once more (7 s of CPU)."""
    script = shutil.which("dispersion-titan", path=str(Path(sys.executable).parent))
    assert script is not None, "pip install -e . installs the dispersion-titan console script"
    ours = subprocess.run([script, command, flag], capture_output=True, text=True, timeout=120)
    theirs = python_module(module, flag, timeout=120)
    assert ours.returncode == theirs.returncode == 0
    assert ours.stdout == theirs.stdout


def test_help_cites_a_page_of_the_docs_not_a_checkout_path():
    """A wheel install has no docs/: train's help and launch/train.sh's cite a page of the project's docs."""
    env = {**os.environ, "PYTHON": sys.executable}
    train, train_sh = [sys.executable, "-m", "dispersion_titan.train"], ["bash", str(REPO / "launch" / "train.sh")]
    for argv, page in (([*train, "--help"], "training.md"), ([*train_sh, "--help"], "reliability.md")):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0 and "docs/" not in proc.stdout and docs_page(page) in proc.stdout, proc.stdout


def test_an_unknown_command_is_refused_with_the_list():
    proc = subprocess.run(
        [sys.executable, "-m", "dispersion_titan", "nope"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "train|analyze|evaluate|convert|sweep|quickstart|data" in proc.stderr
    assert proc.stderr.startswith("dispersion-titan: error: unknown command 'nope'; usage:")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv, argparse_says, path",
    [
        (["init", "-x"], "the following arguments are required: DIR", "-x"),
        (["convert", "to-hf", "-run", "-hf"], "argument -h/--help: ignored explicit argument 'f'", "-run"),
    ],
    ids=["init", "convert"],
)
def test_a_path_that_starts_with_a_dash_is_told_how_to_write_it(argv, argparse_says, path, tmp_path):
    """``init -x`` (a folder named ``-x``): argparse's line, and the path read as an option with how to write it,
    ``./-x`` (was argparse's line alone, ``required: DIR``, of a DIR the user typed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dispersion_titan", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    how = f"({path!r} is read as an option: write a path that starts with a dash as ./{path})"
    assert proc.stderr == f"dispersion_titan: error: {argparse_says} {how}\n"
    assert proc.returncode == 2 and not os.listdir(tmp_path)


def test_help_before_a_command_is_the_commands_help(monkeypatch, capsys):
    """``dispersion-titan --help init`` (as ``git --help commit``): init's help (was ``unknown command
    '--help'``, exit 2); ``--help nope`` is the unknown command; ``--help`` alone, the usage."""
    monkeypatch.setattr(sys, "argv", ["dispersion-titan", "--help"])
    main()
    assert capsys.readouterr() == (USAGE + "\n", "")
    root = [sys.executable, "-m", "dispersion_titan"]
    ours = subprocess.run([*root, "--help", "init"], capture_output=True, text=True, timeout=60)
    theirs = subprocess.run([*root, "init", "--help"], capture_output=True, text=True, timeout=60)
    assert ours.returncode == theirs.returncode == 0 and ours.stdout == theirs.stdout and "DIR" in ours.stdout
    nope = subprocess.run([*root, "-h", "nope"], capture_output=True, text=True, timeout=60)
    assert nope.returncode == 2 and nope.stderr.startswith("dispersion-titan: error: unknown command 'nope'")


@pytest.mark.parametrize("threads", ["abc", "0", "", "4,,2"])
def test_an_invalid_omp_num_threads_is_refused_before_torch_is_imported(threads, tmp_path):
    """Was libgomp's own line on torch's import (``Invalid value for environment variable OMP_NUM_THREADS``),
    then the command ran on torch's default thread count."""
    proc = subprocess.run(
        [sys.executable, "-m", "dispersion_titan", "init", str(tmp_path / "configs")],
        capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": threads},
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "dispersion_titan: error: OMP_NUM_THREADS must be a positive whole number of threads, e.g. 4, or unset;"
        f" got {threads!r}\n"
    )
    assert not any(tmp_path.iterdir())


def test_omp_num_threads_as_libgomp_takes_it_is_not_refused(tmp_path):
    """A count per nesting level, spaces and a plus sign allowed: libgomp takes it, so do we."""
    proc = subprocess.run(
        [sys.executable, "-m", "dispersion_titan", "init", str(tmp_path / "configs")],
        capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": " +4, 2"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("argv", [["paper", "--list"], ["analyze", "--help"], ["train", "--help"]])
def test_a_reader_that_goes_away_ends_a_command_quietly(argv):
    """``dispersion-titan paper --list | head -3``: a closed pipe ends the command without a
    traceback, as a shell reports a tool SIGPIPE ended (141). The reader closes before the
    command writes, so the pipe is closed every time, not only when the output outgrows it."""
    script = shutil.which("dispersion-titan", path=str(Path(sys.executable).parent))
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([script, *argv], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode in (0, 141)
    shell = subprocess.run(
        f"{shlex.quote(script)} {shlex.join(argv)} | head -3", shell=True, capture_output=True, text=True, timeout=120
    )
    assert shell.returncode == 0 and shell.stderr == "" and len(shell.stdout.splitlines()) == 3


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_that_lands_in_a_finalizer_still_ends_the_command(signum):
    """A SIGINT that arrives while a ``__del__`` runs is swallowed by Python ("Exception ignored in"), and
    evaluate once finished its work, exit 0: the command's handler delivers it again, one line, exit 130
    (SIGTERM alike, 143)."""
    code = (
        "import os, signal, time\n"
        "from dispersion_titan.utils.errors import command\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        f"        os.kill(os.getpid(), {int(signum)})\n"
        "        sum(range(1000))\n"
        "@command('what is kept; how to go on')\n"
        "def main():\n"
        "    Finalized()\n"
        "    deadline = time.monotonic() + 60\n"  # bytecode after bytecode: the redelivery may land (one long C
        "    while time.monotonic() < deadline:\n"  # call, as sum(range(10**8)), holds it off on a loaded machine)
        "        pass\n"
        "    print('finished')\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (128 + signum, "")
    assert proc.stderr == "dispersion_titan: interrupted; what is kept; how to go on\n"


def test_ctrl_c_in_code_run_from_text_ends_python_m_with_its_line_and_130(tmp_path):
    """A Ctrl-C that lands in code run from text (``exec``: a dataclass made as a module loads), handled by the
    command (its line said), ended ``python -m dispersion_titan.COMMAND`` by SIGINT all the same, status -2, not
    130 (``evaluate table`` interrupted while it drew): CPython marked it unhandled. The mark is cleared."""
    (tmp_path / "command_from_text.py").write_text(
        "import os, signal\n"
        "from dispersion_titan.utils.errors import command, run_command\n"
        "@command('what is kept; how to go on')\n"
        "def main():\n"
        "    exec('import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(30)')\n"
        "run_command(main)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "command_from_text"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert (proc.returncode, proc.stderr) == (130, "dispersion_titan: interrupted; what is kept; how to go on\n")


@pytest.mark.parametrize(
    "signum, whom", [(signal.SIGINT, os.kill), (signal.SIGTERM, os.killpg)], ids=["kill-INT", "scancel"]
)
def test_a_background_command_interrupted_or_terminated_says_one_line(signum, whom):
    """A command started in the background of a script (``cmd &``: SIGINT inherited ignored) and sent ``kill -INT``
    worked on to the end; SIGTERM to its process group (``kill``, Slurm's ``scancel``) killed it without a line,
    exit 143. Each: the command's one line, exit 128 + the signal, at once."""
    code = (
        "import time\n"
        "from dispersion_titan.utils.errors import command, run_command\n"
        "@command('what is kept; how to go on')\n"
        "def main():\n"
        "    print('working', flush=True)\n"
        "    time.sleep(30)\n"  # the interrupt ends it long before
        "    print('finished')\n"
        "run_command(main)\n"
    )
    background = 'trap "" INT; exec "$@"'  # as bash starts a background job without job control
    proc = subprocess.Popen(
        ["bash", "-c", background, "bash", sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout.readline() == "working\n"
    whom(proc.pid, signum)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (
        128 + signum,
        "",
        "dispersion_titan: interrupted; what is kept; how to go on\n",
    )


def test_an_interrupt_inside_a_progress_bar_is_the_last_line_on_its_own():
    """Ctrl-C while a progress bar a library keeps in a local is open (lm-eval's 'Running loglikelihood requests',
    hit by test_reliability's evaluate case under load): the line went onto the bar's line, and the bar, closed when
    the interrupted frame was freed, came after it. The bar is closed first: the line ends the output, whole."""
    code = (
        "import os, signal\n"
        "from tqdm import tqdm\n"
        "from dispersion_titan.utils.errors import command, run_command\n"
        "@command('what is kept; how to go on')\n"
        "def main():\n"
        "    requests = tqdm(total=8, desc='requests')\n"
        "    requests.update(1)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    requests.close()\n"
        "run_command(main)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    line = "dispersion_titan: interrupted; what is kept; how to go on"
    assert proc.returncode == 130 and proc.stderr.split("\n")[-2:] == [line, ""], proc.stderr


def test_a_signal_a_command_ignores_stays_ignored_as_it_ends():
    """The trainer ignores SIGTERM once its ranks stop on a non-finite loss (torchrun's SIGTERM to a rank shutting
    down would end it, -15, and the launcher report that, not its line): the handler the command's end takes back
    is its own only, so the SIGTERM here, sent as the interpreter exits, leaves the line and exit 3."""
    code = (
        "import atexit, os, signal, time\n"
        "from dispersion_titan.utils.errors import NonFiniteLossError, command, run_command\n"
        "@command('what is kept; how to go on')\n"
        "def main():\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    raise NonFiniteLossError('loss is not finite')\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.2)))\n"
        "run_command(main)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "", "dispersion_titan: error: loss is not finite\n")


SIGINT_SELF = "os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)"
EXITING = {  # run while the interpreter exits, once main has returned: each sends this process a SIGINT then
    "atexit": f"atexit.register(lambda: ({SIGINT_SELF}))",
    "thread join": "threading.Thread(target=lambda: (threading.main_thread().join(), " + SIGINT_SELF + ")).start()",
    "module teardown": "globals()['LATE'] = type('Late', (), {'__del__': lambda _: (" + SIGINT_SELF + ")})()",
}


@pytest.mark.parametrize("exiting", EXITING)
def test_ctrl_c_while_a_finished_command_exits_keeps_its_outcome(exiting):
    """``analyze``/``evaluate`` printed ``results:`` and returned; a Ctrl-C while the interpreter exits (here sent
    by code that runs then, so it lands there each time) gave a traceback, or status 130 and no line at all (the
    default action Python restores for its module teardown): the work is done and written, exit 0, silent."""
    code = (
        "import atexit, os, signal, threading, time\n"
        "from dispersion_titan.utils.errors import command, run_command\n"
        "@command('what is kept; how to go on')\n"
        "def main():\n"
        "    print('results: OUT', flush=True)\n"
        f"    {EXITING[exiting]}\n"
        "run_command(main)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "results: OUT\n", "")


@pytest.mark.parametrize("launcher", ["dispersion-titan convert", "python -m dispersion_titan.convert"])
def test_ctrl_c_while_a_command_imports_is_one_line(tmp_path, launcher):
    """Ctrl-C in a command's first seconds, while torch is imported: was a KeyboardInterrupt traceback from deep in
    torch's import (``python -m`` imported convert's torch with its module, before anything of ours ran); one line,
    exit 130, nothing written. A command imports torch in its ``main``, under its own handler (``run_command``'s
    ``interrupted while starting`` is for the rest of the start)."""
    script = shutil.which("dispersion-titan", path=str(Path(sys.executable).parent))
    command = [script, "convert"] if launcher.startswith("dispersion-") else [sys.executable, *launcher.split()[1:]]
    step = tmp_path / "run" / "checkpoint" / "step-1"
    step.mkdir(parents=True)
    (step / ".metadata").touch()  # a checkpoint, which convert reads with torch (it checks a path without)
    proc = subprocess.Popen(
        [*command, "to-hf", str(tmp_path / "run"), str(tmp_path / "hf")], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text():  # torch's import under way
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (
        130,
        "dispersion_titan: interrupted; no new export in OUT_DIR (its config.json, which completes one, is written "
        "last); run it again\n",
    )
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()] == [
        step.relative_to(tmp_path) / ".metadata"
    ]


def test_ctrl_c_while_python_m_data_imports_datasets_is_one_line(tmp_path):
    """``python -m dispersion_titan.data prepare`` imports datasets (a second) with its module, before its
    ``run_command``: a Ctrl-C then was a 40-line KeyboardInterrupt traceback, killed by SIGINT. One line, exit 130,
    nothing written (``utils.errors.interrupted_while_starting``, as for every ``python -m`` command)."""
    out = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispersion_titan.data", "prepare", "enwiki_sample", "--out", str(out)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while "libarrow" not in Path(f"/proc/{proc.pid}/maps").read_text():  # datasets' import under way
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (130, "dispersion_titan: interrupted while starting; nothing was done\n")
    assert not out.exists()


STARTING_INTERRUPTED = "dispersion_titan: interrupted while starting; nothing was done\n"
ENTRY_MODULES = sorted({m.removesuffix(".__main__") for m in COMMANDS.values()} | {"dispersion_titan.torchrun"})


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_ctrl_c_while_python_m_imports_its_module_is_one_line(module):
    """``python -m dispersion_titan.COMMAND`` runs its module's imports before its ``run_command``: a Ctrl-C there
    (0.1 s, torchrun's 1.7 s) was a KeyboardInterrupt traceback, killed by SIGINT. SIGINT every 20 ms from the
    moment the package is imported (``-X importtime``'s line for it; before it, the interpreter's own start) until
    the command ends: one line, exit 130, or ``--help`` answered."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", module, "--help"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err = []
    for line in proc.stderr:
        err.append(line)
        if line.rstrip().endswith("| dispersion_titan"):
            break
    threading.Thread(target=_interrupt_until_it_ends, args=(proc,), daemon=True).start()  # stderr read meanwhile
    said = [line for line in err + proc.stderr.readlines() if not line.startswith("import time:")]
    proc.wait(timeout=60)
    assert (proc.returncode, said) in [(0, []), (130, [STARTING_INTERRUPTED])]


def _interrupt_until_it_ends(proc: subprocess.Popen) -> None:
    while proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)


@pytest.mark.parametrize("argv", [["data", "prepare", "enwiki_sample", "--out", "OUT"], ["analyze", "RUN"]])
def test_no_usable_temporary_directory_is_one_line(argv, tmp_path):
    """A full /tmp (here: no file may be written at all) fails the imports of datasets and torch (dill's
    tempfile.gettempdir()), before a command's own checks: one line naming it and TMPDIR, exit 74, not
    the importer's traceback."""
    script = shutil.which("dispersion-titan", path=str(Path(sys.executable).parent))
    limited = 'trap "" XFSZ; ulimit -f 0; exec "$@"'
    proc = subprocess.run(
        ["bash", "-c", limited, "bash", script, *(str(tmp_path / a) if a.isupper() else a for a in argv)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 74, proc.stderr[-2000:]
    assert proc.stderr.startswith("dispersion_titan: error: No usable temporary directory found in [")
    assert proc.stderr.endswith(": full or not writable; free space, or set TMPDIR to a folder with room\n")
    assert not any(tmp_path.iterdir())


def test_choices_holding_a_comma_are_shown_as_typed():
    """argparse shows choices as ``{a,b}``: ``paper --rows`` (``last`` or ``first,last``) read ``{last,first,last}``
    in its help, three choices where there are two. Such an option names its choices in a metavar."""
    from dispersion_titan.analyze import analyze_parser, compare_parser, size_series_parser
    from dispersion_titan.evaluate import evaluate_parser, table_parser
    from dispersion_titan.paper import paper_parser
    from dispersion_titan.plan import plan_parser

    parsers = (analyze_parser, compare_parser, size_series_parser, evaluate_parser, table_parser, paper_parser)
    unclear = [
        f"{make().prog} {action.option_strings}"
        for make in (*parsers, plan_parser)
        for action in make()._actions
        if action.choices and action.metavar is None and any("," in str(choice) for choice in action.choices)
    ]
    assert unclear == []
    assert "--rows last|first,last" in paper_parser().format_help()


WRAPPED_CTRL_C = """\
import os, signal, time
from dispersion_titan.utils.errors import command, run_command
class Field:
    def __set_name__(self, owner, name):  # as a dataclass's field while torch imports
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
@command("nothing was written")
def main():
    class Metadata:
        shards = Field()
run_command(main)
"""


def test_ctrl_c_that_python_wraps_in_a_runtimeerror_is_the_interrupted_line():
    """Ctrl-C landing in a ``__set_name__`` (a dataclass of torch's being made while a command imports it, seen once in
    6 Ctrl-Cs of a sweep --dry-run): Python 3.11 wraps the KeyboardInterrupt in ``RuntimeError: Error calling
    __set_name__ …``; the command's interrupted line, exit 130 (was that traceback, exit 1)."""
    proc = subprocess.run([sys.executable, "-c", WRAPPED_CTRL_C], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines() == ["dispersion_titan: interrupted; nothing was written"], proc.stderr
