"""The run's tokenizer as TorchTitan's interface: GPT-2's BPE or TorchTitan's HuggingFaceTokenizer
over the model's folder (``encoders.tokenizer_folder`` chooses)."""

from __future__ import annotations

from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer
from torchtitan.config import JobConfig

from ..tokenizer.encoders import EOT_ID, gpt2_encoding, tokenizer_folder


class GPT2Tokenizer(BaseTokenizer):
    """The exact ``gpt2`` encoding; no BOS (``add_bos`` adds nothing), ``<|endoftext|>`` as EOS."""

    def __init__(self) -> None:
        super().__init__()
        self.encoding = gpt2_encoding()
        self.eos_id = EOT_ID

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        del add_bos
        ids = self.encoding.encode_ordinary(text)
        return ids + [EOT_ID] if add_eos else ids

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)

    def get_vocab_size(self) -> int:
        return self.encoding.n_vocab


def build_tokenizer(job_config: JobConfig) -> BaseTokenizer:
    """Every TrainSpec's ``build_tokenizer_fn``."""
    folder = tokenizer_folder(job_config.model.name, job_config.model.hf_assets_path)
    return GPT2Tokenizer() if folder is None else HuggingFaceTokenizer(folder)
