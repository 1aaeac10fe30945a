"""Canaries for every TorchTitan internal that ``components/titan_compat.py`` touches.

Each test names the touch it guards: when a TorchTitan upgrade changes what the touch
relies on, the failure says which one to re-check. The pin itself comes first.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.metadata
import inspect
import pathlib
import re
import sys
import textwrap

import pytest
import torch

from dispersion_titan.components import titan_compat
from dispersion_titan.config.cli import CONFIG_MODULE

TORCHTITAN = pathlib.Path(importlib.import_module("torchtitan").__file__).parent


def _source(obj) -> str:
    return textwrap.dedent(inspect.getsource(obj))


def _assigned_attributes(function) -> set[str]:
    return set(re.findall(r"^\s*self\.(\w+)\s*(?::[^=]+)?=", _source(function), flags=re.M))


def test_installed_torchtitan_is_the_pinned_release():
    assert importlib.metadata.version("torchtitan") == titan_compat.TORCHTITAN_VERSION == "0.2.2"
    titan_compat.check_torchtitan_version()


def test_other_torchtitan_version_fails_loudly(monkeypatch):
    monkeypatch.setattr(titan_compat, "version", lambda name: "0.3.0")
    with pytest.raises(RuntimeError, match=r"requires torchtitan==0\.2\.2, found 0\.3\.0"):
        titan_compat.check_torchtitan_version()


TITAN_MAIN_SHA256 = "0d01bcc4e9ab533e88f021ef088e0015eaf7e9550fb0008fbbabce230f215bf9"


def test_our_main_follows_torchtitans_main():
    """``trainer.train`` re-implements ``torchtitan.train.main`` on a config parsed once (its
    ``main`` parses ``sys.argv`` itself): any change to that body must be re-read, and no
    TorchTitan attribute is reassigned to hand it our config."""
    import torchtitan.train

    from dispersion_titan.trainer import trainer

    digest = hashlib.sha256(_source(torchtitan.train.main).encode()).hexdigest()
    assert digest == TITAN_MAIN_SHA256, "torchtitan.train.main changed: re-read it against trainer.train"
    ours = _source(trainer.train)
    for step in (
        "init_logger()",
        "create_seed_checkpoint",
        "checkpointer.save(curr_step=0, last_step=True)",
        ".train()",
        ".close()",
        "destroy_process_group()",
    ):
        assert step in ours, step
    assert not re.search(r"(import|from)\s+torchtitan\.train\b", _source(trainer)) and "setattr" not in ours


def test_merged_job_config_class_has_our_sections(monkeypatch):
    """``merged_job_config_class``: the class ``ConfigManager.parse_args`` builds with our module, the same one."""
    from torchtitan.config import JobConfig

    merged = titan_compat.merged_job_config_class(CONFIG_MODULE)
    assert issubclass(merged, JobConfig)
    # one class per process, the parse's too: tyro's caches of what it read of its source then serve every parse
    args = ["--job.custom_config_module", CONFIG_MODULE, "--model.name", "gpt2"]
    parsed = titan_compat.config_manager_parse(args, {})
    assert type(parsed) is merged is titan_compat.merged_job_config_class(CONFIG_MODULE)
    sources, parse = [], ast.parse
    monkeypatch.setattr(ast, "parse", lambda source, *a, **k: (sources.append(source[:40]), parse(source, *a, **k))[1])
    titan_compat.config_manager_parse(args, {})
    assert sources == []  # was types.py, for the merged class, once per section: 0.09 s of CPU a parse
    names = {f.name for f in dataclasses.fields(merged)}
    assert {"dispersion", "training", "model"} <= names
    model_fields = {f.name for f in dataclasses.fields(merged().model)}
    assert {"name", "flavor", "mlp_hidden_dim", "tie_embeddings"} <= model_fields


def test_every_module_that_binds_the_device_is_rebound():
    """Touch ``apply``: the modules that copy ``device_type``/``device_module`` at import."""
    binding = set()
    for path in TORCHTITAN.rglob("*.py"):
        if "experiments" in path.parts:
            continue
        if re.search(
            r"^from torchtitan\.tools\.utils import .*\b(device_type|device_module)\b", path.read_text(), flags=re.M
        ):
            binding.add(".".join(path.relative_to(TORCHTITAN.parent).with_suffix("").parts))
    assert binding | {"torchtitan.tools.utils"} == set(titan_compat.MODULES_BINDING_DEVICE)


def test_cpu_shim_rebinds_the_device_of_the_memory_monitor():
    """Touch ``apply``: behaviour on a machine without CUDA."""
    if torch.cuda.is_available():
        pytest.skip("the shim only acts without a GPU")
    titan_compat.apply()
    assert titan_compat.MODULES_BINDING_DEVICE
    for name in titan_compat.MODULES_BINDING_DEVICE:
        assert sys.modules[name].device_type == "cpu", name
    from torchtitan.components.metrics import MetricsProcessor, build_device_memory_monitor

    assert "self.device_memory_monitor = build_device_memory_monitor()" in _source(MetricsProcessor.__init__)
    monitor = build_device_memory_monitor()
    assert monitor.device.type == "cpu" and monitor.device_capacity > 0
    assert monitor.get_peak_stats().max_reserved_gib > 0


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_without_data_parallel_leaves_data_parallelism_to_the_caller(family):
    """Touch ``WithoutDataParallel``: TorchTitan's parallelize functions gate FSDP and DDP
    on ``fsdp_enabled`` / ``dp_replicate_enabled`` only (no process group needed to see it)."""
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.protocols.train_spec import get_train_spec

    job = ConfigManager().parse_args(
        ["--model.name", family, "--activation_checkpoint.mode", "full", "--job.dump_folder", "/nonexistent"]
    )
    spec = get_train_spec(family)  # TorchTitan's own (ours are registered as qwen3_dispersion, llama3_dispersion)
    args = spec.model_args["debugmodel"]
    with torch.device("meta"):
        model = spec.model_cls(args)
    sharded_and_replicated = ParallelDims(dp_replicate=2, dp_shard=2, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=4)
    model = spec.parallelize_fn(model, titan_compat.WithoutDataParallel(sharded_and_replicated), job)
    assert not any(isinstance(m, FSDPModule) for m in model.modules())
    assert type(model.layers["0"]).__name__ == "CheckpointWrapper"  # the rest was applied


def test_torchtitan_shards_a_tied_qwen3_apart():
    """Why ``WithoutDataParallel`` exists: the FSDP of TorchTitan's qwen3 puts the token
    embeddings in a unit of their own and ``[norm, output]`` in another, which a tied head
    (one matrix) cannot be. When this fails, TorchTitan may keep the tie itself now."""
    from torchtitan.models.llama4.infra.parallelize import apply_fsdp

    source = _source(apply_fsdp)
    assert re.search(r"fully_shard\(\s*model\.tok_embeddings", source)
    assert re.search(r"fully_shard\(\s*\[model\.norm, model\.output\]", source)


def test_attention_on_local_shards_wraps_sdpa(tmp_path):
    """Touch ``attention_on_local_shards``: the wrapper's forward takes q, k, v positionally
    and returns SDPA's output; heads sharded over a (1-process gloo) mesh stay exact."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper

    assert list(inspect.signature(ScaledDotProductAttentionWrapper.forward).parameters)[:4] == ["self", "q", "k", "v"]
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        holder = torch.nn.Sequential(ScaledDotProductAttentionWrapper())
        titan_compat.attention_on_local_shards(holder)
        q, k, v = (torch.randn(1, 4, 8, 2, requires_grad=True) for _ in range(3))
        out = holder[0](*(DTensor.from_local(t, mesh, [Shard(1)]) for t in (q, k, v)))
        assert isinstance(out, DTensor) and out.placements == (Shard(1),)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert torch.allclose(out.to_local(), want, atol=1e-6)
        out.to_local().sum().backward()
        assert q.grad is not None and k.grad is not None
    finally:
        torch.distributed.destroy_process_group()


