"""``analyze family SPEC ... --out DIR``: where models of several sizes sit, family by family (the
paper's Figure 2), and per family Spearman's ρ between parameter count and last-n ``mean_cos``:
negative when larger models condense less. The command's help describes SPEC, ``--family``, ``--paired``.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..run_folder.outputs import atomic_write, format_table, save_png, write_csv
from ..run_folder.owners import FAMILY, results_run, rewritten
from ..utils.errors import AnalysisError
from . import figures
from .compare import analyses_folder, pick
from .condensation_schema import Condensation
from .inputs import differences
from .statistics import point_layers, rank_trend


@dataclass(frozen=True)
class Member:
    spec: str
    label: str
    family: str
    result: Condensation
    folder: str
    """Its analyses folder, symlinks resolved: one model named twice (``RUN``, ``./link/condensation``) is refused."""
    given: str
    """The folder as given, with its step or revision: the label of models whose names are alike (one model
    analysed into two folders, fp32 and bf16; runs named ``ours`` in two places)."""


def load_member(spec: str, families: dict[str, str]) -> Member:
    """``FOLDER@WHICH``'s analysis; a bare folder's last."""
    folder, at, which = spec.rpartition("@")
    if not (at and os.path.isdir(folder)):
        folder, which = spec, "last"
    result = pick(folder, which, option=spec)
    if result.n_params is None:  # analyses made before ``family`` existed record none
        raise AnalysisError(f"family: {spec}: its analysis records no parameter count; re-analyze it with --force")
    if result.model is None:
        model, at = results_run(analyses_folder(folder), result.run), f"@{result.step}"
    else:
        model, at = result.model, f"@{result.revision}" if result.revision else ""
    kind = result.model_args.get("model_type")  # ``gpt2 run`` for our runs of gpt2
    family = families.get(spec) or (kind if result.model else f"{kind} run")
    name = os.path.basename(os.path.normpath(model)) + at
    return Member(spec, name, family, result, os.path.realpath(analyses_folder(folder)), os.path.normpath(folder) + at)


def load_members(specs: Sequence[str], families: dict[str, str], protocol: str) -> list[Member]:
    """Every SPEC's analysis, all of the same inputs (and ``protocol``)."""
    members, named = [load_member(spec, families) for spec in dict.fromkeys(specs)], {}  # --family, --paired repeat
    for member in members:  # one model by two names (a link, ``..``): two rows, counted twice in its family's trend
        first = named.setdefault((member.folder, member.result.label), member)
        if first is not member:
            raise AnalysisError(
                f"family: {first.spec} and {member.spec} are the same analysis ({member.result.label} in "
                f"{member.folder}); name each model once"
            )
    alike = Counter(member.label for member in members)
    members = [dataclasses.replace(m, label=m.given) if alike[m.label] > 1 else m for m in members]
    first = members[0]
    for other in members:
        a, b = (member.result.located_inputs(member.folder) for member in (first, other))
        if protocol == "paper" and b["protocol"] != "paper":
            raise AnalysisError(f"--protocol paper: {other.spec} was not analysed with analyze --protocol paper")
        if {**a, "tokens_sha256": None} != {**b, "tokens_sha256": None}:  # token ids differ between tokenizers
            raise AnalysisError(
                f"family: {other.spec} was analyzed with other inputs than {first.spec} ({differences(a, b)})"
            )
    return members


def last_n_mean(result: Condensation, n: int, key: str = "mean_cos") -> float | None:
    """Mean of ``key`` over the last n layer points (``statistics.point_layers``; None: not measured)."""
    values = [getattr(layer, key) for layer in point_layers(result)[-n:]]
    return None if None in values else float(np.mean(values))


LAST_N_KEYS = ("mean_cos", "mean_cos_offdiag", "effective_rank", "mev")


def model_rows(members: list[Member], n: int) -> list[dict]:
    return [
        {
            "family": m.family,
            "model": m.label,
            "n_params": m.result.n_params,
            "layers": len(point_layers(m.result)),
            "spearman": m.result.spearman,
            "kendall": m.result.kendall,
            **{f"{key}_last_{n}": last_n_mean(m.result, n, key) for key in LAST_N_KEYS},
        }
        for m in sorted(members, key=lambda m: (m.family, m.result.n_params))
    ]


def trend_rows(members: list[Member], n: int) -> list[dict]:
    """Per family: Spearman's ρ of last-n mean cosine against parameter count."""
    rows = []
    for family in sorted({m.family for m in members}):
        group = [m for m in members if m.family == family]
        x, y = [m.result.n_params for m in group], [last_n_mean(m.result, n) for m in group]
        rho = rank_trend(x, y)["spearman"]["rho"] if len(group) >= 2 else None
        rows.append({"family": family, "models": len(group), f"spearman_params_vs_mean_cos_last_{n}": rho})
    return rows


def paired_rows(pairs: list[tuple[Member, Member]], n: int) -> list[dict]:
    """A − B of last-n mean cosine and of the depth trend."""
    return [
        {
            "A": a.label,
            "B": b.label,
            f"mean_cos_last_{n}_A": last_n_mean(a.result, n),
            f"mean_cos_last_{n}_B": last_n_mean(b.result, n),
            f"delta_mean_cos_last_{n}": last_n_mean(a.result, n) - last_n_mean(b.result, n),
            "delta_spearman": None
            if None in (a.result.spearman, b.result.spearman)
            else a.result.spearman - b.result.spearman,
        }
        for a, b in pairs
    ]


