"""A job's results table: metrics per dataset, per category and Overall."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from aml_contract.api.vocabulary import JobState, Track

# The Metrics field that is a cell's headline score.
Headline = Literal["accuracy", "f1_mean", "resolved_rate"]


class Metrics(BaseModel):
    """One cell of the results table. Failed questions (participant outage, contract error,
    judge failure) are counted apart, by kind, and never scored as wrong."""

    questions: int
    scored: int
    failed: int
    failures: dict[str, int] = Field(
        default_factory=dict, description="Failed questions by kind (judge_failure, ...)."
    )
    accuracy: float | None = Field(
        default=None,
        description="The headline: correct / scored, over judged open questions and "
        "multiple-choice questions together.",
    )
    judge_correct: int
    judge_accuracy: float | None
    unjudged: int = Field(
        default=0,
        description="Scored open questions with F1 and BLEU-1 but no judge verdict asked for "
        "(offline rescoring without a label for them): not failures, outside judge_accuracy.",
    )
    option_correct: int = 0
    option_questions: int = Field(default=0, description="Scored multiple-choice questions.")
    option_accuracy: float | None = Field(
        default=None,
        description="option_correct / option_questions: multiple-choice questions alone, over "
        "the answers that named an option (those naming none are failures, unreadable_choice).",
    )
    headline: Headline = Field(
        default="accuracy",
        description="Which field is this cell's headline: `accuracy`, `f1_mean` when its "
        "questions were scored by token F1 alone (a `token_f1` dataset such as Mem-Gallery, "
        "whose questions are `unjudged` and whose accuracy is None), or `resolved_rate` for "
        "the coding track's attempts.",
    )
    # The coding track's attempts; absent (not null) from a cell without any, so
    # earlier results, and their fingerprints, are unchanged.
    attempts: int | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="Coding attempts verified (resolved or not); attempts the platform failed "
        "are counted in `failed`, never here.",
    )
    resolved: int | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="Coding attempts whose patch made every FAIL_TO_PASS test pass and kept "
        "every PASS_TO_PASS test passing.",
    )
    resolved_rate: float | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="resolved / attempts: the coding track's headline.",
    )
    f1_mean: float | None
    bleu1_mean: float | None = None
    judge_runs: int = Field(default=1, description="Judge calls per question (majority vote).")
    judge_run_accuracy_mean: float | None = Field(
        default=None, description="Mean over judge runs of each run's own accuracy."
    )
    judge_run_accuracy_spread: float | None = Field(
        default=None, description="Population standard deviation of the per-run accuracies."
    )


class DatasetResults(BaseModel):
    dataset_id: str
    overall: Metrics
    categories: dict[str, Metrics]
    excluded_from_overall: list[str]
    f1_variant: str = Field(default="f1-locomo-v1", description="Which token F1 `f1_mean` is.")
    # Absent (not null) for a dataset that is not streaming, so earlier results, and their
    # fingerprints, are unchanged.
    points: dict[str, Metrics] | None = Field(
        default=None,
        exclude_if=lambda points: points is None,
        description="Streaming datasets only: the dataset's overall split by the point where "
        "each question was asked, keyed by the point's ordinal among its question's points "
        '("1" = its first point, "2" = its second, ...).',
    )
    # Absent (not null) for a dataset that declares no task types, as `points`.
    task_types: dict[str, Metrics] | None = Field(
        default=None,
        exclude_if=lambda task_types: task_types is None,
        description="Coding datasets only: the dataset's overall split by the task type the "
        'dataset declares for each task ("debug", "development").',
    )


class JobResults(BaseModel):
    job_id: str
    state: JobState
    track: Track | None = Field(
        default=None,
        description="The job's track (R-2.1): every dataset of the job is of this track, and "
        "its scores compare only with other results of the same track. Set by the API from "
        "the job.",
    )
    overall: Metrics
    datasets: dict[str, DatasetResults]