def test_init_validator_sets_what_validator_init_sets():
    """Touch ``init_validator``: ``Validator.__init__`` sets a field of each of its parameters (those that
    ``Trainer.__init__`` hands ``build_validator_fn``, all of them) but ``dp_world_size`` and ``dp_rank``, which
    its C4 loader takes, and ``validation_dataloader``: nothing ``PackedValidator``, which sets what it is handed,
    would miss."""
    from torchtitan.components.validate import Validator
    from torchtitan.train import Trainer

    params = list(inspect.signature(Validator.__init__).parameters)[1:]
    assert params[:3] == ["job_config", "dp_world_size", "dp_rank"] and len(params) == 12
    assert _assigned_attributes(Validator.__init__) == {*params, "validation_dataloader"} - {"dp_world_size", "dp_rank"}
    init = " ".join(_source(Trainer.__init__).split())
    handed = init[init.index("self.validator = self.train_spec.build_validator_fn(") :].split(")", 1)[0]
    assert re.findall(r"(\w+)=", handed) == params


def test_checkpointer_attributes_used_exist():
    """Touches ``save_full_checkpoint`` and ``checkpointer_folder``: CheckpointManager's
    ``last_save_model_only``/``last_save_in_hf``/``folder``/``enable`` and ``save``'s arguments."""
    from torchtitan.components.checkpoint import CheckpointManager

    assigned = _assigned_attributes(CheckpointManager.__init__)
    assert {"enable", "folder", "last_save_model_only", "last_save_in_hf"} <= assigned
    init = _source(CheckpointManager.__init__)
    # ``folder`` is set only past the early return of a disabled manager.
    assert init.index("if not self.enable") < init.index("self.folder =")
    assert list(inspect.signature(CheckpointManager.save).parameters)[:3] == ["self", "curr_step", "last_step"]


