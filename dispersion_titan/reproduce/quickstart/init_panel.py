"""Condensation at initialization, for model shapes too large to train on a laptop: the paper's
"wider MLPs condense less" and "present from initialization" need GPT-2 small's shape, which a
toy model lacks, and a fresh model costs one forward pass. Same statistics and
``condensation.json`` as a run's analysis (step 0, ``checkpoint`` = ``"initialization"``)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...analysis.condensation_schema import RESULT_FILE, Condensation
from ...analysis.inputs import InputOptions, Sequences, select_sequences
from ...analysis.measure import DecoderLayers, measure
from ...analysis.statistics import condensation
from ...models.gpt2.args import GPT2ModelArgs, gpt2_flavors
from ...models.gpt2.model import GPT2
from ...run_folder.outputs import read_json_files, write_json

INIT_CHECKPOINT = "initialization"


def measure_at_init(args: GPT2ModelArgs, seed: int, sequences: Sequences, batch_size: int, run: str) -> Condensation:
    torch.manual_seed(seed)  # the model exactly as dispersion_titan.train initialises it with debug.seed = seed
    with torch.device("meta"):
        model = GPT2(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()
    model.eval()
    measured = measure(DecoderLayers(model), sequences.tokens, batch_size, "cpu")
    return condensation(
        0,
        sequences,
        measured,
        dtype="fp32",
        device="cpu",
        checkpoint=INIT_CHECKPOINT,
        run=run,
        model_args=dataclasses.asdict(args),
        n_params=sum(p.numel() for p in model.parameters()),
    )


@dataclass(frozen=True)
class InitPanel:
    widths: dict[int, Condensation]  # per MLP width, at the main seed
    seeds: dict[int, Condensation]  # the narrowest width per seed, the main one first


def init_panel(
    out: str,
    flavor: str,
    widths: tuple[int, ...],
    seeds: Sequence[int],
    texts: InputOptions,
    say: Callable[[str], None],
) -> InitPanel:
    """Step-0 condensation of ``flavor`` at each width (``out/w{width}/``) and at the narrowest for each
    extra seed (``out/w{width}-s{seed}/``), on the sequences ``texts`` selects; a shape measured on the
    same sequences is read back."""
    begun = time.monotonic()
    extra = f"; seed {', '.join(map(str, seeds[1:]))} at {widths[0]}" if seeds[1:] else ""
    say(
        f"init     condensation at initialization, {flavor} shape, MLP width "
        f"{', '.join(map(str, widths))} at seed {seeds[0]}{extra}: one forward pass each"
    )
    stored = read_json_files(out, RESULT_FILE)  # a corrupt one refused in one line before any work
    sequences = select_sequences(texts)
    jobs = [(w, seeds[0]) for w in widths] + [(widths[0], s) for s in seeds[1:]]
    results = {}
    for i, (width, seed) in enumerate(jobs, start=1):
        name = f"w{width}" if seed == seeds[0] else f"w{width}-s{seed}"
        folder, path = os.path.join(out, name), os.path.join(out, name, RESULT_FILE)
        args = dataclasses.replace(gpt2_flavors[flavor], mlp_hidden_dim=width)
        start = time.monotonic()
        if name in stored:
            cached = Condensation.from_json(stored[name], path)
            if cached.tokens_sha256 == sequences.sha256 and cached.model_args == dataclasses.asdict(args):
                results[width, seed] = cached
                say(f"init     MLP width {width}, seed {seed}: read back ({i} of {len(jobs)})")
                continue
        results[width, seed] = measure_at_init(args, seed, sequences, batch_size=4, run=folder)
        write_json(path, results[width, seed].to_json())
        took = time.monotonic() - start
        say(f"init     MLP width {width}, seed {seed}: measured in {took:.0f} s ({i} of {len(jobs)})")
    say(f"init     done in {time.monotonic() - begun:.0f} s")
    return InitPanel({w: results[w, seeds[0]] for w in widths}, {s: results[widths[0], s] for s in seeds})
