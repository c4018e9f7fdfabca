"""What the platform keeps in MongoDB: the collections' names, which collection holds each
stage's items, the states a job and an item pass through, the failure kinds the pipeline
records, every index, and models of the documents whose fields several services share.

The models describe documents as they are stored (field names included, `_id` as `id`), so
existing data reads unchanged; they allow fields they do not name, and a field added by a later
writer is optional, since documents written before it lack it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.api.publication import ReviewState

# The stored capacity and run limits are what registration validated: the same models.
from aml_contract.api.versions import Capacity as DeclaredCapacity
from aml_contract.api.versions import RunLimits, VersionProfile
from aml_contract.api.vocabulary import JobState, Mode, Stage, Track
from aml_contract.questions import PlannedQuestion
from aml_runtime.db import Document, read_time

# -- collections --------------------------------------------------------------------------------

JOBS = "jobs"
ADD_CHUNKS = "add_chunks"
QUESTIONS = "questions"
QUESTION_RELEASES = "question_releases"
SEARCHES = "searches"
ANSWERS = "answers"
SCORES = "scores"
WRITTEN_TEXTS = "written_texts"
CALLS = "calls"
JOB_ERRORS = "job_errors"
VERSIONS = "versions"
TEAMS = "teams"
SECRETS = "secrets"
SYSTEM_NAMES = "system_names"
# Evaluation spec documents by content hash (aml_evaluation.spec.EvaluationSpec).
EVALUATION_SPECS = "specs"
LEADERBOARD = "leaderboard"
# Per full job, its questions' values in Overall's headline figure, for the board's ties
# (aml_runtime.stores.leaderboard: compact, by job id).
HEADLINE_OUTCOMES = "headline_outcomes"
ACCESS_REQUESTS = "access_requests"
CAPACITY_SLOTS = "capacity_slots"
RUN_USAGE = "run_usage"
# Open outages, one per capacity key, and the history of closed ones (aml_pipeline.outages).
LANE_PAUSES = "lane_pauses"
OUTAGES = "outages"
# The gateway's per-address token buckets, shared by its replicas (aml_runtime.stores.limits).
RATE_LIMITS = "rate_limits"

ItemStage = Literal["add", "search", "answer", "score"]
ITEM_STAGES: tuple[ItemStage, ...] = ("add", "search", "answer", "score")
# Where each stage keeps its per-item documents (the truth the progress repair backfills from).
STAGE_COLLECTIONS: dict[ItemStage, str] = {
    "add": ADD_CHUNKS,
    "search": SEARCHES,
    "answer": ANSWERS,
    "score": SCORES,
}

# -- states -------------------------------------------------------------------------------------

# A job still to plan or running: work for it may still be released, called and counted.
ACTIVE_JOB_STATES: tuple[JobState, ...] = ("queued", "running")
FINISHED_JOB_STATES: tuple[JobState, ...] = ("completed", "failed")
# An Add chunk is `pending` until its call ends; a question stage's document is written once,
# terminal. `done` and `failed` are the outcomes the progress counters count.
ItemState = Literal["pending", "done", "failed"]
TERMINAL_ITEM_STATES: tuple[ItemState, ...] = ("done", "failed")


class FailureKind(StrEnum):
    """Why an item or a job failed, as stored (`failure_kind` of jobs and items, `kind` of
    `job_errors`). Only `PLATFORM_ERROR` is the platform's: it does not charge a team's quota
    nor hold a smoke run against the participant."""

    CONTRACT_ERROR = "contract_error"
    AUTHENTICATION_ERROR = "authentication_error"
    ACCESS_DENIED = "access_denied"
    WRONG_URL = "wrong_url"
    PARTICIPANT_OUTAGE = "participant_outage"
    RUN_LIMIT_REACHED = "run_limit_reached"
    ISOLATION_VIOLATION = "isolation_violation"
    JOB_STALLED = "job_stalled"
    # Recorded in the error summary; the job itself fails as `PLATFORM_ERROR`.
    DATASET_MISSING = "dataset_missing"
    PLATFORM_ERROR = "platform_error"
    # Not stored: what the status shows for a failed job with no error entry of its own.
    JOB_FAILED = "job_failed"


# -- indexes ------------------------------------------------------------------------------------


class Index(NamedTuple):
    collection: str
    keys: tuple[tuple[str, int], ...]
    unique: bool = False
    # A TTL index: a document goes once the date in its (single) key field is this long past.
    expire_after_seconds: int | None = None


def _index(collection: str, *fields: str, unique: bool = False) -> Index:
    return Index(collection, tuple((name, ASCENDING) for name in fields), unique)


# Natural keys are the documents' `_id`s (unique by construction); these are the lookups.
# nx-27017 (measured, 0.8.1) serves an equality filter only from a single-field index, not from
# a compound index's prefix, hence the separate `job_id` indexes: without them reading one
# job's stage documents scans the collection (the progress repair, the final aggregation).
INDEXES: tuple[Index, ...] = (
    _index(JOBS, "team_id", "created_at"),
    _index(ADD_CHUNKS, "job_id", "user_id", "seq"),
    _index(ADD_CHUNKS, "job_id", "state"),
    _index(ADD_CHUNKS, "job_id"),
    _index(QUESTIONS, "job_id", "conversation_id"),
    _index(QUESTIONS, "job_id"),
    # A user's questions, released when its Adds are written (a memory user_id is one job's).
    _index(QUESTIONS, "user_id"),
    *(_index(name, "job_id", "state") for name in (SEARCHES, ANSWERS, SCORES)),
    *(_index(name, "job_id") for name in (SEARCHES, ANSWERS, SCORES)),
    _index(CALLS, "job_id", "item_id", "attempt"),
    # A completed job's records are read once, by `job_id` (the efficiency figures): nx-27017
    # would scan every job's records for it with the compound index alone (measured: 0.56 s on
    # 400,000 records against 0.11 s with this, and no measurable cost per insert).
    _index(CALLS, "job_id"),
    # The status shows a job's first errors by time: with (job_id, at) nx-27017 reads only those
    # (with job_id alone it sorts all of the job's errors; without an index, the collection).
    _index(JOB_ERRORS, "job_id"),
    _index(JOB_ERRORS, "job_id", "at"),
    _index(VERSIONS, "team_id"),
    # The searcher reads a job's written texts at once (retention deletes them the same way).
    _index(WRITTEN_TEXTS, "job_id"),
    _index(TEAMS, "key_hash", unique=True),
    # Every admission takes a slot of a key's pool: a scan of every key's slots otherwise.
    _index(CAPACITY_SLOTS, "pool"),
    # The stall watchdog reads a key's latest outage.
    _index(OUTAGES, "key"),
)
# Created by the gateway, the only writer of these documents: the unique keys settle races
# between its own writes, and a job inserted by anything else (a test's fixture) lacks them.
GATEWAY_INDEXES: tuple[Index, ...] = (
    _index(JOBS, "run_label_key", unique=True),
    # One submission at a time per team: see the gateway's routes/jobs.py.
    _index(JOBS, "submission_key", unique=True),
    _index(JOBS, "review_state"),
    # One entry per job, whatever races: the second insert is refused.
    _index(LEADERBOARD, "job_id", unique=True),
    _index(LEADERBOARD, "track", "board"),
    _index(LEADERBOARD, "system_name"),
    # A bucket goes once it is full again (`expires`), so the collection holds only the
    # addresses limited now, however many have been seen.
    Index(RATE_LIMITS, (("expires", ASCENDING),), expire_after_seconds=0),
)


async def ensure_indexes(db: AsyncDatabase[Document], indexes: tuple[Index, ...] = INDEXES) -> None:
    for index in indexes:
        options: dict[str, Any] = {"unique": index.unique}
        if index.expire_after_seconds is not None:
            options["expireAfterSeconds"] = index.expire_after_seconds
        await db[index.collection].create_index(list(index.keys), **options)


# -- documents ----------------------------------------------------------------------------------

# nx-27017 keeps a datetime written through `$set` as a naive ISO string (`read_time`).
StoredTime = Annotated[datetime, BeforeValidator(read_time)]


class Stored(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str = Field(alias="_id")

    def stored(self) -> dict[str, Any]:
        """The document as MongoDB keeps it: stored field names, and only the fields given
        (a field another writer fills in later is absent until then, not null)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


