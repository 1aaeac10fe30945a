"""Writes the tiny offline lm-eval tasks the evaluation tests run, from the embedded
Wikipedia sample (held-out articles), so the tests never touch the hub:

- ``wiki_next_word.jsonl``: "which word continues this sentence", 4 choices (the true
  next word and 3 other words of the same article), scored by ``acc``;
- ``wiki_text.jsonl``: a few short passages for ``loglikelihood_rolling`` (perplexity).

Run once from the repository root; the jsonl files are committed:
    PYTHONPATH=. python tests/lm_eval_tasks/make_tasks.py
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from dispersion_titan.data.corpora import iter_documents

HERE = Path(__file__).resolve().parent
ITEMS = 40
PASSAGES = 6
_WORD = re.compile(r"^[A-Za-z]{4,}$")


def sentences(article: str) -> list[list[str]]:
    """Sentences of at least 12 words, as word lists."""
    return [s.split() for s in re.split(r"(?<=[.!?])\s+", article) if len(s.split()) >= 12]


def next_word_items(articles: list[str], rng: random.Random) -> list[dict]:
    items = []
    for article in articles:
        words = sorted({w for w in article.split() if _WORD.match(w)})
        for sentence in sentences(article)[:10]:
            cut = rng.randrange(6, len(sentence) - 1)
            answer = sentence[cut]
            if not _WORD.match(answer):
                continue
            distractors = rng.sample([w for w in words if w.lower() != answer.lower()], 3)
            choices = [answer, *distractors]
            rng.shuffle(choices)
            items.append({"context": " ".join(sentence[:cut]), "choices": choices, "label": choices.index(answer)})
    return items[:ITEMS]


def passages(articles: list[str]) -> list[dict]:
    """The first 60 words of the first long paragraphs."""
    paragraphs = [p for a in articles for p in a.split("\n") if len(p.split()) >= 60]
    return [{"text": " ".join(p.split()[:60])} for p in paragraphs[:PASSAGES]]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def main() -> None:
    articles = list(iter_documents("enwiki_sample", "validation", None, "dataset"))
    items = next_word_items(articles, random.Random(0))
    assert len(items) == ITEMS, len(items)
    write_jsonl(HERE / "wiki_next_word.jsonl", items)
    write_jsonl(HERE / "wiki_text.jsonl", passages(articles))


if __name__ == "__main__":
    main()
