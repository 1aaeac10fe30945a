"""dispersion_titan: GPT-2-like pre-training with a dispersion loss on TorchTitan 0.2.2,
and condensation analysis of the checkpoints.

The package root holds only commands (``python -m dispersion_titan.<command>``, or the
``dispersion-titan`` console script). Kept import-free on purpose: each command pays
only its own imports (under ``python -m``, SIGINT's handler until the command's own: below).
"""

import signal
import sys

if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    # python -m dispersion_titan.COMMAND: runpy imports this package as it locates the module (sys.argv[0] is "-m"
    # only then), before the module's imports, which come before its run_command: a Ctrl-C there is one line too
    # (SIGINT ignored, as in a script's background, stays so until then; code that imports the package: untouched)
    from dispersion_titan.utils.errors import interrupted_while_starting

    signal.signal(signal.SIGINT, interrupted_while_starting)