class JobTotals(BaseModel):
    model_config = ConfigDict(extra="allow")

    add: int
    questions: int


def code_hashes_of(job: Mapping[str, Any]) -> list[str]:
    """The code hashes recorded on a stored job (`JobDocument.code_hashes`), sorted; none on a
    job no stage has worked on yet, or recorded before stages recorded them."""
    recorded = job.get("code_hashes")
    return sorted(recorded) if isinstance(recorded, Mapping) else []


def mixed_code(code_hash: str | None, code_hashes: Sequence[str]) -> str | None:
    """Why a job's results come from mixed code, or None: its items were processed by more
    than one build, or by one other than the build recorded at submission (`code_hash`). The
    publication gate's reason (aml_publisher.gate), and the approval's (aml_gateway.publication)."""
    if not set(code_hashes) - {code_hash} or (len(code_hashes) == 1 and code_hash is None):
        return None
    builds = ", ".join(value[:12] for value in code_hashes)
    submitted = code_hash[:12] if code_hash else "none recorded"
    return (
        f"mixed code: the job's items were processed by builds {builds} (submitted under "
        f"{submitted}): the services were replaced mid-job (a rolling upgrade), the platform's "
        "doing; run the job again"
    )


class JobDocument(Stored):
    """A job (`jobs`): inserted `queued` by the gateway's submission, planned and completed by
    the scheduler, failed by `aml_pipeline.jobs.fail_job`, counted by `aml_pipeline.progress`
    (`progress`, read through its helpers), gated by the publisher, reviewed and published by
    the gateway."""

    team_id: str
    version_id: str
    mode: Mode
    track: Track
    run_label: str
    run_label_key: str | None = None
    submission_seq: int = 0
    submission_key: str | None = None
    datasets: list[str]
    state: JobState
    planned: bool = False
    created_at: StoredTime
    # Written by the plan.
    started_at: StoredTime | None = None
    top_k: int | None = None
    # The evaluation spec the job ran with: its summary (`EvaluationSpec.summary`) and the hash
    # of the whole document in `specs`.
    spec: dict[str, Any] = Field(default_factory=dict)
    spec_hash: str | None = None
    code_hash: str | None = None
    # Every build that processed the job's items, as a set: code hash -> true, one entry added
    # by each stage process at its first item of the job and by the scheduler as it completes
    # it (`JobStore.record_code_hash`). A map rather than an array because nx-27017 ignores
    # `$addToSet`; `code_hashes_of` reads it.
    code_hashes: dict[str, Any] = Field(default_factory=dict)
    dataset_bundles: dict[str, str] = Field(default_factory=dict)
    dataset_bundle_hash: str | None = None
    users: list[str] = Field(default_factory=list)
    excluded_categories: dict[str, list[str]] = Field(default_factory=dict)
    f1_variants: dict[str, str] = Field(default_factory=dict)
    # Dataset id -> the chunk rule its Adds were planned with (absent on older jobs).
    chunkers: dict[str, str] = Field(default_factory=dict)
    totals: JobTotals | None = None
    progress: dict[str, Any] = Field(default_factory=dict)
    # Written when the job ends.
    finished_at: StoredTime | None = None
    failed_stage: Stage | None = None
    failure_kind: FailureKind | None = None
    failure: str | None = None
    results: dict[str, Any] | None = None
    # Written when the job completes: how many of its items the platform itself failed
    # (`platform_error`), and that said in words. Such a run is neither publishable nor charged
    # to the team's quota (the team could not have done better), though its results stay
    # visible. Absent on jobs completed before it was recorded: read as none.
    platform_failures: int | None = None
    platform_failure_reason: str | None = None
    # Written by the publisher's gate and the gateway's review.
    gate: dict[str, Any] | None = None
    review_state: ReviewState | None = None
    review_reason: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_JOB_STATES

    @property
    def mixed_code(self) -> str | None:
        """Why its results come from mixed code (`mixed_code`), or None."""
        return mixed_code(self.code_hash, sorted(self.code_hashes))


