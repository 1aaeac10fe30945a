"""TorchTitan's own decoders, Qwen3 and Llama 3, as dispersion_titan families (``qwen3_dispersion``,
``llama3_dispersion``).

In one process: the ``[model]`` keys each family takes or refuses, the baselines on
their token embeddings, and llama3's Hugging Face export and analysis against
``transformers``. For real, one qwen3 run through ``python -m dispersion_titan.train``
(served to every test below): mid-trained from a tiny random ``transformers`` Qwen3
saved locally with its GPT-2-BPE tokenizer (``initial_load_in_hf`` through the model's
state-dict adapter; the tokenizer is the folder's own), with the dispersion loss, live
condensation, gradient accumulation, ``save_initial`` and ``last_save_in_hf``. Its
weights match ``transformers``' logits, export back, analyse like ``transformers`` on
the exports, and resume exactly; its run.json records the weights it started from, so Table 2
(``paper table2``) treats it as mid-training. One short llama3 run trains through the same entry point.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
from importlib import import_module
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from torchtitan.models.qwen3 import Qwen3Model, qwen3_args
from torchtitan.models.qwen3.model.state_dict_adapter import Qwen3StateDictAdapter
from torchtitan.protocols.train_spec import get_train_spec

from dispersion_titan.analysis.condensation_schema import Condensation
from dispersion_titan.analysis.inputs import InputOptions, select_sequences
from dispersion_titan.analysis.size_series import load_member
from dispersion_titan.config.schema import Baseline
from dispersion_titan.data.packed import build_packed_dataloader
from dispersion_titan.job_config.checks import launch_notes
from dispersion_titan.job_config.hf_weights import _advice
from dispersion_titan.job_config.parse import check_launch, validated_args
from dispersion_titan.models import register_all
from dispersion_titan.models.llama3_dispersion import Llama3Args, hf_config, llama3_flavors
from dispersion_titan.models.qwen3_dispersion import Qwen3Args, qwen3_flavors
from dispersion_titan.paper import main as paper_main
from dispersion_titan.run_folder.checkpoints import load_model, load_model_args, run_encoder
from dispersion_titan.run_folder.hf_export import save_tokenizer, to_hf
from dispersion_titan.tokenizer.encoders import LOADED
from dispersion_titan.trainer.baselines import build_baseline
from dispersion_titan.trainer.objective import BlockOutputs
from dispersion_titan.utils.errors import ConfigError
from support.cli import analyze, run_cli
from support.condensation import independent_states, plain_mean_cos
from support.corpora import texts_jsonl
from support.eval_tasks import evaluated_arms
from support.launch import DEBUG_TOML, QWEN3_TOML, job_args, python_module
from support.runs import hub_cache, scalars, tiny_run

BASE = job_args(QWEN3_TOML)
VOCAB = 50257  # GPT-2's BPE: the tokenizer of every tiny model here
K, S = 4, 32
TOKENS = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(TOKENS)
    return out.logits if hasattr(out, "logits") else out


def hf_logits(folder: Path | str) -> torch.Tensor:
    return logits_of(transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval())


def our_logits(step_dir: Path) -> torch.Tensor:
    return logits_of(load_model(str(step_dir), load_model_args(str(step_dir.parent))))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def load_result(run: Path, step: int) -> Condensation:
    path = run / "condensation" / f"step-{step}" / "condensation.json"
    return Condensation.from_json(json.loads(path.read_text()), str(path))


def assert_analysis_matches_transformers(result: Condensation, export: Path, family: str, texts: Path) -> None:
    """The run's analysis of one checkpoint against ``transformers`` on its export: the same
    token windows (the export's own tokenizer), layers mapped as ``analysis.hf_model`` maps them."""
    encode = transformers.AutoTokenizer.from_pretrained(str(export))
    sequences = select_sequences(
        InputOptions(None, None, str(texts), K, S, 0),
        lambda t: encode(t, add_special_tokens=False, verbose=False)["input_ids"],
    )
    assert result.tokens_sha256 == sequences.sha256
    n_blocks = len(result.layers) - 2
    assert [layer.name for layer in result.layers] == [
        "embedding",
        *(f"block_{i}" for i in range(1, n_blocks + 1)),
        "final_norm",
    ]
    want = plain_mean_cos(independent_states(export, family, sequences.tokens))
    got = [(layer.mean_cos, layer.mean_cos_offdiag) for layer in result.layers]
    assert np.allclose(got, want, rtol=0, atol=1e-5), (got, want)


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    return texts_jsonl(tmp_path_factory.mktemp("texts") / "texts.jsonl", documents=3, words=200)


# ---------------------------------------------------------------- in one process


# The [model] keys each family refuses: test_config_errors.py's table.


def test_family_keys_reach_torchtitans_arguments(caplog):
    job = validated_args(
        [
            *BASE,
            "--model.mlp_hidden_dim",
            "512",
            "--model.tie_embeddings",
            "False",
            "--model.head_dim",
            "32",
            "--validation.seq_len",
            "256",
        ]
    )
    args = qwen3_flavors["debugmodel"]
    args.update_from_config(job)
    assert (args.hidden_dim, args.enable_weight_tying, args.tie_embeddings, args.head_dim) == (512, False, False, 32)
    assert args.max_seq_len == 256  # the RoPE table covers validation's longer sequences
    assert qwen3_args["debugmodel"].hidden_dim == 3072 and qwen3_args["debugmodel"].enable_weight_tying  # untouched
    llama = validated_args([*BASE, "--model.name", "llama3_dispersion", "--model.n_kv_heads", "4"])
    args = llama3_flavors["debugmodel"]
    args.update_from_config(llama)
    assert (args.n_kv_heads, args.hidden_dim, args.tie_embeddings) == (4, 768, False)
    with caplog.at_level(logging.WARNING):  # sequences beyond the flavor's 4096 positions
        args = qwen3_flavors["debugmodel"]
        args.update_from_config(validated_args([*BASE, "--training.seq_len", "8192"]))
    assert args.max_seq_len == 8192
    assert "exceeds original maximum" not in caplog.text  # TorchTitan's, of the flavor's table (was: once a parse)


def test_a_hub_id_is_fetched_at_launch_and_the_job_goes_on_with_its_snapshot(monkeypatch, tmp_path):
    """The checks accept a hub id without fetching it (shipped configs, ``--check-only``
    on a login node); the launch fetches it once and names the local snapshot."""
    import huggingface_hub

    from dispersion_titan.job_config.parse import check, fetch_local_assets
    from dispersion_titan.tokenizer import encoders

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    save_tokenizer(str(snapshot), 64)
    fetched: list[str] = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **_: fetched.append(repo) or str(snapshot))
    args = [*BASE, "--model.hf_assets_path", "Qwen/Qwen3-0.6B"]
    job = validated_args(args)
    assert not fetched
    assert fetch_local_assets(job, None)
    assert fetched == ["Qwen/Qwen3-0.6B"] and job.model.hf_assets_path == str(snapshot)
    assert check(job).model.hf_assets_path == str(snapshot)
    assert not fetch_local_assets(job, None) and fetched == ["Qwen/Qwen3-0.6B"]  # a local folder is used as it is

    def offline(repo: str, **_) -> str:
        raise OSError("no connection\nmore")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with monkeypatch.context() as reachable:  # the hub answers, the download fails: its first line
        reachable.setattr(encoders, "hub_offline", lambda: contextlib.nullcontext(None))
        with pytest.raises(
            ConfigError,
            match=r"^model\.hf_assets_path: Qwen/Qwen3-0\.6B: cannot be fetched from the "
            r"Hugging Face hub \(no connection\)$",
        ):
            fetch_local_assets(validated_args(args), None)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # no hub: the cache at once, no retries
    with pytest.raises(
        ConfigError,
        match=r"^model\.hf_assets_path: Qwen/Qwen3-0\.6B: not in the local Hugging Face cache, and the hub is not "
        r"asked: 127\.0\.0\.1:9 is unreachable from here",
    ):
        fetch_local_assets(validated_args(args), None)


