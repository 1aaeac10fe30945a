"""``docs/reproduction.md`` line by line. Its table of the authors' protocol: every default its
"this project's default" column cites in code form is checked against what it names:
``section.key = VALUE`` against ``config/schema.py``'s default, ``NAME.toml: section.key = VALUE``
against that config under ``train_configs/``, ``COMMAND --option VALUE`` against the command's
default (``paper``'s analysing defaults and ``paper table2``'s included), ``COMMAND --option`` that the option exists;
every row cites one, or names a count checked here; every option it names exists. The page's
counts are recomputed from the code and configs, its artifacts' GPU-hours are ``paper --list``'s, the code
its condensation table cites is defined where it says, and every command it shows parses. The README's tour:
each training line checks, into a run folder of its own, and does what it says."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
import tomllib

from dispersion_titan.analysis.inputs import PAPER_SEQ_LEN, PAPER_TEXTS
from dispersion_titan.analyze import analyze_parser, size_series_parser
from dispersion_titan.components.optimizers import body_warmup_steps
from dispersion_titan.components.titan_compat import merged_job_config_class
from dispersion_titan.config.cli import CONFIG_MODULE
from dispersion_titan.config.schema import JobConfig
from dispersion_titan.evaluate import evaluate_parser, table_parser
from dispersion_titan.evaluation.protocol import FEW_SHOT, PAPER_TASKS, PERPLEXITY, PRESETS
from dispersion_titan.evaluation.runner import lm_eval_seeds
from dispersion_titan.evaluation.table import MIDTRAIN_NUM_CKPT, SCRATCH_NUM_CKPT
from dispersion_titan.job_config.checks import launch_notes
from dispersion_titan.job_config.parse import setup_torchtitan, validated_args
from dispersion_titan.paper import paper_parser
from dispersion_titan.reproduce.paper import catalog
from dispersion_titan.reproduce.paper.workflow import PAPER_DEFAULTS, TABLE2_DEFAULTS
from support.launch import REPO, job_args

setup_torchtitan()
DOC = Path(REPO) / "docs" / "reproduction.md"
HEADER = "| protocol item | paper / released code | this project's default | option | the authors' file |"
PARSERS = {
    "evaluate table": table_parser,
    "evaluate": evaluate_parser,
    "analyze family": size_series_parser,
    "analyze": analyze_parser,
    "paper table2": paper_parser,
    "paper": paper_parser,
}
TOML_CITE = re.compile(r"^([\w.\-]+\.toml): (\w+)\.(\w+) = (.+)$")
SCHEMA_CITE = re.compile(r"^(\w+)\.(\w+) = (.+)$")
CLI_CITE = re.compile(r"^(" + "|".join(PARSERS) + r") (--[\w-]+)(?: (\S+))?$")


def cells(line: str) -> list[str]:
    """A Markdown table line's cells (``\\|`` inside a cell is a literal bar)."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table() -> list[list[str]]:
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return rows


def value(text: str):
    return tomllib.loads(f"v = {text}")["v"]


def cli_default(command: str, option: str):
    action = next((a for a in PARSERS[command]()._actions if option in a.option_strings), None)
    assert action is not None, f"{command} has no option {option}"
    if action.default is None and command.startswith("paper"):
        return (TABLE2_DEFAULTS if command == "paper table2" else PAPER_DEFAULTS).get(action.dest)
    return action.default


def check(citation: str) -> bool:
    """Check one cited default; False if the text is not a citation of code or config."""
    if match := TOML_CITE.match(citation):
        name, section, key, text = match.groups()
        found = [p for p in (Path(REPO) / "train_configs").rglob(name)]
        assert len(found) == 1, f"{citation}: {name} is not one config under train_configs/ ({found})"
        assert tomllib.loads(found[0].read_text())[section][key] == value(text), citation
        return True
    if (match := SCHEMA_CITE.match(citation)) and match.group(1) in JobConfig.__dataclass_fields__:
        section, key, text = match.groups()
        assert getattr(getattr(JobConfig(), section), key) == value(text), f"{citation}: config/schema.py differs"
        return True
    if match := CLI_CITE.match(citation):
        command, option, text = match.groups()
        default = cli_default(command, option)
        assert text is None or str(default) == text, f"{citation}: the default of {command} {option} is {default!r}"
        return True
    return False


