"""Bad configuration fails before any process group starts: one line naming the field,
exit code 2, and nothing written to the dump folder."""

from __future__ import annotations

import re

import pytest

from dispersion_titan.losses.options import resolve_layers
from dispersion_titan.job_config.parse import validated_args
from dispersion_titan.utils.errors import ArgumentError, ConfigError
from support.cli import analyze, assert_one_line_error
from support.launch import DEBUG_TOML, python_module

BASE = ["--job.config_file", DEBUG_TOML, "--job.custom_config_module", "dispersion_titan.config"]


def write_toml(tmp_path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["--model.mlp_hidden_dim", "250", "--parallelism.tensor_parallel_degree", "3"], "model.n_heads"),
        (["--model.mlp_hidden_dim", "255", "--parallelism.tensor_parallel_degree", "2"], "model.mlp_hidden_dim"),
        (["--model.n_heads", "3", "--parallelism.tensor_parallel_degree", "3"], "model.dim"),
        (["--model.dim", "66"], "model.dim"),
        (["--training.seq_len", "512"], "training.seq_len"),
        (["--model.flavor", "huge"], "model.flavor"),
        (["--model.n_layers", "-1"], "model.n_layers"),
        (["--model.name", "llama4"], "model.name"),
        (["--training.dataset", "nope"], "training.dataset"),
        (["--training.dataset", "local", "--training.dataset_path", "/nonexistent/*.jsonl"], "training.dataset_path"),
        (["--dispersion.variant", "spread"], "dispersion.variant"),
        (["--dispersion.coeff", "-0.1"], "dispersion.coeff"),
        (["--dispersion.coeff", "inf"], "dispersion.coeff"),
        (["--dispersion.coeff", "nan"], "dispersion.coeff"),
        (["--dispersion.tau", "inf"], "dispersion.tau"),
        (["--dispersion.lambda_norm", "inf"], "dispersion.lambda_norm"),
        (["--optimizer.lr", "inf"], "optimizer.lr"),
        (["--optimizer.weight_decay", "nan"], "optimizer.weight_decay"),
        (["--training.max_norm", "nan"], "training.max_norm"),
        (["--baseline.noise_alpha", "inf"], "baseline.noise_alpha"),
        (["--dispersion.tau", "0"], "dispersion.tau"),
        (["--dispersion.clamp", "1.0"], "dispersion.clamp"),
        (["--dispersion.clamp", "0"], "dispersion.clamp"),
        (["--dispersion.layers", "0", "2"], "dispersion.layers"),
        (["--dispersion.layers", "5"], "dispersion.layers"),
        (["--dispersion.layers", "middle"], "dispersion.layers"),
        (["--dispersion.layers", "1,1,2"], "dispersion.layers"),
        (["--dispersion.max_tokens", "1"], "dispersion.max_tokens"),
        (["--dispersion.warmup_steps", "-2"], "dispersion.warmup_steps"),
        (["--dispersion.precision", "fp8"], "dispersion.precision"),
        (["--dispersion.variant", "perplexity_entropy", "--dispersion.precision", "tf32"], "dispersion.precision"),
        (["--dispersion.form", "authors"], "dispersion.form"),
        (["--checkpoint.keep_latest_k", "3"], "checkpoint.keep_latest_k"),
        (["--baseline.method", "neftune"], "baseline.method"),
        (["--baseline.noise_alpha", "-1"], "baseline.noise_alpha"),
        (["--baseline.forget_every", "0"], "baseline.forget_every"),
        (["--baseline.embedding_lr", "0"], "baseline.embedding_lr"),
        (["--baseline.method", "active_forgetting", "--optimizer.early_step_in_backward"],
         "optimizer.early_step_in_backward"),
        (["--baseline.method", "active_forgetting", "--baseline.forget_every", "10", "--training.steps", "10"],
         "baseline.forget_every"),  # no reset would ever happen
    ],
)
def test_invalid_values_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        validated_args([*BASE, *overrides])
    message = str(err.value)
    assert message.startswith(field + ":") and "\n" not in message


