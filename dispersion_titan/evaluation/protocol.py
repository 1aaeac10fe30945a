"""What is evaluated and how it is scored: the authors' two protocols (Table 2 of arXiv 2602.00217) and
user overrides of them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..utils.errors import EvaluationError
from ..utils.records import finite_number

# What Table 2 reports of the authors' two simple_evaluate calls (zero-shot, few-shot); their other
# zero-shot names (groups, hellaswag) get their shots too when asked for with --tasks.
ZERO_SHOT = ("anli_r2", "lambada_openai", "openbookqa", "piqa", "truthfulqa_mc2", "winogrande")
FEW_SHOT = ("arc_easy", "arc_challenge", "medmcqa", "mmlu")
PERPLEXITY = ("paloma_wikitext_103",)
PAPER_TASKS = (*ZERO_SHOT, *FEW_SHOT, *PERPLEXITY)
_AUTHORS_ZERO_SHOT_NAMES = ("anli", "hellaswag", "lambada", *ZERO_SHOT, *PERPLEXITY)


@dataclass(frozen=True)
class Protocol:
    """One of the authors' settings: shots of the few-shot tasks and examples per task."""

    few_shot: int  # --num_fewshot of the authors' script
    limit: int  # --max_eval_samples of the authors' script

    def shots(self, task: str) -> int | None:
        """The task's shots under this protocol; None for a task the authors did not run."""
        return self.few_shot if task in FEW_SHOT else 0 if task in _AUTHORS_ZERO_SHOT_NAMES else None


PRESETS = {
    "gpt2": Protocol(1, 500),  # lm_dispersion/midtrain_gpt2_huggingface/midtrain_gpt2.py
    "qwen3": Protocol(5, 200),  # lm_dispersion/midtrain_qwen3_huggingface/midtrain_qwen3.py
}
DEFAULT_PROTOCOL = "gpt2"
FAMILY_PROTOCOLS = {"gpt2": "gpt2", "qwen3_dispersion": "qwen3", "qwen3": "qwen3"}
"""A run's model family, or a Hugging Face model's ``model_type`` -> the authors' protocol for it (others:
``DEFAULT_PROTOCOL``, with a note)."""
AUTHORS_BATCH_SIZE = 1
"""The authors' lm-eval batch size: padded batches move log-likelihoods by ~1e-6, so a tie can flip."""


def run_protocol(model_name: str) -> tuple[str, str | None]:
    """The protocol of a run of family ``model_name``, and a note when no authors' protocol matches it."""
    if model_name in FAMILY_PROTOCOLS:
        return FAMILY_PROTOCOLS[model_name], None
    return DEFAULT_PROTOCOL, (
        f"the authors evaluated no {model_name} model; using --protocol {DEFAULT_PROTOCOL} "
        f"(--protocol {' or '.join(PRESETS)} chooses)"
    )


BEST_STEP = {
    "auto": "per seed for mid-training arms, on the seed-averaged curve for from-scratch arms",
    "per-seed": "per seed",
    "averaged": "on the seed-averaged curve",
}
"""``evaluate table --best-step``'s choices (its help says what each does), as the table's note names them."""
TESTS = {"student": "Student's", "welch": "Welch's"}
"""``evaluate table --test``'s choices, as the table's note names them."""

# A task's score: lm-eval's `acc` where it has one, else its word perplexity.
ACCURACY = "acc"
WORD_PERPLEXITY = "word_perplexity"
_FILTER = "none"  # lm-eval keys metrics as "metric,filter"; loglikelihood tasks use "none"


@dataclass(frozen=True)
class TaskSelection:
    """Tasks in order, shots per task (None: the task's own default) and the limit."""

    protocol: str
    tasks: tuple[str, ...]
    num_fewshot: dict[str, int | None]
    limit: int | None

    def settings(self) -> dict:
        """What makes two evaluations of one checkpoint comparable (stored with each)."""
        return {**asdict(self), "tasks": list(self.tasks)}  # as JSON reads it back


def select_tasks(
    tasks: str | None, num_fewshot: int | None, limit: int | None | str, protocol: str = DEFAULT_PROTOCOL
) -> TaskSelection:
    """The protocol's tasks, shots and limit, with --tasks / --num-fewshot / --limit replacing its parts."""
    preset = PRESETS[protocol]
    names = PAPER_TASKS if tasks is None else tuple(name.strip() for name in tasks.split(","))
    if not all(names):
        raise EvaluationError(f"--tasks: {tasks!r} has an empty task name")
    if repeated := sorted({name for name in names if names.count(name) > 1}):
        raise EvaluationError(f"--tasks: {repeated[0]} is listed twice")
    shots = {name: num_fewshot if num_fewshot is not None else preset.shots(name) for name in names}
    return TaskSelection(protocol, names, shots, None if limit == "all" else limit or preset.limit)


def task_scores(metrics_by_task: dict[str, dict], tasks: list[str]) -> dict[str, float]:
    """``{"task/metric": value}``, ``acc`` else ``word_perplexity``, for each of ``tasks`` that has one."""
    scores = {}
    for name in tasks:
        metrics = metrics_by_task.get(name, {})
        for metric in (ACCURACY, WORD_PERPLEXITY):
            if (key := f"{metric},{_FILTER}") in metrics:
                scores[f"{name}/{metric}"] = finite_number(metrics[key], f"results.{name}.{key}")
                break
    return scores


def is_accuracy(column: str) -> bool:
    return column.endswith(f"/{ACCURACY}")


def mean_accuracy(scores: dict[str, float]) -> float | None:
    """The paper's average: accuracies only, perplexity left out."""
    accuracies = [value for column, value in scores.items() if is_accuracy(column)]
    return sum(accuracies) / len(accuracies) if accuracies else None
