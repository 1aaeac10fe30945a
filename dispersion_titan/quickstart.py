"""The main job end to end: ``bash launch/quickstart.sh``, or ``python -m dispersion_titan.quickstart``.

Measures condensation at initialization for GPT-2 small's shape (the init panel), trains and analyzes
the toy MLP-width sweep of ``configs/quickstart.toml`` with and without the dispersion loss, compares
the runs and sets the paper's findings against the numbers: ``OUT/summary.md`` and ``OUT/summary.png``.
Runs are one-process jobs, ``--jobs`` at a time (on a few CPU cores that beats one FSDP job), forked on
Linux from a server that imported torch once (``reproduce.quickstart.jobs``). A rerun redoes only what
is missing; one with other result-changing options than ``OUT/quickstart.json`` is refused.
"""

from __future__ import annotations

import argparse
import os
import sys

from dispersion_titan.config.cli import OneLineErrorParser, named, named_out, positive_int
from dispersion_titan.reproduce.quickstart import CONFIG, VARIANT
from dispersion_titan.utils.errors import command, run_command

OUT_ENV = "QUICKSTART_OUT"


def _widths(text: str) -> tuple[int, ...]:
    widths = tuple(positive_int(part.strip()) for part in text.split(","))
    if len(set(widths)) != len(widths):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a width")
    return tuple(sorted(widths))


def _init_widths(text: str) -> tuple[int, ...]:
    """Two or more: finding 2 (wider MLPs condense less) is decided on the init panel's widths."""
    widths = _widths(text)
    if len(widths) < 2:
        raise argparse.ArgumentTypeError(f"{text!r} is one width; finding 2 compares two or more")
    return widths


def _coeff(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite positive number")
    return value


def parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.quickstart",
        description="Train, analyze and compare the toy MLP-width × dispersion sweep; summarize it.",
    )
    p.add_argument(
        "--out",
        type=named_out,
        default=os.environ.get(OUT_ENV, "outputs/quickstart"),
        help=f"output folder (default: ${OUT_ENV}, else outputs/quickstart)",
    )
    p.add_argument(
        "--config",
        type=named("a training TOML, or leave the option out for quickstart.toml"),
        default=CONFIG,
        help="training TOML shared by every run (default: quickstart.toml)",
    )
    p.add_argument("--widths", type=_widths, default=(64, 256, 1024), help="MLP widths (default 64,256,1024)")
    p.add_argument("--coeff", type=_coeff, default=1.0, help=f"λ of the {VARIANT} runs (default 1.0)")
    p.add_argument("--steps", type=positive_int, help="training steps (default: the TOML's)")
    p.add_argument("--checkpoint-interval", type=positive_int, help="steps between checkpoints (default: the TOML's)")
    p.add_argument("--num-sequences", type=positive_int, default=32, help="analysis: K sequences (default 32)")
    p.add_argument("--seq-len", type=positive_int, default=128, help="analysis: S tokens (default 128)")
    p.add_argument(
        "--spread-seeds",
        type=int,
        choices=range(0, 4),
        default=1,
        metavar="N",
        help="extra seeds at the smallest width of the sweep and of the init panel, for the "
        "seed-to-seed spread the verdicts weigh (0-3, default 1)",
    )
    p.add_argument("--init-flavor", default="small", help="model shape of the init panel (default small: GPT-2 small)")
    p.add_argument(
        "--init-widths",
        type=_init_widths,
        default=(768, 1536, 3072, 6144),
        help="MLP widths of the init panel, two or more (default 768,1536,3072,6144)",
    )
    p.add_argument(
        "--init-num-sequences",
        type=positive_int,
        default=16,
        help="init panel: K sequences of --seq-len tokens (default 16)",
    )
    p.add_argument("--jobs", type=positive_int, help="runs at a time (default: one per CPU core, at most all runs)")
    return p


@command("each stage finished so far is kept in --out; the same command goes on from there")
def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    # Imported after parsing: --help and typos answer without torch (seconds).
    from dispersion_titan.reproduce.quickstart import pipeline

    pipeline.run(pipeline.make_setup(args))


if __name__ == "__main__":
    run_command(main)
