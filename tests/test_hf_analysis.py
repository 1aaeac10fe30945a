"""Condensation of Hugging Face models (``analyze hf:``), model families (``analyze
family``) and the geometry measures, offline: tiny random-initialised models of several
architectures saved with our GPT-2 BPE tokenizer, checked against an independent
computation through ``output_hidden_states``."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from scipy import stats

from dispersion_titan.analysis.compare import compare
from dispersion_titan.analysis.condensation_schema import Condensation, LayerCondensation
from dispersion_titan.analysis.hf_model import decoder_layers
from dispersion_titan.analysis.inputs import InputOptions, paper_texts, select_sequences
from dispersion_titan.analysis.measure import effective_rank, max_explainable_variance, unit_tokens
from dispersion_titan.analysis.size_series import load_member, write_size_series
from dispersion_titan.run_folder.hf_export import save_tokenizer, to_hf
from dispersion_titan.utils.errors import AnalysisError, ModelLoadError
from support.cli import analyze, assert_one_line_error
from support.condensation import independent_states, plain_mean_cos
from support.corpora import authors_long_text, texts_jsonl, write_wikitext_copy
from support.runs import logged, tiny_run

K, S = 4, 16
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VOCAB = 50257


def config(family: str, width: int = 32, layers: int = 2) -> transformers.PretrainedConfig:
    """A tiny config of ``family`` (every model has 64 positions but BLOOM, which has none)."""
    common = {"vocab_size": VOCAB, "hidden_size": width, "num_hidden_layers": layers, "num_attention_heads": 2}
    shape = {"intermediate_size": 2 * width, "max_position_embeddings": 64}
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=width, n_layer=layers, n_head=2)
    if family == "llama":
        return transformers.LlamaConfig(**common, **shape, num_key_value_heads=1)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, **shape, num_key_value_heads=1, head_dim=width // 2)
    if family == "bloom":
        return transformers.BloomConfig(vocab_size=VOCAB, hidden_size=width, n_layer=layers, n_head=2)
    return transformers.GPTNeoXConfig(**common, **shape)


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(str(folder), 64)
    return folder


def save_model(
    folder: Path,
    cfg: transformers.PretrainedConfig,
    tokenizer_files: Path,
    seed: int = 0,
    auto=transformers.AutoModelForCausalLM,
) -> Path:
    torch.manual_seed(seed)
    auto.from_config(cfg).save_pretrained(folder)
    for f in tokenizer_files.iterdir():
        shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    return texts_jsonl(tmp_path_factory.mktemp("texts") / "texts.jsonl", documents=3, words=300)


def options(texts: Path, *extra: str) -> list[str]:
    return ["--texts", str(texts), "--num-sequences", str(K), "--seq-len", str(S), "--batch-size", "3", *extra]


def load(out: Path, folder: str = "rev-default") -> Condensation:
    path = out / folder / "condensation.json"
    return Condensation.from_json(json.loads(path.read_text()), str(path))


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen3", "bloom", "neox"])
def test_hf_model_matches_independent_computation(family, tokenizer_files, texts, tmp_path, capsys):
    folder = save_model(tmp_path / family, config(family, layers=3), tokenizer_files)
    code, out, err = analyze(f"hf:{folder}", *options(texts), "--out", tmp_path / "out", capsys=capsys)
    assert code == 0, err
    result = load(tmp_path / "out")
    assert [layer.name for layer in result.layers] == ["embedding", "block_1", "block_2", "block_3", "final_norm"]
    assert (result.model, result.revision, result.model_args["model_type"]) == (
        str(folder),
        None,
        config(family).model_type,
    )
    encode = transformers.AutoTokenizer.from_pretrained(folder)
    sequences = select_sequences(
        InputOptions(None, None, str(texts), K, S, 0),
        lambda t: encode(t, add_special_tokens=False, verbose=False)["input_ids"],
    )
    assert result.tokens_sha256 == sequences.sha256
    want = plain_mean_cos(independent_states(folder, family, sequences.tokens))
    got = [(layer.mean_cos, layer.mean_cos_offdiag) for layer in result.layers]
    assert np.allclose(got, want, rtol=0, atol=1e-5)
    assert result.n_params == sum(
        p.numel() for p in transformers.AutoModelForCausalLM.from_config(config(family, layers=3)).parameters()
    )
    assert (tmp_path / "out" / "heatmap_rev-default.png").read_bytes().startswith(PNG_MAGIC)


def test_exported_run_equals_run_analysis(tmp_path, texts, capsys):
    run = tiny_run(tmp_path / "run", steps=(3,))
    assert analyze(run, *options(texts), capsys=capsys)[0] == 0
    exported = tmp_path / "exported"
    to_hf(str(run / "checkpoint" / "step-3"), str(exported))
    assert analyze(f"hf:{exported}", *options(texts), "--out", tmp_path / "hf", capsys=capsys)[0] == 0
    ours, theirs = load(run / "condensation", "step-3"), load(tmp_path / "hf")
    assert theirs.tokens_sha256 == ours.tokens_sha256
    assert ours.layers and [layer.name for layer in theirs.layers] == [layer.name for layer in ours.layers]
    for a, b in zip(theirs.layers, ours.layers, strict=True):
        assert (a.mean_cos, a.mean_cos_offdiag) == pytest.approx((b.mean_cos, b.mean_cos_offdiag), abs=1e-5)
        assert (a.effective_rank, a.mev) == pytest.approx((b.effective_rank, b.mev), rel=1e-4)
    assert theirs.n_params == ours.n_params


def test_revisions_of_a_local_model(tokenizer_files, texts, tmp_path, capsys):
    """``hf:/path@a,b`` means /path/a/ and /path/b/; each cached under OUT/rev-NAME/."""
    model = tmp_path / "olmo"
    for seed, revision in enumerate(("stage1-step100", "stage1-step200")):
        save_model(model / revision, config("llama"), tokenizer_files, seed=seed)
    out = tmp_path / "out"
    code, stdout, _ = analyze(f"hf:{model}@stage1-step100,stage1-step200", *options(texts), "--out", out, capsys=capsys)
    assert code == 0
    both = [load(out, f"rev-stage1-step{step}") for step in (100, 200)]
    assert [(r.step, r.revision) for r in both] == [(100, "stage1-step100"), (200, "stage1-step200")]
    assert both[0].curve != both[1].curve
    assert (out / "evolution.png").read_bytes().startswith(PNG_MAGIC)
    with open(out / "summary.csv") as f:
        assert [r["revision"] for r in csv.DictReader(f)][::4] == ["stage1-step100", "stage1-step200"]
    # The same as analysing the revision's folder alone; a rerun skips both.
    assert (
        analyze(f"hf:{model / 'stage1-step200'}", *options(texts), "--out", tmp_path / "alone", capsys=capsys)[0] == 0
    )
    assert load(tmp_path / "alone").curve == both[1].curve
    code, stdout, _ = analyze(f"hf:{model}@stage1-step100,stage1-step200", *options(texts), "--out", out, capsys=capsys)
    assert code == 0 and "2 revision(s) already analyzed" in stdout
    # A revision published anew, analysed with --force: TensorBoard holds its new values alone (were the old alone).
    save_model(model / "stage1-step200", config("llama"), tokenizer_files, seed=7)
    spec = f"hf:{model}@stage1-step200"
    assert analyze(spec, *options(texts), "--out", out, "--force", capsys=capsys)[0] == 0
    new = load(out, "rev-stage1-step200")
    assert new.curve != both[1].curve
    tag = "analysis/mean_cos/embedding"
    assert logged(out / "tb", tag) == [(100, pytest.approx(both[0].curve[0])), (200, pytest.approx(new.curve[0]))]
    # Revisions of another family: refused before --out is made (was: analysed, each recorded with the first's
    # shape, the GPT-2's and the Llama's curves in one evolution.png).
    save_model(model / "gpt2", config("gpt2"), tokenizer_files)
    code, _, err = analyze(
        f"hf:{model}@stage1-step100,gpt2", *options(texts), "--out", tmp_path / "mixed", capsys=capsys
    )
    assert_one_line_error(
        code,
        err,
        f"hf:{model}@stage1-step100,gpt2: revisions stage1-step100 and gpt2 are different models (model_type llama vs "
        "gpt2",
        "; analyze each into its own --out",
    )
    assert not (tmp_path / "mixed").exists()


def test_a_local_folder_whose_name_holds_an_at_is_that_model(tokenizer_files, texts, tmp_path, capsys):
    """``hf:models/gpt2@v1``, a folder so named: that model (was read as MODEL@REV, ``models/gpt2`` taken for a hub
    id: `cannot be loaded (OSError: We couldn't connect to 'https://huggingface.co' …); … give a local folder`);
    its own revisions after a further ``@``; a folder MODEL beside it keeps ``MODEL@REV`` its revision."""
    folder = save_model(tmp_path / "gpt2@v1", config("gpt2"), tokenizer_files)
    assert analyze(f"hf:{folder}", *options(texts), "--out", tmp_path / "out", capsys=capsys)[0] == 0
    assert (load(tmp_path / "out").model, load(tmp_path / "out").revision) == (str(folder), None)
    code, _, err = analyze(f"hf:{folder}@r", *options(texts), "--out", tmp_path / "r", capsys=capsys)
    assert_one_line_error(code, err, f"hf:{folder}@r: no such folder {folder / 'r'}")
    save_model(tmp_path / "gpt2" / "v1", config("gpt2"), tokenizer_files, seed=1)
    assert analyze(f"hf:{folder}", *options(texts), "--out", tmp_path / "rev", capsys=capsys)[0] == 0
    assert load(tmp_path / "rev", "rev-v1").revision == "v1"
    assert not (tmp_path / "r").exists()


def test_a_tb_dir_that_is_the_out_folder_is_refused_before_any_work(tokenizer_files, texts, tmp_path, capsys):
    """``--tb-dir OUT --out OUT``: one line before anything is measured, no OUT made (was: measured, a heatmap
    written into OUT, then `--tb-dir: OUT holds the histograms of an analysis with other settings`, of its own)."""
    model, out = save_model(tmp_path / "model", config("gpt2"), tokenizer_files), tmp_path / "out"
    code, _, err = analyze(f"hf:{model}", *options(texts), "--out", out, "--tb-dir", f"{out}/", capsys=capsys)
    assert_one_line_error(code, err, f"--tb-dir: {out}/ is --out; leave --tb-dir out (its default is {out}/tb)")
    assert not out.exists()


def test_a_model_saved_over_its_folder_is_not_taken_for_the_one_analyzed(tokenizer_files, texts, tmp_path, capsys):
    """Another model saved into an analysed ``hf:`` folder: the rerun, ``compare`` and ``family`` refuse the analysis
    of the old one in one line, nothing changed (was: `already analyzed`, exit 0, its stale numbers compared). An
    ``--out`` inside the model's folder is no change of its weights: the rerun skips it."""
    model, other = tmp_path / "model", tmp_path / "other"
    out = model / "condensation"
    save_model(model, config("gpt2"), tokenizer_files)
    save_model(tmp_path / "o", config("gpt2"), tokenizer_files, seed=1)
    for spec, folder in ((model, out), (tmp_path / "o", other)):
        assert analyze(f"hf:{spec}", *options(texts), "--out", folder, capsys=capsys)[0] == 0
    code, printed, _ = analyze(f"hf:{model}", *options(texts), "--out", out, capsys=capsys)
    assert code == 0 and "1 revision(s) already analyzed" in printed
    result = out / "rev-default" / "condensation.json"
    before = hashlib.sha256(result.read_bytes()).hexdigest()
    save_model(model, config("gpt2"), tokenizer_files, seed=2)
    code, _, err = analyze(f"hf:{model}", *options(texts), "--out", out, capsys=capsys)
    assert_one_line_error(
        code, err, f"--out: {out}: rev-default was analyzed from another checkpoint than {model} holds now", "--force"
    )
    again = f"python -m dispersion_titan.analyze hf:{model} --out {out} --force --protocol default"
    for command, *step in (("compare",), ("compare", "--step", "default"), ("family",)):  # a revision named too
        code, _, err = analyze(command, out, other, *step, "--out", tmp_path / command, capsys=capsys)
        assert_one_line_error(code, err, f"{out}: rev-default was analyzed from another model than {model}", again)
        assert not (tmp_path / command).exists()
    assert hashlib.sha256(result.read_bytes()).hexdigest() == before
    # The command the line names measures the model now there, after which compare draws it.
    command = shlex.split(err.strip().split("analyze it again with ")[1])
    assert analyze(*command[3:], capsys=capsys)[0] == 0
    assert hashlib.sha256(result.read_bytes()).hexdigest() != before
    assert analyze("compare", out, other, "--out", tmp_path / "compare", capsys=capsys)[0] == 0