def test_every_cited_default_matches_what_it_names():
    rows = table()
    assert len(rows) >= 20 and all(len(row) == 5 for row in rows), "the table's rows must keep their 5 cells"
    checked = [citation for row in rows for citation in re.findall(r"`([^`]+)`", row[2]) if check(citation)]
    assert len(checked) >= 15, checked  # the table cites its defaults in code form; each one was checked


@pytest.mark.parametrize(
    "citation",
    [
        'dispersion.form = "paper"',
        "evaluate --batch-size 8",
        "paper table2 --dtype fp32",
        "midtrain_gpt2_wikitext103_dispersion.toml: dispersion.coeff = 1",
    ],
)
def test_a_false_citation_fails(citation):
    with pytest.raises(AssertionError):
        check(citation)


def citations(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def config_file(name: str) -> dict:
    (path,) = (Path(REPO) / "train_configs").rglob(name)
    return tomllib.loads(path.read_text())


def accumulation(name: str) -> int:
    """A paper config's accumulation count: the authors' gradient_accumulation_steps ([released])."""
    return config_file(name)["released"]["gradient_accumulation_steps"]


def on_gpus(name: str, gpus: int):
    """``name`` as a launch on ``gpus`` ranks derives it ([released])."""
    (path,) = (Path(REPO) / "train_configs").rglob(name)
    return validated_args(["--job.config_file", str(path), "--job.custom_config_module", CONFIG_MODULE], gpus)


def eight_gpus(name: str) -> str:
    """What the page says ``name`` trains on 8 GPUs, from the launch's own derivation."""
    c = on_gpus(name, 8)
    return (
        f"on 8 GPUs {c.training.global_batch_size} sequences a step, T = {c.training.steps}, "
        f"W = {c.lr_scheduler.warmup_steps}, lr {c.optimizer.lr:.4g}, every {c.checkpoint.interval}"
    )


QWEN3, GPT2 = "midtrain_qwen3_0.6b_baseline.toml", "midtrain_gpt2_wikitext103_dispersion.toml"
ROW_COUNTS = {
    # a row whose default is a count: the phrase its default cell holds, recomputed from the code
    "evaluation tasks": f"the {len(PAPER_TASKS) - len(PERPLEXITY)} reported accuracies + {PERPLEXITY[0]}",
    "shots per task": f"`gpt2` runs 0 / {PRESETS['gpt2'].few_shot}, `qwen3` runs 0 / {PRESETS['qwen3'].few_shot}",
    "examples per task": f"{PRESETS['gpt2'].limit} (`gpt2`), {PRESETS['qwen3'].limit} (`qwen3`)",
    "lm-eval seeds": "the run's training seed" if set(lm_eval_seeds(7).values()) == {7} else "(seeds differ)",
    "evaluated steps": f"{MIDTRAIN_NUM_CKPT} mid-training, {SCRATCH_NUM_CKPT} from scratch",
    "mid-training schedule": eight_gpus(QWEN3),
    "Fig. 3 analysis": f"at {catalog.FIG3_SEQ_LEN} tokens",
}
PAGE_COUNTS = [
    # counts in the page's prose, recomputed
    f"{sum(len(models) for models in catalog.SIZE_SERIES.values())} models",
    f"analyses {catalog.FIG4_REVISIONS} of them",
    f"K × S = {PAPER_TEXTS * PAPER_SEQ_LEN:,}",
    f"A = {accumulation(GPT2)} (GPT-2 mid-training), {accumulation(QWEN3)} (Qwen3), "
    f"{accumulation('fig3_gpt2_small.toml')} (Fig. 3)",
    f"W = ⌊0.2·T⌋ = {int(0.2 * on_gpus(QWEN3, 1).training.steps)}",
    "MLP width "
    + ", ".join(map(str, catalog.FIG3_PRESETS["paper"].widths[:-1]))
    + f" and {catalog.FIG3_PRESETS['paper'].widths[-1]}",
    f"the first {PAPER_SEQ_LEN} tokens of each (fig3: {catalog.FIG3_SEQ_LEN}",
    f"the authors' {PAPER_TEXTS} wikitext-103-v1 texts",
]


def test_every_row_cites_a_default_or_names_a_checked_count():
    rows = {row[0]: row for row in table()}
    assert len(FEW_SHOT) and set(ROW_COUNTS) <= set(rows)
    for item, row in rows.items():
        if item in ROW_COUNTS:
            assert ROW_COUNTS[item] in row[2], (item, ROW_COUNTS[item])
        else:
            assert any(check(c) for c in citations(row[2])), f"{item}: its default cites no code or config"


def option_exists(option: str) -> bool:
    """``COMMAND --option`` of our commands, or a training flag ``--section.key``."""
    if CLI_CITE.match(option):
        return check(option)
    if match := re.match(r"^--(\w+)\.(\w+)(?: \S+)?$", option):
        section, key = match.groups()
        return hasattr(getattr(merged_job_config_class(CONFIG_MODULE)(), section, None), key)
    return False


def test_every_option_the_table_names_exists():
    for row in table():
        for option in citations(row[3]):
            if option.startswith("--") or CLI_CITE.match(option):
                assert option_exists(option), f"{row[0]}: {option} is no option"


N_GPU_HEADER = "| run | 1 GPU | 2 GPUs | 4 GPUs | 8 GPUs |"
N_GPU_ROWS = {  # the N-GPU table's rows -> the paper config each describes
    "GPT-2 mid-training": GPT2,
    "GPT-2 active forgetting": "midtrain_gpt2_wikitext103_active_forgetting.toml",
    "Qwen3 mid-training": QWEN3,
    "Fig. 3": "fig3_gpt2_small.toml",
}
LAYOUT = re.compile(r"^(\d+)(?: a step)?, T = (\d+), W = (\d+), lr ([\d.e-]+), every (\d+)$")


def forgetting_cell(c) -> str:
    """The active-forgetting row's cell for a launch ``c``: its body's warm-up, the resets in T steps
    (before step s when (s - 1) mod K = 0) and whether ⌊T/K⌋ = 0 keeps the embeddings at lr 0."""
    t, k = c.training.steps, c.baseline.forget_every
    resets = {0: "no reset", 1: f"one reset (after step {k})"}[(t - 1) // k]
    frozen = ", embeddings at lr 0" if t // k == 0 else ""
    return f"W = {body_warmup_steps(c.lr_scheduler.warmup_steps, t, True)}, {resets}{frozen}"


def test_the_n_gpu_table_is_what_the_launch_derives():
    """Each cell of "A paper config on N GPUs" is what a launch on that many ranks derives ([released])."""
    lines = DOC.read_text().splitlines()
    start = lines.index(N_GPU_HEADER)
    rows = [cells(line) for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2 :])]
    names = [next(name for key, name in N_GPU_ROWS.items() if row[0].startswith(key)) for row in rows]
    assert sorted(names) == sorted(N_GPU_ROWS.values())
    for name, row in zip(names, rows, strict=True):
        for gpus, cell in zip((1, 2, 4, 8), row[1:], strict=True):
            c = on_gpus(name, gpus)
            if c.baseline.method == "active_forgetting":
                assert cell == forgetting_cell(c), (row[0], gpus)
                continue
            batch, steps, warmup, lr, every = LAYOUT.match(cell).groups()
            t, schedule = c.training, c.lr_scheduler
            layout = (t.global_batch_size, t.steps, schedule.warmup_steps, c.checkpoint.interval)
            assert (int(batch), int(steps), int(warmup), int(every)) == layout, (row[0], gpus)
            assert float(lr) == pytest.approx(c.optimizer.lr, rel=1e-3), (row[0], gpus)


