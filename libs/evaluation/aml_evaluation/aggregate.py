"""Aggregation of per-question outcomes (SPEC R-6.3): per category, per dataset and Overall, each
with its counts.

Rules, in the order they apply:
- A question that failed before it could be judged (participant outage, contract error, platform
  fault), whose judge verdict could not be read, or whose multiple-choice answer names no
  option, counts in `failed` under its kind, never as a wrong answer.
- An open question is correct when the judge's majority label is CORRECT; a multiple-choice
  question when the answer names the right option. `accuracy` = correct / scored over both;
  `judge_accuracy` is over the judged open questions only, `option_accuracy` over the
  multiple-choice questions only (option_correct / option_questions).
- `f1_mean` and `bleu1_mean` are over the scored open questions that have them (a question
  without a gold answer has no BLEU-1).
- An open question that no judge was asked about (offline rescoring without a label for it) is
  scored by F1 and BLEU-1 only: counted in `unjudged`, neither correct, wrong nor failed, and
  outside `judge_accuracy` and `accuracy`.
- With N judge runs, each run's own accuracy (over the questions that run could judge) is
  reported as a mean and a population standard deviation across runs.
- A cell's `headline` names the metric that ranks it: `accuracy` when some question in it has a
  verdict (judge or option), `f1_mean` when its scored questions were scored by token F1 alone
  (a dataset whose scorer is `token_f1`, Mem-Gallery's, is never judged).
- A dataset's overall is the micro-average over its categories except the excluded ones (LoCoMo's
  adversarial category is reported on its own, as the field does).
- Overall is the micro-average over every dataset's included questions (every question weighs
  the same).
- A streaming dataset asks a question at several points of its conversation: each (question,
  point) is one item, counted in its category, the dataset's overall and Overall like any other,
  and the dataset also reports `points`: its overall split by the point's ordinal among its
  question's points ("1", "2", ...). Other datasets have no `points`.
- A coding attempt (R-2.5) that was verified has a verdict, resolved or not: `attempts`,
  `resolved` and `resolved_rate` = resolved / attempts (the cell's headline). An attempt the
  platform failed (LLM outage, sandbox, infrastructure) counts in `failed` under its kind, never
  as unresolved. The categories are the memory conditions; Overall is over every attempt; a
  dataset whose attempts carry a task type also reports `task_types`, its overall split by it.
  Cells without coding attempts have none of these fields, so their results, and fingerprints,
  are as before.
- An ATM-Bench question (its score carries an answer type) is scored by that type (exact match
  1/0, Jaccard, the benchmark's judge 1/0): `qs_mean` is the mean over a cell's scored ATM-Bench
  questions, the headline of a cell whose scored questions are all ATM-Bench's. Its judge
  verdicts are not counted in `accuracy` (they are part of QS); an unreadable one is a
  judge_failure like any other.
- A question whose score records where its evidence was returned (`evidence_ranks`,
  aml_evaluation.evidence) adds to the cell's `evidence`: Recall@k (the share of its evidence
  in the first k candidates) and Joint@k (that recall when the question's own value is
  non-zero: its verdict, QS value or F1), each the mean over such scored questions. Cells
  without any have no `evidence`.
- Every cell with a headline figure reports `headline_ci`, its 95% interval: a seeded bootstrap
  over the values the figure is the mean of (`aml_evaluation.confidence`): 1/0 per verdict for
  `accuracy`, per verified attempt for `resolved_rate`, the F1 of each scored open question for
  `f1_mean`. It follows from those values, so the fingerprint leaves it out.
- The same values of the questions that count in Overall, keyed by question
  (`headline_values`), are what two results are compared over on the board (the paired
  bootstrap of `aml_evaluation.confidence.tied`).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from aml_contract.api.results import (
    DatasetResults,
    EvidenceFigures,
    Headline,
    Interval,
    JobResults,
    Metrics,
)
from aml_contract.api.vocabulary import JobState
from aml_evaluation.confidence import headline_interval
from aml_evaluation.evidence import EVIDENCE_K, recall_at

JudgeLabel = Literal["CORRECT", "WRONG"]
JUDGE_FAILURE = "judge_failure"
UNREADABLE_CHOICE = "unreadable_choice"


class QuestionOutcome(BaseModel):
    dataset_id: str
    category_name: str
    scored: bool = Field(description="False: the question failed before it could be scored.")
    failure_kind: str | None = None
    judge_label: JudgeLabel | None = None
    judge_labels: list[JudgeLabel | None] = Field(
        default_factory=list, description="One label (or None) per judge run."
    )
    judged: bool | None = Field(
        default=None,
        description="False: no judge verdict was asked for; F1 and BLEU-1 still count. Not "
        "given: judged iff a judge label or a judge run is recorded (a `token_f1` dataset's "
        "scores carry neither; every judged score has one label per run, None when unreadable).",
    )
    f1: float | None = None
    bleu1: float | None = None
    # Multiple choice: whether the answer named the right option (None: it named none).
    multiple_choice: bool = False
    choice_correct: bool | None = None
    question_id: str | None = None
    # Streaming datasets: the ordinal of the point the item was asked at (1-based).
    point_index: int | None = None
    # A coding attempt: whether its patch resolved the task (None: not a coding attempt,
    # or one that failed before it was verified), and its task's type where the dataset
    # declares one.
    resolved: bool | None = None
    task_type: str | None = None
    # An ATM-Bench question: its answer type and its value in QS (None: not scored).
    answer_type: str | None = None
    qs: float | None = None
    # Per evidence id, the rank of the first candidate that is it (None: not returned).
    evidence_ranks: dict[str, int | None] | None = None

    @model_validator(mode="after")
    def _judged_when_a_judge_ran(self) -> QuestionOutcome:
        if self.judged is None:
            self.judged = self.judge_label is not None or bool(self.judge_labels)
        return self

    @property
    def failure(self) -> str | None:
        """The kind this question failed with, or None when it was scored."""
        if not self.scored:
            return self.failure_kind or "failed"
        if self.multiple_choice:
            return UNREADABLE_CHOICE if self.choice_correct is None else None
        return JUDGE_FAILURE if self.judged and self.judge_label is None else None


@dataclass
class _Tally:
    questions: int = 0
    scored: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    judge_correct: int = 0
    judged: int = 0
    unjudged: int = 0
    option_correct: int = 0
    options: int = 0
    f1_values: list[float] = field(default_factory=list)
    bleu_values: list[float] = field(default_factory=list)
    # Per judge run: [correct, judged].
    runs: list[list[int]] = field(default_factory=list)
    attempts: int = 0
    resolved: int = 0
    qs_values: list[float] = field(default_factory=list)
    # Per question with evidence: (its own value is non-zero, its recall at each EVIDENCE_K).
    evidence: list[tuple[bool, tuple[float, ...]]] = field(default_factory=list)

    def add(self, outcome: QuestionOutcome) -> None:
        self.questions += 1
        failure = outcome.failure
        if failure is not None:
            self.failures[failure] += 1
            return
        self.scored += 1
        if outcome.evidence_ranks:
            ranks = outcome.evidence_ranks
            self.evidence.append(
                (bool(own_value(outcome)), tuple(recall_at(ranks, k) for k in EVIDENCE_K))
            )
        if outcome.answer_type is not None:
            if outcome.qs is not None:
                self.qs_values.append(outcome.qs)
            else:
                # An open_end answer that no judge was asked about (offline rescoring).
                self.unjudged += 1
            return
        if outcome.resolved is not None:
            self.attempts += 1
            self.resolved += outcome.resolved
            return
        if outcome.multiple_choice:
            self.options += 1
            self.option_correct += bool(outcome.choice_correct)
            return
        if outcome.f1 is not None:
            self.f1_values.append(outcome.f1)
        if outcome.bleu1 is not None:
            self.bleu_values.append(outcome.bleu1)
        if not outcome.judged:
            self.unjudged += 1
            return
        self.judged += 1
        self.judge_correct += outcome.judge_label == "CORRECT"
        while len(self.runs) < len(outcome.judge_labels):
            self.runs.append([0, 0])
        for run, label in zip(self.runs, outcome.judge_labels, strict=False):
            if label is not None:
                run[0] += label == "CORRECT"
                run[1] += 1

    def metrics(self, intervals: _Intervals | None = None) -> Metrics:
        per_run = [correct / judged for correct, judged in self.runs if judged]
        correct = self.judge_correct + self.option_correct
        # Unjudged questions have no verdict, so they are outside the accuracy.
        verdicts = self.judged + self.options
        coding = (
            {
                "attempts": self.attempts,
                "resolved": self.resolved,
                "resolved_rate": self.resolved / self.attempts,
            }
            if self.attempts
            else {}
        )
        headline = _headline(verdicts, self.f1_values, self.attempts, len(self.qs_values))
        return Metrics(
            questions=self.questions,
            scored=self.scored,
            failed=sum(self.failures.values()),
            failures=dict(sorted(self.failures.items())),
            accuracy=correct / verdicts if verdicts else None,
            judge_correct=self.judge_correct,
            judge_accuracy=self.judge_correct / self.judged if self.judged else None,
            unjudged=self.unjudged,
            option_correct=self.option_correct,
            option_questions=self.options,
            option_accuracy=self.option_correct / self.options if self.options else None,
            headline=headline,
            f1_mean=_mean(self.f1_values),
            bleu1_mean=_mean(self.bleu_values),
            headline_ci=(intervals or _Intervals()).of(self, headline, correct, verdicts),
            judge_runs=max(1, len(self.runs)),
            judge_run_accuracy_mean=_mean(per_run),
            judge_run_accuracy_spread=statistics.pstdev(per_run) if per_run else None,
            qs_mean=_mean(self.qs_values),
            evidence=self._evidence(),
            **coding,
        )

    def _evidence(self) -> EvidenceFigures | None:
        if not self.evidence:
            return None
        count = len(self.evidence)
        recall = {
            str(k): sum(recalls[i] for _, recalls in self.evidence) / count
            for i, k in enumerate(EVIDENCE_K)
        }
        joint = {
            str(k): sum(recalls[i] for correct, recalls in self.evidence if correct) / count
            for i, k in enumerate(EVIDENCE_K)
        }
        return EvidenceFigures(questions=count, recall=recall, joint=joint)


@dataclass
class _Intervals:
    """One aggregation's headline intervals by the values they are over, which is all an
    interval depends on: a job's Overall and its only dataset's overall have the same values,
    and the bootstrap is most of what aggregation costs (docs/performance.md)."""

    known: dict[tuple[object, ...], Interval | None] = field(default_factory=dict)

    def of(self, tally: _Tally, headline: Headline, correct: int, verdicts: int) -> Interval | None:
        """0/1 values are rebuilt from their counts, since the bootstrap sorts them anyway."""
        if headline in ("f1_mean", "qs_mean"):
            values = tally.f1_values if headline == "f1_mean" else tally.qs_values
            key: tuple[object, ...] = (headline, *sorted(values))
            if key not in self.known:
                self.known[key] = headline_interval(values, _mean(values))
            return self.known[key]
        coding = headline == "resolved_rate"
        ones, total = (tally.resolved, tally.attempts) if coding else (correct, verdicts)
        if not total:
            return None
        if (ones, total) not in self.known:
            values = [0.0] * (total - ones) + [1.0] * ones
            self.known[(ones, total)] = headline_interval(values, ones / total)
        return self.known[(ones, total)]


def _headline(
    verdicts: int, f1_values: list[float], attempts: int = 0, qs_scored: int = 0
) -> Headline:
    """`resolved_rate` for coding attempts (a job is of one track, so a cell never mixes them
    with questions); else `accuracy` whenever some question has a verdict; `f1_mean` when the
    scored questions were scored by F1 alone (a `token_f1` dataset such as Mem-Gallery);
    `qs_mean` when they are all ATM-Bench's."""
    if attempts and not verdicts:
        return "resolved_rate"
    if qs_scored and not verdicts and not f1_values:
        return "qs_mean"
    return "f1_mean" if not verdicts and f1_values else "accuracy"