def written_analysis(
    folder: Path,
    model: str,
    cosines: list[float],
    dtype: str = "fp32",
    n_params: int | None = 1000,
    layer_points: str = "all",
) -> Path:
    """An ``analyze hf:MODEL --out FOLDER`` result of the default revision, written as analyze writes it."""
    layers = [
        LayerCondensation(i, name, c, c, [])
        for i, (name, c) in enumerate(zip(["embedding", "block_1", "block_2", "final_norm"], cosines, strict=True))
    ]
    inputs = {"num_sequences": K, "seq_len": S, "protocol": "default", "layer_points": layer_points}
    inputs["tokens_sha256"] = "t"
    result = Condensation(
        0, K, S, layers, 1.0, 1.0, [], 128, [-1.0, 1.0], inputs, dtype, "cpu", model, model,
        {"model_type": "gpt2", "dim": 32, "mlp_hidden_dim": 128}, model, None, n_params,
    )  # fmt: skip
    (folder / "rev-default").mkdir(parents=True)
    (folder / "rev-default" / "condensation.json").write_text(json.dumps(result.to_json()))
    return folder


def test_compare_refuses_depth_trends_over_other_layer_points(tmp_path):
    """The same tokens, Spearman and Kendall over other layers (``--layer-points``): refused in one line (was: one
    model's two analyses side by side, spearman 0.2 and 0.3, as if the models differed)."""
    cosines = [0.1, 0.3, 0.2, 0.25]
    every = written_analysis(tmp_path / "all", "org/h4", cosines)
    hidden = written_analysis(tmp_path / "hidden", "org/h4", cosines, layer_points="hidden_states")
    with pytest.raises(AnalysisError, match=r"inputs than .*all \(layer_points 'all' vs 'hidden_states'\); re-anal"):
        compare([str(every), str(hidden)], str(tmp_path / "cmp"), "last")
    assert not (tmp_path / "cmp").exists()


