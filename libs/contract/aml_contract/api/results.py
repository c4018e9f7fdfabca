"""A job's results table: metrics per dataset, per category and Overall."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from aml_contract.api.vocabulary import JobState, Track

# The Metrics field that is a cell's headline score.
Headline = Literal["accuracy", "f1_mean", "resolved_rate", "qs_mean"]


class Interval(BaseModel):
    """A confidence interval of a headline figure (`low` <= the figure <= `high`, as a share in
    [0, 1] like the figure): a seeded bootstrap over the cell's scored questions, its method,
    level, resamples and seed in the evaluation spec (`confidence`)."""

    low: float
    high: float


class EvidenceFigures(BaseModel):
    """How much of its questions' evidence a system's Searches returned (ATM-Bench's Recall@k
    and Joint@k; aml_evaluation.evidence says how the platform recognises evidence)."""

    questions: int = Field(
        description="Scored questions with evidence the platform can recognise; the figures are "
        "means over them."
    )
    recall: dict[str, float] = Field(
        description="k -> mean over those questions of |evidence in the first k candidates| / "
        "|evidence|."
    )
    joint: dict[str, float] = Field(
        description="k -> mean of correct x recall@k, correct being a non-zero headline value "
        "for the question (ATM-Bench's joint_partial@k)."
    )


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
        "whose questions are `unjudged` and whose accuracy is None), `resolved_rate` for "
        "the coding track's attempts, or `qs_mean` for ATM-Bench's questions.",
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
    # ATM-Bench's question-type score; absent (not null) from a cell without ATM-Bench questions,
    # so earlier results, and their fingerprints, are unchanged.
    qs_mean: float | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="ATM-Bench's QS: the mean over scored questions of their score by answer "
        "type (exact match 1/0, Jaccard, judge 1/0).",
    )
    evidence: EvidenceFigures | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="Recall@k and Joint@k of the evidence the cell's questions declare. Absent "
        "where no question declares evidence the platform can recognise.",
    )
    headline_ci: Interval | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="95% confidence interval of the headline figure (bootstrap over the cell's "
        "scored questions; method and seed in the evaluation spec). Absent on results computed "
        "before it was reported, and on a cell without a headline figure.",
    )
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


class LatencyStats(BaseModel):
    """Latency of participant calls as the participant served them (the audit's `latency_ms`:
    request sent to response received, the platform's queueing excluded), from a histogram of
    log-spaced buckets: each percentile is its bucket's upper bound, within `resolution` of the
    exact order statistic; `max_ms` is exact."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    resolution: float = Field(description="Relative width of a histogram bucket (0.02: 2%).")


class CallStats(BaseModel):
    """One operation's HTTP calls to the participant (Add with its status polls, or Search)."""

    items: int = Field(description="Work items (an Add request, a question's Search).")
    attempts: int = Field(description="HTTP attempts, retries included.")
    first_attempts: LatencyStats = Field(
        description="Attempts that succeeded at their item's first try."
    )
    retried: LatencyStats = Field(
        description="Every attempt of items that needed more than one (the retries and the "
        "attempts they retried)."
    )
    timeouts: int = Field(description="Attempts that got no answer within the timeout.")
    rate_limited: int = Field(description="Attempts answered 429.")
    errors: int = Field(description="Other failed attempts: 5xx, connection errors, bad bodies.")


class ContextStats(BaseModel):
    """What the participant's Search returned per question and how much of it reached the
    answer model after the evaluation spec's context budget (R-4.5 word counter for tokens)."""

    questions: int = Field(description="Questions answered from a Search's candidates.")
    candidates_returned_mean: float | None
    retrieved_tokens_mean: float | None = Field(
        description="Tokens of every returned candidate (frozen word counter), per question."
    )
    retrieved_bytes_mean: float | None = Field(
        description="UTF-8 bytes of every returned candidate's text, per question."
    )
    candidates_used_mean: float | None = Field(
        description="Candidates that fitted the answer model's context budget, per question."
    )
    used_tokens_mean: float | None = Field(
        description="Tokens of the candidates that reached the answer model, per question."
    )
    truncated_questions: int = Field(
        description="Questions where some returned candidates did not fit the context budget."
    )


class LLMUse(BaseModel):
    """The platform's own model use per question (as the provider counted it)."""

    questions: int
    answer_tokens_in_mean: float | None
    answer_tokens_out_mean: float | None
    judge_tokens_in_mean: float | None
    judge_tokens_out_mean: float | None


class Efficiency(BaseModel):
    """What one cell's results cost: the participant's latency, its retrieved context and the
    platform's model use. `add` is reported per job and per dataset only (an Add belongs to no
    question category)."""

    add: CallStats | None = None
    search: CallStats | None = None
    context: ContextStats | None = None
    llm: LLMUse | None = None


class DatasetEfficiency(BaseModel):
    overall: Efficiency
    categories: dict[str, Efficiency]


class MeasuredUnder(BaseModel):
    """The conditions the efficiency figures were measured under: figures compare only between
    results measured under the same ones."""

    search_top_k: dict[str, int] = Field(description="Dataset id -> Search top_k.")
    max_concurrency: int | None = Field(description="The version's declared concurrency.")
    max_rps: float | None = Field(description="The version's declared request rate.")
    deployment: str = Field(
        description="The platform deployment's label an operator sets (AML_DEPLOYMENT_LABEL, "
        "e.g. its region): latency includes the network between it and the participant."
    )


class JobEfficiency(BaseModel):
    method: str = Field(description="The versioned rule the figures were computed by.")
    measured_under: MeasuredUnder
    overall: Efficiency
    datasets: dict[str, DatasetEfficiency]


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
    efficiency: JobEfficiency | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="What the results cost, beside them (latency, retrieved context, the "
        "platform's model use); outside the results fingerprint. Absent on results computed "
        "before it was reported.",
    )