@pytest.mark.parametrize(
    "toml, field",
    [
        ('[model]\nname = "gpt2"\nflavour = "debug"\n', "model.flavour"),
        ('[dispersion]\nvariant = "angular_spread"\ncoef = 0.1\n', "dispersion.coef"),
        ("[trainning]\nsteps = 3\n", "trainning"),
        ('[model]\nmlp_hidden_dim = "wide"\n', "model.mlp_hidden_dim"),
        ('[dispersion]\ncoeff = "a lot"\n', "dispersion.coeff"),
        ("[training]\nsteps = 2.5\n", "training.steps"),
        ('[dispersion]\nlayers = [1, "two"]\n', "dispersion.layers"),
        ("model = 3\n", "model"),
    ],
)
def test_unknown_keys_and_wrong_types_name_their_field(tmp_path, toml, field):
    path = write_toml(tmp_path, toml)
    with pytest.raises(ConfigError) as err:
        validated_args(["--job.config_file", path, "--job.custom_config_module", "dispersion_titan.config"])
    assert str(err.value).startswith(field + ":")


def test_infinity_is_accepted_where_it_has_a_meaning(tmp_path):
    """``training.max_norm = inf``: no gradient clipping; a TOML ``inf`` elsewhere is refused."""
    assert validated_args([*BASE, "--training.max_norm", "inf"]).training.max_norm == float("inf")
    text = open(DEBUG_TOML).read().replace("\nlr = 1e-3 ", "\nlr = inf ", 1)
    path = write_toml(tmp_path, text)
    with pytest.raises(ConfigError, match=r"^optimizer.lr: must be a finite number, got inf$"):
        validated_args(["--job.config_file", path, *BASE[2:]])


@pytest.mark.parametrize("flag, blocks", [("3", [2]), ("1,2,4", [0, 1, 3]), (" 4 , 1", [0, 3]), ("late_half", [2, 3])])
def test_dispersion_layers_from_the_command_line(flag, blocks):
    """One index or a comma-separated list, as a user types them (the debug model has 4 blocks)."""
    config = validated_args([*BASE, "--dispersion.layers", flag])
    assert resolve_layers(config.dispersion.layers, 4) == blocks


def test_dispersion_layers_list_in_toml(tmp_path):
    text = open(DEBUG_TOML).read().replace('layers = "all"', "layers = [4, 2]", 1)
    assert "layers = [4, 2]" in text
    config = validated_args(["--job.config_file", write_toml(tmp_path, text), *BASE[2:]])
    assert resolve_layers(config.dispersion.layers, 4) == [1, 3]