def test_model_converter_names_are_the_registry_the_converters_are_looked_up_in():
    """``model_converter_names``: ``ModelConvertersContainer`` looks each of ``model.converters`` up in the
    private registry, which holds TorchTitan's float8 and MX converters."""
    from torchtitan.protocols.model_converter import ModelConvertersContainer

    lookup = "_registry_model_converter_cls[name] for name in job_config.model.converters"
    assert lookup in " ".join(_source(ModelConvertersContainer.__init__).split())
    assert {"quantize.linear.float8", "quantize.linear.mx"} <= titan_compat.model_converter_names()


def test_wandb_logs_from_passes_over_earlier_steps_for_wandb_only(tmp_path, monkeypatch):
    """``wandb_logs_from``: ``MetricsProcessor.logger`` a ``LoggerContainer`` whose ``_loggers`` hold the
    ``WandBLogger``: a resumed W&B run (offline here) gets the steps from ``first`` on, TensorBoard all of them."""
    from torchtitan.components.metrics import LoggerContainer, TensorBoardLogger, WandBLogger
    from torchtitan.config import JobConfig

    from support.runs import scalars
    from support.wandb_files import history

    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "dispersion-test"}.items():
        monkeypatch.setenv(key, value)
    loggers = LoggerContainer()
    loggers.add_logger(TensorBoardLogger(str(tmp_path / "tb" / "events")))
    loggers.add_logger(WandBLogger(str(tmp_path), JobConfig()))
    titan_compat.wandb_logs_from(loggers, 3)
    for step in (1, 2, 3, 4):
        loggers.log({"loss": float(step)}, step)
    loggers.close()
    assert history(tmp_path) == {"loss": {3: 3.0, 4: 4.0}}
    assert scalars(tmp_path) == {"loss": {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}}


def test_checkpoint_folder_of_a_disabled_checkpointer_is_none():
    class Disabled:
        enable = False

    class Enabled:
        enable, folder = True, "/runs/x/checkpoint"

    assert titan_compat.checkpointer_folder(Disabled()) is None
    assert titan_compat.checkpointer_folder(Enabled()) == "/runs/x/checkpoint"


def test_will_save_follows_the_checkpointers_rule():
    """Touch ``will_save``: ``CheckpointManager._should_save(curr_step, last_step)``, and
    ``train()`` calling ``checkpointer.save(self.step, last_step=...)`` after ``train_step``."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.train import Trainer

    assert list(inspect.signature(CheckpointManager._should_save).parameters) == ["self", "curr_step", "last_step"]
    train = _source(Trainer.train)
    assert train.index("self.train_step(") < train.index("self.checkpointer.save(")
    manager = object.__new__(CheckpointManager)
    manager.enable, manager.load_only, manager.enable_first_step_checkpoint, manager.interval = True, False, False, 5
    assert [s for s in range(1, 13) if titan_compat.will_save(manager, s, last_step=s == 12)] == [5, 10, 12]
    manager.enable = False
    assert not titan_compat.will_save(manager, 12, last_step=True)


def test_every_save_goes_through_the_checkpointers_save_and_failures_reach_the_handler(tmp_path):
    """Touch ``on_save_error``: ``train()`` and ``main()`` save through ``self.checkpointer.save`` /
    ``trainer.checkpointer.save`` (the instance attribute the wrapper replaces), and a failure
    inside DCP's save, which raises ``CheckpointException`` (a BaseException), reaches the handler."""
    import torchtitan.train
    from torch.distributed.checkpoint.api import CheckpointException

    assert "self.checkpointer.save(" in _source(torchtitan.train.Trainer.train)
    assert "trainer.checkpointer.save(" in _source(torchtitan.train.main)

    class Checkpointer:
        def save(self, curr_step: int, last_step: bool = False) -> None:
            raise CheckpointException("write", {0: (OSError(28, "No space left on device"), None)})

    seen = []
    checkpointer = Checkpointer()
    titan_compat.on_save_error(checkpointer, lambda step, error: seen.append((step, error)), seen.append)
    with pytest.raises(CheckpointException):
        checkpointer.save(4, last_step=True)
    assert [(step, type(error)) for step, error in seen] == [(4, CheckpointException)]


