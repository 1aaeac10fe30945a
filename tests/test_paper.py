"""``python -m dispersion_titan.paper ARTIFACT`` end to end, offline: tiny random-init
transformers models built here drive fig2 (three sizes of one family, at the paper's
protocol, the default: the authors' texts from a local wikitext-103-v1 copy and transformers'
n + 1 hidden_states), fig4 (local revision folders), fig5 (a pair) and robustness (two local
corpora), those three at ``--protocol default``; tiny runs evaluated on the offline lm-eval
tasks drive table2. Every number in each JSON is checked against transformers' hidden
states and scipy, computed here."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import signal
from pathlib import Path

import huggingface_hub
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import transformers
from matplotlib import image
from scipy import stats

from dispersion_titan.analysis.inputs import InputOptions, select_sequences
from dispersion_titan.paper import PAPER
from dispersion_titan.paper import main as paper_main
from dispersion_titan.reproduce.paper import catalog, render
from dispersion_titan.reproduce.paper.render import revision_label
from dispersion_titan.reproduce.paper.workflow import build, check_devices, pick_revisions
from dispersion_titan.run_folder.hf_export import save_tokenizer, to_hf
from dispersion_titan.run_folder.outputs import FORMAT, FORMAT_KEY
from dispersion_titan.run_folder.owners import FolderOwner, record_owner
from dispersion_titan.utils.errors import ArgumentError
from support.cli import assert_one_line_error, run_cli
from support.condensation import independent_states, plain_mean_cos
from support.corpora import authors_long_text, texts_jsonl, write_wikitext_copy
from support.eval_tasks import LM_EVAL_TASKS
from support.launch import REPO, fake_slurm
from support.runs import digests, scale_weights, tiny_hub_model, tiny_run

K, S = 4, 16
INPUTS = ["--num-sequences", str(K), "--seq-len", str(S), "--batch-size", "4", "--device", "cpu"]
OURS = [*INPUTS, "--protocol", "default"]  # our inputs and all n + 2 layer points
SIZES = {"gpt2-s": (16, 2), "gpt2-m": (32, 3), "gpt2-l": (64, 4)}  # width, layers


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """One DIR for the analysing artifacts, as a user would: a model analysed for one is reused."""
    return tmp_path_factory.mktemp("paper")


def paper(*args, capsys) -> tuple[int, str, str]:
    return run_cli(paper_main, *args, capsys=capsys)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict[str, Path]:
    """Tiny GPT-2 models of three sizes, three revisions of one, and a 'distilled' twin."""
    root = tmp_path_factory.mktemp("zoo")
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    save_tokenizer(str(tokenizer), 64)

    def save(folder: Path, width: int, layers: int, seed: int) -> Path:
        torch.manual_seed(seed)
        cfg = transformers.GPT2Config(vocab_size=50257, n_positions=64, n_embd=width, n_layer=layers, n_head=2)
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
        for f in tokenizer.iterdir():
            shutil.copy(f, folder / f.name)
        return folder

    models = {name: save(root / name, w, n, i) for i, (name, (w, n)) in enumerate(SIZES.items())}
    for step, seed in ((0, 10), (100, 11), (200, 12)):
        save(root / "olmo" / f"stage1-step{step}-tokens{step // 100}B", 32, 3, seed)
    models["olmo"] = root / "olmo"
    models["distilled"] = save(root / "distilled", 16, 2, 20)
    models["texts"] = texts_jsonl(root / "texts.jsonl", documents=3, words=300)
    models["wikitext"] = write_wikitext_copy(root / "wikitext", rows=600)
    models["news"] = texts_jsonl(root / "news.jsonl", documents=3, words=300, seed=1)
    return models


@functools.cache
def tokenizer(folder: Path):
    return transformers.AutoTokenizer.from_pretrained(folder)


def expected(folder: Path, texts: Path | None) -> dict:
    """The numbers of one model, computed here: hidden states, cosine, scipy. Every model of
    the zoo has the same tokenizer files; ``texts`` None: the default dataset through our
    GPT-2 encoder (what a run is analysed with)."""
    if texts is None:
        tokens = select_sequences(InputOptions("enwiki_sample", None, None, K, S, 0)).tokens
    else:
        zoo = folder.parent.parent if folder.parent.name == "olmo" else folder.parent
        encode = tokenizer(zoo / "tokenizer")
        tokens = select_sequences(
            InputOptions(None, None, str(texts), K, S, 0),
            lambda t: encode(t, add_special_tokens=False, verbose=False)["input_ids"],
        ).tokens
    curve = [mean for mean, _ in plain_mean_cos(independent_states(folder, "gpt2", tokens))]
    depth = list(range(len(curve)))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return {
        "mean_cos": curve,
        "spearman": stats.spearmanr(depth, curve),
        "kendall": stats.kendalltau(depth, curve),
        "n_params": sum(p.numel() for p in model.parameters()),
        "last_3": float(np.mean(curve[-3:])),
    }


def assert_model(got: dict, want: dict) -> None:
    assert got["mean_cos"] == pytest.approx(want["mean_cos"], abs=1e-5)
    assert got["n_params"] == want["n_params"]
    for key, stat in (("spearman", "rho"), ("kendall", "tau")):
        assert got[key][stat] == pytest.approx(want[key].statistic, abs=1e-9)
        assert got[key]["p"] == pytest.approx(want[key].pvalue, abs=1e-9)


def assert_figure(stem: Path, least_bytes: int = 20_000) -> None:
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    assert png.stat().st_size > least_bytes and pdf.read_bytes().startswith(b"%PDF")
    rgb = np.round(image.imread(png)[..., :3] * 255).astype(np.uint32)  # packed: a row-wise unique takes seconds
    assert len(np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2])) > 50  # not one colour


def test_list_names_every_artifact_with_models_and_compute(capsys):
    code, out, _ = paper("--list", capsys=capsys)
    assert code == 0
    for name in ("fig2", "fig3", "fig4", "fig5", "table2", "robustness"):
        assert f"\n{name}  (" in f"\n{out}"
    for hub_id in (
        "openai-community/gpt2-xl",
        "Qwen/Qwen3-32B",
        "bigscience/bloom-7b1",
        "allenai/Olmo-3-1025-7B",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
        "Qwen/Qwen2.5-Math-7B",
    ):
        assert hub_id in out
    assert out.count("GPU-hours") >= 6 and "estimate" in out


def paper_expected(folder: Path, wikitext: Path) -> dict:
    """fig2's numbers of one model at the paper's protocol, computed as the authors do: their texts
    (the first S tokens, the tokenizer's default special tokens), transformers' n + 1 hidden_states
    in fp32, the sequence-averaged cosine matrix per point, scipy against the point index."""
    rows = [r for f in sorted((wikitext / "wikitext-103-v1").iterdir()) for r in pq.read_table(f)["text"].to_pylist()]
    encode = tokenizer(folder)
    tokens = torch.tensor([encode(authors_long_text(rows, seed))["input_ids"][:S] for seed in range(K)])
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(tokens, output_hidden_states=True).hidden_states
    curve = [mean for mean, _ in plain_mean_cos(list(hidden))]
    depth = list(range(len(curve)))
    return {
        "mean_cos": curve,
        "spearman": stats.spearmanr(depth, curve),
        "kendall": stats.kendalltau(depth, curve),
        "n_params": sum(p.numel() for p in model.parameters()),
        "last_3": float(np.mean(curve[-3:])),
        "layers": len(model.transformer.h) + 1,
    }


def test_fig2_matches_hidden_states_and_resumes(zoo, out, capsys, monkeypatch):
    """The paper's protocol by default: every statistic and figure over transformers' n + 1 hidden_states."""
    models = [str(zoo[name]) for name in SIZES]
    args = ["fig2", "--models", *models, "--dataset-path", zoo["wikitext"], *INPUTS, "--out", out]
    code, _, err = paper(*args, capsys=capsys)
    assert code == 0, err
    numbers = json.loads((out / "fig2.json").read_text())
    wants = [paper_expected(zoo[name], zoo["wikitext"]) for name in SIZES]
    assert [m["label"] for m in numbers["models"]] == list(SIZES)
    assert numbers["inputs"]["gpt2"]["protocol"] == "paper"
    for got, want in zip(numbers["models"], wants, strict=True):
        assert_model(got, want)
        assert len(got["mean_cos"]) == want["layers"] and got["layer_points"] == "hidden_states"
        assert got["layers"][-2:] == [f"block_{want['layers'] - 2}", "final_norm"]  # the last block's own output: out
        assert got["mean_cos_last_n"] == pytest.approx({str(n): np.mean(want["mean_cos"][-n:]) for n in range(1, 6)})
        half = want["layers"] // 2 + 1
        assert (got["half_n"], got["mean_cos_last_half"]) == (half, pytest.approx(np.mean(want["mean_cos"][-half:])))
        table_half = max(1, want["layers"] // 2)  # cossim_family_tables.py's "last half mean": one point fewer
        assert got["mean_cos_last_half_table"] == pytest.approx(np.mean(want["mean_cos"][-table_half:]))
    analysed = [json.loads(p.read_text()) for p in sorted((out / "analyses").rglob("condensation.json"))]
    assert {a["dtype"] for a in analysed} == {"fp32"}
    assert_figure(out / "fig2_last_n")
    (row,) = numbers["rows"]
    assert row["row"] == "gpt2" and row["x"] == [w["n_params"] for w in wants]
    trend = stats.spearmanr([w["n_params"] for w in wants], [w["last_3"] for w in wants])
    assert (row["spearman"]["rho"], row["spearman"]["p"]) == pytest.approx((trend.statistic, trend.pvalue))
    assert len({m["tokens_sha256"] for m in numbers["models"]}) == 1  # one tokenizer: the same windows
    assert_figure(out / "fig2")
    results = {p: p.stat().st_mtime_ns for p in (out / "analyses").rglob("condensation.json")}
    assert len(results) == 3
    code, _, err = paper(*args, capsys=capsys)  # a rerun reuses every analysis
    assert code == 0, err
    assert {p: p.stat().st_mtime_ns for p in results} == results
    other = [*args, "--seq-len", "8"]  # refused, naming the --force it takes (paper had none), nothing changed
    code, _, err = paper(*other, capsys=capsys)  # its one line on a line of its own, not run into the progress bar
    assert code == 2 and err.count("error:") == 1 and "(seq_len 16 vs 8); use another --out, or --force to" in err
    assert [line for line in re.split("[\r\n]", err) if "error:" in line][0].startswith("dispersion_titan: error: ")
    assert {p: p.stat().st_mtime_ns for p in results} == results
    code, stdout, _ = paper(*other, "--force", "--dry-run", capsys=capsys)
    assert code == 0 and all("--force" in line for line in stdout.splitlines() if "dispersion_titan.analyze" in line)
    drawn = digests(out, "fig2*")
    monkeypatch.setattr(render, "last_n_figure", lambda *_: os.kill(os.getpid(), signal.SIGINT))  # Ctrl-C mid-way
    code, _, err = paper(*args, "--draw-only", capsys=capsys)
    assert code == 130 and "interrupted" in err and digests(out, "fig2*") == drawn  # was: a new fig2.png, old json


def test_fig4_takes_four_branches_of_each_stage_and_the_final_model():
    """The paper's 13 points (S1-0 … S1-1059k, S2-1k … S2-37k, S3-1k … S3-10k, Main): per stage the first, the
    last and two evenly spaced between, by step, whatever the branches' other fields."""
    stage1 = [f"stage1-step{s}-tokens{s // 1000}B" for s in range(0, 1_059_001, 1000)]
    stage2 = [f"stage2-ingredient1-step{s}-tokens{s}M" for s in range(1000, 37_001, 1000)]
    stage2 += [f"stage2-ingredient2-step{s}-tokens{s}M" for s in range(1000, 99_001, 1000)]  # a second run of it
    stage3 = [f"stage3-step{s}" for s in range(1000, 10_001, 1000)]
    picked = pick_revisions(["main", "stage1-note", *stage3, *stage2, *stage1])
    assert [revision_label(r) for r in picked] == [
        "S1-0", "S1-353k", "S1-706k", "S1-1059k", "S2-1k", "S2-13k", "S2-25k", "S2-37k",
        "S3-1k", "S3-4k", "S3-7k", "S3-10k", "Main",
    ]  # fmt: skip
    assert picked[4] == "stage2-ingredient1-step1000-tokens1000M" and len(picked) == catalog.FIG4_REVISIONS
    assert pick_revisions(["main", "stage1-step0", "stage1-step5"]) == ["stage1-step0", "stage1-step5", "main"]
    with pytest.raises(ArgumentError, match="no stageN-stepM branches"):
        pick_revisions(["main"])


def test_fig4_revisions_fig5_pair_and_robustness(zoo, tmp_path, capsys):
    out = tmp_path  # not fig2's DIR: its analyses of gpt2-s were of the paper's inputs
    revisions = sorted(os.listdir(zoo["olmo"]))
    code, _, err = paper(
        "fig4",
        "--models",
        zoo["olmo"],
        "--revisions",
        ",".join(revisions),
        "--texts",
        zoo["texts"],
        *OURS,
        "--out",
        out,
        capsys=capsys,
    )
    assert code == 0, err
    fig4 = json.loads((out / "fig4.json").read_text())
    assert [m["tokens_seen"] for m in fig4["models"]] == ["0B", "1B", "2B"]
    assert [m["step"] for m in fig4["models"]] == [0, 100, 200] and fig4["rows"][0]["against"] == "training_order"
    assert [m["label"] for m in fig4["models"]] == ["S1-0", "S1-100", "S1-200"]
    for got, revision in zip(fig4["models"], revisions, strict=True):
        assert_model(got, expected(zoo["olmo"] / revision, zoo["texts"]))
    assert_figure(out / "fig4")

    code, _, err = paper(
        "fig5", "--models", zoo["gpt2-s"], zoo["distilled"], "--texts", zoo["texts"], *OURS, "--out", out, capsys=capsys
    )
    assert code == 0, err
    fig5 = json.loads((out / "fig5.json").read_text())
    base, distilled = expected(zoo["gpt2-s"], zoo["texts"]), expected(zoo["distilled"], zoo["texts"])
    assert [m["row"] for m in fig5["models"]] == ["base", "distilled"]
    assert_model(fig5["models"][1], distilled)
    (pair,) = fig5["pairs"]
    assert pair["delta_spearman"] == pytest.approx(distilled["spearman"].statistic - base["spearman"].statistic)
    assert pair["delta_mean_cos_last_3"] == pytest.approx(distilled["last_3"] - base["last_3"], abs=1e-6)
    assert_figure(out / "fig5")

    code, _, err = paper(
        "robustness",
        "--models",
        zoo["gpt2-s"],
        zoo["gpt2-m"],
        "--corpus",
        f"wiki={zoo['texts']}",
        "--corpus",
        f"news={zoo['news']}",
        *OURS,
        "--out",
        out,
        capsys=capsys,
    )
    assert code == 0, err
    robust = json.loads((out / "robustness.json").read_text())
    assert [m["row"] for m in robust["models"]] == ["wiki", "wiki", "news", "news"]
    assert robust["inputs"]["news"]["texts"] == str(zoo["news"])
    assert_model(robust["models"][3], expected(zoo["gpt2-m"], zoo["news"]))
    assert_figure(out / "robustness")


def width_runs(root: Path, widths: tuple[int, ...]) -> list[Path]:
    """Tiny GPT-2 runs (no training: seeded checkpoints at steps 0 and 5) of these MLP widths."""
    from dispersion_titan.models.gpt2.args import gpt2_flavors

    return [
        tiny_run(root / f"mlp{w}", steps=(0, 5), args=dataclasses.replace(gpt2_flavors["debug"], mlp_hidden_dim=w))
        for w in widths
    ]


def test_fig3_draws_each_widths_cross_entropy_run_or_the_authors_pick(zoo, tmp_path, capsys):
    """Per width one run analysed at its first and last checkpoints at the paper's protocol. By default the
    cross-entropy-only run at its last checkpoint, one row titled by width and parameters (the paper's
    figure); ``--pick authors --rows first,last``: a dispersion run first, two rows (plot_heatmaps.py).
    Every number as transformers' hidden states and scipy give it."""
    ce_64, run_512 = width_runs(tmp_path, (64, 512))
    disp_64 = tmp_path / "mlp64_angular_spread"
    shutil.copytree(ce_64, disp_64)
    metadata = json.loads((disp_64 / "run.json").read_text())
    (disp_64 / "run.json").write_text(json.dumps({**metadata, "dispersion": {"variant": "angular_spread", "coeff": 1}}))
    common = ("fig3", "--models", ce_64, run_512, disp_64, "--dataset-path", zoo["wikitext"], *INPUTS)
    code, _, err = paper(*common, "--out", tmp_path / "out", capsys=capsys)
    assert code == 0, err
    assert f"fig3: MLP 64: takes {ce_64} (a cross-entropy-only run) over {disp_64}, --pick ce" in err
    numbers = json.loads((tmp_path / "out" / "fig3.json").read_text())
    exports = {}
    for got in numbers["models"]:
        export = exports.setdefault((got["model"], got["step"]), tmp_path / f"{Path(got['model']).name}-{got['step']}")
        if not export.exists():
            to_hf(str(Path(got["model"]) / "checkpoint" / f"step-{got['step']}"), str(export))  # transformers' GPT-2
    params = {
        m: transformers.GPT2LMHeadModel.from_pretrained(exports[(m, 5)]).num_parameters()
        for m in (str(ce_64), str(run_512))
    }
    assert [(m["row"], m["label"], m["step"], m["model"]) for m in numbers["models"]] == [
        ("last checkpoint", f"MLP 64 ({params[str(ce_64)] / 1e6:.0f} M params)", 5, str(ce_64)),
        ("last checkpoint", f"MLP 512 ({params[str(run_512)] / 1e6:.0f} M params)", 5, str(run_512)),
    ]
    assert [m["n_params"] for m in numbers["models"]] == list(params.values())
    assert [row["row"] for row in numbers["rows"]] == ["last checkpoint"]
    assert_figure(tmp_path / "out" / "fig3")
    code, _, err = paper(*common, "--pick", "authors", "--rows", "first,last", "--out", tmp_path / "two", capsys=capsys)
    assert code == 0, err
    assert f"fig3: MLP 64: takes {disp_64} (a dispersion run) over {ce_64}, as the authors' plot_heatmaps.py" in err
    numbers = json.loads((tmp_path / "two" / "fig3.json").read_text())
    assert [(m["row"], m["step"]) for m in numbers["models"]] == [
        ("first checkpoint", 0),
        ("last checkpoint", 5),
        ("first checkpoint", 0),
        ("last checkpoint", 5),
    ]
    assert [m["model"] for m in numbers["models"]] == [str(disp_64)] * 2 + [str(run_512)] * 2
    assert [row["row"] for row in numbers["rows"]] == ["first checkpoint", "last checkpoint"]
    assert all(row["x"] == [64.0, 512.0] and row["against"] == "mlp_width" for row in numbers["rows"])
    for got in numbers["models"]:
        export = exports.setdefault((got["model"], got["step"]), tmp_path / f"{Path(got['model']).name}-{got['step']}")
        if not export.exists():
            to_hf(str(Path(got["model"]) / "checkpoint" / f"step-{got['step']}"), str(export))
        want = paper_expected(export, zoo["wikitext"])
        assert_model(got, want)
        assert len(got["mean_cos"]) == want["layers"] and got["layer_points"] == "hidden_states"
    assert_figure(tmp_path / "two" / "fig3")
    shutil.rmtree(ce_64 / "checkpoint")  # a width with dispersion runs only has nothing to draw under --pick ce
    code, _, err = paper("fig3", "--models", disp_64, "--out", tmp_path / "none", "--dry-run", capsys=capsys)
    assert_one_line_error(code, err, "fig3: MLP 64: no cross-entropy-only run among", "--pick authors")


def test_counteract_draws_both_runs_at_every_checkpoint(zoo, tmp_path, capsys, monkeypatch):
    """The default loss's run and the dispersion run, a row each, every checkpoint a heatmap titled by its step,
    at plot_heatmaps.py's 10 texts of 1024 tokens unless told otherwise; without runs, one line naming the
    training of each config."""
    base, disp = width_runs(tmp_path, (64, 65))
    metadata = json.loads((disp / "run.json").read_text())
    (disp / "run.json").write_text(json.dumps({**metadata, "dispersion": {"variant": "angular_spread", "coeff": 0.1}}))
    monkeypatch.chdir(REPO)
    code, out, _ = paper("counteract", "--models", base, disp, "--out", tmp_path / "dry", "--dry-run", capsys=capsys)
    assert code == 0 and out.count("--steps all") == 2 and "--num-sequences 10 --seq-len 1024" in out
    code, _, err = paper(
        "counteract", "--models", base, disp, "--dataset-path", zoo["wikitext"], *INPUTS, "--out", tmp_path / "out",
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    numbers = json.loads((tmp_path / "out" / "counteract.json").read_text())
    assert [(m["row"], m["label"]) for m in numbers["models"]] == [
        ("default loss", "step 0"),
        ("default loss", "step 5"),
        ("angular_spread λ=0.1", "step 0"),
        ("angular_spread λ=0.1", "step 5"),
    ]
    assert all(row["x"] == [0.0, 5.0] and row["against"] == "step" for row in numbers["rows"])
    export = tmp_path / "disp-5"
    to_hf(str(disp / "checkpoint" / "step-5"), str(export))
    assert_model(numbers["models"][3], paper_expected(export, zoo["wikitext"]))
    assert_figure(tmp_path / "out" / "counteract")
    assert_one_line_error(
        *paper("counteract", "--out", tmp_path / "none", "--dry-run", capsys=capsys)[::2],
        "counteract: no checkpoints in ./outputs/midtrain_gpt2_wikitext103_baseline",
        "launch/train.sh train_configs/paper/midtrain_gpt2_wikitext103_baseline.toml",
    )
    # A step that fails (a diverged checkpoint analyze skips), stderr no terminal: its command's line ends paper's
    # output, the last (was followed by paper's own progress bar, drawn again as it closed; then by the bar cleared,
    # a bare carriage return after the line).
    scale_weights(disp / "checkpoint" / "step-5", 1e30)
    code, _, err = paper(
        "counteract", "--models", base, disp, "--dataset-path", zoo["wikitext"], *INPUTS, "--out", tmp_path / "bad",
        capsys=capsys,
    )  # fmt: skip
    said = f"dispersion_titan: error: 1 of 2 checkpoints could not be analyzed: {disp / 'checkpoint' / 'step-5'}"
    assert code == 1 and err.split("\n")[-2:] == [said, ""], err


def test_fig3_trains_the_paper_preset_on_slurm(tmp_path, capsys, monkeypatch):
    """Without runs: locally one line naming the training; --slurm trains both arms of the paper preset
    at the paper's widths, each on train.sbatch's 8 GPUs as the authors' 8-GPU run ([released]), then
    analyses each width's cross-entropy run at 1024 tokens after its training job."""
    monkeypatch.chdir(REPO)  # the presets' configs live in the repository
    code, _, err = paper("fig3", "--out", tmp_path, capsys=capsys)
    assert_one_line_error(
        code,
        err,
        "fig3: no run of MLP width 64",
        "--slurm",
        "launch/train.sh train_configs/paper/fig3_gpt2_small.toml --model.mlp_hidden_dim 64",
    )
    code, out, _ = paper("fig3", "--slurm", "--dry-run", "--out", tmp_path, capsys=capsys)
    lines = out.strip().splitlines()
    train = [line for line in lines if "train.sbatch" in line]
    assert code == 0 and len(train) == 8 and not list(tmp_path.iterdir())
    for i, width in enumerate((64, 256, 1024, 4096)):
        ce, disp = train[2 * i], train[2 * i + 1]
        assert (
            f"train_configs/paper/fig3_gpt2_small.toml --model.mlp_hidden_dim {width} --job.dump_folder "
            f"{tmp_path}/runs/fig3_gpt2_small_mlp{width}" in ce
        )
        assert (
            f"train_configs/paper/fig3_gpt2_small_angular_spread.toml --model.mlp_hidden_dim {width} "
            f"--job.dump_folder {tmp_path}/runs/fig3_gpt2_small_mlp{width}_angular_spread" in disp
        )
        for name in (f"fig3_gpt2_small_mlp{width}", f"fig3_gpt2_small_mlp{width}_angular_spread"):
            assert (
                f"# fig3: {name}: [released] on 8 GPUs: 16 × 8 sequences per GPU, global batch 1024, 2385 steps" in out
            )
        analysis = next(line for line in lines if line.startswith(f"job_{9 + i}="))  # after the eight trainings
        assert f"--dependency=afterok:$job_{2 * i + 1} " in analysis and "--steps first,last" in analysis
        assert f"analyze.sbatch {tmp_path}/runs/fig3_gpt2_small_mlp{width} " in analysis
        assert "--seq-len 1024" in analysis and "--protocol paper" in analysis
    assert (
        "paper.sbatch fig3" in lines[-1]
        and "--dependency=afterok:" + ":".join(f"$job_{i}" for i in range(1, 13)) in lines[-1]
    )
    # a run whose last checkpoint is half written (no .metadata yet: killed while saving) is trained again
    run = tmp_path / "runs" / "fig3_gpt2_small_mlp64"
    (run / "checkpoint" / "step-2385").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({FORMAT_KEY: FORMAT, "model_args": {}, "training_steps": 2385}))
    record_owner(str(tmp_path), PAPER)  # as the first paper fig3 --slurm made it
    code, out, err = paper("fig3", "--slurm", "--dry-run", "--out", tmp_path, capsys=capsys)
    assert code == 0 and f"--job.dump_folder {run})" in out, err  # was: taken as trained, its training left out
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    code, out, _ = paper(
        "fig3", "--slurm", "--dry-run", "--sbatch-arg=--gpus-per-node=4", "--out", tmp_path, capsys=capsys
    )
    assert code == 0 and "[released] on 4 GPUs: 16 × 8 sequences per GPU, global batch 512, 4769 steps" in out
    # the trainings' alone: the analyses' --gpus=1 was refused by sbatch 22.05 under it, the drawing's --gpus=0 got 4
    alone = [" --gpus-per-node=4 --gpus-per-node=0 " in line for line in out.splitlines() if "--parsable" in line]
    assert alone == [False] * 8 + [True] * 5, out
    given = ("--sbatch-arg=--gpus-per-n", "--sbatch-arg=2", "--sbatch-arg=-N2")  # sbatch's other spellings: 2 × 2
    code, out, _ = paper("fig3", "--slurm", "--dry-run", *given, "--out", tmp_path, capsys=capsys)
    assert code == 0 and "[released] on 4 GPUs: 16 × 8 sequences per GPU, global batch 512, 4769 steps" in out
    code, out, _ = paper(
        "fig3", "--slurm", "--dry-run", "--sbatch-arg=--gpus-per-node=h100:2", "--out", tmp_path, capsys=capsys
    )
    assert code == 0 and "[released] on 2 GPUs: 16 × 8 sequences per GPU, global batch 256" in out  # a typed count
    for given, said in (
        ("--gpus-per-node=0", "--gpus-per-node=0"),
        ("-N0", "-N0"),
        ("-ON0", "-ON0"),
        ("--nodes", "--nodes 0"),
    ):
        more = ["--sbatch-arg=0"] if given == "--nodes" else []  # was a ZeroDivisionError traceback
        code, _, err = paper(
            "fig3", "--slurm", "--dry-run", f"--sbatch-arg={given}", *more, "--out", tmp_path, capsys=capsys
        )
        assert_one_line_error(code, err, f"--sbatch-arg: {said}: fig3 trains on GPUs; give a count of at least 1")
    for given, said in (("--nodes=2-4", "--nodes=2-4"), ("-N", "-N 2-4")):  # was taken for 1 node
        more = ["--sbatch-arg=2-4"] if given == "-N" else []
        code, _, err = paper(
            "fig3", "--slurm", "--dry-run", f"--sbatch-arg={given}", *more, "--out", tmp_path, capsys=capsys
        )
        assert_one_line_error(
            code, err, f"--sbatch-arg: {said}: not one count, which the training's layout is checked for; give one, "
            "as --nodes=N"
        )  # fmt: skip
    signal = "--sbatch-arg=--signal=B:USR1@60"  # the trainings told its lead, as the sweep's (train.sbatch's check)
    code, out, _ = paper("fig3", "--slurm", "--dry-run", signal, "--out", tmp_path, capsys=capsys)
    told = [" --export=ALL,PREEMPT_LEAD=60 " in line for line in out.splitlines() if "sbatch --parsable" in line]
    assert code == 0 and told == [True] * 8 + [False] * 5, out
    # sbatch's environment, which it reads over train.sbatch's #SBATCH lines (its command line over it): was ignored
    monkeypatch.setenv("SBATCH_SIGNAL", "B:USR1@60")
    code, out, _ = paper("fig3", "--slurm", "--dry-run", "--out", tmp_path, capsys=capsys)
    told = [" --export=ALL,PREEMPT_LEAD=60 " in line for line in out.splitlines() if "sbatch --parsable" in line]
    assert code == 0 and told == [True] * 8 + [False] * 5, out
    monkeypatch.setenv("SBATCH_GPUS_PER_NODE", "4")  # was laid out for 8
    code, out, _ = paper("fig3", "--slurm", "--dry-run", "--out", tmp_path, capsys=capsys)
    assert code == 0 and "[released] on 4 GPUs: 16 × 8 sequences per GPU, global batch 512, 4769 steps" in out
    # the analyses' and the drawing's own GPUs (sbatch 22.05 refused the analyses' --gpus=1 under the variable, and
    # gave the drawing's --gpus=0 its 4)
    alone = [
        " --kill-on-invalid-dep=yes --gpus-per-node=0 " in line for line in out.splitlines() if "--parsable" in line
    ]
    assert alone == [False] * 8 + [True] * 5, out
    code, out, _ = paper("fig3", "--slurm", "--dry-run", "--sbatch-arg=--gpus-per-node=2", "--out", tmp_path,
                         capsys=capsys)  # fmt: skip
    assert code == 0 and "[released] on 2 GPUs: 16 × 8 sequences per GPU, global batch 256" in out
    monkeypatch.setenv("SBATCH_GPUS_PER_NODE", "0")
    code, _, err = paper("fig3", "--slurm", "--dry-run", "--out", tmp_path, capsys=capsys)
    assert_one_line_error(code, err, "SBATCH_GPUS_PER_NODE: --gpus-per-node=0: fig3 trains on GPUs; give a count of")
    monkeypatch.delenv("SBATCH_GPUS_PER_NODE")
    # a time limit within train.sbatch's warning (its --signal's lead, here SBATCH_SIGNAL's, plus 60 s), as the
    # sweep's: refused before any job (was submitted, every training refused at its start)
    for given, env, said in (
        (("--sbatch-arg=--time=2",), {}, "--sbatch-arg: '2' leaves no time to train: train.sbatch is signalled 60 s"),
        (("--sbatch-arg=-t", "--sbatch-arg=1:59"), {}, "--sbatch-arg: '1:59' leaves no time"),
        ((), {"SBATCH_TIMELIMIT": "00:02:00"}, "SBATCH_TIMELIMIT: '00:02:00' leaves no time to train"),
    ):
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        code, _, err = paper("fig3", "--slurm", "--dry-run", *given, "--out", tmp_path, capsys=capsys)
        assert_one_line_error(code, err, said, "give more than 00:02:00, or signal later with --sbatch-arg=--signal=")
    code, out, _ = paper("fig3", "--slurm", "--dry-run", "--sbatch-arg=--time=2:01", "--out", tmp_path, capsys=capsys)
    assert code == 0 and " --time=2:01 " in out  # the command line's over the variable, as sbatch reads them
    monkeypatch.delenv("SBATCH_TIMELIMIT")
    monkeypatch.delenv("SBATCH_SIGNAL")
    # refused alone, before the layouts are said (were after their 8 lines), an option refused before a --time
    for given, env, said in (
        ((), {"SBATCH_ARRAY_INX": "0-1"}, "SBATCH_ARRAY_INX=0-1: sbatch reads it as --array"),
        (("--sbatch-arg=--time=2", "--sbatch-arg=-d", "--sbatch-arg=afterany:7"), {}, "--sbatch-arg: -d: these jobs"),
    ):
        with monkeypatch.context() as env_given:
            for var, value in env.items():
                env_given.setenv(var, value)
            assert_one_line_error(*paper("fig3", "--slurm", "--dry-run", *given, "--out", tmp_path,
                                         capsys=capsys)[::2], said)  # fmt: skip
    # a --gpus reaches the trainings too: sbatch 22.05 refused train.sbatch under it (its --gpus-per-node=8); a --gres
    # of GPUs the same (was submitted: the trainings got its GPUs per node, not those their layout was checked for)
    for given in (
        ("--sbatch-arg=--gpus=2",),
        ("--sbatch-arg=-G", "--sbatch-arg=2"),
        ("--sbatch-arg=--gres=gpu:2",),
        ("--sbatch-arg=--gres", "--sbatch-arg=gres:gpu:a100:1"),
        ("--sbatch-arg=--gpus-per-task=1",),  # were submitted: GPUs per task beside the layout's per node
        ("--sbatch-arg=--gpus-per-s", "--sbatch-arg=2"),  # --gpus-per-socket, as sbatch abbreviates it
    ):
        code, _, err = paper("fig3", "--slurm", "--dry-run", *given, "--out", tmp_path, capsys=capsys)
        assert_one_line_error(
            code, err, f"--sbatch-arg: {given[0].split('=', 1)[1]}: fig3's training jobs would get it too",
            "give the trainings' GPUs as --sbatch-arg=--gpus-per-node=N"
        )  # fmt: skip
    code, out, _ = paper("fig3", "--slurm", "--dry-run", "--sbatch-arg=--gres=nvme:1", "--out", tmp_path, capsys=capsys)
    assert code == 0 and " --gres=nvme:1 " in out  # no GPUs: kept
    code, out, _ = paper("fig3", "--preset", "ours", "--slurm", "--dry-run", "--out", tmp_path, capsys=capsys)
    assert code == 0 and "train.sbatch train_configs/gpt2_small_mlp768_angular_spread.toml --job.dump_folder" in out
    for option in ("--preset", "--pick", "--rows"):
        value = {"--preset": "ours", "--pick": "authors", "--rows": "last"}[option]
        assert_one_line_error(
            *paper("fig2", option, value, "--dry-run", capsys=capsys)[::2], f"{option}: only for fig3"
        )


def test_missing_inputs_and_dry_runs(zoo, tmp_path, capsys, monkeypatch):
    code, _, err = paper(
        "fig2", "--models", zoo["gpt2-s"], "--texts", zoo["texts"], "--out", tmp_path, "--draw-only", capsys=capsys
    )
    assert_one_line_error(code, err, "no analysis of gpt2-s", "python -m dispersion_titan.analyze hf:")
    assert not list(tmp_path.glob("fig2.*"))  # never a half figure
    code, _, err = paper("fig2", "--models", zoo["gpt2-s"], f"hf:{zoo['gpt2-s']}", "--dry-run", capsys=capsys)
    assert_one_line_error(code, err, f"--models: {zoo['gpt2-s']} is named twice; name each model once")
    code, _, err = paper("robustness", "--models", zoo["gpt2-s"], capsys=capsys)
    assert_one_line_error(code, err, "pubmed_qa", "--corpus pubmed_qa=FILE.jsonl")
    code, _, err = paper("fig4", "--revisions", "", "--dry-run", "--out", tmp_path, capsys=capsys)  # not: the hub's
    assert_one_line_error(code, err, "--revisions: empty; give REV1,REV2,...")
    code, _, err = paper("fig4", "--revisions", "a,,b", "--dry-run", "--out", tmp_path, capsys=capsys)  # as analyze
    assert_one_line_error(code, err, "--revisions: ", "expected hf:MODEL or hf:MODEL@REV1,REV2,...")  # was exit 0
    empty = tmp_path / "empty"  # or a sweep's folder: named as typed, not as hf:DIR (was: --models: 'DIR': hf:DIR: …)
    empty.mkdir()
    code, _, err = paper("fig2", "--models", empty, "--dry-run", "--out", tmp_path, capsys=capsys)
    assert_one_line_error(code, err, f"--models: {empty}: {empty} holds no config.json: not a Hugging Face model's")
    assert "hf:" not in err
    empty.rmdir()
    for corpus, said in (("x=absent.jsonl", "x=absent.jsonl: no such file"), ("x=nosuch", "x: unknown dataset")):
        code, _, err = paper("robustness", "--corpus", corpus, "--dry-run", "--out", tmp_path, capsys=capsys)
        assert_one_line_error(code, err, f"--corpus: {said}")  # was: exit 0, then analyze's --texts or --dataset
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # check_hub: offline, an empty cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_hf_home" / "hub"))
    code, _, err = paper("fig2", "--models", "openai-community/gpt2-xl", "--out", tmp_path / "xl", capsys=capsys)
    assert_one_line_error(  # up front, not analyze's "cannot be loaded" once --out is made
        code, err, "openai-community/gpt2-xl is not in the Hugging Face cache", "hf download openai-community/gpt2-xl"
    )
    assert not list(tmp_path.iterdir())
    with pytest.raises(ArgumentError, match=r"Qwen2.5-Math-7B \(7B\).* need a GPU .*--slurm"):
        check_devices(build("fig5", {"out": str(tmp_path)}), {}, cuda=False)
    code, out, _ = paper("fig5", "--dry-run", "--out", tmp_path, capsys=capsys)
    assert code == 0 and out.count("python -m dispersion_titan.analyze hf:") == 8 and not list(tmp_path.iterdir())
    run = tmp_path / "run"  # a run's folder as --out: the dry run refuses it, as the run itself would
    tiny_run(run)
    before = digests(run)
    code, _, err = paper("fig2", "--dry-run", "--out", run, capsys=capsys)
    assert_one_line_error(code, err, f"--out: {run} is the folder of run {run}; use another --out")
    assert digests(run) == before
    at = tmp_path / "run@2"  # fig4 of a run whose path holds an @ (was: taken as a model's revision, exit 0)
    shutil.move(run, at)
    code, _, err = paper("fig4", "--models", at, "--dry-run", "--out", tmp_path / "fig4", capsys=capsys)
    assert_one_line_error(code, err, "--models: fig4 takes a Hugging Face model (hub id or folder), not a run")
    shutil.rmtree(at)
    code, _, err = paper("table2", "--models", "A", "--select", "last", "--num-ckpt", "3", "--out", run, capsys=capsys)
    assert_one_line_error(code, err, "--num-ckpt: chooses among the steps of --select best")  # before any evaluation
    for models in ("=A,B", "base=", "base=A,,B"):  # table2's arms as evaluate table would refuse them
        code, _, err = paper("table2", "--models", models, "--dry-run", "--out", run, capsys=capsys)
        assert_one_line_error(code, err, f"--models: {models!r}: give [ARM=]RUN1,RUN2,..., a name before = and no")
    for option, value in (("--limit", "0"), ("--num-fewshot", "-1")):  # evaluate's types, the dry run too
        code, _, err = paper("table2", "--models", "A,B", option, value, "--dry-run", "--out", run, capsys=capsys)
        assert_one_line_error(code, err, f"argument {option}: '{value}' is not a ")  # was: passed on, exit 0
    for device, said in (("cuda:x", "argument --device: Invalid device string"), ("cuda:99", "--device: cuda:99: ")):
        code, _, err = paper("table2", "--models", "A,B", "--device", device, "--dry-run", "--out", run, capsys=capsys)
        assert_one_line_error(code, err, said)  # was: dry run exit 0; the run failing at evaluate, an empty --out left
        assert not run.exists()
    (run / "table2").mkdir(parents=True)  # table2's evaluate table folder another command's: refused up front
    record_owner(str(run), PAPER)
    record_owner(str(run / "table2"), FolderOwner("comparison"))
    before = digests(run)
    code, _, err = paper("table2", "--models", "A", "--dry-run", "--out", run, capsys=capsys)
    assert_one_line_error(  # was: refused after every evaluation, at the drawing
        code, err, f"--out: {run / 'table2'} holds a comparison folder; use another --out"
    )
    assert digests(run) == before
    shutil.rmtree(run)
    run.write_text("mine")  # a file as --out: named so, not a path inside it to train into
    code, _, err = paper("fig3", "--dry-run", "--out", run, capsys=capsys)
    assert_one_line_error(code, err, f"--out: {run} is a file, not a folder; use another --out")
    assert run.read_text() == "mine"
    run.unlink()
    code, out, _ = paper("fig2", "--dry-run", "--trust-remote-code", "--out", tmp_path, capsys=capsys)
    analyses = [line for line in out.splitlines() if "dispersion_titan.analyze hf:" in line]
    assert code == 0 and len(analyses) == 26
    assert all("--protocol paper" in line and "--dtype fp32" in line for line in analyses)  # the paper's, fp32
    assert [line.split()[3] for line in analyses if "--trust-remote-code" in line] == [
        "hf:" + m for m in QWEN_1
    ]  # asked for: the models that ship code get it, the others need none
    assert out.splitlines()[-1] == (  # the drawing line names its --out once
        f"python -m dispersion_titan.paper fig2 --trust-remote-code --out {tmp_path} --draw-only"
    )
    code, out, _ = paper("fig2", "--dry-run", "--draw-only", "--out", tmp_path, capsys=capsys)
    assert code == 0 and out.splitlines() == [  # was: every analysis too, and --draw-only twice
        f"python -m dispersion_titan.paper fig2 --out {tmp_path} --draw-only"
    ]
    for option, value in (("--plan-gpus", "3"), ("--plan-gpu", "h200")):  # was: ignored, passed to the drawing
        assert_one_line_error(*paper("fig2", option, value, "--dry-run", capsys=capsys)[::2], f"{option}: only with")
    code, out, _ = paper(
        "robustness",
        "--models",
        zoo["gpt2-s"],
        "--corpus",
        "wikitext-103=wikitext-103",
        "--corpus",
        f"imdb={zoo['texts']}",
        "--dataset-path",
        zoo["wikitext"],
        "--dry-run",
        "--out",
        tmp_path,
        capsys=capsys,
    )
    wiki, imdb = (line for line in out.splitlines() if "dispersion_titan.analyze" in line)
    assert f"--dataset-path {zoo['wikitext']}" in wiki and "--texts" not in wiki and "--dataset " not in wiki
    assert f"--texts {zoo['texts']}" in imdb and "--dataset-path" not in imdb and "--protocol paper" in imdb
    code, out, _ = paper("fig2", "--slurm", "--dry-run", "--out", tmp_path, capsys=capsys)
    gpus = {
        line.split("analyze.sbatch ")[1].split()[0]: re.findall(r"--gpus=(\d+)", line)
        for line in out.splitlines()
        if "analyze.sbatch" in line
    }
    assert gpus["hf:Qwen/Qwen2.5-14B"] == [] and gpus["hf:Qwen/Qwen3-32B"] == ["2"]  # fp32 with 20% headroom
    assert gpus["hf:Qwen/Qwen2.5-72B"] == ["5"]  # ceil(72 * 4 * 1.2 / 80)
    code, out, _ = paper("fig2", "--slurm", "--dry-run", "--dtype", "bf16", "--out", tmp_path, capsys=capsys)
    assert "--gpus=3" in next(line for line in out.splitlines() if "hf:Qwen/Qwen2.5-72B" in line)  # bf16: half
    code, out, _ = paper("fig2", "--slurm", "--dry-run", "--device", "cpu", "--out", tmp_path, capsys=capsys)
    big = next(line for line in out.splitlines() if "hf:Qwen/Qwen2.5-72B" in line)  # on CPU: no GPUs, no device map
    assert "--device cpu" in big and "--gpus=" not in big and "--device-map" not in big, big
    assert_one_line_error(  # was accepted: accelerate spread the models over the GPUs all the same
        *paper("fig2", "--device-map", "auto", "--device", "cpu", "--dry-run", capsys=capsys)[::2],
        "--device-map: auto spreads the model over the GPUs, not with --device cpu; drop one",
    )
    assert_one_line_error(
        *paper("fig2", "--dtype", "autocast", "--dry-run", capsys=capsys)[::2],
        "--dtype: autocast is for table2's evaluations; the analysing artifacts take fp32 or bf16",
    )
    assert_one_line_error(
        *paper("fig2", "--protocol", "qwen3", "--dry-run", capsys=capsys)[::2],
        "--protocol: 'qwen3'",
        "paper (the default) or default",
    )
    assert_one_line_error(
        *paper("table2", "--models", "x", "--trust-remote-code", capsys=capsys)[::2],
        "--trust-remote-code: only for the analysing artifacts",
    )
    code, out, _ = paper(
        "fig2",
        "--models",
        zoo["gpt2-s"],
        zoo["gpt2-m"],
        "--slurm",
        "--dry-run",
        "--sbatch-arg=--partition=debug",
        "--out",
        tmp_path,
        capsys=capsys,
    )
    lines = out.strip().splitlines()
    assert code == 0 and sum("analyze.sbatch hf:" in line for line in lines) == 2
    assert "--dependency=afterok:$job_1:$job_2" in lines[-1] and "paper.sbatch fig2" in lines[-1]
    assert lines[-1].endswith("--draw-only") and "--partition=debug" in lines[-1] and "--slurm" not in lines[-1]
    # Ctrl-C while the 2nd sbatch queues its job (a stand-in sbatch interrupts this process): both ids recorded, one
    # line saying they stay queued and how to submit again (was: "the same command goes on from there", which a
    # rerun refuses while they are queued), exit 130.
    sbatch = tmp_path / "bin" / "sbatch"
    sbatch.parent.mkdir()
    sbatch.write_text(
        f"#!/bin/sh\necho x >> {tmp_path}/n\nn=$(wc -l < {tmp_path}/n)\n[ $n = 2 ] && kill -INT $PPID\necho 10$n\n"
    )
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{sbatch.parent}:{os.environ['PATH']}")
    out = tmp_path / "submitted"
    code, printed, err = paper("fig2", "--models", zoo["gpt2-s"], zoo["gpt2-m"], "--slurm", "--out", out, capsys=capsys)
    assert code == 130 and err.strip().splitlines()[-1] == (
        "dispersion_titan: interrupted; each analysis and evaluation finished so far is kept in --out; the same "
        "command goes on from there (with --slurm: the jobs submitted so far stay queued, their ids above; submit "
        "again once they end, or scancel them)"
    ), err
    assert re.findall(r"^\s*(\d+)  ", printed, re.MULTILINE) == ["101", "102"]
    assert sorted(json.loads((out / "logs" / "submitted.json").read_text())) == ["101", "102"]


QWEN_1 = ["Qwen/Qwen-1_8B", "Qwen/Qwen-7B", "Qwen/Qwen-14B", "Qwen/Qwen-72B"]


def test_remote_code_runs_only_when_asked(tmp_path, capsys):
    """Without --trust-remote-code, fig2 plans the paper's models that need none and names those
    it left out in one line, also for the drawing job of --slurm; a given model that needs it is refused."""
    for slurm in ([], ["--slurm"]):
        code, out, err = paper("fig2", "--dry-run", *slurm, "--out", tmp_path, capsys=capsys)
        assert code == 0 and "--trust-remote-code" not in out
        assert err.splitlines() == [
            f"fig2: left out {', '.join(QWEN_1)}: they run their own modelling code; "
            "add --trust-remote-code to include them"
        ]
        analysed = re.findall(r"analyze(?:\.sbatch)? hf:(\S+)", out)
        assert len(analysed) == 22 and not set(QWEN_1) & set(analysed)
    assert len(build("fig2", {"out": str(tmp_path)}).models) == 22
    code, _, err = paper("fig2", "--models", "openai-community/gpt2", QWEN_1[1], "--dry-run", capsys=capsys)
    assert_one_line_error(
        code, err, f"--models: {QWEN_1[1]} run only with their own modelling code", "add --trust-remote-code"
    )
    code, out, _ = paper("fig2", "--models", QWEN_1[1], "--dry-run", "--trust-remote-code", capsys=capsys)
    assert code == 0 and f"hf:{QWEN_1[1]} " in out and "--trust-remote-code" in out
    assert not list(tmp_path.iterdir())


def test_table2_a_hub_models_block_is_its_pretrained_row(tmp_path, capsys):
    """GPT2-large's and -xl's blocks: ``--pretrained hf:MODEL`` evaluates the model as published into
    ``OUT/pretrained/`` first and tables it alone (no arms); its cells are that evaluation's scores."""
    model = tiny_hub_model(tmp_path / "gpt2-tiny")
    options = ["--include-path", LM_EVAL_TASKS, "--tasks", "wiki_next_word", "--limit", "4", "--num-fewshot", "0"]
    args = ["table2", "--pretrained", f"hf:{model}", *options, "--device", "cpu", "--out", tmp_path / "t"]
    code, out, err = paper(*args, "--dry-run", capsys=capsys)
    evaluation = tmp_path / "t" / "pretrained" / str(model).strip("/").replace("/", "--")
    assert code == 0 and f"dispersion_titan.evaluate hf:{model} --out " in out, err
    assert "--dtype autocast" in out  # was: evaluate's fp32, not the authors' callback's bf16 autocast
    code, out, _ = paper(*args, "--dry-run", "--dtype", "fp32", capsys=capsys)
    assert code == 0 and "--dtype fp32" in out and "autocast" not in out  # the option
    assert not (tmp_path / "t").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")  # a training run's folder named as a hub model
    for refused, says in ((f"hf:{tmp_path}/run", "give it without hf:"), (f"hf:{tmp_path}/t", "no such folder")):
        code, _, err = paper("table2", "--pretrained", refused, "--out", tmp_path / "t", "--dry-run", capsys=capsys)
        assert_one_line_error(code, err, f"--pretrained: {refused}: ", says)  # as its evaluate step would
    nosuch = tmp_path / "nosuch"  # was submitted: its evaluate job failed once it started
    code, _, err = paper(
        *args[:3], "--include-path", nosuch, "--out", tmp_path / "t", "--slurm", "--dry-run", capsys=capsys
    )
    assert_one_line_error(code, err, f"--include-path: {nosuch}: no such file or directory (give a readable folder")
    assert not (tmp_path / "t").exists()
    code, out, err = paper(*args, capsys=capsys)
    assert code == 0, err
    found = list((tmp_path / "t" / "pretrained").glob("*/step-0/results.json"))
    assert len(found) == 1, found
    results = json.loads(found[0].read_text())
    table = json.loads((tmp_path / "t" / "table2.json").read_text())
    assert table["arms"] == [] and table["pretrained"]["runs"] == [str(found[0].parent.parent)]
    assert table["pretrained"]["mean"]["wiki_next_word/acc"] == results["results"]["wiki_next_word"]["acc,none"]
    assert results["dispersion_titan"]["run"] == f"hf:{model}"
    assert results["dispersion_titan"]["settings"]["dtype"] == "autocast"
    assert_figure(tmp_path / "t" / "table2", 10_000)  # one row
    assert found[0].parent.parent == evaluation


def test_table2_a_step_failing_in_a_log_says_why_on_a_line_of_its_own(tmp_path, capsys):
    """A step failing (its evaluation's folder another command's) with stderr not a terminal: the progress bar's
    line ends before the error, the last line (was glued to it: the bar, cleared with a bare carriage return)."""
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2"}))  # not loaded: refused before
    out = tmp_path / "t"
    evaluation = out / "pretrained" / str(model).strip("/").replace("/", "--")
    evaluation.mkdir(parents=True)
    record_owner(str(out), PAPER)
    record_owner(str(evaluation), FolderOwner("comparison"))
    options = ["--include-path", LM_EVAL_TASKS, "--tasks", "wiki_next_word", "--device", "cpu"]  # indexed alone: fast
    code, _, err = paper("table2", "--pretrained", f"hf:{model}", *options, "--out", out, capsys=capsys)
    said = f"dispersion_titan: error: --out: {evaluation} holds a comparison folder; use another --out"
    assert code == 2 and err.split("\n")[-2:] == [said, ""] and "table2:" in err, err


def test_table2_models_naming_a_hub_model_names_its_pretrained_row(tmp_path, capsys):
    """``table2 --models openai-community/gpt2`` (a hub id, not a run; nothing of that name here): one line naming
    ``--pretrained hf:MODEL`` beside training (was only `train it first: … --job.dump_folder openai-community/gpt2`),
    ``hf:MODEL`` that alone; exit 2, before any folder is made, with or without --dry-run."""
    out = tmp_path / "t"
    for model, way in (
        ("openai-community/gpt2", "train it first: launch/train.sh CONFIG --job.dump_folder openai-community/gpt2; a "
         "hub model: its row of Table 2: --pretrained hf:openai-community/gpt2"),
        ("hf:openai-community/gpt2", "a hub model; its row of Table 2: --pretrained hf:openai-community/gpt2"),
    ):  # fmt: skip
        for dry_run in ((), ("--dry-run",)):
            code, _, err = paper("table2", "--models", model, "--out", out, *dry_run, capsys=capsys)
            assert code == 2 and err.strip().splitlines() == [
                f"dispersion_titan: error: --models: {model}: not a run folder ({way})"
            ], err
    assert not out.exists()


def test_paper_slurm_given_a_dependency_keeps_the_drawing_jobs_own(tmp_path, capsys, monkeypatch):
    """``--slurm --sbatch-arg=--dependency=afterany:7`` (or ``-d``): one line, exit 2, before any folder, with or
    without --dry-run (was submitted: sbatch keeps the last --dependency, so the drawing job waited for job 7 instead
    of the evaluations it draws); ``--array`` the same, also after sbatch's no-argument flags (``-Hd``, ``-vQa``), and
    as sbatch's environment gives it (``SBATCH_ARRAY_INX``, ``SBATCH_EXPORT``: were submitted), and GPUs sbatch's
    environment would ask every job for (``SBATCH_GPUS``, a GPU ``SBATCH_GRES``: were submitted, then refused by
    sbatch 22.05). A --time here is kept: no job trains."""
    model, out = tiny_hub_model(tmp_path / "gpt2-tiny"), tmp_path / "t"
    capsys.readouterr()  # its writing's progress
    for dependency in (
        ("--sbatch-arg=--dependency=afterany:7",),
        ("--sbatch-arg=-d", "--sbatch-arg=afterany:7"),
        ("--sbatch-arg=--dep=afterany:7",),  # sbatch's abbreviations (getopt_long's): were submitted
        ("--sbatch-arg=--depend", "--sbatch-arg=afterany:7"),
        ("--sbatch-arg=-Hd", "--sbatch-arg=afterany:7"),  # after getopt's bundled flags (-H -d): were submitted
    ):
        for dry_run in ((), ("--dry-run",)):
            args = ["table2", "--pretrained", f"hf:{model}", "--slurm", *dependency, *dry_run, "--out", out]
            code, _, err = paper(*args, capsys=capsys)
            assert code == 2 and err.strip().splitlines() == [
                f"dispersion_titan: error: --sbatch-arg: {dependency[0].split('=', 1)[1]}: these jobs wait for the "
                "ones before them with a --dependency of their own, which sbatch would replace with this one (it "
                "keeps the last given); leave it out (to wait for a job of yours, submit once it ended, or hold them "
                "with --begin)"
            ], err
    for array in (("--sbatch-arg=--array=0-1",), ("--sbatch-arg=--ar", "--sbatch-arg=0-1"), ("--sbatch-arg=-vQa0-1",)):
        code, _, err = paper("table2", "--pretrained", f"hf:{model}", "--slurm", *array, "--out", out, capsys=capsys)
        assert code == 2 and err.strip().splitlines() == [  # was submitted: every task the same command, folders
            f"dispersion_titan: error: --sbatch-arg: {array[0].split('=', 1)[1]}: the tasks of an array job would each "
            "run the same command, into the same folders; leave it out"
        ], err
    monkeypatch.setenv("PATH", fake_slurm(tmp_path, "")["PATH"])  # were submitted
    for var, value, said in (
        ("SBATCH_ARRAY_INX", "0-1", "--array: the tasks of an array job would each run the same command"),
        ("SBATCH_EXPORT", "NONE", "--export: these jobs read the environment they are submitted with: PYTHON"),
        ("SBATCH_GPUS", "1", "--gpus: each job asks for the GPUs it needs"),  # sbatch refused the trainings
        ("SBATCH_GRES", "gpu:2", "--gres: each job asks for the GPUs it needs"),  # and the evaluations
    ):
        monkeypatch.setenv(var, value)
        for dry_run in ((), ("--dry-run",)):
            args = ("table2", "--pretrained", f"hf:{model}", "--slurm", *dry_run, "--out", out)
            code, _, err = paper(*args, capsys=capsys)
            assert_one_line_error(code, err, f"error: {var}={value}: sbatch reads it as {said}", f"(here: unset {var})")
        monkeypatch.delenv(var)
    assert not out.exists() and not (tmp_path / "calls").exists()
    for chdir in (
        "--sbatch-arg=--chdir=/tmp",
        "--sbatch-arg=-D/tmp",
        "--sbatch-arg=-sD/tmp",
    ):  # was: run there, its relative paths broken
        code, _, err = paper("table2", "--pretrained", f"hf:{model}", "--slurm", chdir, "--dry-run", capsys=capsys)
        assert_one_line_error(code, err, f"--sbatch-arg: {chdir.split('=', 1)[1]}: these jobs run in the folder this")
    code, _, err = paper("table2", "--pretrained", f"hf:{model}", "--slurm", "--sbatch-arg=--kill-on-invalid-dep=no",
                         "--dry-run", capsys=capsys)  # fmt: skip
    assert_one_line_error(  # was: the drawing job pending forever once an evaluation failed
        code, err, "--sbatch-arg: --kill-on-invalid-dep=no: these jobs are submitted with --kill-on-invalid-dep=yes"
    )
    code, _, err = paper("table2", "--pretrained", f"hf:{model}", "--slurm", "--sbatch-arg=--export=NONE",
                         "--dry-run", capsys=capsys)  # fmt: skip
    assert_one_line_error(  # was submitted: sbatch keeps the last --export, a training job told PREEMPT_LEAD=N none
        code, err, "--sbatch-arg: --export=NONE: these jobs read the environment they are submitted with: PYTHON, the"
    )
    for ambiguous in ("--de=afterany:7", "--a=0-1"):  # sbatch's own refusal: --deadline, --delay-boot; --account ...
        args = ["table2", "--pretrained", f"hf:{model}", "--slurm", f"--sbatch-arg={ambiguous}", "--dry-run"]
        code, shown, err = paper(*args, "--out", out, capsys=capsys)
        assert code == 0 and f" {ambiguous} " in shown, err
    for kept in ("-t5", "--gpus=2"):  # a time limit within train.sbatch's warning, a --gpus: no job trains
        args = ["table2", "--pretrained", f"hf:{model}", "--slurm", f"--sbatch-arg={kept}", "--dry-run", "--out", out]
        code, shown, err = paper(*args, capsys=capsys)
        assert code == 0 and f" {kept} " in shown, err


def test_paper_slurm_again_into_its_folder_by_a_link_is_the_same_submission(tmp_path, capsys, monkeypatch):
    """``--slurm --out LINK``, then ``--out REAL`` (LINK a link to REAL) while its jobs are queued: one folder, so the
    same jobs, refused as such (was `job 101 of this name is queued or running with other settings`: their commands
    compared by the path typed, --out made absolute, not resolved as the sweep's), with ``SBATCH_GPUS_PER_NODE`` set
    too (was `... with other settings`: the --gpus-per-node=0 their jobs ask under it)."""
    model, real = tiny_hub_model(tmp_path / "gpt2-tiny"), tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("PATH", fake_slurm(tmp_path, "")["PATH"])
    args = ("table2", "--pretrained", f"hf:{model}", "--slurm", "--out")
    code, _, err = paper(*args, tmp_path / "link", capsys=capsys)
    assert code == 0, err
    code, _, err = paper(*args, real, capsys=capsys)
    assert_one_line_error(code, err, "): the same job is queued or running as 101; wait for it to end, or scancel 101")
    monkeypatch.setenv("SBATCH_GPUS_PER_NODE", "8")  # its jobs' --gpus-per-node=0 under it asks what they asked
    code, _, err = paper(*args, real, capsys=capsys)  # was "job 101 of this name is queued ... with other settings"
    assert_one_line_error(code, err, "): the same job is queued or running as 101; wait for it to end, or scancel 101")
    assert len((tmp_path / "calls").read_text().splitlines()) == 2  # its evaluation and drawing jobs, once


def test_paper_fig3_slurm_submitted_again_under_another_sbatch_gpus_per_node_is_refused(tmp_path, capsys, monkeypatch):
    """``SBATCH_GPUS_PER_NODE`` changed since fig3's trainings were submitted into its --out (``logs/environment.json``,
    as the sweep's ``sweep.json``), no --gpus-per-node given: one line naming the variable and its earlier value, exit
    2, nothing submitted, by the dry run too (was submitted: the runs not trained yet laid out on another number of
    GPUs than the arms trained before, the [released] loss scale with it); under the earlier count, its ended jobs
    again; a record of the variable alone (an earlier version's) compared alike."""
    monkeypatch.chdir(REPO)  # the presets' configs live in the repository
    monkeypatch.setenv("PATH", fake_slurm(tmp_path, "")["PATH"])
    out, calls, held = tmp_path / "out", tmp_path / "calls", tmp_path / "held"
    monkeypatch.setenv("SBATCH_GPUS_PER_NODE", "4")
    code, _, err = paper("fig3", "--slurm", "--out", out, capsys=capsys)
    assert code == 0 and len(calls.read_text().splitlines()) == 13, err
    held.write_text("")  # its jobs ended (cancelled), the runs untrained
    for variable, said in (("8", "SBATCH_GPUS_PER_NODE=8: "), (None, "SBATCH_GPUS_PER_NODE unset: ")):
        if variable is None:
            monkeypatch.delenv("SBATCH_GPUS_PER_NODE")
        else:
            monkeypatch.setenv("SBATCH_GPUS_PER_NODE", variable)
        for dry_run in ((), ("--dry-run",)):
            code, _, err = paper("fig3", "--slurm", *dry_run, "--out", out, capsys=capsys)
            assert_one_line_error(
                code,
                err,
                f"error: {said}{out} holds a paper fig3 submitted with SBATCH_GPUS_PER_NODE=4: its trainings would go "
                "on on 8 GPUs per node, not the 4 they were submitted for; submit it again with "
                "SBATCH_GPUS_PER_NODE=4, or use another --out",
            )
    assert len(calls.read_text().splitlines()) == 13
    monkeypatch.setenv("SBATCH_GPUS_PER_NODE", "gpu:4")  # the same count
    code, _, err = paper("fig3", "--slurm", "--out", out, capsys=capsys)
    assert code == 0 and len(calls.read_text().splitlines()) == 26, err
    held.write_text("")
    (out / "logs" / "environment.json").write_text('{"SBATCH_GPUS_PER_NODE": "4"}\n')  # an earlier version's
    monkeypatch.setenv("SBATCH_GPUS_PER_NODE", "8")
    code, _, err = paper("fig3", "--slurm", "--dry-run", "--out", out, capsys=capsys)
    assert_one_line_error(
        code, err, f"error: SBATCH_GPUS_PER_NODE=8: {out} holds a paper fig3 submitted with SBATCH_GPUS_PER_NODE=4: its"
    )


GIVEN_4, GIVEN_8 = "--sbatch-arg=--gpus-per-node=4", "--sbatch-arg=--gpus-per-node=8"  # fig3's trainings' GPUs
GIVEN_SPLIT, VARIABLE_4 = "--sbatch-arg=--gpus-per-node", "SBATCH_GPUS_PER_NODE=4"


@pytest.mark.parametrize(
    ("first", "again", "said"),  # said: the count and where from, again then first, and the setting to submit with
    [
        (("4",), (None, GIVEN_8), (8, GIVEN_8, 4, VARIABLE_4, f"{VARIABLE_4} and without {GIVEN_8}")),
        ((None, GIVEN_4), ("8",), (8, "SBATCH_GPUS_PER_NODE=8", 4, GIVEN_4, GIVEN_4)),
        (
            (None, GIVEN_4),
            (None, GIVEN_SPLIT, "--sbatch-arg=8"),
            (8, f"{GIVEN_SPLIT} --sbatch-arg=8", 4, GIVEN_4, GIVEN_4),
        ),
        (("8", GIVEN_4), ("8",), (8, "SBATCH_GPUS_PER_NODE=8", 4, GIVEN_4, GIVEN_4)),
        ((None, GIVEN_4), (None,), (8, "SBATCH_GPUS_PER_NODE unset", 4, GIVEN_4, GIVEN_4)),  # train.sbatch's own 8
        (("4",), (None, GIVEN_4), None),  # the same count from another source
        ((None, GIVEN_8), (None,), None),
    ],
)
def test_paper_fig3_slurm_submitted_again_on_another_gpus_per_node_from_any_source_is_refused(
    first, again, said, tmp_path, capsys, monkeypatch
):
    """fig3's trainings submitted into its --out on one count of GPUs per node (``logs/environment.json``: the count
    ``train.sbatch`` gets and where from: ``--sbatch-arg=--gpus-per-node``, else ``SBATCH_GPUS_PER_NODE``, else its
    own 8), again on another from any source: one line naming both counts and sources, exit 2, nothing submitted or
    printed, by the dry run too (was submitted where --sbatch-arg gave one now, or then: the arms of one figure on
    two GPU layouts, the [released] loss scale with them); the same count from another source: its ended jobs again."""
    monkeypatch.chdir(REPO)  # the presets' configs live in the repository
    monkeypatch.setenv("PATH", fake_slurm(tmp_path, "")["PATH"])
    out, calls, held = tmp_path / "out", tmp_path / "calls", tmp_path / "held"

    def submit(variable: str | None, *args: str) -> tuple[int, str, str]:
        if variable is None:
            monkeypatch.delenv("SBATCH_GPUS_PER_NODE", raising=False)
        else:
            monkeypatch.setenv("SBATCH_GPUS_PER_NODE", variable)
        return paper("fig3", "--slurm", *args, "--out", out, capsys=capsys)

    code, _, err = submit(*first)
    assert code == 0 and len(calls.read_text().splitlines()) == 13, err
    held.write_text("")  # its jobs ended (cancelled), the runs untrained
    if said is None:
        code, _, err = submit(*again)
        assert code == 0 and len(calls.read_text().splitlines()) == 26, err
        return
    counted, is_, count, was, fix = said
    for dry_run in ((), ("--dry-run",)):
        code, printed, err = submit(*again, *dry_run)
        assert_one_line_error(
            code,
            err,
            f"error: {is_}: {out} holds a paper fig3 submitted with {was}: its trainings would go on on {counted} GPUs "
            f"per node, not the {count} they were submitted for; submit it again with {fix}, or use another --out",
        )
        assert printed == ""
    assert len(calls.read_text().splitlines()) == 13


def test_paper_slurm_into_an_analysis_of_other_settings_is_refused_at_submission(zoo, tmp_path, capsys, monkeypatch):
    """fig3 --slurm into the DIR where fig2 analysed the run at another --seq-len: one line, exit 2, by the dry run
    too, nothing written (was exit 0, submitted: its analyze job refused the folder's other settings hours later);
    or where fig2's analyze job of it is still queued, at submission."""
    (run,) = width_runs(tmp_path, (64,))
    out = tmp_path / "out"
    common = ("--models", run, "--dataset-path", zoo["wikitext"], *INPUTS, "--out", out)
    code, _, err = paper("fig2", *common, capsys=capsys)
    assert code == 0, err
    before = digests(out)
    code, _, err = paper("fig3", *common, "--seq-len", str(S // 2), "--slurm", "--dry-run", capsys=capsys)
    analyses = out / "analyses" / run.name
    assert_one_line_error(
        code, err, f"--out: {analyses}: step-5 was analyzed with other settings (seq_len {S} vs {S // 2}); use another"
    )
    assert digests(out) == before
    code, _, err = paper("fig3", *common, "--slurm", "--dry-run", capsys=capsys)  # fig2's settings: step-0 to add
    assert code == 0, err
    # fig2 --slurm queued into a new DIR: fig3 --slurm of another --seq-len refused while its analyze job is queued
    monkeypatch.setenv("PATH", fake_slurm(tmp_path, "")["PATH"])
    queued = ("--models", run, "--dataset-path", zoo["wikitext"], *INPUTS, "--slurm", "--out", tmp_path / "queued")
    code, _, err = paper("fig2", *queued, capsys=capsys)
    assert code == 0, err
    code, _, err = paper("fig3", *queued, "--seq-len", str(S // 2), capsys=capsys)
    assert_one_line_error(
        code,
        err,
        f"{tmp_path / 'queued' / 'analyses' / run.name}: job 101, queued or running, analyzes into it with "
        f"other settings (seq_len {S} vs {S // 2}); wait for it to end, or scancel 101",
    )
    assert len((tmp_path / "calls").read_text().splitlines()) == 2  # fig2's analysis and drawing jobs alone
    # The same folder by another path, through a link or relative to the job's working directory (squeue's %Z, here
    # the stand-in sbatch's), as another version may record it: refused alike (was: compared as strings, submitted)
    (tmp_path / "link").symlink_to(tmp_path / "queued")
    code, _, err = paper("fig3", *queued[:-1], tmp_path / "link", "--seq-len", str(S // 2), capsys=capsys)
    assert_one_line_error(code, err, f"{tmp_path / 'queued' / 'analyses' / run.name}: job 101, queued or running")
    record = tmp_path / "queued" / "logs" / "submitted.json"
    jobs, work_dir = json.loads(record.read_text()), (tmp_path / "held").read_text().splitlines()[0].split(" ", 1)[1]
    at = jobs["101"].index("--out") + 1
    jobs["101"][at] = os.path.relpath(jobs["101"][at], work_dir)
    record.write_text(json.dumps(jobs))
    monkeypatch.chdir(tmp_path / "link")  # elsewhere than the job
    code, _, err = paper("fig3", *queued, "--seq-len", str(S // 2), capsys=capsys)
    assert_one_line_error(code, err, f"{tmp_path / 'queued' / 'analyses' / run.name}: job 101, queued or running")
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    # A queued job whose recorded command this version's analyze does not read (an older version's option): not
    # compared, left to its own job's check (was that option's usage line, exit 2, as if typed here)
    jobs = json.loads(record.read_text())
    jobs["101"].append("--an-older-option")
    record.write_text(json.dumps(jobs))
    code, _, err = paper("fig3", *queued, "--seq-len", str(S // 2), capsys=capsys)
    assert code == 0 and "error" not in err, err


def test_paper_slurm_reads_a_queued_jobs_relative_texts_from_its_working_directory(zoo, tmp_path, capsys, monkeypatch):
    """fig2 --slurm given ``--texts texts.jsonl`` (relative: its analyze job reads it from where it was submitted),
    then fig3 --slurm into the same DIR from another folder: its check of fig2's queued job reads that job's texts
    from the job's working directory (squeue's %Z): other settings refused, the same ones submitted (was `--texts:
    texts.jsonl: no such file`, exit 2, for a file this command never named)."""
    (run,) = width_runs(tmp_path, (64,))
    shutil.copy(zoo["texts"], tmp_path / "texts.jsonl")
    monkeypatch.setenv("PATH", fake_slurm(tmp_path, "")["PATH"])
    monkeypatch.chdir(tmp_path)
    common = ("--models", run, *INPUTS, "--slurm", "--out", tmp_path / "out")
    code, _, err = paper("fig2", *common, "--texts", "texts.jsonl", capsys=capsys)
    assert code == 0, err
    monkeypatch.chdir(tmp_path / "out")
    code, _, err = paper("fig3", *common, "--texts", tmp_path / "texts.jsonl", "--seq-len", str(S // 2), capsys=capsys)
    assert_one_line_error(code, err, "job 101, queued or running, analyzes into it with other settings (seq_len ")
    code, _, err = paper("fig3", *common, "--texts", tmp_path / "texts.jsonl", capsys=capsys)
    assert code == 0, err


def test_an_older_analysis_recording_a_relative_dataset_path_is_drawn_in_its_row(zoo, tmp_path, capsys, monkeypatch):
    """A row's analyses compared with their files located, as ``analyze family`` compares them: one an earlier
    version recorded with ``--dataset-path`` as typed, relative, is drawn beside one recording it absolute, and
    ``--slurm`` takes it as of its settings (was refused by both: ``dataset_path 'wikitext' vs '/…/wikitext'``)."""
    models = ["--models", zoo["gpt2-s"], zoo["gpt2-m"]]
    args = ["fig2", *models, "--dataset-path", zoo["wikitext"], *INPUTS, "--out", tmp_path]
    code, _, err = paper(*args, capsys=capsys)
    assert code == 0, err
    result = tmp_path / "analyses" / "gpt2-s" / "rev-default" / "condensation.json"
    older = json.loads(result.read_text())
    older["inputs"]["dataset_path"] = zoo["wikitext"].name  # as an earlier version recorded it: as typed
    result.write_text(json.dumps(older))
    monkeypatch.chdir(zoo["wikitext"].parent)
    for more in (["--draw-only"], ["--slurm", "--dry-run"]):
        code, _, err = paper(*args, *more, capsys=capsys)
        assert code == 0, err


def test_paper_with_an_empty_out_is_refused_not_written_into_the_working_folder(tmp_path, capsys, monkeypatch):
    """``--out ""`` (an unset ``$OUT``): one line, exit 2, with or without --dry-run, the working folder untouched (was
    the working folder itself: its dry run printed `--out /the/cwd`, a run there claimed it as the paper's)."""
    monkeypatch.chdir(tmp_path)
    for dry_run in (("--dry-run",), ()):
        code, out, err = paper("fig2", "--out", "", *dry_run, capsys=capsys)
        assert (
            code == 2
            and out == ""
            and err.strip().splitlines()
            == [
                "dispersion_titan: error: argument --out: empty; name a folder, or leave the option out for its default"
            ]
        ), err
    assert list(tmp_path.iterdir()) == []


DISP = "\\disp_#2|$"
"""An arm named with what LaTeX and Markdown escape (was: a .tex that does not compile, a Markdown column more)."""


def test_table2_two_arms_two_seeds(tmp_path, capsys, monkeypatch):
    runs = {name: tiny_run(tmp_path / name, steps=(seed,)) for seed, name in enumerate(("a1", "a2", "b1", "b2"), 1)}
    table2 = (
        "table2",
        "--models",
        f"base={runs['a1']},{runs['a2']}",
        f"{DISP}={runs['b1']},{runs['b2']}",
        "--include-path",
        LM_EVAL_TASKS,
        "--tasks",
        "wiki_next_word",
        "--limit",
        "4",
        "--num-fewshot",
        "0",
        "--device",
        "cpu",
    )
    (tmp_path / "a1_link").symlink_to(runs["a1"])  # one run by two paths, or its cp -a copy: refused before any
    shutil.copytree(runs["a1"], tmp_path / "a1_copy", symlinks=True)  # evaluation (was: after all, by the table)
    refusals = {
        "a1_link": (f"--models: {runs['a1']} and {tmp_path / 'a1_link'} are the same run (", "name each run once"),
        "a1_copy": (f"--models: {tmp_path / 'a1_copy'}: the same settings and seed as {runs['a1']} (named twice, a ",),
    }
    for other, refusal in refusals.items():
        twice = [f"base={runs['a1']},{runs['a2']}", f"disp={runs['b1']},{tmp_path / other}", *table2[4:]]
        code, _, err = paper("table2", "--models", *twice, "--out", tmp_path / "t2", capsys=capsys)
        assert_one_line_error(code, err, *refusal)
        assert not (tmp_path / "t2").exists() and not list(tmp_path.glob("*/evaluation"))
    code, _, err = paper(
        *table2,
        "--best-step",
        "per-seed",
        "--out",
        tmp_path / "t2",
        capsys=capsys,
    )  # each run evaluated one step of its own: per seed
    assert code == 0, err
    table = json.loads((tmp_path / "t2" / "table2.json").read_text())
    assert table["pretrained"] is None  # no run evaluated step 0
    averages = {}
    for arm in table["arms"]:
        scores = []
        for run, step in zip(arm["runs"], arm["steps"], strict=True):
            results = json.loads((Path(run) / "evaluation" / f"step-{step}" / "results.json").read_text())["results"]
            scores.append(
                {
                    f"{task}/{key.split(',')[0]}": value
                    for task, metrics in results.items()
                    for key, value in metrics.items()
                    if key.split(",")[0] == "acc"
                }
            )
        columns = list(scores[0])
        assert columns, arm["arm"]  # at least one accuracy to average
        for column in columns:
            values = [s[column] for s in scores]
            assert arm["mean"][column] == pytest.approx(np.mean(values), rel=1e-5)
            assert arm["std"][column] == pytest.approx(np.std(values, ddof=1), rel=1e-5, abs=1e-9)
        averages[arm["arm"]] = [np.mean([s[c] for c in columns]) for s in scores]
        assert arm["average_mean"] == pytest.approx(np.mean(averages[arm["arm"]]), rel=1e-5)
    (other,) = (arm for arm in table["arms"] if arm["arm"] != table["reference"])
    assert table["test"] == "student"
    p = stats.ttest_ind(averages[other["arm"]], averages[table["reference"]], equal_var=True).pvalue
    assert other["p_value"] == pytest.approx(p, rel=1e-5)  # the seeds' averages differ: scipy's p is a number
    code, _, err = paper(
        *table2,
        "--test",
        "welch",
        "--reference",
        "base",
        "--best-step",
        "per-seed",
        "--out",
        tmp_path / "t2w",
        capsys=capsys,
    )  # the evaluations are reused; only the table is made again
    welch = json.loads((tmp_path / "t2w" / "table2.json").read_text())
    assert code == 0 and welch["test"] == "welch" and welch["reference"] == "base"
    p = stats.ttest_ind(averages[DISP], averages["base"], equal_var=False).pvalue
    got = next(arm for arm in welch["arms"] if arm["arm"] == DISP)["p_value"]
    assert got == pytest.approx(p, rel=1e-5)
    tex = (tmp_path / "t2" / "table2.tex").read_text()
    assert tex.startswith(r"\begin{tabular}") and r"$\pm$" in tex
    assert r"\textbackslash{}disp\_\#2\textbar{}\$ & 2 &" in tex
    assert "| \\disp_#2\\|$ | 2 |" in (tmp_path / "t2" / "table2.md").read_text()  # its | no column of its own
    assert "| base |" in (tmp_path / "t2" / "table2.md").read_text()
    assert_figure(tmp_path / "t2" / "table2")
    before = digests(tmp_path / "t2", "table2.*")  # a Ctrl-C while drawing the new table2.png: the last set kept whole
    monkeypatch.setattr(render, "_figure", lambda *_: signal.raise_signal(signal.SIGINT))
    code, _, err = paper(
        *table2, "--best-step", "per-seed", "--test", "welch", "--out", tmp_path / "t2", "--draw-only", capsys=capsys
    )
    assert code == 130, err
    assert digests(tmp_path / "t2", "table2.*") == before  # was: welch's .md, .tex, .json, student's figure
    monkeypatch.undo()
    # Other settings: evaluate refuses the runs' folders, and table2 refuses to weigh a result made so.
    models = ["--models", f"base={runs['a1']},{runs['a2']}", f"disp={runs['b1']},{runs['b2']}"]
    options = ["--include-path", LM_EVAL_TASKS, "--tasks", "wiki_next_word", "--num-fewshot", "0", "--device", "cpu"]
    options += ["--best-step", "per-seed"]  # each run evaluated one step of its own
    code, _, err = paper("table2", *models, *options, "--limit", "5", "--out", tmp_path / "t3", capsys=capsys)
    assert code == 2 and err.count("dispersion_titan: error: ") == 1  # after the progress bar, as it runs evaluate
    assert (
        f"error: --out: {runs['a1'] / 'evaluation'}: step-1 was evaluated with other settings (limit 4 vs 5); "
        "use another --out, or --force to recompute\n" in err
    )
    result = runs["b2"] / "evaluation" / "step-4" / "results.json"
    changed = json.loads(result.read_text())
    changed["dispersion_titan"]["settings"]["limit"] = 5
    result.write_text(json.dumps(changed))
    code, _, err = paper(
        "table2", *models, *options, "--limit", "4", "--out", tmp_path / "t3", "--draw-only", capsys=capsys
    )
    assert_one_line_error(code, err, f"{runs['b2']} was evaluated with other settings than {runs['a1']} (limit 4 vs 5)")
    assert not list((tmp_path / "t3").glob("table2*"))
