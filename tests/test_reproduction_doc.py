"""``docs/reproduction.md``'s table of the authors' protocol, line by line: every default its
"this project's default" column cites in code form is checked against what it names:
``section.key = VALUE`` against ``config/schema.py``'s default, ``NAME.toml: section.key = VALUE``
against that config under ``train_configs/``, ``COMMAND --option VALUE`` against the command's
default (``paper``'s analysing defaults included), ``COMMAND --option`` that the option exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from dispersion_titan.analyze import analyze_parser, size_series_parser
from dispersion_titan.config.schema import JobConfig
from dispersion_titan.evaluate import evaluate_parser, table_parser
from dispersion_titan.paper import paper_parser
from dispersion_titan.reproduce.paper.plan import PAPER_DEFAULTS

from support.launch import REPO

DOC = Path(REPO) / "docs" / "reproduction.md"
HEADER = "| protocol item | paper / released code | this project's default | option | the authors' file |"
PARSERS = {"evaluate table": table_parser, "evaluate": evaluate_parser, "analyze family": size_series_parser,
           "analyze": analyze_parser, "paper": paper_parser}
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
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return rows


def value(text: str):
    return tomllib.loads(f"v = {text}")["v"]


def cli_default(command: str, option: str):
    action = next((a for a in PARSERS[command]()._actions if option in a.option_strings), None)
    assert action is not None, f"{command} has no option {option}"
    if action.default is None and command == "paper":
        return PAPER_DEFAULTS.get(action.dest)
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


@pytest.mark.parametrize("citation", ["dispersion.form = \"paper\"", "evaluate --batch-size 8",
                                      "midtrain_gpt2_wikitext103_dispersion.toml: dispersion.coeff = 1"])
def test_a_false_citation_fails(citation):
    with pytest.raises(AssertionError):
        check(citation)