def test_the_pages_counts_are_the_codes():
    text = " ".join(DOC.read_text().split())
    for phrase in PAGE_COUNTS:
        assert phrase in text, phrase


PACKAGE = Path(REPO) / "dispersion_titan"
CITED = re.compile(r"^([\w/]+\.py): (\w+(?:, \w+)*)$")


def citation_problems(cell: str) -> list[str]:
    """Our code as a cell of the condensation table cites it: ``PATH.py: NAME, NAME`` each defined in that
    module (PATH under ``dispersion_titan/``, or the one module of that name there), never ``PATH.py:LINE``."""
    problems = [f"{c}: cite our code by name, not line" for c in re.findall(r"`([\w/]+\.py:\d[\d,\-]*)`", cell)]
    for path, names in (m.groups() for c in citations(cell) if (m := CITED.match(c))):
        found = [f for f in PACKAGE.rglob(Path(path).name) if f.as_posix().endswith(path)]
        if len(found) != 1:
            problems.append(f"{path}: {len(found)} modules of that name under dispersion_titan/")
            continue
        source = found[0].read_text()
        problems += [
            f"{path}: no {name}"
            for name in names.split(", ")
            if not re.search(rf"^\s*(?:def |class )?(?:\w+, )*{name}\b(?:, \w+)*\s*[:=(]", source, flags=re.M)
        ]
    return problems