QWEN3 = Qwen3Args(
    dim=32,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    head_dim=16,
    hidden_dim=64,
    vocab_size=VOCAB,
    max_seq_len=64,
    enable_weight_tying=True,
)
LLAMA3 = Llama3Args(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=VOCAB, max_seq_len=64)


@pytest.mark.parametrize("args", [QWEN3, LLAMA3], ids=["qwen3", "llama3"])
def test_baselines_act_on_the_token_embeddings(args, tmp_path):
    """Noise in training forwards only; a reset re-draws the token embeddings (and so
    Qwen3's tied LM head, the same parameter)."""
    model = load_model(str(tiny_run(tmp_path, args=args) / "checkpoint" / "step-0"), args)
    clean = logits_of(model)
    noise = build_baseline(Baseline(method="noisy_embedding"), model, [], seed=0, tied=args.tie_embeddings)
    noise.begin_step(1)
    assert torch.equal(logits_of(model), clean)  # eval: none
    assert not torch.allclose(logits_of(model.train()), clean)
    before = model.tok_embeddings.weight.detach().clone()
    forgetting = build_baseline(
        Baseline(method="active_forgetting", forget_every=1), model, [], seed=0, tied=args.tie_embeddings
    )
    forgetting.begin_step(2)
    after = model.tok_embeddings.weight
    assert not torch.allclose(after, before) and after.std().item() == pytest.approx(0.02, rel=0.05)
    assert (model.output.weight is after) == args.tie_embeddings


