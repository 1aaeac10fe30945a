"""Any Hugging Face causal LM as a ``LayeredModel``: loaded through ``transformers``, its
hidden states captured with forward hooks so that the layers mean what they mean for
our runs.

transformers' ``output_hidden_states`` gives n + 1 entries: the input of each decoder
layer, then the output of the final norm in place of the last layer's output. So:

- ``embedding`` = the input of the first decoder layer (``hidden_states[0]``: token
  embeddings, plus positions / embedding norm / scaling where the model has them);
- ``block_i`` = the output of decoder layer i (residual included), from a forward hook
  on it; ``block_n`` is therefore the last layer's own output, as in our runs;
- ``final_norm`` = the backbone's ``last_hidden_state`` (``hidden_states[-1]``).

The decoder layers are found generically: the ``nn.ModuleList`` of ``num_hidden_layers``
modules holding the most parameters (``model.layers``, ``transformer.h``,
``gpt_neox.layers``, …). Only the backbone runs; the LM head never does.

``hf:MODEL[@REV1,REV2,...]``: MODEL is a hub id or a local folder. Revisions of a hub
model are hub revisions (branches, tags, commits); revisions of a local folder are its
subfolders, ``hf:/path/olmo@stage1-step1000,stage1-step2000`` meaning
``/path/olmo/stage1-step1000/`` and ``/path/olmo/stage1-step2000/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..utils.errors import ModelLoadError
from .inputs import Encode
from .measure import LayerSink

PREFIX = "hf:"
BF16_ABOVE_PARAMS = 10**9
_STEP_IN_NAME = re.compile(r"step(\d+)")


@dataclass(frozen=True)
class HFSpec:
    model: str
    revisions: tuple[str | None, ...]
    """``(None,)``: the default revision (a hub model's main branch, or the folder itself)."""

    @property
    def local(self) -> bool:
        return os.path.isdir(self.model)

    def location(self, revision: str | None) -> tuple[str, str | None]:
        """(``from_pretrained`` path or id, its ``revision=``) of one revision."""
        if revision is None:
            return self.model, None
        if self.local:
            return os.path.join(self.model, revision), None
        return self.model, revision

    def name(self, revision: str | None) -> str:
        return f"{PREFIX}{self.model}" + (f"@{revision}" if revision else "")


def parse_spec(text: str) -> HFSpec:
    """``hf:MODEL[@REV1,REV2,...]``; the last ``@`` separates the revisions."""
    body = text.removeprefix(PREFIX)
    model, at, revisions = body.rpartition("@") if "@" in body else (body, "", "")
    names = tuple(r.strip() for r in revisions.split(",")) if at else (None,)
    if not model or any(r == "" for r in names):
        raise ModelLoadError(f"{text}: expected hf:MODEL or hf:MODEL@REV1,REV2,...")
    if len(set(names)) < len(names):
        raise ModelLoadError(f"{text}: a revision is listed twice")
    return HFSpec(os.path.abspath(model) if os.path.isdir(model) else model, names)


def revision_step(revision: str | None, position: int) -> int:
    """A revision's place in training: the number after ``step`` in its name (OLMo's
    ``stage1-step1000-tokens5B``, Pythia's ``step1000``), else its position in the list."""
    match = _STEP_IN_NAME.search(revision or "")
    return int(match.group(1)) if match else position


@contextmanager
def _loading(name: str) -> Iterator[None]:
    """Anything transformers or the hub raise while loading becomes one line naming the model."""
    try:
        yield
    except (OSError, ValueError, KeyError, ImportError, RuntimeError, TypeError) as e:
        cause = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelLoadError(f"{name}: cannot be loaded ({type(e).__name__}: {cause})") from None


def load_config(spec: HFSpec, revision: str | None):
    from transformers import AutoConfig

    path, rev = spec.location(revision)
    with _loading(spec.name(revision)):
        return AutoConfig.from_pretrained(path, revision=rev)


def load_encoder(spec: HFSpec, revision: str | None, special_tokens: bool = False) -> Encode:
    """The model's own tokenizer, adding no special tokens (no BOS), as for our runs; or, with
    ``special_tokens``, its default ones, as the authors' analysis does (``--protocol paper``)."""
    from transformers import AutoTokenizer

    path, rev = spec.location(revision)
    with _loading(spec.name(revision)):
        tokenizer = AutoTokenizer.from_pretrained(path, revision=rev)
    return lambda texts: tokenizer(texts, add_special_tokens=special_tokens, verbose=False)["input_ids"]


def _auto_class(config):
    """AutoModelForCausalLM, or AutoModel for architectures without a causal-LM head."""
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return AutoModelForCausalLM if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModel


def model_args(config) -> dict:
    """The shape recorded with each result (the fields ``compare`` and ``size_series`` read)."""
    text = config.get_text_config()
    dim = text.hidden_size
    return {
        "model_type": config.model_type,
        "dim": dim,
        "n_layers": text.num_hidden_layers,
        "mlp_hidden_dim": getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * dim,
        "max_seq_len": positions(config),
    }


def positions(config) -> int | None:
    """Learned or rotary positions the model was built for; None when unbounded (ALiBi)."""
    text = config.get_text_config()
    return getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)


