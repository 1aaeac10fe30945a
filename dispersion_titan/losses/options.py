"""The dispersion options' block selection, on top of what the loss itself defines (its variants,
kernels and parameter ranges; ``config/schema.py`` types the choices). ``job_config.checks``
applies it to a job config and the trainer resolves ``layers`` with it.
"""

from __future__ import annotations


def resolve_layers(spec: str | list[int], n_layers: int) -> list[int]:
    """0-based block indices selected by ``dispersion.layers`` (keywords, a list of 1-based indices, or
    ``"3"`` / ``"1,2,5"`` as typed on a command line); ValueError naming what is wrong."""
    parts = spec if isinstance(spec, list) else [p.strip() for p in spec.split(",")]
    if not isinstance(spec, list) and not all(p.isdigit() for p in parts):
        half = n_layers // 2
        table = {
            "all": range(n_layers),
            "last": range(n_layers - 1, n_layers),
            "early_half": range(half),
            "late_half": range(half, n_layers),
        }
        if spec not in table:
            raise ValueError(f"{spec!r} is not one of {tuple(table)} or block indices such as 3 or 1,2,5")
        chosen = list(table[spec])
    else:
        indices = [int(p) for p in parts]
        bad = [i for i in indices if not 1 <= i <= n_layers]
        if bad or not indices:
            raise ValueError(f"block indices must be 1..{n_layers} (1-based), got {spec}")
        if twice := sorted({i for i in indices if indices.count(i) > 1}):
            raise ValueError(f"block {', '.join(map(str, twice))} named twice in {spec}; name each block once")
        chosen = sorted({i - 1 for i in indices})
    if not chosen:
        raise ValueError(f"{spec!r} selects no block of {n_layers}")
    return chosen
