"""Run under torchrun: ``python -m dispersion_titan.train TRAINING_ARGS``, watched by a
profile hook that changes nothing. Rank 0 writes JSON: how often the job config was parsed
(TorchTitan's ``ConfigManager.parse_args``, whatever its arguments: a parse by tyro costs 0.1 s of CPU),
its TOML read (``tomllib.load``) and checked (``check_job_config``, which fills in the derived values),
whether the trainer got the very object that was checked, and whether ``sys.argv`` and ``parse_args``'s
default argument are as they were.

    torchrun --nproc_per_node 1 tests/dist_scripts/count_parses.py OUT.json TRAINING_ARGS...
"""

from __future__ import annotations

import json
import os
import sys


def main(out: str, args: list[str]) -> None:
    import tomllib
    from torchtitan.config import ConfigManager

    import dispersion_titan.train
    from dispersion_titan.job_config.checks import check_job_config
    from dispersion_titan.trainer.trainer import DispersionTrainer

    watched = {
        ConfigManager.parse_args.__code__: "parses",
        check_job_config.__code__: "checks",
        DispersionTrainer.__init__.__code__: "trainers",
        tomllib.load.__code__: "toml_reads",
    }
    counts = {name: 0 for name in watched.values()}
    seen: dict[str, list[int]] = {"checks": [], "trainers": []}

    def profile(frame, event, arg) -> None:
        name = watched.get(frame.f_code) if event == "call" else None
        if name is not None:
            counts[name] += 1
            if name in seen:
                seen[name].append(id(frame.f_locals["config" if name == "checks" else "job_config"]))

    sys.argv = ["dispersion_titan.train", *args]
    argv, default = list(sys.argv), list(ConfigManager.parse_args.__defaults__[0])
    sys.setprofile(profile)
    try:
        dispersion_titan.train.main()
    finally:
        sys.setprofile(None)
        if os.environ["RANK"] == "0":
            with open(out, "w") as f:
                json.dump(
                    {
                        **counts,
                        "trainer_got_the_checked_config": seen["trainers"] == seen["checks"][-1:],
                        "argv_kept": sys.argv == argv,
                        "default_kept": ConfigManager.parse_args.__defaults__[0] == default,
                    },
                    f,
                )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