def test_llama3_exports_and_analyses_like_transformers(tmp_path, texts, capsys, caplog):
    """The export's positions are Meta's Llama 3.1 convention, the original context times the factor: at the
    original context, transformers warned twice on every convert (``original_max_position_embeddings field must
    be less than max_position_embeddings``)."""
    run = tiny_run(tmp_path / "run", steps=(0,), args=LLAMA3)
    export = tmp_path / "hf"
    to_hf(str(run / "checkpoint" / "step-0"), str(export))
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert json.loads((export / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert max_diff(hf_logits(export), our_logits(run / "checkpoint" / "step-0")) <= 1e-4
    code, _, err = analyze(
        str(run), "--texts", str(texts), "--num-sequences", str(K), "--seq-len", str(S), capsys=capsys
    )
    assert code == 0, err
    assert_analysis_matches_transformers(load_result(run, 0), export, "llama", texts)
    assert load_member(str(run), {}).family == "llama3_dispersion run"


def test_torchtitans_own_qwen3_and_llama3_stay_torchtitans_after_register_all():
    """Ours are registered under names of our own: TorchTitan's ``qwen3`` / ``llama3`` keep its
    own data loader and tokenizer (a registered spec would take precedence over them)."""
    register_all()
    for titan_name, ours in (("qwen3", "qwen3_dispersion"), ("llama3", "llama3_dispersion")):
        titans = import_module(f"torchtitan.models.{titan_name}").get_train_spec()
        spec = get_train_spec(titan_name)
        assert (spec.build_dataloader_fn, spec.build_tokenizer_fn) == (
            titans.build_dataloader_fn,
            titans.build_tokenizer_fn,
        ), titan_name
        assert spec.build_dataloader_fn is not build_packed_dataloader, titan_name
        assert get_train_spec(ours).build_dataloader_fn is build_packed_dataloader, ours
        assert get_train_spec(ours).model_cls is titans.model_cls, ours


# ---------------------------------------------------------------- one qwen3 run, for real

TRAIN = (
    "--model.dim",
    "64",
    "--model.n_layers",
    "2",
    "--model.n_heads",
    "4",
    "--model.n_kv_heads",
    "2",
    "--model.head_dim",
    "16",
    "--model.mlp_hidden_dim",
    "128",
    "--model.vocab_size",
    str(VOCAB),
    "--training.seq_len",
    "64",
    "--validation.seq_len",
    "64",
    "--training.global_batch_size",
    "4",
    "--training.max_local_batch_size",
    "2",
    "--training.steps",
    "3",
    "--checkpoint.interval",
    "2",
    "--checkpoint.initial_load_in_hf",
    "--checkpoint.last_save_in_hf",
    "--validation.freq",
    "3",
    "--validation.steps",
    "1",
    "--dispersion.coeff",
    "0.5",
)

FULL_LAST = ("--checkpoint.no-last_save_in_hf", "--checkpoint.no-last_save_model_only")
"""A full last step, which a relaunch to more steps resumes from (a weights-only one it refuses to train over)."""


def hf_qwen3(folder: Path) -> Path:
    """A random ``transformers`` Qwen3 of the run's shape (TorchTitan's debugmodel RoPE θ and
    ε), with GPT-2's BPE as its own tokenizer files."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,  # more than the run's 64: its exports keep the model's own
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=True,
    )
    transformers.Qwen3ForCausalLM(config).save_pretrained(str(folder))
    save_tokenizer(str(folder), 64)
    return folder


def train(dump: Path, hf: Path) -> str:
    proc = python_module(
        "dispersion_titan.train", *BASE, "--job.dump_folder", str(dump), "--model.hf_assets_path", str(hf), *TRAIN
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def qwen3_run(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3")
    hf = hf_qwen3(root / "hf")
    run = root / "run"
    train(run, hf)
    exports = {}
    for step in (0, 2, 3):
        exports[step] = root / f"export-{step}"
        to_hf(str(run / "checkpoint" / f"step-{step}"), str(exports[step]))
    return {"hf": hf, "run": run, **{f"export-{step}": path for step, path in exports.items()}}


def test_a_hugging_face_folder_that_does_not_fit_the_model_is_refused_at_launch(tmp_path):
    """A folder whose weights the ``[model]`` keys do not build: one line naming the folder's option, the
    first tensor that differs and the keys its config.json gives, before any process starts (were a
    100-line traceback from every rank at the load, exit 1; an untied ``lm_head.weight`` under a tied
    head was dropped, and its config.json's RoPE, norms' ε or sliding window not read: the run trained another
    model than the folder's, exit 0). gpt2 given another family's folder the same (was an 87-line traceback)."""
    hf = hf_qwen3(tmp_path / "hf")

    def refusal(folder: Path, *args: str) -> str:
        dump = ("--job.dump_folder", str(tmp_path / "run"))
        config = validated_args([*BASE, *TRAIN, *dump, "--model.hf_assets_path", str(folder), *args])
        with pytest.raises(ConfigError) as err:
            check_launch(config, take_lock=False)
        assert not (tmp_path / "run").exists()
        return str(err.value)

    fits = check_launch(validated_args([*BASE, *TRAIN, "--model.hf_assets_path", str(hf)]), take_lock=False)
    assert launch_notes(fits, {}) == []
    longer = validated_args([*BASE, *TRAIN, "--model.hf_assets_path", str(hf), "--training.seq_len", "256"])
    assert launch_notes(check_launch(longer, take_lock=False), {}) == [  # RoPE past its 128 positions: said, trained
        f"training.seq_len 256 is beyond the 128 positions of {hf} (its config.json's max_position_embeddings): RoPE "
        "extrapolates past them, as a context extension does; lower it to 128 unless that is meant"
    ]
    head = f"model.hf_assets_path: {hf} does not hold this qwen3_dispersion model's weights: "
    assert refusal(hf, "--model.dim", "32") == head + (
        "model.embed_tokens.weight is [50257, 64] there, [50257, 32] here (and 19 more); "
        "set [model] as its config.json says: dim = 64 (here 32)"
    )
    assert refusal(hf, "--model.n_layers", "3").endswith("(and 10 more); set [model] as its config.json says: "
                                                         "n_layers = 2 (here 3)")  # fmt: skip
    untied = tmp_path / "untied"  # its own LM head, which a tied model would not read
    shutil.copytree(hf, untied)
    weights = load_file(str(hf / "model.safetensors"))
    save_file({**weights, "lm_head.weight": torch.randn(VOCAB, 64)}, str(untied / "model.safetensors"))
    config = json.loads((hf / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    assert refusal(untied) == (
        f"model.hf_assets_path: {untied} does not hold this qwen3_dispersion model's weights: lm_head.weight "
        "there is read by no part of this model; set [model] as its config.json says: tie_embeddings = false "
        "(here true)"
    )
    spare = tmp_path / "spare"  # a tied model's head saved as well, as some published tied checkpoints carry it,
    shutil.copytree(hf, spare)  # and an older export's rotary buffer: transformers loads them into nothing, as we do
    inv_freq = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}
    head = {"lm_head.weight": weights["model.embed_tokens.weight"].clone()}
    save_file({**weights, **head, **inv_freq}, str(spare / "model.safetensors"))
    check_launch(validated_args([*BASE, *TRAIN, "--model.hf_assets_path", str(spare)]), take_lock=False)
    llama = refusal(hf, "--model.name", "llama3_dispersion", "--model.head_dim", "0", "--model.mlp_hidden_dim", "0")
    assert llama.endswith("its config.json is a qwen3 model: use --model.name qwen3_dispersion"), llama
    gpt2 = [*job_args(DEBUG_TOML), "--job.dump_folder", str(tmp_path / "g"), "--model.hf_assets_path", str(hf)]
    gpt2 = validated_args([*gpt2, "--checkpoint.initial_load_in_hf"])
    with pytest.raises(ConfigError) as err:
        check_launch(gpt2, take_lock=False)
    assert str(err.value) == (
        f"model.hf_assets_path: {hf} does not hold this gpt2 model's weights: transformer.wte.weight is not there "
        "(and 75 more); its config.json is a qwen3 model: use --model.name qwen3_dispersion"
    )
    other = tmp_path / "other"  # the same tensors, computed otherwise: its RoPE and a sliding window
    shutil.copytree(hf, other)
    rope = {"rope_type": "default", "rope_theta": 1e4}
    (other / "config.json").write_text(json.dumps({**config, "rope_parameters": rope, "use_sliding_window": True}))
    assert refusal(other) == (
        f"model.hf_assets_path: {other}: its config.json computes another model than this qwen3_dispersion (flavor "
        "debugmodel): rope_theta = 10000.0 (this model: 1000000.0) (and 1 more), which no [model] key sets; give "
        "model.flavor the one of its model"
    )
    (other / "config.json").write_text(json.dumps({**config, "rope_parameters": "x", "max_position_embeddings": "x"}))
    assert refusal(other) == (  # values no JSON type of theirs: were AttributeError and ValueError tracebacks
        f"model.hf_assets_path: {other}: its config.json computes another model than this qwen3_dispersion (flavor "
        'debugmodel): rope_type = "x" (this model: "default"), which no [model] key sets; give model.flavor the one '
        "of its model"
    )
    broken = tmp_path / "broken"  # its config.json cut short: named (was the JSON parser's bare message)
    shutil.copytree(hf, broken)
    (broken / "config.json").write_text('{"model_type": "qwen3",')
    with pytest.raises(ConfigError) as err:
        check_launch(validated_args([*BASE, *TRAIN, "--model.hf_assets_path", str(broken)]), take_lock=False)
    assert str(err.value).startswith(f"model.hf_assets_path: {broken / 'config.json'}: unreadable (Expecting")
    assert str(err.value).endswith("); copy the model's config.json again")
    sharded = tmp_path / "sharded"  # a copy cut short: the index names a shard that is not there
    shutil.copytree(hf, sharded)
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    index = {"weight_map": {**dict.fromkeys(weights, "model-00001-of-00002.safetensors"),
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert refusal(sharded) == (
        f"model.hf_assets_path: {sharded}: model.safetensors.index.json names model-00002-of-00002.safetensors, "
        "which is not there (a copy or download cut short?); copy the model's missing files in"
    )
    (sharded / "model.safetensors.index.json").write_text("[]")  # JSON, not an index (was `TypeError: list indices…`)
    assert refusal(sharded) == (
        f"model.hf_assets_path: {sharded / 'model.safetensors.index.json'}: holds no weight_map of tensors to files; "
        "copy the model's file again"
    )
    stale = tmp_path / "stale"  # an older download's shard left beside the model's: the load read either, silently
    shutil.copytree(hf, stale)
    save_file({k: torch.ones_like(v) for k, v in weights.items()}, str(stale / "model-old.safetensors"))
    assert refusal(stale) == (
        f"model.hf_assets_path: {stale}: model.embed_tokens.weight (and 23 more) is in model-old.safetensors and "
        "model.safetensors, and the load would read either; remove the file that is not the model's (an older "
        "download's shard?)"
    )
    cut = tmp_path / "cut"  # cut short inside its header: the file named (was its folder)
    shutil.copytree(hf, cut)
    (cut / "model.safetensors").write_bytes((hf / "model.safetensors").read_bytes()[:100])
    assert refusal(cut) == (
        f"model.hf_assets_path: {cut / 'model.safetensors'}: unreadable safetensors (Error while deserializing "
        "header: invalid header length); copy the model's file again"
    )


@pytest.mark.slow
def test_the_advice_on_a_folder_of_grouped_heads_names_n_kv_heads():
    """llama3 with one key/value head per head (``n_kv_heads`` unset) against a folder of grouped ones: the
    advice names ``n_kv_heads``, read as the export writes it (was left out: the keys advised built another
    model than the folder's)."""
    ungrouped = Llama3Args(dim=32, n_layers=2, n_heads=2, vocab_size=VOCAB, max_seq_len=64)
    folder = hf_config(LLAMA3, SimpleNamespace(eos_id=0)).to_dict()
    config = SimpleNamespace(model=SimpleNamespace(name="llama3_dispersion"))
    assert _advice(config, ungrouped, folder) == "set [model] as its config.json says: n_kv_heads = 1 (here 2)"


def test_qwen3_dispersion_points_are_transformers_hidden_states():
    """``dispersion.points = "hidden_states"`` on Qwen3 (the paper configs'): the authors' midtrain_qwen3.py
    disperses transformers' ``hidden_states[1:]``, blocks 1 … n−1 and the final norm's output."""
    a = qwen3_args["debugmodel"]
    config = transformers.Qwen3Config(
        vocab_size=a.vocab_size,
        hidden_size=a.dim,
        intermediate_size=a.hidden_dim,
        num_hidden_layers=a.n_layers,
        num_attention_heads=a.n_heads,
        num_key_value_heads=a.n_kv_heads,
        head_dim=a.head_dim,
        rope_theta=a.rope_theta,
        rms_norm_eps=a.norm_eps,
        tie_word_embeddings=a.enable_weight_tying,
    )
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(config).eval()
    ours = Qwen3Model(a)
    ours.load_state_dict(Qwen3StateDictAdapter(a, None).from_hf(hf.state_dict()))
    hooks = BlockOutputs(ours.train(), "hidden_states")  # the hooks capture training forwards (no dropout)
    tokens = torch.randint(0, a.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    ours(tokens)
    with torch.no_grad():
        hidden_states = hf(tokens, output_hidden_states=True).hidden_states
    points = hooks.take()
    assert len(points) == len(hidden_states) - 1 == a.n_layers
    assert all(max_diff(p, h) <= 1e-5 for p, h in zip(points, hidden_states[1:], strict=True))
    blocks = BlockOutputs(ours, "blocks")
    ours(tokens)
    assert max_diff(blocks.take()[-1], hidden_states[-1]) > 1e-2  # the last block's raw output, before the norm


def test_qwen3_mid_trains_from_hf_weights_and_exports_back(qwen3_run):
    run, hf = qwen3_run["run"], qwen3_run["hf"]
    metadata = json.loads((run / "run.json").read_text())
    assert (metadata["model_name"], metadata["tokenizer"]) == ("qwen3_dispersion", str(hf))  # its own tokenizer
    initial = hf_logits(hf)
    assert max_diff(our_logits(run / "checkpoint" / "step-0"), initial) <= 1e-4  # initial_load_in_hf
    trained = our_logits(run / "checkpoint" / "step-2")
    assert max_diff(trained, initial) > 1e-3
    assert max_diff(hf_logits(qwen3_run["export-2"]), trained) <= 1e-4  # convert to-hf of a DCP checkpoint
    # lm-eval's context (HFLM's max_length) is the started-from model's, as the authors' callback read it
    positions = [
        json.loads((p / "config.json").read_text())["max_position_embeddings"] for p in (hf, qwen3_run["export-2"])
    ]
    assert positions == [128, 128], positions
    last = run / "checkpoint" / "step-3"  # last_save_in_hf: safetensors under HF names, tied head left out
    assert not (last / ".metadata").exists() and "lm_head.weight" not in load_file(
        str(last / next(p.name for p in last.glob("*.safetensors")))
    )
    final = hf_logits(qwen3_run["export-3"])
    assert torch.isfinite(final).all() and max_diff(final, trained) > 1e-4
    live = scalars(run)
    for tag in (
        "condensation/block_1_mean_cos_offdiag",
        "condensation/block_2_mean_cos_offdiag",
        "loss_metrics/dispersion",
    ):
        assert sorted(live[tag]) == [1, 2, 3], tag
    assert all(v != 0.0 and math.isfinite(v) for v in live["loss_metrics/dispersion"].values())
    assert sorted(live["validation_metrics/loss"]) == [1, 3]  # TorchTitan validates at step 1 too


@pytest.mark.slow
def test_qwen3_run_analyses_like_transformers_on_its_exports(qwen3_run, texts, capsys):
    run = qwen3_run["run"]
    code, _, err = analyze(
        str(run), "--steps", "0,2", "--texts", str(texts), "--num-sequences", str(K), "--seq-len", str(S), capsys=capsys
    )
    assert code == 0, err
    for step in (0, 2):
        assert_analysis_matches_transformers(load_result(run, step), qwen3_run[f"export-{step}"], "qwen3", texts)


@pytest.mark.slow
def test_qwen3_mid_training_gets_per_seed_steps_and_a_pretrained_row(qwen3_run, tmp_path, capsys):
    """Started from the HF folder's safetensors (model.hf_assets_path, no initial_load_path), the run
    records it; ``paper table2`` over evaluated copies of it (support.eval_tasks.PEAKS) then takes
    each seed's best step, as the authors' mid-training plot_results.py, under a Pretrained row."""
    run = qwen3_run["run"]
    record = json.loads((run / "run.json").read_text())["started_from"]
    assert record == {"pretrained": True, "source": "hf", "path": str(qwen3_run["hf"])}
    code, _, err = run_cli(
        paper_main,
        "table2",
        "--models",
        *evaluated_arms(run, tmp_path / "runs"),
        "--draw-only",
        "--out",
        tmp_path / "t2",
        capsys=capsys,
    )
    assert code == 0, err
    table = json.loads((tmp_path / "t2" / "table2.json").read_text())
    assert table["pretrained"]["steps"] == [0, 0] and table["pretrained"]["average_mean"] == pytest.approx(0.2)
    assert {arm["arm"]: arm["steps"] for arm in table["arms"]} == {"base": [1, 3], "disp": [1, 3]}
    assert {arm["arm"]: arm["difference"]["average"] for arm in table["arms"]} == pytest.approx(
        {"base": (0.6 + 0.65) / 2 - 0.2, "disp": (0.7 + 0.75) / 2 - 0.2}
    )


@pytest.mark.slow
def test_qwen3_run_resumes_exactly(qwen3_run, tmp_path):
    """Stopped after step 2 (its full checkpoint), the run continues to the same step 3."""
    resumed = tmp_path / "resumed"
    shutil.copytree(qwen3_run["run"], resumed, ignore=shutil.ignore_patterns("step-3", "tb", "condensation"))
    assert "Training starts at step 3" in train(resumed, qwen3_run["hf"])
    want, got = scalars(qwen3_run["run"]), scalars(resumed)
    for tag in ("loss_metrics/global_avg_loss", "loss_metrics/dispersion", "grad_norm"):
        assert got[tag][3] == want[tag][3], tag


@pytest.mark.slow
def test_a_relaunch_from_another_folder_where_a_relative_tokenizer_folder_names_another_is_refused(
    tmp_path, monkeypatch
):
    """``--model.hf_assets_path tok`` (relative: the model's tokenizer and weights) launched from A, relaunched
    by the same command from B, which holds a ``tok`` of its own: one line naming both folders and where to
    relaunch from, exit 2 (was: the same string, so the run went on with B's tokenizer, silently). From a copy of
    A, whose ``tok`` holds the same files, it relaunches; from A with ``tok`` replaced in place (other tokenizer
    files), it is refused (was: the rest of the data tokenized by the new one, silently); with ``tok`` moved away,
    the line says to put it back."""
    hf = hf_qwen3(tmp_path / "hf")
    for folder in ("A", "B"):
        shutil.copytree(hf, tmp_path / folder / "tok")
    save_tokenizer(str(tmp_path / "B" / "tok"), 32)  # B's another: its tokenizer files differ from A's
    dump = tmp_path / "run"
    args = (*BASE, "--job.dump_folder", str(dump), "--model.hf_assets_path", "tok", *TRAIN, "--validation.no-enable",
            *FULL_LAST)  # fmt: skip
    first = python_module("dispersion_titan.train", *args, "--training.steps", "1", cwd=tmp_path / "A")
    assert first.returncode == 0, first.stderr[-3000:]
    again = python_module("dispersion_titan.train", *args, "--training.steps", "2", "--check-only", cwd=tmp_path / "B")
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"dispersion_titan: error: run folder {dump} was first launched from {tmp_path / 'A'}, where "
        f"model.hf_assets_path 'tok' names {tmp_path / 'A' / 'tok'}, not {tmp_path / 'B' / 'tok'} as from here; "
        f"relaunch from {tmp_path / 'A'}"
    ], again.stderr[-3000:]
    shutil.copytree(tmp_path / "A", tmp_path / "copy_of_A")  # the same files in another folder: the same run
    copied = python_module("dispersion_titan.train", *args, "--training.steps", "2", "--check-only",
                           cwd=tmp_path / "copy_of_A")  # fmt: skip
    assert copied.returncode == 0, copied.stderr[-3000:]
    monkeypatch.chdir(tmp_path / "A")
    config = json.loads(Path("tok/tokenizer_config.json").read_text())  # a chat template edited upstream: goes on
    Path("tok/tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    check_launch(validated_args([*args, "--training.steps", "2"]), take_lock=False)
    vocabulary = json.loads(Path("tok/tokenizer.json").read_text())  # replaced in place: the same path, other
    vocabulary["model"]["merges"].pop()  # merges, which tokenize the rest of the data otherwise
    Path("tok/tokenizer.json").write_text(json.dumps(vocabulary))
    LOADED.clear()  # the next launch: a new process, which reads the folder again
    with pytest.raises(ConfigError) as err:
        check_launch(validated_args([*args, "--training.steps", "2"]), take_lock=False)
    assert str(err.value) == (
        f"model.hf_assets_path: tok: its tokenizer.json (or its eos_token) is not the one run folder {dump} was "
        "started with (the folder replaced since?); put the run's tokenizer files back, or start a new run "
        "(another --job.dump_folder) with this one"
    )
    Path("tok").rename("moved")  # gone: put it back (was "no such folder; give the model's folder", whose
    gone = python_module("dispersion_titan.train", *args, "--training.steps", "2", "--check-only", cwd=tmp_path / "A")
    assert gone.returncode == 2 and gone.stderr.strip().splitlines() == [  # relaunch was refused as other settings)
        f"dispersion_titan: error: model.hf_assets_path: tok: no such folder, and run folder {dump} takes its "
        "tokenizer from it; put it back there (a symbolic link to where it is now will do)"
    ], gone.stderr[-3000:]


@pytest.mark.slow
def test_a_relaunch_of_a_hub_id_reads_the_revision_its_run_started_from_wherever_the_cache_is(tmp_path, monkeypatch):
    """A run started from hub id ``org/tiny`` relaunches after the hub's main moved on (a README edited upstream,
    a new commit): it reads the revision it started from (was: refused as started with other settings, the two
    snapshot folders named, for the same id typed); from a cache elsewhere (another cluster's ``HF_HOME``) too, and
    the commands that read its tokenizer find it there (were: the folder gone, put it back). Another model is still
    refused."""
    import huggingface_hub.constants

    first, second = "1" * 40, "2" * 40
    started = hub_cache(tmp_path / "cache", "org/tiny", first, hf_qwen3(tmp_path / "hf"))
    dump = tmp_path / "run"

    def args(hub_id: str, steps: int) -> list[str]:
        return [*BASE, "--job.dump_folder", str(dump), "--model.hf_assets_path", hub_id, *TRAIN,
                "--validation.no-enable", *FULL_LAST, "--training.steps", str(steps)]  # fmt: skip

    env = {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    run = python_module("dispersion_titan.train", *args("org/tiny", 1), env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    hub_cache(tmp_path / "cache", "org/tiny", second, started)  # main moves on
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for cache in ("cache", "moved"):  # the same cache; a copy of it elsewhere
        shutil.copytree(tmp_path / "cache", tmp_path / "moved", dirs_exist_ok=True, symlinks=True)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / cache))
        job = check_launch(validated_args(args("org/tiny", 2)), take_lock=False)
        assert job.model.hf_assets_path == str(tmp_path / cache / "models--org--tiny" / "snapshots" / first)
    (tmp_path / "cache").rename(tmp_path / "gone")  # the run moved: analyze and evaluate read the same revision
    moved = tmp_path / "moved" / "models--org--tiny" / "snapshots" / first
    assert run_encoder(str(dump)).name == str(moved)
    hub_cache(tmp_path / "moved", "org/other", first, moved)
    with pytest.raises(ConfigError, match=r"^run folder .* was started with other settings: model\.hf_assets_path "):
        check_launch(validated_args(args("org/other", 2)), take_lock=False)


@pytest.mark.slow
def test_llama3_trains_through_the_entry_point(tmp_path):
    proc = python_module(
        "dispersion_titan.train",
        *BASE,
        "--job.dump_folder",
        str(tmp_path),
        "--model.name",
        "llama3_dispersion",
        "--model.dim",
        "32",
        "--model.n_layers",
        "2",
        "--model.n_heads",
        "2",
        "--training.seq_len",
        "32",
        "--training.steps",
        "1",
        "--validation.no-enable",
        "--checkpoint.no-enable",
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    live = scalars(tmp_path)
    assert sorted(live["condensation/block_2_mean_cos_offdiag"]) == [1] and live["loss_metrics/dispersion"][1] != 0
