"""The README and docs against the code: ``docs/training.md``'s configuration reference names keys that
exist, each with its default as the merged job config has it; every command line a page shows (in a code
block, or a code span that is one; ``sbatch`` of a launch script as the command it runs) parses with that
command's own parser, and every ``--section.key`` a ``launch/train.sh`` or ``train`` line overrides exists;
``docs/reliability.md``'s list of what a relaunch may change is ``run_folder/settings.py``'s; the package
scripts the README names exist; every ``hf download`` a page or a shipped config shows gives one pattern
per ``--include``. ``docs/reproduction.md``'s own claims: ``test_reproduction_doc.py``."""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection
from fnmatch import fnmatch
from pathlib import Path

import pytest

from dispersion_titan.analyze import analyze_parser, compare_parser, size_series_parser
from dispersion_titan.components.titan_compat import merged_job_config_class
from dispersion_titan.config.cli import CONFIG_MODULE
from dispersion_titan.data.__main__ import parser as data_parser
from dispersion_titan.evaluate import evaluate_parser, table_parser
from dispersion_titan.job_config.parse import setup_torchtitan
from dispersion_titan.paper import paper_parser
from dispersion_titan.plan import plan_parser
from dispersion_titan.run_folder.settings import ALLOWED_KEYS, ALLOWED_SECTIONS
from dispersion_titan.sweep import parse_args as sweep_args
from support.launch import REPO

setup_torchtitan()
PAGES = [Path(REPO) / "README.md", *sorted((Path(REPO) / "docs").glob("*.md"))]
TRAINING = Path(REPO) / "docs" / "training.md"
RELIABILITY = Path(REPO) / "docs" / "reliability.md"
PARSE = {  # command -> its arguments parsed: (options, training overrides)
    "analyze compare": lambda argv: (compare_parser().parse_args(argv), []),
    "analyze family": lambda argv: (size_series_parser().parse_args(argv), []),
    "analyze": lambda argv: (analyze_parser().parse_args(argv), []),
    "evaluate table": lambda argv: (table_parser().parse_args(argv), []),
    "evaluate": lambda argv: (evaluate_parser().parse_args(argv), []),
    "paper": lambda argv: (paper_parser().parse_args(argv), []),
    "plan": lambda argv: plan_parser().parse_known_args(argv),
    "data": lambda argv: (data_parser().parse_args(argv), []),
    "sweep": sweep_args,
}
TRAIN_FLAGS = ("--profile", "--check-only", "--help", "--help-all")
"""``launch/train.sh``'s options that are not training keys (``python -m dispersion_titan.train --help``)."""
SBATCH = {  # a launch/slurm script -> the command it runs with the arguments after it
    "train": ["launch/train.sh"],
    "analyze": ["python", "-m", "dispersion_titan.analyze"],
    "evaluate": ["python", "-m", "dispersion_titan.evaluate"],
    "prepare": ["python", "-m", "dispersion_titan.data", "prepare"],
}
COMMAND = re.compile(r"^(?:python -m dispersion_titan\.|dispersion-titan )(\w+(?: compare| family| table)?)(?: (.*))?$")


def default_cell_problems(text: str, config: object) -> list[str]:
    """Rows of the configuration reference whose keys are missing, or whose default cell does not hold
    the key's default (``—`` and ``TorchTitan's`` claim none)."""
    lines = text.splitlines()
    start = lines.index("| key | default | meaning |")
    problems = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        keys, default = (cell.strip() for cell in line.split("|")[1:3])
        section = None
        for key in re.findall(r"`([\w.]+)`", keys):
            section, _, key = key.rpartition(".") if "." in key else (section, "", key)
            value = getattr(getattr(config, section, None), key, problems)
            if value is problems:
                problems.append(f"{section}.{key}: no such key")
            elif default not in ("—", "TorchTitan's") and not shown(value, default):
                problems.append(f"{section}.{key}: default {value!r}, the page says {default}")
    return problems


def shown(value: object, cell: str) -> bool:
    """Whether ``cell`` holds ``value`` as the page writes defaults."""
    words = re.findall(r"[\w.+\-\"]+", cell.replace("`", ""))
    if value is None or isinstance(value, bool):
        return {None: "unset", True: "true", False: "false"}[value] in words
    if isinstance(value, (int, float)):
        return any(re.fullmatch(r"[+-]?[\d.]+(e[+-]?\d+)?", w) and float(w) == value for w in words)
    return (value or '""') in words


def test_every_configuration_key_exists_with_its_stated_default():
    problems = default_cell_problems(TRAINING.read_text(), merged_job_config_class(CONFIG_MODULE)())
    assert problems == []


