"""``python -m dispersion_titan.torchrun TORCHRUN_ARGS``: torchrun as ``launch/train.sh`` runs
it, the same launch, ending in at most one line of its own (``trainer.launcher``)."""

from __future__ import annotations

import sys

from dispersion_titan.trainer.launcher import run


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