def test_an_analysis_recording_no_layer_points_is_read_as_the_default_alike(tmp_path):
    """Analyses made before every input was recorded left out layer_points and protocol at their defaults (all,
    default): compare and family both read them so (was: compare took all, family a KeyError traceback)."""
    cosines = [0.1, 0.3, 0.2, 0.25]
    old = written_analysis(tmp_path / "old", "org/h4", cosines)
    path = old / "rev-default" / "condensation.json"
    data = json.loads(path.read_text())
    del data["inputs"]["layer_points"], data["inputs"]["protocol"]
    path.write_text(json.dumps(data))
    every = written_analysis(tmp_path / "every", "org/h2", [0.1, 0.2, 0.2, 0.2])
    hidden = written_analysis(tmp_path / "hidden", "org/h4", cosines, layer_points="hidden_states")
    compare([str(old), str(every)], str(tmp_path / "cmp"), "last")
    with pytest.raises(AnalysisError, match=r"\(layer_points 'all' vs 'hidden_states'\); re-analyze"):
        compare([str(old), str(hidden)], str(tmp_path / "cmp"), "last")
    write_size_series([str(old), str(every)], str(tmp_path / "fam"), [], [], 2, "default")
    with open(tmp_path / "fam" / "family.csv") as f:
        assert {row["model"]: row["layers"] for row in csv.DictReader(f)} == {"h4": "4", "h2": "4"}  # all 4 points
    with pytest.raises(AnalysisError, match=r"family: .*hidden was analyzed with other inputs .*layer_points 'all' v"):
        write_size_series([str(old), str(hidden)], str(tmp_path / "fam"), [], [], 2, "default")
    with pytest.raises(AnalysisError, match=r"^--protocol paper: .*old was not analysed with analyze --protocol paper"):
        write_size_series([str(old), str(every)], str(tmp_path / "fam"), [], [], 2, "paper")