def _point_metrics(
    points: dict[int, _Tally] | None, intervals: _Intervals
) -> dict[str, Metrics] | None:
    if not points:
        return None
    return {str(index): points[index].metrics(intervals) for index in sorted(points)}


def _task_type_metrics(
    task_types: dict[str, _Tally] | None, intervals: _Intervals
) -> dict[str, Metrics] | None:
    if not task_types:
        return None
    return {name: task_types[name].metrics(intervals) for name in sorted(task_types)}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate(
    job_id: str,
    state: JobState,
    outcomes: Iterable[QuestionOutcome],
    excluded: dict[str, list[str]],
    f1_variants: dict[str, str] | None = None,
) -> JobResults:
    """`excluded` maps a dataset id to the category names kept out of its overall;
    `f1_variants` names each dataset's token F1 (default the LoCoMo variant)."""
    per_category: dict[str, dict[str, _Tally]] = {}
    per_dataset: dict[str, _Tally] = {}
    per_point: dict[str, dict[int, _Tally]] = {}
    per_task_type: dict[str, dict[str, _Tally]] = {}
    overall = _Tally()
    for outcome in outcomes:
        categories = per_category.setdefault(outcome.dataset_id, {})
        categories.setdefault(outcome.category_name, _Tally()).add(outcome)
        if outcome.category_name in excluded.get(outcome.dataset_id, []):
            continue
        per_dataset.setdefault(outcome.dataset_id, _Tally()).add(outcome)
        overall.add(outcome)
        if outcome.point_index is not None:
            points = per_point.setdefault(outcome.dataset_id, {})
            points.setdefault(outcome.point_index, _Tally()).add(outcome)
        if outcome.task_type is not None:
            task_types = per_task_type.setdefault(outcome.dataset_id, {})
            task_types.setdefault(outcome.task_type, _Tally()).add(outcome)
    variants = f1_variants or {}
    intervals = _Intervals()
    datasets = {
        dataset_id: DatasetResults(
            dataset_id=dataset_id,
            overall=per_dataset.get(dataset_id, _Tally()).metrics(intervals),
            categories={
                name: tally.metrics(intervals) for name, tally in sorted(categories.items())
            },
            excluded_from_overall=sorted(excluded.get(dataset_id, [])),
            points=_point_metrics(per_point.get(dataset_id), intervals),
            task_types=_task_type_metrics(per_task_type.get(dataset_id), intervals),
            **({"f1_variant": variants[dataset_id]} if dataset_id in variants else {}),
        )
        for dataset_id, categories in sorted(per_category.items())
    }
    overall_metrics = overall.metrics(intervals)
    return JobResults(job_id=job_id, state=state, overall=overall_metrics, datasets=datasets)


