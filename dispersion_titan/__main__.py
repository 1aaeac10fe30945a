"""``dispersion-titan COMMAND [ARGS]``: the ``main`` of ``python -m dispersion_titan.COMMAND``, importing
nothing before it knows the command."""

from __future__ import annotations

import os
import re
import sys
from importlib import import_module

from dispersion_titan.utils.errors import fail, run_command

COMMANDS = {
    name: f"dispersion_titan.{name}{'.__main__' if name == 'data' else ''}"  # data: python -m dispersion_titan.data
    for name in ("train", "analyze", "evaluate", "convert", "sweep", "quickstart", "data", "paper", "init", "plan")
}
OMP_THREADS = re.compile(r"\s*\+?[0-9]+\s*(,\s*\+?[0-9]+\s*)*", re.ASCII)
"""What libgomp takes for ``OMP_NUM_THREADS`` (a count per nesting level); anything else it warns of on
torch's import, in its own words, and ignores."""
USAGE = f"usage: dispersion-titan {{{'|'.join(COMMANDS)}}} [ARGS ...]   (each command's --help says more)"


def main() -> None:
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        if len(args) == 1:
            print(USAGE)
            return
        args = [*args[1:], "--help"]  # --help init: init's help (was "unknown command '--help'")
    if not args or args[0] not in COMMANDS:
        named = f"unknown command {args[0]!r}; " if args else "name a command; "
        fail(named + USAGE, prog="dispersion-titan")
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads is not None and not (
        OMP_THREADS.fullmatch(threads) and all(0 < int(n) < 2**64 - 1 for n in threads.split(","))
    ):
        fail(f"OMP_NUM_THREADS must be a positive whole number of threads, e.g. 4, or unset; got {threads!r}")
    sys.argv = [COMMANDS[args[0]], *args[1:]]  # what python -m COMMAND's main sees
    run_command(lambda: import_module(COMMANDS[args[0]]).main())  # the imports inside its error handling


if __name__ == "__main__":
    run_command(main)