def test_the_default_check_finds_a_wrong_default_and_a_missing_key():
    text = TRAINING.read_text()
    planted = text.replace("| `dispersion.tau` | 1.0 |", "| `dispersion.tau` | 2.0 |", 1)
    planted = planted.replace("`baseline.noise_alpha`", "`baseline.noise_beta`", 1)
    assert planted.count("noise_beta") == 1 and "| `dispersion.tau` | 2.0 |" in planted
    assert default_cell_problems(planted, merged_job_config_class(CONFIG_MODULE)()) == [
        "dispersion.tau: default 1.0, the page says 2.0",
        "baseline.noise_beta: no such key",
    ]


def command_lines(text: str) -> list[str]:
    """The lines of a page's code blocks (without their comments), and its code spans, that are one
    command (its environment variables left out): ours, ``launch/train.sh`` or ``sbatch`` of a launch
    script; none with a shell substitution or a ``[placeholder]``."""
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S)
    lines = [line.split("  #")[0] for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    lines += [" ".join(span.split()) for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose)]
    lines += [line.strip() for line in prose.splitlines() if line.startswith("    python -m dispersion_titan.")]
    lines = [re.sub(r"^(?:[A-Z_]+=\S*\s+)*", "", line.strip()) for line in lines]
    starts = ("python -m dispersion_titan.", "dispersion-titan ", "launch/train.sh ", "sbatch ")
    return [line for line in lines if line.startswith(starts) and not re.search(r"\$\(|\[|…|&&", line)]


def key_problems(line: str, options: list[str]) -> list[str]:
    """Training overrides (``--section.key``, ``--section.no-key``) the merged job config lacks."""
    config = merged_job_config_class(CONFIG_MODULE)()
    problems = []
    for option in (o for o in options if o.startswith("--") and o not in TRAIN_FLAGS):
        section, _, key = option[2:].partition(".")
        if not hasattr(getattr(config, section, None), key.replace("-", "_").removeprefix("no_")):
            problems.append(f"{line}: no key {option}")
    return problems


def command_problems(line: str) -> list[str]:
    """What is wrong with one command line a page shows: a config that is not there, options its command
    does not take, training overrides the job config does not have."""
    argv = shlex.split(line.replace("\\|", "|").split(" | ")[0], comments=True)
    if argv[0] == "sbatch":
        script = next((a for a in argv if a.endswith(".sbatch")), "")
        if Path(script).stem not in SBATCH:
            return []
        argv = SBATCH[Path(script).stem] + argv[argv.index(script) + 1 :]
    if argv[0] == "launch/train.sh":
        config, *overrides = argv[1:] or ["--help"]
        missing = config.startswith("train_configs/") and not (Path(REPO) / config).exists()
        return [f"{line}: no file {config}"] * missing + key_problems(line, overrides)
    match = COMMAND.match(" ".join(argv))
    if match and match.groups() and match.group(1) == "train":
        return key_problems(line, shlex.split(match.group(2) or ""))  # its checks: the README tour's test
    if not match or match.group(1) not in PARSE or not match.group(2):
        return []  # a bare name is a reference
    name, rest = match.groups()
    try:
        _, overrides = PARSE[name](shlex.split(rest.replace("ARTIFACT", "fig2")))
    except SystemExit as e:
        return [f"{line}: exit status {e.code}"] if e.code else []
    return key_problems(line, overrides)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_a_page_shows_parses(page: Path, capsys):
    lines = command_lines(page.read_text())
    assert [problem for line in lines for problem in command_problems(line)] == [], capsys.readouterr().err


def test_the_command_check_finds_an_unknown_option_and_key():
    text = (
        "```bash\npython -m dispersion_titan.analyze RUN --stepz 3  # x\n```\n"
        "`launch/train.sh train_configs/debug.toml --dispersion.coef 1`, `dispersion-titan plan C.toml --gpuz 2`\n"
        "```\nNPROC=4 launch/train.sh train_configs/debugg.toml\n"
        "sbatch --gpus=0 launch/slurm/analyze.sbatch RUN --seqs 9\n"
        "DISPERSION_TITAN_ALLOW_CPU=1 sbatch launch/slurm/train.sbatch C.toml --training.stepz 2\n```\n"
        "`python -m dispersion_titan.train --job.config_file C.toml --dispersion.coef 1`\n"
    )
    lines = command_lines(text)
    assert [p for line in lines for p in command_problems(line)] == [
        "python -m dispersion_titan.analyze RUN --stepz 3: exit status 2",
        "launch/train.sh train_configs/debugg.toml: no file train_configs/debugg.toml",
        "sbatch --gpus=0 launch/slurm/analyze.sbatch RUN --seqs 9: exit status 2",
        "sbatch launch/slurm/train.sbatch C.toml --training.stepz 2: no key --training.stepz",
        "launch/train.sh train_configs/debug.toml --dispersion.coef 1: no key --dispersion.coef",
        "dispersion-titan plan C.toml --gpuz 2: no key --gpuz",
        "python -m dispersion_titan.train --job.config_file C.toml --dispersion.coef 1: no key --dispersion.coef",
    ]