class AddChunkDocument(Stored):
    """One Add request of a job (`add_chunks`): planned `pending` by the scheduler, finished
    once by the adder's guarded update. `body` is emptied by retention."""

    job_id: str
    dataset_id: str
    conversation_id: str
    user_id: str
    session_id: str
    seq: int
    messages: int
    body: bytes | None
    state: ItemState
    trace_id: str | None = None
    # Streaming datasets: the item ids of the questions asked right before this Add (after
    # Add seq - 1); the scheduler sends it only once their searches are final. Absent otherwise.
    searched_before: list[str] | None = None
    finished_at: StoredTime | None = None
    at_us: int | None = None
    failure_kind: FailureKind | None = None
    failure: str | None = None


class QuestionDocument(PlannedQuestion, Stored):
    """A planned question (`questions`, written by the scheduler's plan): its facts
    (`PlannedQuestion`; the optional ones written only when set, so other questions' documents
    are unchanged) and what planning adds. `search_body` is emptied by retention."""

    job_id: str
    conversation_id: str
    search_body: bytes | None = None
    trace_id: str | None = None
    # Streaming datasets only (absent otherwise): the question is asked after `point` turns,
    # its `point_index`-th point (1-based), i.e. after Add `after_seq` (0: before the first);
    # `holds_add` is the seq of the Add that waits for this search (absent when the point is
    # the end of the conversation: then it is released with the user's other questions).
    point: int | None = None
    point_index: int | None = None
    after_seq: int | None = None
    holds_add: int | None = None


class StageRecord(Stored):
    """A question's document at one stage (`searches`, `answers`, `scores`), inserted once by
    `aml_pipeline.question_stage`: `done` with the stage's fields, or `failed` with why."""

    job_id: str
    state: Literal["done", "failed"]
    finished_at: StoredTime | None = None
    at_us: int | None = None
    failure_kind: FailureKind | None = None
    failure: str | None = None