def test_family_labels_models_of_one_name_by_their_folders_and_needs_their_sizes(tmp_path):
    """One model analysed into two folders (fp32 and bf16): two rows named by their folders (was ``h4`` twice, in
    the table and the legend, the rows told apart by nothing)."""
    fp32 = written_analysis(tmp_path / "cond" / "h4", "org/h4", [0.1, 0.2, 0.3, 0.3])
    bf16 = written_analysis(tmp_path / "cond" / "h4-bf16", "org/h4", [0.1, 0.2, 0.31, 0.3], "bf16")
    other = written_analysis(tmp_path / "cond" / "h2", "org/h2", [0.1, 0.1, 0.1, 0.1])
    write_size_series([str(fp32), str(bf16), str(other)], str(tmp_path / "fam"), [], [], 2, "default")
    with open(tmp_path / "fam" / "family.csv") as f:
        assert sorted(row["model"] for row in csv.DictReader(f)) == sorted(["h2", str(fp32), str(bf16)])

    # --family and --paired may spell a listed model's folder otherwise (was: "name each model once", as it was)
    write_size_series(
        [str(fp32), f"{other}/"], str(tmp_path / "fam"), [f"small={other}/."], [f"{fp32}/={other}"], 2, "default"
    )
    with open(tmp_path / "fam" / "family.csv") as f:
        assert {row["model"]: row["family"] for row in csv.DictReader(f)} == {"h4": "gpt2", "h2": "small"}

    # an analysis of an older version, without n_params: one line (was a traceback sorting None among ints)
    old = written_analysis(tmp_path / "cond" / "old", "org/old", [0.1, 0.1, 0.1, 0.1], n_params=None)
    with pytest.raises(AnalysisError, match=f"^family: {old}: its analysis records no parameter count; re-analyze"):
        write_size_series([str(fp32), str(old)], str(tmp_path / "fam"), [], [], 2, "default")


def test_family_refuses_a_model_paired_with_itself(tmp_path, capsys):
    """``--paired A=A``, however A is spelled: one line naming the pair, nothing written (was: a row of zeros,
    A − A, as if two models measured alike)."""
    a = written_analysis(tmp_path / "cond" / "a", "org/a", [0.1, 0.2, 0.3, 0.3])
    b = written_analysis(tmp_path / "cond" / "b", "org/b", [0.1, 0.1, 0.1, 0.1])
    code, _, err = analyze("family", a, b, "--paired", f"{a}/={a}", "--out", tmp_path / "fam", capsys=capsys)
    assert_one_line_error(code, err, f"--paired: '{a}/={a}' pairs {a} with itself; pair two models (A=B)")
    assert not (tmp_path / "fam").exists()


