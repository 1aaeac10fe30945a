"""``python -m dispersion_titan.job_server PRELOAD...``: the server ``utils.preloaded.Commands``
starts; it imports each PRELOAD once, then forks every job it is sent from there."""

from __future__ import annotations

import sys

from dispersion_titan.utils.preloaded import serve

if __name__ == "__main__":
    serve(sys.argv[1:])