def test_our_code_the_condensation_table_cites_is_there():
    lines = DOC.read_text().splitlines()
    start = lines.index("| quantity | theirs | ours | verdict |")
    rows = [cells(line) for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2 :])]
    assert len(rows) >= 15
    assert [p for row in rows for cell in row[2:] for p in citation_problems(cell)] == []


def test_the_citation_check_finds_a_line_number_and_a_missing_name():
    assert citation_problems("`render.py:217-240`, `catalog.py: SIZE_SERIES, NO_SUCH`, `analyze.py: main`") == [
        "render.py:217-240: cite our code by name, not line",
        "catalog.py: no NO_SUCH",
    ]


def test_each_artifacts_cost_is_paper_lists():
    """The artifacts table's "~X GPU-hours" per artifact, as ``paper --list`` estimates it (``catalog.ARTIFACTS``)."""
    lines = DOC.read_text().splitlines()
    start = lines.index("| artifact | what it runs | drawn |")
    checked = 0
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, runs, _ = cells(line)
        for cost in re.findall(r"~[\d.]+ GPU-hours", runs):
            assert cost in catalog.ARTIFACTS[name.split("`")[1]][3], (name, cost)
            checked += 1
    assert checked >= 5


COMMAND = re.compile(r"python -m dispersion_titan\.(\w+)(?: (table|family))? (.*)")


def commands() -> list[str]:
    """Every command line the page shows: in code blocks, and in code spans (across line breaks); a
    module named without arguments is a reference, not a command."""
    text = DOC.read_text()
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S)
    lines = [line.split("  #")[0] for block in blocks for line in block.splitlines()]
    spans = [
        " ".join(span.split())
        for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    ]
    return [
        c.strip()
        for c in lines + spans
        if c.strip().startswith(("python -m dispersion_titan.", "python bench/", "launch/", "bash launch/"))
    ]


def test_every_command_the_page_shows_parses():
    found = commands()
    assert len(found) >= 8, found
    for line in found:
        argv = shlex.split(line)
        if line.startswith("python bench/"):
            source = (Path(REPO) / argv[1]).read_text()
            assert all(f'"{a}"' in source for a in argv[2:] if a.startswith("--")), line
        elif argv[0] in ("launch/train.sh", "bash"):
            assert all((Path(REPO) / a).exists() for a in argv if a.endswith((".sh", ".toml"))), line
        elif match := COMMAND.match(line):
            name, sub, rest = match.groups()
            parser = PARSERS[f"{name} {sub}" if sub else name]()
            parser.parse_args(shlex.split(rest.replace("ARTIFACT", "fig2")))  # the page's placeholder for one


def tour_trainings() -> list[list[str]]:
    """The README tour's ``launch/train.sh CONFIG [overrides]`` lines, as argv after the script."""
    (tour,) = re.findall(r"## A tour\n.*?```bash\n(.*?)```", (Path(REPO) / "README.md").read_text(), flags=re.S)
    lines = [shlex.split(line, comments=True) for line in tour.splitlines()]
    return [argv[1:] for argv in lines if argv and argv[0] == "launch/train.sh"]


def test_the_readme_tours_trainings_check_each_into_its_own_folder():
    """Run one after the other as written, a second line into the first's folder with other settings was
    refused (``debug.toml --dispersion.coeff 0.05``), and that coeff without a variant trained nothing new."""
    folders = []
    for config, *overrides in tour_trainings():
        job = validated_args([*job_args(str(Path(REPO) / config)), *overrides], 1)
        assert not [n for n in launch_notes(job, {}) if n.startswith("dispersion.")], (config, overrides)
        folders.append(job.job.dump_folder)
    assert len(folders) >= 2 and len(set(folders)) == len(folders), folders