def count_parameters(spec: HFSpec, config) -> int:
    """Parameters of the whole model (each tied matrix once), counted on the meta device."""
    with _loading(spec.model), torch.device("meta"):
        return sum(p.numel() for p in _auto_class(config).from_config(config).parameters())


def decoder_layers(backbone: nn.Module, count: int, name: str) -> nn.ModuleList:
    """The ModuleList of ``count`` decoder layers holding the most parameters."""
    candidates = [m for m in backbone.modules() if isinstance(m, nn.ModuleList) and len(m) == count]
    if not candidates:
        raise ModelLoadError(f"{name}: unsupported architecture ({type(backbone).__name__} has no list of "
                             f"{count} decoder layers)")
    return max(candidates, key=lambda m: sum(p.numel() for p in m.parameters()))


class HFLayers:
    """A loaded Hugging Face model as a ``LayeredModel`` (see the module docstring)."""

    def __init__(self, model: nn.Module, name: str):
        self.backbone = model.base_model
        self.layers = decoder_layers(self.backbone, model.config.get_text_config().num_hidden_layers, name)
        self.num_layers = len(self.layers) + 2
        self.input_device = self.backbone.get_input_embeddings().weight.device

    def run(self, tokens: torch.Tensor, sink: LayerSink) -> None:
        def embedding(_module, args, kwargs) -> None:
            sink("embedding", args[0] if args else kwargs["hidden_states"])

        def block(index: int):
            return lambda _module, _args, output: sink(f"block_{index}",
                                                       output[0] if isinstance(output, tuple) else output)

        hooks = [self.layers[0].register_forward_pre_hook(embedding, with_kwargs=True)]
        hooks += [layer.register_forward_hook(block(i)) for i, layer in enumerate(self.layers, start=1)]
        try:
            output = self.backbone(input_ids=tokens, use_cache=False)
        finally:
            for hook in hooks:
                hook.remove()
        sink("final_norm", output[0])


def load_model(spec: HFSpec, revision: str | None, dtype: torch.dtype, device: torch.device,
               device_map: str | None) -> HFLayers:
    """The model's weights in ``dtype``, on ``device`` or spread by ``device_map``, in eval mode."""
    path, rev = spec.location(revision)
    config = load_config(spec, revision)
    placement = {"device_map": device_map} if device_map else {}
    with _loading(spec.name(revision)):
        model = _auto_class(config).from_pretrained(path, revision=rev, dtype=dtype, **placement)
    if not device_map:
        model = model.to(device)
    return HFLayers(model.eval(), spec.name(revision))