def family_figure(members: list[Member], pairs: list[tuple[Member, Member]], title: str) -> figures.Figure:
    """One panel per family (curves coloured by size) and one for the pairs."""
    families = sorted({m.family for m in members})
    panels = len(families) + bool(pairs)
    fig, axes = figures.plt.subplots(1, panels, figsize=(6.4 * panels, 4.6), layout="constrained", squeeze=False)
    cmap = figures.plt.get_cmap("viridis")
    for ax, family in zip(axes[0], families):
        group = sorted((m for m in members if m.family == family), key=lambda m: m.result.n_params)
        for rank, m in enumerate(group):
            figures.plot_curve(
                ax,
                m.result,
                color=cmap(rank / max(len(group) - 1, 1) * 0.9),
                label=f"{m.label} ({m.result.n_params / 1e6:.3g}M)",
            )
        figures.curve_axes(ax, f"{family}: {title}")
        figures.outside_legend(ax)
    if pairs:
        ax = axes[0][-1]
        for index, (a, b) in enumerate(pairs):
            color = figures.plt.get_cmap("tab10")(index)
            figures.plot_curve(ax, a.result, color=color, label=a.label)
            figures.plot_curve(ax, b.result, color=color, linestyle="--", label=b.label)
        figures.curve_axes(ax, f"paired (A solid, B dashed): {title}")
        figures.outside_legend(ax)
    return fig


def family_markdown(members: list[Member], pairs: list[tuple[Member, Member]], n: int, title: str) -> str:
    sections = [
        ("", model_rows(members, n)),
        (
            f"Trend: Spearman's ρ between parameter count and the mean `mean_cos` of the last {n} layers, "
            "per family (negative: larger models condense less; needs 2 or more models).",
            trend_rows(members, n),
        ),
        *([("Paired (A − B):", paired_rows(pairs, n))] if pairs else []),
    ]
    lines = [f"# Condensation by model size ({title})"]
    for text, rows in sections:  # each table as text, below its line
        lines += ["", *([text, ""] if text else []), "```", format_table(rows), "```"]
    return "\n".join(lines) + "\n"


def parse_assignments(values: Sequence[str], option: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` pairs of ``--family`` / ``--paired``."""
    parsed = []
    for value in values:
        name, eq, rest = value.partition("=")
        if not eq or not name or not rest:
            raise AnalysisError(f"{option}: {value!r} is not NAME=VALUE")
        parsed.append((name, rest))
    return parsed


def spelled(spec: str) -> str:
    """``spec`` with its folder normalised, so that ``--family`` and ``--paired`` may name a model as ``cond/x/`` or
    ``./cond/x`` where the list has ``cond/x``."""
    folder, at, which = spec.rpartition("@")
    return f"{os.path.normpath(folder)}@{which}" if at and os.path.isdir(folder) else os.path.normpath(spec)


def write_size_series(
    specs: Sequence[str], out: str, family_options: Sequence[str], paired: Sequence[str], last_n: int, protocol: str
) -> str:
    """Write ``family.md``, ``family.csv`` and ``family.png``; return the markdown."""
    families: dict[str, str] = {}
    for value, (name, listed) in zip(family_options, parse_assignments(family_options, "--family"), strict=True):
        if "" in listed.split(","):  # was read as the working folder: '.: no condensation analyses here'
            raise AnalysisError(f"--family: {value!r}: give NAME=SPEC,SPEC,..., no empty model")
        for spec in map(spelled, listed.split(",")):
            if families.setdefault(spec, name) != name:  # was: the last one named, silently
                raise AnalysisError(f"--family: {spec} is put in {families[spec]} and in {name}; put it in one")
    pair_specs = [(spelled(a), spelled(b)) for a, b in parse_assignments(paired, "--paired")]
    for i, (value, (a, b)) in enumerate(zip(paired, pair_specs, strict=True)):
        if a == b:  # its row would be A − A: zeros, as if the two were alike
            raise AnalysisError(f"--paired: {value!r} pairs {a} with itself; pair two models (A=B)")
        if {a, b} in ({*pair} for pair in pair_specs[:i]):  # was: its row twice
            raise AnalysisError(f"--paired: {value!r} pairs {a} and {b} again; give each pair once")
    specs = [spelled(spec) for spec in specs]
    members = load_members([*specs, *families, *(s for pair in pair_specs for s in pair)], families, protocol)
    by_spec = {m.spec: m for m in members}
    pairs = [(by_spec[a], by_spec[b]) for a, b in pair_specs]
    shortest = min(len(point_layers(m.result)) for m in members)
    if not 1 <= last_n <= shortest:
        raise AnalysisError(f"--last-n: {last_n} is not between 1 and {shortest}, the fewest layers of these models")
    inputs = members[0].result.inputs
    title = f"K={inputs['num_sequences']}, S={inputs['seq_len']}"
    trend = {row["family"]: row[f"spearman_params_vs_mean_cos_last_{last_n}"] for row in trend_rows(members, last_n)}
    text = family_markdown(members, pairs, last_n, title)
    files = ("family.csv", "family_paired.csv", "family.md", "family.png")
    with rewritten(out, FAMILY, files) as staging:
        write_csv(
            os.path.join(staging, "family.csv"),
            [{**row, "family_trend_spearman": trend[row["family"]]} for row in model_rows(members, last_n)],
        )
        if pairs:
            write_csv(os.path.join(staging, "family_paired.csv"), paired_rows(pairs, last_n))
        atomic_write(os.path.join(staging, "family.md"), lambda f: f.write(text))
        save_png(family_figure(members, pairs, title), os.path.join(staging, "family.png"))
    return text
