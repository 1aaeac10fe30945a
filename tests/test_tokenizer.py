"""The offline GPT-2 tokenizer and the embedded Wikipedia corpus.

References: tiktoken's own gpt2 definition (file hashes, split pattern, vocabulary size)
and Hugging Face ``tokenizers`` (an independent BPE implementation) on the same files.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import shutil

import tiktoken.load
import tiktoken_ext.openai_public as openai_public
import transformers
from tokenizers import Tokenizer, models

from dispersion_titan.data import corpora
from dispersion_titan.data.corpora import ENWIKI_VALIDATION_EVERY, iter_documents
from dispersion_titan.tokenizer.encoders import EOT_ID, EOT_TOKEN, GPT2_BPE, HFTokenizerFile, bpe_files, gpt2_encoding


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def articles(split: str) -> list[str]:
    return list(iter_documents("enwiki_sample", split, None, "training.dataset"))


def test_hello_world():
    assert gpt2_encoding().encode_ordinary("Hello world") == [15496, 995]


def test_vocabulary_and_endoftext():
    encoding = gpt2_encoding()
    assert GPT2_BPE.vocab_size == encoding.n_vocab == 50257
    assert EOT_ID == 50256 and GPT2_BPE.eos_id == 50256
    assert encoding.encode(EOT_TOKEN, allowed_special="all") == [50256]
    assert next(GPT2_BPE.tokenize(["end"]))[-1] == 50256
    assert EOT_ID not in encoding.encode_ordinary(f"text {EOT_TOKEN} text")  # ordinary text, never the separator


def test_files_are_the_ones_tiktoken_verifies_for_gpt2(monkeypatch, tmp_path):
    """tiktoken's own gpt2 definition, fed our files instead of its download, checks their
    SHA-256 (it raises on a mismatch) and must tokenise exactly as we do."""
    expected = dict(
        re.findall(r'(vocab_bpe|encoder_json)_hash="([0-9a-f]{64})"', inspect.getsource(openai_public.gpt2))
    )
    encoder_json, vocab_bpe = bpe_files()
    assert sha256(encoder_json) == expected["encoder_json"]
    assert sha256(vocab_bpe) == expected["vocab_bpe"]
    local = {"encoder.json": encoder_json, "vocab.bpe": vocab_bpe}
    monkeypatch.setattr(tiktoken.load, "read_file", lambda url: open(local[url.rsplit("/", 1)[1]], "rb").read())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty cache: every file goes through the hash check
    reference = tiktoken.Encoding(**openai_public.gpt2())
    assert reference.n_vocab == 50257
    ours = gpt2_encoding()
    texts = [*articles("validation"), "x   \t\n  y  ", "a \n\n b", "hello   world   ", "\n\n\n", "a\u00a0 b"]
    for text in texts:
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text)


def test_round_trip_on_wikipedia_text():
    tokenizer = gpt2_encoding()
    texts = articles("train") + articles("validation")
    assert len(texts) == 106
    for text, ids in zip(texts, map(tokenizer.encode_ordinary, texts), strict=True):
        assert tokenizer.decode(ids) == text


def test_same_ids_as_huggingface_tokenizers(tmp_path):
    encoder_json, vocab_bpe = bpe_files()
    shutil.copy(encoder_json, tmp_path / "vocab.json")
    shutil.copy(vocab_bpe, tmp_path / "merges.txt")
    reference = transformers.GPT2TokenizerFast.from_pretrained(str(tmp_path))
    ours = gpt2_encoding()
    texts = articles("validation")
    assert len(texts) == 10
    for text in texts:
        assert ours.encode_ordinary(text) == reference(text)["input_ids"]


def test_embedded_corpus_counts_split_and_markup():
    train, validation = articles("train"), articles("validation")
    assert len(train) + len(validation) == 106  # the real articles of gensim's sample dump
    assert len(validation) == 106 // ENWIKI_VALIDATION_EVERY == 10
    assert not set(train) & set(validation)
    corpora._enwiki_articles.cache_clear()  # a fresh extraction from the dump gives the same split
    assert (train, validation) == (articles("train"), articles("validation"))
    for text in train + validation:
        assert text and "{{" not in text and "[[" not in text and "'''" not in text


def test_a_folders_special_tokens_as_transformers_writes_them(tmp_path):
    """tokenizer_config.json names a token as text or as transformers' ``{"content": ...}``; no pad_token: EOS pads."""
    Tokenizer(models.WordLevel({"a": 0, "<eos>": 1, "<pad>": 2}, unk_token="a")).save(str(tmp_path / "tokenizer.json"))
    for config, eos_id, pad_id in (
        ('{"eos_token": "<eos>"}', 1, 1),
        ('{"eos_token": {"content": "<eos>"}, "pad_token": {"content": "<pad>"}}', 1, 2),
        ('{"eos_token": "<eos>", "pad_token": "<pad>"}', 1, 2),
    ):
        (tmp_path / "tokenizer_config.json").write_text(config)
        encoder = HFTokenizerFile(str(tmp_path))
        assert (encoder.eos_token, encoder.eos_id, encoder.pad_id) == ("<eos>", eos_id, pad_id), config