def relaunch_list_problems(text: str, keys: Collection[str], sections: Collection[str]) -> list[str]:
    """reliability.md's list of what a relaunch may change against ``settings.ALLOWED_KEYS`` and
    ``ALLOWED_SECTIONS``: each named both ways (``x.*`` a section, ``x.y*`` keys so named, a bare key
    in the section named before it)."""
    listed = text.split("A relaunch may change only", 1)[1].split("Any other change", 1)[0]
    listed = re.sub(r"\([^)]*\)", "", listed.split(":", 1)[1])
    named, section = [], ""
    for name in re.findall(r"`([\w.*]+)`", listed):
        section = name.split(".")[0] if "." in name else section
        named.append(name if "." in name else f"{section}.{name}")
    problems = [f"{s}* is not in the list" for s in sorted(sections) if f"{s}*" not in named]
    problems += [f"{k} is not in the list" for k in sorted(keys) if not any(fnmatch(k, n) for n in named)]
    allowed = [*keys, *(f"{s}*" for s in sections)]
    problems += [f"{n} may not change" for n in named if not any(fnmatch(a, n) for a in allowed)]
    return problems


def test_what_a_relaunch_may_change_is_settings_allowed_keys():
    assert relaunch_list_problems(RELIABILITY.read_text(), ALLOWED_KEYS, ALLOWED_SECTIONS) == []


def test_the_relaunch_list_check_finds_a_key_missing_and_one_too_many():
    text = "A relaunch may change only (x):\n- `training.steps` (not `lr.x`), `metrics.*`, `seed`.\nAny other change"
    assert relaunch_list_problems(text, {"training.steps", "job.fork_from"}, ("metrics.",)) == [
        "job.fork_from is not in the list",
        "metrics.seed may not change",
    ]


def hf_download_problems(text: str) -> list[str]:
    """``hf download`` lines with a bare pattern after an ``--include`` pattern: hf (huggingface_hub >= 1.0)
    takes one pattern per ``--include`` and reads the next as a file name, then ignores every ``--include``."""
    problems = []
    for line in re.findall(r"hf download [^`\n]*", text):
        argv = shlex.split(line, comments=True)
        if any(argv[i] == "--include" and not argv[i + 2].startswith("-") for i in range(len(argv) - 2)):
            problems.append(line)
    return problems


def test_every_hf_download_shown_names_one_pattern_per_include():
    configs = sorted((Path(REPO) / "dispersion_titan" / "train_configs").rglob("*.toml"))
    assert [p for path in PAGES + configs for p in hf_download_problems(path.read_text())] == []
    planted = '`hf download openai-community/gpt2 --include "*.json" "*.txt" --local-dir d`'
    assert hf_download_problems(planted) == [planted.strip("`")]


def test_the_package_scripts_the_readme_names_are_in_the_package():
    """The README's ``$PKG/launch_scripts/...`` (its installed package's folder) for ``launch/``."""
    named = re.findall(r"\$PKG/(\S+)", (Path(REPO) / "README.md").read_text())
    assert {"launch_scripts/train.sh", "launch_scripts/slurm/train.sbatch"} <= set(named)
    assert [p for p in named if not (Path(REPO) / "dispersion_titan" / p).is_file()] == []


def test_every_sweep_of_the_example_a_page_shows_checks(monkeypatch, capsys):
    """The pages' sweeps of ``launch/sweep_example.toml`` (but ``--plan``, a minute), each as a ``--dry-run``:
    every cell's configuration is checked, as before a submission (``-- --baseline.forget_every 1000`` was
    refused: the example trains 10 steps). A page's own ``--dry-run`` of a sweep another page shows is that
    sweep's check: run once (each cell's check costs 0.3 s of CPU)."""
    from dispersion_titan.sweep import main

    example = "python -m dispersion_titan.sweep launch/sweep_example.toml"
    lines = {line for page in PAGES for line in command_lines(page.read_text()) if line.startswith(example)}
    lines = sorted(line for line in lines if "--plan" not in line)
    assert len(lines) >= 3, lines
    dry_runs = {tuple(arg for arg in shlex.split(line)[3:] if arg != "--dry-run"): line for line in lines}
    assert len(dry_runs) >= 2, lines
    monkeypatch.chdir(REPO)
    for argv, line in dry_runs.items():
        try:
            main([argv[0], "--dry-run", *argv[1:]])
        except SystemExit as e:
            assert not e.code, (line, capsys.readouterr().err)