def test_family_table_trend_and_figure(tokenizer_files, texts, tmp_path, capsys, recwarn):
    specs = []
    for width in (16, 32, 64):
        folder = save_model(tmp_path / f"gpt2-{width}", config("gpt2", width=width), tokenizer_files)
        out = tmp_path / f"analysed-{width}"
        assert analyze(f"hf:{folder}", *options(texts), "--out", out, capsys=capsys)[0] == 0
        specs.append(str(out))
    run = tiny_run(tmp_path / "ours", steps=(0,))
    assert analyze(run, *options(texts), capsys=capsys)[0] == 0
    out = tmp_path / "family"
    code, stdout, err = analyze(
        "family", *specs, f"{run}@0", "--out", out, "--paired", f"{specs[2]}={specs[0]}", "--last-n", "2", capsys=capsys
    )
    assert code == 0, err
    with open(out / "family.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["family"], r["model"]) for r in rows] == [
        ("gpt2", "gpt2-16"),
        ("gpt2", "gpt2-32"),
        ("gpt2", "gpt2-64"),
        ("gpt2 run", "ours@0"),
    ]
    members = [load(Path(spec)) for spec in specs]
    last2 = [np.mean([layer.mean_cos for layer in r.layers[-2:]]) for r in members]
    assert [float(r["mean_cos_last_2"]) for r in rows[:3]] == pytest.approx(last2, rel=1e-5)
    assert [int(r["n_params"]) for r in rows[:3]] == [r.n_params for r in members]
    assert members[0].n_params < members[1].n_params < members[2].n_params
    want = stats.spearmanr([r.n_params for r in members], last2).statistic
    assert float(rows[0]["family_trend_spearman"]) == pytest.approx(want, abs=1e-6)
    assert rows[3]["family_trend_spearman"] == ""  # one model: no trend
    assert float(rows[0]["effective_rank_last_2"]) > 1
    text = (out / "family.md").read_text()
    assert "Paired (A − B)" in text and "gpt2-64" in text
    with open(out / "family_paired.csv") as f:
        (pair,) = list(csv.DictReader(f))
    assert float(pair["delta_mean_cos_last_2"]) == pytest.approx(last2[2] - last2[0], abs=2e-6)
    png = (out / "family.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 20000
    twin = shutil.copytree(run, tmp_path / "twin")  # models of one size: no trend, and no scipy warning saying so
    code, _, err = analyze("family", f"{run}@0", f"{twin}@0", "--out", out, capsys=capsys)  # rewritten, no --paired
    assert code == 0 and err == "" and "ConstantInputWarning" not in [w.category.__name__ for w in recwarn]
    with open(out / "family.csv") as f:  # the copy named by its own folder (was: by the one it was copied from)
        assert [(r["model"], r["family_trend_spearman"]) for r in csv.DictReader(f)] == [
            (f"{run.name}@0", ""),
            ("twin@0", ""),
        ]
    assert sorted(os.listdir(out)) == [".owner.json", "family.csv", "family.md", "family.png"]  # no stale pairs
    absent = tmp_path / "absent"
    assert_one_line_error(
        *analyze("family", *specs, str(absent), "--out", tmp_path / "family2", capsys=capsys)[::2],
        f"{absent}: no such folder",
    )
    inside = (
        f"a folder inside run {run} (its condensation analyses are in {run / 'condensation'}); give the run's folder"
    )
    family = "a family folder, which holds no condensation analyses; give the runs it was made from"
    for spec, said in (
        (run / "checkpoint", inside),
        (run / "run.json", "not a folder"),
        (out, family),
        (  # was `hf:gpt2: no such folder`
            "hf:gpt2",
            "a Hugging Face model, which holds no condensation analyses; make them with python -m "
            "dispersion_titan.analyze hf:gpt2 --out DIR, then give DIR",
        ),
    ):  # was: analyze it first
        assert_one_line_error(
            *analyze("family", *specs, str(spec), "--out", tmp_path / "family2", capsys=capsys)[::2], f"{spec}: {said}"
        )
    os.symlink(run, tmp_path / "link")  # one model named twice: was two identical rows, counted twice in the trend
    again = os.path.relpath(tmp_path / "link" / "condensation")
    assert_one_line_error(
        *analyze("family", *specs, f"{run}@0", again, "--out", tmp_path / "family2", capsys=capsys)[::2],
        f"family: {run}@0 and {again} are the same analysis (step 0 in {run / 'condensation'}); name each model once",
    )
    for argv, said in (
        ([*specs, "--last-n", "5"], "--last-n: 5 is not between 1 and 4, the fewest layers of these models"),
        ([f"{specs[0]}@main"], f"{specs[0]} has no analysis of revision main (have ['default'])"),
        ([f"{run}@"], f"{run}@: empty; name a step of {run} (have [0])"),  # was "no analysis of step  (have [0])"
    ):
        assert_one_line_error(*analyze("family", *argv, "--out", tmp_path / "family2", capsys=capsys)[::2], said)
    assert_one_line_error(
        *analyze("compare", run, "--step", "", "--out", tmp_path / "compare", capsys=capsys)[::2],
        f"--step: empty; name a step of {run} (have [0])",
    )
    assert not (tmp_path / "family2").exists()
    default = load_member(f"{specs[0]}@default", {})  # as its folder rev-default is named (was: no such revision)
    assert (default.result, default.label) == (members[0], "gpt2-16")


def test_default_seq_len_is_the_models_positions(tokenizer_files, texts, tmp_path, capsys):
    folder = save_model(tmp_path / "llama", config("llama"), tokenizer_files)  # 64 positions
    common = ["--texts", str(texts), "--num-sequences", str(K), "--out", str(tmp_path / "out")]
    assert_one_line_error(
        *analyze(f"hf:{folder}", *common, "--seq-len", "65", capsys=capsys)[::2],
        f"--seq-len: 65 exceeds the model's 64 positions (max_position_embeddings of {folder})",
    )
    assert not (tmp_path / "out" / "rev-default").exists()
    code, _, err = analyze(f"hf:{folder}", *common, capsys=capsys)
    assert code == 0 and "\ndispersion_titan: note: --seq-len 64 (the model's positions" in f"\n{err}", err
    assert load(tmp_path / "out").seq_len == 64


def test_unloadable_models_fail_with_one_line(tokenizer_files, texts, tmp_path, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at import
    out = tmp_path / "out"
    assert_one_line_error(
        *analyze("hf:nobody/no-such-model", *options(texts), "--out", out, capsys=capsys)[::2],
        "hf:nobody/no-such-model: cannot be loaded",
    )
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    assert_one_line_error(
        *analyze(f"hf:{unknown}", *options(texts), "--out", out, capsys=capsys)[::2],
        f"hf:{unknown}: cannot be loaded",
        "no-such-architecture",
    )
    (unknown / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": "abc"}))
    assert_one_line_error(
        *analyze(f"hf:{unknown}", *options(texts), "--out", out, capsys=capsys)[::2],
        f"hf:{unknown}: cannot be loaded (StrictDataclassFieldValidationError: ",
        "n_positions",
    )
    no_weights = save_model(tmp_path / "no_weights", config("gpt2"), tokenizer_files)
    (no_weights / "model.safetensors").write_bytes(b"\x10")  # cut short: safetensors' own error type
    assert_one_line_error(
        *analyze(f"hf:{no_weights}", *options(texts), "--out", out, capsys=capsys)[::2],
        f"hf:{no_weights}: cannot be loaded (SafetensorError: ",
    )
    (no_weights / "model.safetensors").unlink()
    no_vocabulary = save_model(tmp_path / "no_vocabulary", config("gpt2"), tokenizer_files)
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        (no_vocabulary / name).unlink(missing_ok=True)  # transformers builds an empty tokenizer: 0 tokens a text
    assert_one_line_error(
        *analyze(f"hf:{no_vocabulary}", *options(texts), "--out", out, capsys=capsys)[::2],
        f"hf:{no_vocabulary}: its tokenizer has no vocabulary",
    )
    assert_one_line_error(
        *analyze(f"hf:{no_weights}", *options(texts), "--out", out, capsys=capsys)[::2],
        f"hf:{no_weights}: cannot be loaded",
    )
    assert_one_line_error(
        *analyze(f"hf:{no_weights}@missing", *options(texts), "--out", out, capsys=capsys)[::2],
        f"hf:{no_weights}@missing: no such folder {no_weights / 'missing'}",
    )
    for folder in (str(tmp_path / "absent"), "./absent", "absent/a/b"):  # folders, not hub ids
        assert_one_line_error(
            *analyze(f"hf:{folder}", *options(texts), "--out", out, capsys=capsys)[::2],
            f"hf:{folder}: no such folder {folder}",
        )
    assert not list(out.glob("rev-*"))
    with pytest.raises(ModelLoadError, match=r"^hf:odd: unsupported architecture \(Sequential has no list of 2 "):
        decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)), 2, "hf:odd")


