"""``summary.md``: the setup, the table, the paper's findings against the measurements, the files."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ...run_folder.outputs import format_table
from .findings import AGREES, DISAGREES, NOISE, Finding, findings_markdown
from .summary import RunCondensation, late_blocks, table_rows


def summary_markdown(
    runs: list[RunCondensation], found: Sequence[Finding], setup: str, files: Sequence[tuple[str, str]]
) -> str:
    first = runs[0].final
    late = ", ".join(layer.name for layer in late_blocks(first))
    counts = Counter(f.verdict for f in found)
    tally = ", ".join(f"{counts[v]} {v}" for v in (NOISE, DISAGREES) if counts[v])
    lines = [
        "# Embedding condensation: MLP width × dispersion loss, against the paper",
        "",
        setup,
        "",
        "```",
        format_table(table_rows(runs)),
        "```",
        "",
        f"## The paper's findings, measured here: {counts[AGREES]} of {len(found)} agree"
        + (f"; {tally}" if tally else ""),
        "",
        *findings_markdown(found),
        f"late cos = off-diagonal mean cosine (mean_cos_offdiag) between the tokens of one sequence, averaged "
        f"over the late half of the blocks ({late} of the toy model); last block = the last block alone. "
        f"Measured on the same {first.num_sequences} held-out sequences of {first.seq_len} tokens for every "
        "checkpoint. Spearman = rank correlation of the mean cosine with depth (embedding … final norm); "
        "val loss at the final step.",
        "",
        "Figures and tables:",
        *(f"- {description}: {path}" for description, path in files),
    ]
    return "\n".join(lines) + "\n"
