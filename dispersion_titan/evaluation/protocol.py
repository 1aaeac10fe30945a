"""What is evaluated and how it is scored: the paper's protocol (Table 2 of arXiv
2602.00217, as the authors' code runs it for GPT-2) and user overrides of it."""

from __future__ import annotations

from dataclasses import dataclass

from . import EvaluationError

PROTOCOLS = ("paper",)
ZERO_SHOT = ("anli_r2", "lambada_openai", "openbookqa", "piqa", "truthfulqa_mc2", "winogrande")
ONE_SHOT = ("arc_easy", "arc_challenge", "medmcqa", "mmlu")
PERPLEXITY = ("paloma_wikitext_103",)
PAPER_TASKS = (*ZERO_SHOT, *ONE_SHOT, *PERPLEXITY)
PAPER_FEWSHOT = {name: 1 if name in ONE_SHOT else 0 for name in PAPER_TASKS}
PAPER_LIMIT = 500

# A task's score: lm-eval's `acc` where it has one, else its word perplexity.
ACCURACY = "acc"
WORD_PERPLEXITY = "word_perplexity"
_FILTER = "none"  # lm-eval keys metrics as "metric,filter"; loglikelihood tasks use "none"


@dataclass(frozen=True)
class Plan:
    """Tasks in order, shots per task (None: the task's own default) and the limit."""

    protocol: str
    tasks: tuple[str, ...]
    num_fewshot: dict[str, int | None]
    limit: int | None

    def settings(self) -> dict:
        """What makes two evaluations of one checkpoint comparable (stored with each)."""
        return {"protocol": self.protocol, "tasks": list(self.tasks), "num_fewshot": self.num_fewshot,
                "limit": self.limit}


def task_names(spec: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in spec.split(","))
    if not all(names):
        raise EvaluationError(f"--tasks: {spec!r} has an empty task name")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise EvaluationError(f"--tasks: {repeated[0]} is listed twice")
    return names


def build_plan(tasks: str | None, num_fewshot: int | None, limit: int | None | str,
               protocol: str = "paper") -> Plan:
    """The paper's plan, with --tasks / --num-fewshot / --limit replacing its parts.
    Tasks outside the paper keep their own few-shot default unless --num-fewshot;
    ``limit`` "all" evaluates every example."""
    names = task_names(tasks) if tasks is not None else PAPER_TASKS
    shots = {name: num_fewshot if num_fewshot is not None else PAPER_FEWSHOT.get(name) for name in names}
    return Plan(protocol, names, shots, None if limit == "all" else limit or PAPER_LIMIT)


def task_scores(metrics_by_task: dict[str, dict], tasks: list[str]) -> dict[str, float]:
    """``{"task/metric": value}`` for each of ``tasks`` (or groups) that lm-eval's
    ``results`` entry gives ``acc`` or ``word_perplexity``, in the order of ``tasks``."""
    scores = {}
    for name in tasks:
        metrics = metrics_by_task.get(name, {})
        for metric in (ACCURACY, WORD_PERPLEXITY):
            if f"{metric},{_FILTER}" in metrics:
                scores[f"{name}/{metric}"] = float(metrics[f"{metric},{_FILTER}"])
                break
    return scores


def is_accuracy(column: str) -> bool:
    return column.endswith(f"/{ACCURACY}")


def mean_accuracy(scores: dict[str, float]) -> float | None:
    """The paper's average: accuracies only, perplexity left out."""
    accuracies = [value for column, value in scores.items() if is_accuracy(column)]
    return sum(accuracies) / len(accuracies) if accuracies else None
