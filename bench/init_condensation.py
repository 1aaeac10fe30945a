"""Condensation at initialization across model shapes: the exploration behind the
quickstart's init panel (docs/reproduction.md).

For each shape (dim × blocks) and MLP width, a freshly initialised GPT-2 (as
``dispersion_titan.train`` initialises it) is measured on the analysis' default
sequences: the off-diagonal mean cosine of the last block, of the late half of the
blocks, and of the embedding, plus Spearman with depth, for each seed.

    python bench/init_condensation.py                          # the default shapes
    python bench/init_condensation.py --shapes 768x12 --widths 768,6144 --seeds 42
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispersion_titan.analysis.inputs import DEFAULT_DATASET, InputOptions, select_sequences  # noqa: E402
from dispersion_titan.models.gpt2.args import GPT2ModelArgs  # noqa: E402
from dispersion_titan.reproduce.quickstart.findings import embedding_cos, late_cos  # noqa: E402
from dispersion_titan.reproduce.quickstart.pipeline import measure_at_init  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="64x4,128x12,256x12,768x12", help="dim x blocks, comma-separated")
    p.add_argument(
        "--widths", default="1,4,8", help="MLP widths as multiples of dim (1,4,8) or, with --absolute, sizes"
    )
    p.add_argument("--absolute", action="store_true", help="--widths are MLP sizes, not multiples of dim")
    p.add_argument("--seeds", default="42,43")
    p.add_argument("--num-sequences", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    a = p.parse_args()
    sequences = select_sequences(InputOptions(DEFAULT_DATASET, None, None, a.num_sequences, a.seq_len, seed=0))
    print("| dim × blocks | MLP width | seed | embedding | late blocks | last block | Spearman | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        dim, blocks = map(int, shape.split("x"))
        for width in (int(w) if a.absolute else int(w) * dim for w in a.widths.split(",")):
            for seed in map(int, a.seeds.split(",")):
                args = GPT2ModelArgs(dim=dim, n_layers=blocks, n_heads=max(1, dim // 64), mlp_hidden_dim=width)
                start = time.perf_counter()
                r = measure_at_init(dataclasses.replace(args), seed, sequences, 4, run="bench")
                print(
                    f"| {dim} × {blocks} | {width} | {seed} | {embedding_cos(r):.3f} | {late_cos(r):.3f} | "
                    f"{r.layers[-2].mean_cos_offdiag:.3f} | {r.spearman:+.2f} | {time.perf_counter() - start:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