def question_key(outcome: QuestionOutcome) -> str | None:
    """How a question is named across jobs of the same dataset: `<dataset_id>/<question_id>`,
    and `@<point ordinal>` for a streaming question's item at one point; None without an id."""
    if outcome.question_id is None:
        return None
    key = f"{outcome.dataset_id}/{outcome.question_id}"
    return key if outcome.point_index is None else f"{key}@{outcome.point_index}"


def headline_value(outcome: QuestionOutcome, headline: Headline) -> float | None:
    """What one question adds to a cell's `headline` figure, the figure being their mean (the
    rules of `_Tally.add`); None for a question outside it (failed, no verdict for
    `accuracy`, no F1 for `f1_mean`, not a coding attempt for `resolved_rate`)."""
    if outcome.failure is not None:
        return None
    if headline == "resolved_rate":
        return None if outcome.resolved is None else float(outcome.resolved)
    if outcome.resolved is not None:
        return None
    if headline == "qs_mean" or outcome.answer_type is not None:
        return outcome.qs if headline == "qs_mean" else None
    if headline == "f1_mean":
        return None if outcome.multiple_choice else outcome.f1
    if outcome.multiple_choice:
        return float(bool(outcome.choice_correct))
    return float(outcome.judge_label == "CORRECT") if outcome.judged else None