def test_validate_calls_the_model_then_the_loss_inside_its_contexts():
    """Touch of ``PackedValidator.validate``: ``Validator.validate`` calls ``model_parts[0](inputs,
    ...)`` and then ``self.loss_fn(predictions, labels)`` on the non-pipelined path, inside
    ``validation_context()`` and ``maybe_enable_amp``."""
    from torchtitan.components.validate import Validator

    body = _source(Validator.validate)
    path = body[body.index("assert len(model_parts) == 1") :]
    assert body.rindex("with self.validation_context():", 0, body.index("assert len(model_parts) == 1")) > 0
    assert (
        path.index("with self.maybe_enable_amp:")
        < path.index("predictions = model_parts[0](")
        < path.index("loss_sum = self.loss_fn(predictions, labels)")
    )


# The source of the TorchTitan method that TrainerHooks.forward_backward_step re-implements.
FORWARD_BACKWARD_STEP_SHA256 = "d66c2dd178723d3a492c93eb352b37b9ca68fd38073632100dc14769f0b78915"


def test_trainer_hooks_match_the_trainer_they_rely_on():
    """Touch ``TrainerHooks`` (and ``DispersionTrainer``'s ``comm.trace_buf_size = 0`` on a CPU): the flight
    recorder's folder is made from ``job_config.comm`` only when its buffer is on; ``train()`` loads a
    checkpoint, then asks ``should_continue_training``; ``train_step`` calls ``forward_backward_step``, whose
    non-pipelined body TrainerHooks re-implements (any change to it must be re-read)."""
    from torchtitan.train import Trainer

    train = _source(Trainer.train)
    assert train.index("self.checkpointer.load(") < train.index("while self.should_continue_training()")
    from torchtitan.distributed import utils as dist_utils

    assert "dist_utils.init_distributed( job_config.comm," in " ".join(_source(Trainer.init_distributed).split())
    flight_recorder = _source(dist_utils.init_distributed)
    assert flight_recorder.index("if comm_config.trace_buf_size > 0:") < flight_recorder.index("os.makedirs(dump_dir")
    assert "self.forward_backward_step(" in _source(Trainer.train_step)
    assert list(inspect.signature(Trainer.forward_backward_step).parameters) == [
        "self",
        "input_dict",
        "labels",
        "global_valid_tokens",
    ]
    digest = hashlib.sha256(_source(Trainer.forward_backward_step).encode()).hexdigest()
    assert digest == FORWARD_BACKWARD_STEP_SHA256, (
        "Trainer.forward_backward_step changed: re-read it against TrainerHooks.forward_backward_step"
    )


def test_optimizer_per_model_part_pairs_each_part_with_its_one_group_optimizer():
    """Touch ``optimizer_per_model_part``: ``OptimizersContainer.model_parts`` / ``.optimizers``,
    one optimizer per part over its parameters, in one param group."""
    from torchtitan.components.optimizer import build_optimizers
    from torchtitan.config import Optimizer

    parts = [torch.nn.Linear(2, 2), torch.nn.Linear(3, 1)]
    container = build_optimizers(parts, Optimizer(implementation="for-loop"), None)
    pairs = titan_compat.optimizer_per_model_part(container)
    assert [model for model, _ in pairs] == parts and [opt for _, opt in pairs] == list(container)
    for model, optimizer in pairs:
        (group,) = optimizer.param_groups
        assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]


def test_lr_lambda_is_the_factor_build_lr_schedulers_applies():
    """Touch ``lr_lambda``: ``build_lr_schedulers`` gives its ``LambdaLR``s one ``lr_lambda``."""
    from torchtitan.components.lr_scheduler import build_lr_schedulers
    from torchtitan.config import LRScheduler

    config = LRScheduler(warmup_steps=3, decay_type="cosine", min_lr_factor=0.2)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    schedulers = build_lr_schedulers([optimizer], config, 10)
    factor = titan_compat.lr_lambda(config, 10)
    for epoch in range(12):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * factor(epoch)), epoch
        optimizer.step()
        schedulers.step()