def test_models_it_cannot_measure_are_refused(tokenizer_files, texts, tmp_path, capsys):
    """Encoders, encoder-decoders and checkpoints missing backbone weights: one line naming
    the architecture and what is measured, nothing written; a checkpoint without an LM head
    (which never runs) is measured."""
    small = {
        "vocab_size": VOCAB,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 64,
    }
    bert = save_model(tmp_path / "bert", transformers.BertConfig(**small), tokenizer_files, auto=transformers.AutoModel)
    bart = save_model(
        tmp_path / "bart",
        transformers.BartConfig(
            vocab_size=VOCAB,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=64,
        ),
        tokenizer_files,
        auto=transformers.AutoModelForSeq2SeqLM,
    )
    partial = save_model(tmp_path / "partial", config("gpt2", width=16, layers=1), tokenizer_files)
    weights = safetensors.torch.load_file(partial / "model.safetensors")
    del weights["transformer.h.0.mlp.c_fc.weight"]
    safetensors.torch.save_file(weights, partial / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    supported = "analyze measures decoder-only causal language models"
    for folder, said in (
        (bert, "BertModel (bert) is an encoder-only model"),
        (bart, "BartForConditionalGeneration (bart) is an encoder-decoder model"),
        (
            partial,
            "its weights do not load completely into GPT2LMHeadModel (gpt2): 1 weight(s) "
            "missing from the checkpoint (e.g. transformer.h.0.mlp.c_fc.weight)",
        ),
    ):
        code, _, err = analyze(f"hf:{folder}", *options(texts), "--out", out, capsys=capsys)
        assert_one_line_error(code, err, f"hf:{folder}: {said}", supported)
        assert not [p for p in out.rglob("*") if p.is_file()]
    headless = save_model(
        tmp_path / "headless", config("llama", width=16, layers=1), tokenizer_files, auto=transformers.AutoModel
    )
    assert analyze(f"hf:{headless}", *options(texts), "--out", out, capsys=capsys)[0] == 0
    assert load(out).layers[-1].name == "final_norm"


# ---------------------------------------------------------------- geometry


def numpy_geometry(h: np.ndarray) -> tuple[float, float]:
    u = h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-3)
    sigma = np.linalg.svd(u, compute_uv=False)
    p = sigma[sigma > 1e-12] / sigma.sum()
    centred = np.linalg.svd(u - u.mean(axis=0), compute_uv=False) ** 2
    return float(np.exp(-(p * np.log(p)).sum())), float(centred[0] / centred.sum())


