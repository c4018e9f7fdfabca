"""Aggregation of per-question outcomes (SPEC R-6.3): per category, per dataset and Overall, each
with its counts.

Rules, in the order they apply:
- A question that failed before it could be judged (participant outage, contract error, platform
  fault) or whose judge reply could not be parsed counts in `failed`, never as a wrong answer.
- `judge_accuracy` = judge_correct / scored; `f1_mean` is over the scored questions.
- A dataset's overall is the micro-average over its categories except the excluded ones (LoCoMo's
  adversarial category is reported on its own, as the field does).
- Overall is the micro-average over every dataset's included questions (every question weighs
  the same; declared suite weights arrive with the evaluation spec).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from aml_contract.api import DatasetResults, JobResults, JobState, Metrics

JudgeLabel = Literal["CORRECT", "WRONG"]


class QuestionOutcome(BaseModel):
    dataset_id: str
    category_name: str
    scored: bool
    judge_label: JudgeLabel | None = None
    f1: float | None = None


@dataclass
class _Tally:
    questions: int = 0
    scored: int = 0
    failed: int = 0
    correct: int = 0
    f1_values: list[float] = field(default_factory=list)

    def add(self, outcome: QuestionOutcome) -> None:
        self.questions += 1
        if not outcome.scored or outcome.judge_label is None:
            self.failed += 1
            return
        self.scored += 1
        self.correct += outcome.judge_label == "CORRECT"
        if outcome.f1 is not None:
            self.f1_values.append(outcome.f1)

    def metrics(self) -> Metrics:
        return Metrics(
            questions=self.questions,
            scored=self.scored,
            failed=self.failed,
            judge_correct=self.correct,
            judge_accuracy=self.correct / self.scored if self.scored else None,
            f1_mean=sum(self.f1_values) / len(self.f1_values) if self.f1_values else None,
        )


def aggregate(
    job_id: str,
    state: JobState,
    outcomes: Iterable[QuestionOutcome],
    excluded: dict[str, list[str]],
) -> JobResults:
    """`excluded` maps a dataset id to the category names kept out of its overall."""
    per_category: dict[str, dict[str, _Tally]] = {}
    per_dataset: dict[str, _Tally] = {}
    overall = _Tally()
    for outcome in outcomes:
        categories = per_category.setdefault(outcome.dataset_id, {})
        categories.setdefault(outcome.category_name, _Tally()).add(outcome)
        if outcome.category_name in excluded.get(outcome.dataset_id, []):
            continue
        per_dataset.setdefault(outcome.dataset_id, _Tally()).add(outcome)
        overall.add(outcome)
    datasets = {
        dataset_id: DatasetResults(
            dataset_id=dataset_id,
            overall=per_dataset.get(dataset_id, _Tally()).metrics(),
            categories={name: tally.metrics() for name, tally in sorted(categories.items())},
            excluded_from_overall=sorted(excluded.get(dataset_id, [])),
        )
        for dataset_id, categories in sorted(per_category.items())
    }
    return JobResults(job_id=job_id, state=state, overall=overall.metrics(), datasets=datasets)