def test_malformed_toml_names_the_file(tmp_path):
    path = write_toml(tmp_path, "[model\nname = 'gpt2'\n")
    with pytest.raises(ArgumentError) as err:
        validated_args(["--job.config_file", path])
    assert path in str(err.value) and "invalid TOML" in str(err.value)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--parallelism.tensor_parallel_degree", "3"], "dispersion_titan: error: model.n_heads: 4 is not divisible by parallelism.tensor_parallel_degree=3"),
        (["--training.seq_len", "300"], "dispersion_titan: error: training.seq_len: 300 must be in 1..256 (model.max_seq_len positions)"),
        (["--dispersion.layers", "1,1,2"], "dispersion_titan: error: dispersion.layers: block 1 named twice in 1,1,2; name each block once"),
        (["--dispersion.variant", "angular_spread", "--dispersion.coeff", "inf"], "dispersion_titan: error: dispersion.coeff: must be a finite number, got inf"),
        (["--training.dataset", "local", "--training.dataset_path", "missing.jsonl"], "dispersion_titan: error: training.dataset_path: no file matches 'missing.jsonl'"),
        (["--dispersion.variant", "angular_spread", "--dispersion.kernel", "triton"], "dispersion_titan: error: dispersion.kernel: 'triton' needs a CUDA GPU, and torch sees none here; use 'auto' (the PyTorch strips on CPU) or 'torch'"),
    ],
)
def test_cli_exits_2_with_one_line_before_starting(tmp_path, args, expected):
    dump = tmp_path / "run"
    proc = python_module("dispersion_titan.train", "--job.config_file", DEBUG_TOML,
                         "--job.dump_folder", str(dump), *args, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [expected]
    assert not dump.exists()


def test_unknown_toml_field_via_cli(tmp_path):
    path = write_toml(tmp_path, (open(DEBUG_TOML).read() + "\n[extra]\nfoo = 1\n"))
    proc = python_module("dispersion_titan.train", "--job.config_file", path, "--job.dump_folder", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"dispersion_titan: error: extra: unknown section in {path}"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("toml, message", [
    ("[trainning]\nsteps = 3\n", "trainning: unknown section in {}; did you mean training?"),
    ('[model]\nflavour = "debug"\n', "model.flavour: unknown key in {}; did you mean model.flavor?"),
])
def test_unknown_keys_name_the_file_and_the_close_match(tmp_path, toml, message):
    path = write_toml(tmp_path, toml)
    with pytest.raises(ConfigError, match=f"^{re.escape(message.format(path))}$"):
        validated_args(["--job.config_file", path, "--job.custom_config_module", "dispersion_titan.config"])


def imported_modules(stderr: str) -> set[str]:
    """The modules ``PYTHONPROFILEIMPORTTIME`` reports as imported."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_help_and_cheap_errors_come_before_torch_is_imported(tmp_path):
    """``--help`` and the errors found in the TOML alone (a missing or malformed file, an unknown
    key of a section that is ours) import neither torch nor TorchTitan."""
    unknown = write_toml(tmp_path, "[dispersion]\ncoef = 0.1\n")
    (tmp_path / "malformed.toml").write_text("[model\n")
    for args, status, message in [
        (["--help"], 0, None),
        (["--job.config_file", unknown], 2, f"dispersion.coef: unknown key in {unknown}; did you mean dispersion.coeff?"),
        (["--job.config_file", str(tmp_path / "absent.toml")], 2, f"--job.config_file: {tmp_path / 'absent.toml'}: no such file"),
        (["--job.config_file", str(tmp_path / "malformed.toml")], 2, "invalid TOML"),
    ]:
        proc = python_module("dispersion_titan.train", *args, "--job.dump_folder", str(tmp_path / "run"),
                             env={"PYTHONPROFILEIMPORTTIME": "1"}, command_line=True, timeout=120)
        assert proc.returncode == status, proc.stderr[-2000:]
        assert not {"torch", "torchtitan"} & imported_modules(proc.stderr)
        said = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
        if message is None:
            assert said == [] and "--dispersion.coeff" not in proc.stdout and "[dispersion] variant='none'" in proc.stdout
        else:
            assert len(said) == 1 and said[0].startswith("dispersion_titan: error: ") and message in said[0]
    assert not (tmp_path / "run").exists()


def test_a_toml_that_is_not_utf8_or_names_no_model_is_one_line(tmp_path):
    """A byte that is not UTF-8 (once an 18-line UnicodeDecodeError traceback) and an empty TOML
    (once a message about TorchTitan's default model's model.hf_assets_path): one line naming
    the file and what to do, exit 2, nothing written."""
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(open(DEBUG_TOML, "rb").read().replace(b"# TorchTitan optimizer name", b"# caf\xe9", 1))
    empty = write_toml(tmp_path, "")
    for path, message in [
        (latin1, f"--job.config_file: {latin1}: not UTF-8 text (byte 0xe9 at offset "),
        (empty, f"model.name: no model named ({empty}); add [model] name = one of ('gpt2', 'qwen3', 'llama3')"),
    ]:
        proc = python_module("dispersion_titan.train", "--job.config_file", str(path), "--job.dump_folder",
                             str(tmp_path / "run"), timeout=120)
        assert proc.returncode == 2
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"dispersion_titan: error: {message}"), line
    assert not (tmp_path / "run").exists()


def test_a_variant_with_coeff_0_is_noted_once_at_launch(tmp_path):
    """``coeff`` left at 0 with a variant: valid (the term is still logged), but said in one line."""
    proc = python_module("dispersion_titan.train", "--job.config_file", DEBUG_TOML, "--job.dump_folder",
                         str(tmp_path / "run"), "--training.seq_len", "64", "--training.steps", "1",
                         "--checkpoint.no-enable", "--validation.no-enable", "--dispersion.variant", "angular_spread",
                         timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if "note:" in line]
    assert notes == ["dispersion_titan: note: dispersion.coeff is 0: the angular_spread term is logged but adds "
                     "nothing to the loss; set dispersion.coeff > 0, or dispersion.variant = \"none\""]


def test_analyze_texts_not_utf8_leaves_no_out_folder(tmp_path, capsys):
    texts = tmp_path / "latin1.jsonl"
    texts.write_bytes(b'{"text": "caf\xe9"}\n')
    out = tmp_path / "out"
    result = analyze(str(tmp_path / "run"), "--texts", str(texts), "--out", str(out), capsys=capsys)
    assert_one_line_error(*result[::2], f"--texts: {texts}: cannot be read", "can't decode byte 0xe9")
    assert not out.exists()