def test_lr_schedulers_per_group_apply_one_factor_per_group_and_resume():
    """Touch ``lr_schedulers_per_group``: ``LRSchedulersContainer`` passes its ``lr_lambda`` to
    ``LambdaLR`` unchanged, and saves and loads the first scheduler's state."""
    from torchtitan.components.lr_scheduler import LRSchedulersContainer

    def optimizer() -> torch.optim.Optimizer:
        a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
        return torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 2.0}], lr=1.0)

    factors = [lambda epoch: 1 / (epoch + 1), lambda epoch: epoch + 1.0]
    first = optimizer()
    container = titan_compat.lr_schedulers_per_group([first], factors)
    assert isinstance(container, LRSchedulersContainer)
    for _ in range(2):
        first.step()
        container.step()
    assert [g["lr"] for g in first.param_groups] == pytest.approx([1 / 3, 6.0])
    resumed = titan_compat.lr_schedulers_per_group([optimizer()], factors)
    resumed.load_state_dict(container.state_dict())
    resumed.step()
    container.step()
    assert resumed.schedulers[0].get_last_lr() == pytest.approx(container.schedulers[0].get_last_lr())


def test_trainer_builds_optimizers_and_lr_schedulers_from_their_sections():
    """``components.optimizers`` reads ``[baseline]`` from the ``[optimizer]`` / ``[lr_scheduler]``
    sections (``config.schema.BuilderInputs``): ``Trainer.__init__`` must hand the TrainSpec's
    builders those sections of its job config."""
    from torchtitan.train import Trainer

    init = _source(Trainer.__init__)
    assert re.search(r"self\.train_spec\.build_optimizers_fn\(\s*self\.model_parts,\s*job_config\.optimizer,", init)
    assert re.search(
        r"self\.train_spec\.build_lr_schedulers_fn\(\s*self\.optimizers,\s*job_config\.lr_scheduler,", init
    )


def test_stand_in_family_is_built_as_the_trainer_builds_its_model():
    """Touch ``stand_in_family``: ``Trainer.__init__`` looks its TrainSpec up by ``model.name``, builds
    ``model_cls(model_args)`` on the meta device, parallelizes it, then moves it off the meta device
    and initialises it; the family's own entry is left as it was, and one of ours is registered once."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torchtitan.protocols.train_spec import get_train_spec
    from torchtitan.train import Trainer

    init = " ".join(_source(Trainer.__init__).split())
    steps = [
        "train_spec_module.get_train_spec(job_config.model.name)",
        'torch.device("meta")',
        "self.train_spec.model_cls(model_args)",
        "self.train_spec.parallelize_fn(model, parallel_dims, job_config)",
        "model.to_empty(device=init_device)",
        "model).init_weights(buffer_device=buffer_device)",
    ]
    assert [init.index(step) for step in steps] == sorted(init.index(step) for step in steps)
    from dispersion_titan.job_config.parse import setup_torchtitan

    setup_torchtitan()
    name = titan_compat.stand_in_family("qwen3_dispersion")
    assert titan_compat.stand_in_family("qwen3_dispersion") == name == "qwen3_dispersion.fake_world"
    ours, theirs = get_train_spec(name), get_train_spec("qwen3_dispersion")
    assert ours.model_args is theirs.model_args and ours.model_cls is not theirs.model_cls
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake, torch.device("meta"):  # trunc_normal_'s resampling reads values back
        model = ours.model_cls(theirs.model_args["debugmodel"])
    assert not isinstance(model.tok_embeddings.weight, FakeTensor)
    with fake, torch.no_grad():
        model.to_empty(device="cpu")
        model.init_weights(buffer_device=torch.device("cpu"))
    assert isinstance(model.output.weight, FakeTensor)


def test_optimizer_step_is_train_steps_body():
    """Touch ``optimizer_step``: ``Trainer.train_step`` clears the gradients, calls ``forward_backward_step``
    per micro-batch, clips the gradients with ``dist_utils.clip_grad_norm_`` and steps the optimizers."""
    from torchtitan.train import Trainer

    body = _source(Trainer.train_step)
    steps = [
        "self.optimizers.zero_grad()",
        "self.forward_backward_step(",
        "dist_utils.clip_grad_norm_(",
        "self.optimizers.step()",
    ]
    assert [body.index(step) for step in steps] == sorted(body.index(step) for step in steps)
