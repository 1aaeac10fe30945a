"""Any Hugging Face decoder-only causal LM as a ``measure.DecoderLayers``, its hidden states captured with forward
hooks so that the layers mean what they mean for our runs: ``block_n`` is the last layer's own output,
which transformers' ``output_hidden_states`` replaces by the final norm's. Only the backbone runs.
"""

from __future__ import annotations

import torch
from torch import nn

from ..utils.errors import ModelLoadError
from ..utils.hub import HFSpec, loading
from .inputs import Encode
from .measure import DecoderLayers

BF16_ABOVE_PARAMS = 10**9


def _from_pretrained(auto_class, spec: HFSpec, revision: str | None, **kwargs):
    """``auto_class.from_pretrained`` of the model at ``revision``, its load failures in one line."""
    path, rev = spec.location(revision)
    with loading(spec.name(revision), spec.local):
        return auto_class.from_pretrained(path, revision=rev, trust_remote_code=spec.trust_remote_code, **kwargs)


def load_config(spec: HFSpec, revision: str | None):
    """The model's config, refused unless it describes a decoder-only causal LM: encoders see every position
    at once, so their layers are not what a causal LM's are."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    config = _from_pretrained(AutoConfig, spec, revision)
    if config.is_encoder_decoder:
        kind = "an encoder-decoder"
    elif config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.is_decoder:
        kind = "an encoder-only"
    else:
        return config
    architecture = (config.architectures or [type(config).__name__])[0]
    raise ModelLoadError(
        f"{spec.name(revision)}: {architecture} ({config.model_type}) is {kind} model; "
        f"analyze measures decoder-only causal language models (GPT-2, Llama, Qwen, OLMo, …)"
    )


def load_encoder(spec: HFSpec, revision: str | None, paper_length: int | None) -> Encode:
    """The model's own tokenizer, adding no special tokens; with ``paper_length`` (``--protocol paper``) its
    default ones, truncated to that length as the authors' ``tokenizer(text, truncation=True, max_length=512)``:
    a suffix token such as EOS is kept, where cutting the ids afterwards would drop it."""
    from transformers import AutoTokenizer

    tokenizer = _from_pretrained(AutoTokenizer, spec, revision)
    if not tokenizer.vocab_size:  # transformers builds an empty one where the vocabulary files are missing
        raise ModelLoadError(
            f"{spec.name(revision)}: its tokenizer has no vocabulary (its tokenizer files, such as "
            "tokenizer.json, are missing or empty); copy the model's tokenizer files into it"
        )
    cut = {"truncation": True, "max_length": paper_length} if paper_length else {}
    return lambda texts: tokenizer(texts, add_special_tokens=bool(paper_length), verbose=False, **cut)["input_ids"]


def _auto_class(config):
    """AutoModelForCausalLM, or AutoModel for architectures without a causal-LM head."""
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or "AutoModelForCausalLM" in (
        getattr(config, "auto_map", None) or {}
    )
    return AutoModelForCausalLM if causal else AutoModel


def model_args(config) -> dict:
    """The shape recorded with each result (the fields ``compare`` and ``size_series`` read)."""
    text = config.get_text_config()
    dim = text.hidden_size
    return {
        "model_type": config.model_type,
        "dim": dim,
        "n_layers": text.num_hidden_layers,
        "mlp_hidden_dim": getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * dim,
        # learned or rotary positions the model was built for; None when unbounded (ALiBi)
        "max_seq_len": getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None),
    }


def count_parameters(spec: HFSpec, config) -> int:
    """Parameters of the whole model (each tied matrix once), counted on the meta device."""
    with loading(spec.model, spec.local), torch.device("meta"):
        model = _auto_class(config).from_config(config, trust_remote_code=spec.trust_remote_code)
        return sum(p.numel() for p in model.parameters())


def decoder_layers(backbone: nn.Module, count: int, name: str) -> nn.ModuleList:
    """The ModuleList of ``count`` decoder layers holding the most parameters."""
    candidates = [m for m in backbone.modules() if isinstance(m, nn.ModuleList) and len(m) == count]
    if not candidates:
        raise ModelLoadError(
            f"{name}: unsupported architecture ({type(backbone).__name__} has no list of {count} decoder layers)"
        )
    return max(candidates, key=lambda m: sum(p.numel() for p in m.parameters()))


class HFLayers(DecoderLayers):
    """A loaded Hugging Face model's backbone (no LM head), its decoder layers found generically; its last
    hidden state is the final norm's output."""

    def __init__(self, model: nn.Module, name: str):
        self.model = model.base_model
        self.blocks = list(decoder_layers(self.model, model.config.get_text_config().num_hidden_layers, name))
        self.input_device = self.model.get_input_embeddings().weight.device

    def final_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False)[0]


def load_pretrained(
    spec: HFSpec, revision: str | None, dtype: torch.dtype, device: torch.device, device_map: str | None
) -> HFLayers:
    """The model's weights in ``dtype``, on ``device`` or spread by ``device_map``, in eval mode."""
    from transformers.utils import logging

    config = load_config(spec, revision)
    level = logging.get_verbosity()
    logging.set_verbosity_error()  # transformers' multi-line load report: said below in one line
    try:
        model, info = _from_pretrained(
            _auto_class(config),
            spec,
            revision,
            dtype=dtype,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
            device_map=device_map,
        )
    finally:
        logging.set_verbosity(level)
    # a checkpoint whose backbone weights do not all load is refused (transformers would fill them at random)
    backbone = {id(t) for t in model.base_model.state_dict(keep_vars=True).values()}
    needed = {key for key, t in model.state_dict(keep_vars=True).items() if id(t) in backbone}
    problems = {
        "missing from the checkpoint": sorted(set(info["missing_keys"]) & needed),
        "in the checkpoint but not in the model": sorted(info["unexpected_keys"]),
        "of another shape": sorted(key for key, *_shapes in info["mismatched_keys"]),
    }
    if said := [f"{len(keys)} weight(s) {what} (e.g. {keys[0]})" for what, keys in problems.items() if keys]:
        raise ModelLoadError(
            f"{spec.name(revision)}: its weights do not load completely into {type(model).__name__} "
            f"({model.config.model_type}): {'; '.join(said)}; analyze measures decoder-only "
            f"causal language models whose checkpoint holds every weight they use"
        )
    if not device_map:
        model = model.to(device)
    return HFLayers(model.eval(), spec.name(revision))
