"""Export a checkpoint as a Hugging Face model directory (``GPT2LMHeadModel``,
``Qwen3ForCausalLM`` or ``LlamaForCausalLM`` by the run's family), loadable offline by
``transformers`` and ``lm_eval --model hf``:

    python -m dispersion_titan.convert to-hf DUMP/checkpoint/step-N OUT_DIR [--force]
    python -m dispersion_titan.convert to-hf DUMP OUT_DIR     # the run's newest complete checkpoint

``step-N`` may be a DCP checkpoint or a ``last_save_in_hf`` one; the model family, shape
and tokenizer come from the run's ``run.json``. ``OUT_DIR`` receives ``model.safetensors``, the run's
tokenizer files and, last, ``config.json`` (what makes a model folder of it to transformers and lm-eval),
staged in a hidden folder inside it: a conversion that failed or was interrupted leaves no new
``config.json``, and the same command finishes it. An ``OUT_DIR`` holding a whole export is refused unless
``--force`` and it is of the same run; a folder of other files, always.
"""

from __future__ import annotations

import argparse
import sys

from .config.cli import OneLineErrorParser, named, out_folder
from .utils.errors import command, run_command


@command("no new export in OUT_DIR (its config.json, which completes one, is written last); run it again")
def main(argv: list[str] | None = None) -> None:
    parser = OneLineErrorParser(
        prog="python -m dispersion_titan.convert",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="to-hf")
    export = commands.add_parser("to-hf", help="checkpoint step directory -> Hugging Face model directory")
    export.add_argument(
        "step_dir",
        metavar="CHECKPOINT_OR_RUN",
        type=named("a checkpoint's step-N folder or a run folder"),
        help="a step-N folder, or a run (its newest complete checkpoint)",
    )
    export.add_argument("out_dir", metavar="OUT_DIR", type=out_folder)
    export.add_argument("--force", action="store_true", help="replace an export of the same run in OUT_DIR")
    options = parser.parse_args(argv)
    if not options.out_dir:  # was the working directory, refused as holding the user's files or written into
        parser.error("OUT_DIR: empty; give the folder to write the export into")
    from .run_folder.hf_export import to_hf  # torch: after --help, and within run_command's Ctrl-C (python -m)

    to_hf(options.step_dir, options.out_dir, options.force)
    print(f"wrote {options.out_dir}", file=sys.stderr)


if __name__ == "__main__":
    run_command(main)