class SearchDocument(StageRecord):
    candidates: list[dict[str, Any]] = Field(default_factory=list)
    n_candidates: int = 0
    # Candidates holding another user's text.
    leaks: int = 0


class AnswerDocument(StageRecord):
    answer: str | None = None
    model: str | None = None
    prompt: str | None = None
    prompt_sha256: str | None = None
    candidates_returned: int | None = None
    candidates_used: int | None = None
    context_tokens: int | None = None
    # Written only when there were images: how many reached the answer model, and how many were
    # shown as a placeholder instead (a text-only model, or not an image data URL).
    images_sent: int | None = None
    images_withheld: int | None = None
    token_counter: str | None = None
    # What the Search returned (aml_evaluation.efficiency.retrieved_size: every candidate's
    # words by the frozen counter wc-v1 and UTF-8 bytes) and the words of the candidates that
    # reached the model; absent on answers written before they were recorded.
    retrieved_tokens: int | None = None
    retrieved_bytes: int | None = None
    used_tokens: int | None = None
    # The answer model's tokens in and out as the provider counted them (a coding attempt's:
    # summed over its agent's steps); absent on text answers written before they were recorded.
    tokens_in: int | None = None
    tokens_out: int | None = None
    # Written only for a coding task's attempt (R-2.5; aml_pipeline.coding_track.answer_fields,
    # which names every field): `answer` is then the submitted patch, `trajectory` the agent's
    # bounded messages (a body, emptied by retention like `answer`).
    end_reason: str | None = None
    steps: int | None = None
    agent: str | None = None
    agent_config_sha256: str | None = None
    trajectory: list[dict[str, Any]] | None = None


class ScoreDocument(StageRecord):
    """A question's score (`scores`); a `done` one is the question scored, whatever the
    verdict. An open question carries the judge's and the metrics' fields, a multiple-choice
    one the chosen option."""

    dataset_id: str | None = None
    category: int | None = None
    category_name: str | None = None
    judge_label: Literal["CORRECT", "WRONG"] | None = None
    judge_labels: list[Literal["CORRECT", "WRONG"] | None] = Field(default_factory=list)
    judge_replies: list[Any] = Field(default_factory=list)
    judge_calls: int | None = None
    # The judge's tokens in and out over its calls, as the provider counted them (absent on
    # scores written before they were recorded, and where no judge was asked).
    judge_tokens_in: int | None = None
    judge_tokens_out: int | None = None
    judge_model: str | None = None
    judge_prompt: str | None = None
    judge_prompt_sha256: str | None = None
    f1: float | None = None
    f1_version: str | None = None
    bleu1: float | None = None
    bleu1_version: str | None = None
    multiple_choice: bool = False
    chosen_option: int | str | None = None
    choice_correct: bool | None = None
    mc_version: str | None = None
    # Written only for a coding task's attempt (R-2.5; aml_pipeline.coding_track.Verification
    # names every field): whether its patch resolved the task, the task's type, and the test
    # log (a body, emptied by retention).
    resolved: bool | None = None
    resolution: str | None = None
    task_type: str | None = None
    grading_version: str | None = None
    test_log: str | None = None
    # Written only for an ATM-Bench question (aml_evaluation.atmbench.scoring): its answer type,
    # how it was scored (exact_match, jaccard, judge) and its value in QS (None: the judge's
    # verdict could not be read).
    answer_type: str | None = None
    qs: float | None = None
    qs_method: str | None = None
    qs_version: str | None = None
    # Written only for a question with recognisable evidence (aml_evaluation.evidence): per
    # evidence id, the 1-based rank of the first candidate that is it (None: not returned).
    evidence_ranks: dict[str, int | None] | None = None
    evidence_rule: str | None = None
    evidence_version: str | None = None


class VersionFields(VersionProfile):
    """Everything a version document holds besides its id, team and creation time: what a team
    registers for a participant version. Stored as is on a pending access request (its `spec`
    field), so approval creates the version without re-entry (R-3.2)."""

    model_config = ConfigDict(extra="allow")

    # An opaque reference into `secrets`; the key itself is only ever stored sealed.
    secret_ref: str | None = None
    capacity: DeclaredCapacity = Field(default_factory=DeclaredCapacity)
    add_status_url_template: str | None = None
    run_limits: RunLimits = Field(default_factory=RunLimits)
    # Repository, source disclosure and declared models: shown on the leaderboard and
    # kept for integrity checks.
    declaration: dict[str, Any] = Field(default_factory=dict)


class VersionDocument(Stored, VersionFields):
    """A participant's system version (`versions`), written by the gateway's registry (admin
    shortcut or approved access request), read by every stage that calls the participant. The
    Memory System Key is stored apart, sealed (`secret_ref` into `secrets`)."""

    team_id: str
    created_at: StoredTime | None = None
