"""Running a command's ``main`` in the test process and checking its one-line errors."""

from __future__ import annotations

import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


def run_cli(main: Callable[[list[str]], None], *args, capsys) -> tuple[int, str, str]:
    """Run a command's ``main`` in this process (saves the imports of every call):
    exit status, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """This process's writes limited to ``limit`` bytes a file (``ulimit -f``): EFBIG, as a full disk's ENOSPC."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))  # Python ignores SIGXFSZ: the write fails
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def analyze(*args: str, capsys) -> tuple[int, str, str]:
    """The analysis CLI in this process."""
    from dispersion_titan.analyze import main as analyze_main

    return run_cli(analyze_main, *args, capsys=capsys)


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("dispersion_titan: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err
