"""Hugging Face GPT-2 <-> our state dicts: HF's ``Conv1D`` weights transposed, its fused ``c_attn``
split into ``wq/wk/wv``; plain tensors and DTensors alike.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future
from torchtitan.protocols.state_dict_adapter import StateDictAdapter

from .args import GPT2ModelArgs

# (ours, HF) for parameters that map one-to-one; "{}" is the block index.
_DIRECT = (
    ("tok_embeddings.weight", "transformer.wte.weight"),
    ("pos_embeddings.weight", "transformer.wpe.weight"),
    ("norm.weight", "transformer.ln_f.weight"),
    ("norm.bias", "transformer.ln_f.bias"),
    ("layers.{}.attention_norm.weight", "transformer.h.{}.ln_1.weight"),
    ("layers.{}.attention_norm.bias", "transformer.h.{}.ln_1.bias"),
    ("layers.{}.ffn_norm.weight", "transformer.h.{}.ln_2.weight"),
    ("layers.{}.ffn_norm.bias", "transformer.h.{}.ln_2.bias"),
    ("layers.{}.attention.wo.bias", "transformer.h.{}.attn.c_proj.bias"),
    ("layers.{}.feed_forward.w1.bias", "transformer.h.{}.mlp.c_fc.bias"),
    ("layers.{}.feed_forward.w2.bias", "transformer.h.{}.mlp.c_proj.bias"),
)
# Conv1D weights: transposed.
_TRANSPOSED = (
    ("layers.{}.attention.wo.weight", "transformer.h.{}.attn.c_proj.weight"),
    ("layers.{}.feed_forward.w1.weight", "transformer.h.{}.mlp.c_fc.weight"),
    ("layers.{}.feed_forward.w2.weight", "transformer.h.{}.mlp.c_proj.weight"),
)
_QKV = ("wq", "wk", "wv")
_C_ATTN = (("weight", True), ("bias", False))  # HF's fused c_attn: wq, wk, wv concatenated; a weight transposed
# Buffers some GPT-2 checkpoints carry (causal mask); they are not parameters.
_HF_BUFFERS = re.compile(r"\.attn\.(bias|masked_bias)$")


def _canonical_hf_key(key: str) -> str:
    """The original OpenAI-converted checkpoints omit the ``transformer.`` prefix."""
    return key if key.startswith(("transformer.", "lm_head.")) else f"transformer.{key}"


class GPT2StorageReader(HuggingFaceStorageReader):
    """Reads HF GPT-2 safetensors under canonical key names (original files lack ``transformer.`` and
    carry ``attn.bias`` buffers, which are hidden), each slice under the file's own key."""

    def read_metadata(self) -> Metadata:
        metadata = super().read_metadata()
        metadata.state_dict_metadata = {
            _canonical_hf_key(k): v for k, v in metadata.state_dict_metadata.items() if not _HF_BUFFERS.search(k)
        }
        # the canonical keys added: the file's own stay for read_data
        metadata.storage_data |= {
            MetadataIndex(_canonical_hf_key(i.fqn), i.offset): v for i, v in metadata.storage_data.items()
        }
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        def own(index: MetadataIndex) -> MetadataIndex:
            short = MetadataIndex(index.fqn.removeprefix("transformer."), index.offset)
            return short if short in self.storage_data else index

        items = [dataclasses.replace(item, storage_index=own(item.storage_index)) for item in plan.items]
        return super().read_data(dataclasses.replace(plan, items=items), planner)


class GPT2StateDictAdapter(StateDictAdapter):
    def __init__(self, model_args: GPT2ModelArgs, hf_assets_path: str | None):
        super().__init__(model_args, hf_assets_path)
        self.model_args = model_args

    def get_hf_storage_reader(self, path: str, from_quantized: bool = False) -> GPT2StorageReader:
        return GPT2StorageReader(path)  # from_quantized: refused by the launch checks

    def _pairs(self) -> Iterator[tuple[str, str, bool]]:
        """(ours, HF, transposed) of every parameter that maps one-to-one, per block where it is one."""
        for table, transposed in ((_DIRECT, False), (_TRANSPOSED, True)):
            for ours, hf in table:
                for i in range(self.model_args.n_layers) if "{}" in ours else [None]:
                    yield ours.format(i), hf.format(i), transposed

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        hf: dict[str, Any] = {}
        for ours, theirs, transposed in self._pairs():
            hf[theirs] = state_dict[ours].t().contiguous() if transposed else state_dict[ours]
        for i in range(self.model_args.n_layers):
            for kind, transposed in _C_ATTN:
                fused = torch.cat([state_dict[f"layers.{i}.attention.{w}.{kind}"] for w in _QKV], dim=0)
                hf[f"transformer.h.{i}.attn.c_attn.{kind}"] = fused.t().contiguous() if transposed else fused
        if not self.model_args.tie_embeddings:
            hf["lm_head.weight"] = state_dict["output.weight"]
        return hf

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        hf = {_canonical_hf_key(k): v for k, v in hf_state_dict.items() if not _HF_BUFFERS.search(k)}
        ours: dict[str, Any] = {}
        for mine, theirs, transposed in self._pairs():
            ours[mine] = hf[theirs].t().contiguous() if transposed else hf[theirs]
        for i in range(self.model_args.n_layers):
            for kind, transposed in _C_ATTN:
                fused = hf[f"transformer.h.{i}.attn.c_attn.{kind}"]
                for name, part in zip(_QKV, (fused.t() if transposed else fused).chunk(3, dim=0)):
                    ours[f"layers.{i}.attention.{name}.{kind}"] = part.contiguous()
        ours["output.weight"] = (
            ours["tok_embeddings.weight"] if self.model_args.tie_embeddings else hf["lm_head.weight"]
        )
        return ours