def geometry(h: np.ndarray) -> tuple[float, float]:
    u = unit_tokens(torch.tensor(h, dtype=torch.float32)[None])
    return effective_rank(u).item(), max_explainable_variance(u).item()


@pytest.mark.parametrize("shape", [(6, 4), (4, 9), (12, 12)])
def test_geometry_matches_numpy_svd(shape):
    h = np.random.default_rng(sum(shape)).normal(size=shape)
    assert geometry(h) == pytest.approx(numpy_geometry(h), rel=1e-5)


def test_geometry_of_rank_one_and_orthogonal_tokens():
    direction = np.array([1.0, -2.0, 0.5, 3.0])
    rank_one = np.outer([1.0, 2.0, -0.5, 4.0, 3.0], direction)  # every token on one line
    assert geometry(rank_one)[0] == pytest.approx(1.0, abs=1e-5)  # float32 unit vectors: not quite one line
    assert geometry(rank_one)[1] == pytest.approx(1.0)  # ± one direction: one principal axis
    orthogonal = np.diag([3.0, 0.5, 2.0, 7.0, 1.0])  # norms differ, directions orthogonal
    rank, mev = geometry(orthogonal)
    assert rank == pytest.approx(5.0, rel=1e-9)
    assert mev == pytest.approx(numpy_geometry(orthogonal)[1], rel=1e-6)
    assert mev == pytest.approx(1 / 4)  # centred simplex: 4 equal axes
    same = np.tile(direction, (3, 1))  # one direction, no variance at all
    assert geometry(same) == pytest.approx((1.0, 1.0))
    assert geometry(np.zeros((3, 4))) == (0.0, 1.0)  # no direction at all (a zeroed padding row): was NaN
    batch = unit_tokens(torch.tensor(np.stack([rank_one[:4], orthogonal[:4, :4]]), dtype=torch.float32))
    assert effective_rank(batch).tolist() == pytest.approx([1.0, 4.0], abs=1e-5)


