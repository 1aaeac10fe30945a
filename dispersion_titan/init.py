"""``dispersion-titan init DIR``: the shipped configs written into DIR as the repository lays them out,
so an installed package works without a clone; a file already there is kept."""

from __future__ import annotations

import os
import shlex

from dispersion_titan.config.cli import OneLineErrorParser, out_folder
from dispersion_titan.config.shipped import write_shipped
from dispersion_titan.run_folder.owners import read_owner
from dispersion_titan.utils.errors import command, fail, no_room, run_command


@command("the configs written so far are kept; run it again to write the others")
def main(argv: list[str] | None = None) -> None:
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.init",
        description="Write the shipped training configs, the paper's configs and the sweep example into DIR.",
    )
    p.add_argument("dir", metavar="DIR", type=out_folder, help="a new or empty folder")
    a = p.parse_args(argv)
    if not a.dir:
        fail("DIR: empty; name a new or empty folder")
    out = os.path.abspath(a.dir)
    owner = read_owner(out) if os.path.isdir(out) else None
    if owner:  # else named by its first file, .owner.json
        fail(
            f"DIR: {out} is the folder of {owner.describe()}; init writes only into a new or empty folder: "
            "name another DIR"
        )
    try:
        written, kept = write_shipped(out)
    except OSError as e:
        if no_room(e):
            raise  # the commands' out-of-room line, exit 74
        fail(f"DIR: {out}: not writable ({e.strerror})")
    print(
        f"{out}: wrote {len(written)} configs"
        + (f", kept {len(kept)} already there" if kept else "")
        + f"; next: cd {shlex.quote(a.dir)} && dispersion-titan train --job.config_file train_configs/debug.toml"
    )


if __name__ == "__main__":
    run_command(main)