def own_value(outcome: QuestionOutcome) -> float | None:
    """A scored question's value by its own scoring: its QS value (ATM-Bench), its verdict
    (1/0, judged or multiple choice), its resolution, or its F1 when that is all it has."""
    if outcome.answer_type is not None:
        return outcome.qs
    if outcome.resolved is not None:
        return float(outcome.resolved)
    if outcome.multiple_choice:
        return float(bool(outcome.choice_correct))
    if outcome.judged:
        return float(outcome.judge_label == "CORRECT")
    return outcome.f1


def headline_values(
    outcomes: Iterable[QuestionOutcome], excluded: dict[str, list[str]], headline: Headline
) -> dict[str, float]:
    """Question key -> its value in Overall's `headline` figure, over the questions that count
    in Overall (the excluded categories left out): their mean is Overall's figure."""
    values: dict[str, float] = {}
    for outcome in outcomes:
        if outcome.category_name in excluded.get(outcome.dataset_id, []):
            continue
        key, value = question_key(outcome), headline_value(outcome, headline)
        if key is not None and value is not None:
            values[key] = value
    return values


# Metrics computed from others in the fingerprint: left out, so adding one to the results
# does not change the fingerprint of the same numbers (results stored before it was added).
# `headline_ci` follows from the per-question values and the spec's bootstrap.
_DERIVED_METRICS = frozenset({"option_accuracy", "headline", "headline_ci"})
# A derived metric that is an object (an interval) is told from a category of the same name,
# whose metrics are an object too, by its fields.
_INTERVAL_FIELDS = frozenset(Interval.model_fields)


def results_fingerprint(datasets: Mapping[str, Any]) -> str:
    """sha256 of a job's per-dataset results (`JobResults.datasets`, as stored: its JSON dump) in
    canonical JSON: sorted keys, no spaces, UTF-8, and integral floats written as integers so a
    store that reads `1.0` back as `1` gives the same fingerprint. Two jobs with the same
    fingerprint reported the same numbers for every dataset and category (R-3.8 duplicates).
    Derived metrics (`option_accuracy` = option_correct / option_questions, `headline` which
    follows from the counts, `headline_ci` from the per-question values) are left out."""
    canonical = json.dumps(
        _canonical(datasets), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _derived(key: Any, item: Any) -> bool:
    if key not in _DERIVED_METRICS:
        return False
    return not isinstance(item, Mapping) or set(item) == _INTERVAL_FIELDS


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            str(key): _canonical(item) for key, item in value.items() if not _derived(key, item)
        }
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