def test_protocol_paper_inputs_special_tokens_and_hidden_states_points(tokenizer_files, texts, tmp_path, capsys):
    """``--protocol paper``: the authors' texts from a local wikitext-103-v1 copy, the tokenizer's default
    special tokens (here a BOS and an EOS its post-processor adds) truncated as theirs (the EOS kept), and
    Spearman/Kendall over transformers' n + 1
    hidden_states; ``family --protocol paper`` refuses a model analysed otherwise."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    folder = save_model(tmp_path / "llama", config("llama", layers=3), tokenizer_files)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = [("<|endoftext|>", 50256)]
    tokenizer.post_processor = TemplateProcessing(single="<|endoftext|> $A <|endoftext|>", special_tokens=eos)
    tokenizer.save(str(folder / "tokenizer.json"))
    corpus = write_wikitext_copy(tmp_path / "wikitext")
    out = tmp_path / "paper"
    code, _, err = analyze(
        f"hf:{folder}",
        "--protocol",
        "paper",
        "--dataset-path",
        corpus,
        "--num-sequences",
        "3",
        "--seq-len",
        "24",
        "--out",
        out,
        capsys=capsys,
    )
    assert code == 0, err
    result = load(out)
    assert result.inputs["protocol"] == "paper" and result.inputs["layer_points"] == "hidden_states"

    import pyarrow.parquet as pq

    rows = [r for f in sorted((corpus / "wikitext-103-v1").iterdir()) for r in pq.read_table(f)["text"].to_pylist()]
    encode = transformers.AutoTokenizer.from_pretrained(folder)
    theirs = [authors_long_text(rows, seed) for seed in range(3)]
    tokens = torch.tensor(encode(theirs, truncation=True, max_length=24)["input_ids"])  # compute_embedding_cossim.py
    assert (tokens[:, 0] == 50256).all() and (tokens[:, -1] == 50256).all()  # was: [BOS] + 23 ids, the EOS cut
    assert (
        result.tokens_sha256
        == hashlib.sha256(tokens.numpy().astype("<i8").tobytes() + repr(tuple(tokens.shape)).encode()).hexdigest()
    )
    curve = [mean for mean, _ in plain_mean_cos(independent_states(folder, "llama", tokens))]
    hidden_states = curve[:-2] + curve[-1:]  # embedding, blocks 1..n-1, final norm
    assert len(hidden_states) == 4 and [layer.mean_cos for layer in result.layers] == pytest.approx(curve, abs=1e-5)
    assert result.spearman == pytest.approx(stats.spearmanr(range(4), hidden_states).statistic, abs=1e-9)
    assert result.kendall == pytest.approx(stats.kendalltau(range(4), hidden_states).statistic, abs=1e-9)

    code, _, err = analyze("family", str(out), "--out", tmp_path / "family-paper", "--protocol", "paper", capsys=capsys)
    with open(tmp_path / "family-paper" / "family.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert code == 0 and int(row["layers"]) == 4  # the last-n of the family table: over the n + 1 points too
    assert float(row["mean_cos_last_3"]) == pytest.approx(np.mean(hidden_states[-3:]), abs=1e-5)
    other = tmp_path / "default"
    assert analyze(f"hf:{folder}", *options(texts), "--out", other, capsys=capsys)[0] == 0
    assert_one_line_error(
        *analyze("family", str(out), str(other), "--out", tmp_path / "family", "--protocol", "paper", capsys=capsys)[
            ::2
        ],
        "--protocol paper",
        "was not analysed with",
    )


def test_a_model_with_its_own_code_needs_trust_remote_code(tokenizer_files, texts, tmp_path, capsys):
    """A model that ships its modelling code (as the original Qwen does) is refused in one line naming
    --trust-remote-code, and measured with it; the option is refused for our runs."""
    folder = save_model(tmp_path / "remote", config("gpt2"), tokenizer_files)
    plain = save_model(tmp_path / "plain", config("gpt2"), tokenizer_files)  # the same weights (seed 0)
    (folder / "configuration_tiny.py").write_text(
        "from transformers import GPT2Config\n\n\nclass TinyConfig(GPT2Config):\n    model_type = 'tiny_remote'\n"
    )
    (folder / "modeling_tiny.py").write_text(
        "from transformers import GPT2LMHeadModel\n\nfrom .configuration_tiny import TinyConfig\n\n\n"
        "class TinyForCausalLM(GPT2LMHeadModel):\n    config_class = TinyConfig\n"
    )
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        model_type="tiny_remote",
        architectures=["TinyForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_tiny.TinyConfig",
            "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(
        *analyze(f"hf:{folder}", *options(texts), "--out", tmp_path / "no", capsys=capsys)[::2],
        f"hf:{folder}: ships its own modelling code",
        "--trust-remote-code",
    )
    code, _, err = analyze(
        f"hf:{folder}", *options(texts), "--trust-remote-code", "--out", tmp_path / "yes", capsys=capsys
    )
    assert code == 0, err
    result = load(tmp_path / "yes")
    encode = transformers.AutoTokenizer.from_pretrained(plain)
    tokens = select_sequences(
        InputOptions(None, None, str(texts), K, S, 0),
        lambda t: encode(t, add_special_tokens=False, verbose=False)["input_ids"],
    ).tokens
    want = plain_mean_cos(independent_states(plain, "gpt2", tokens))
    assert result.model_args["model_type"] == "tiny_remote"
    assert np.allclose([(layer.mean_cos, layer.mean_cos_offdiag) for layer in result.layers], want, rtol=0, atol=1e-5)
    run = tiny_run(tmp_path / "run")
    assert_one_line_error(
        *analyze(run, *options(texts), "--trust-remote-code", capsys=capsys)[::2],
        "--trust-remote-code: only for hf: models",
    )


def test_protocol_paper_builds_other_corpora_from_rows_as_the_authors(tmp_path):
    """The robustness corpora (pubmed_qa's long_answer, imdb, squad rows as a --texts jsonl) under
    --protocol paper: text r is the rows from default_rng(r).integers(0, ⌊0.95·rows⌋) on, concatenated
    with no separator until it has >= 1024 words; hand-countable rows of 300 words take 4 rows each."""
    rows = [" ".join(f"r{i}w{j}" for j in range(300)) + " " for i in range(40)]
    texts = tmp_path / "rows.jsonl"
    texts.write_text("".join(json.dumps({"text": row}) + "\n" for row in rows))
    starts = [int(np.random.default_rng(seed).integers(0, 38)) for seed in range(3)]
    assert paper_texts(rows, 3) == ["".join(rows[i : i + 4]) for i in starts]
    assert paper_texts(rows, 3) == [authors_long_text(rows, seed) for seed in range(3)]
    words = lambda batch: [[len(t.split())] * 30 for t in batch]  # noqa: E731  (a stand-in tokenizer: counts)
    chosen = select_sequences(InputOptions(None, None, str(texts), 3, 24, 0, protocol="paper"), words)
    assert chosen.tokens.tolist() == [[1200] * 24] * 3  # 4 rows of 300 words each, the first 24 "tokens"
    assert chosen.record()["protocol"] == "paper" and chosen.record()["texts"] == str(texts)
    short = tmp_path / "short.jsonl"
    short.write_text((json.dumps({"text": "too few words"}) + "\n") * 3)
    with pytest.raises(AnalysisError, match="the corpus ends before text 0 has 1024 words"):
        select_sequences(InputOptions(None, None, str(short), 1, 24, 0, protocol="paper"), words)
