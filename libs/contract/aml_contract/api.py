"""Request and response bodies of the gateway's REST API (the participant-facing contract)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    SecretStr,
    StrictBool,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

Track = Literal["textual", "multimodal", "coding"]
Board = Literal["academic", "industrial"]
AuthMethod = Literal["token", "bearer", "x-api-key", "none"]
Mode = Literal["smoke", "full"]
JobState = Literal["queued", "running", "completed", "failed"]
Stage = Literal["add", "search", "answer", "score", "aggregate"]
STAGES: tuple[Stage, ...] = ("add", "search", "answer", "score", "aggregate")

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Label = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
LongText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4000)]
# A Memory System Key as the participant issued it: any real key is far shorter.
MemorySystemKey = Annotated[SecretStr, Field(max_length=4096)]
# More requests than this in one run is no limit at all (and stays far inside int64).
MAX_REQUESTS_PER_RUN = 1_000_000_000


class Capacity(BaseModel):
    """What the participant allows AML to send (R-4.12)."""

    model_config = ConfigDict(extra="forbid")
    max_concurrency: Annotated[int, Field(ge=1, le=1024)] = 4
    max_rps: Annotated[float, Field(gt=0, le=10_000)] = 10.0


class VersionRegistration(BaseModel):
    """A system version bound to a team directly: the admin shortcut beside the access-request
    workflow (demos and tests use it)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "team": "acme-memory",
                    "system_name": "acme-recall",
                    "version_label": "1.0",
                    "track": "textual",
                    "board": "industrial",
                    "add_url": "https://memory.example.com/add",
                    "search_url": "https://memory.example.com/search",
                    "health_url": "https://memory.example.com/health",
                    "auth_method": "bearer",
                    "memory_system_key": "msk-REPLACE-ME",
                    "capacity": {"max_concurrency": 4, "max_rps": 10.0},
                }
            ]
        },
    )
    team: Annotated[str, Field(min_length=1, max_length=200)]
    system_name: Annotated[str, Field(min_length=1, max_length=200)]
    version_label: Annotated[str, Field(min_length=1, max_length=100)]
    track: Track = "textual"
    board: Board = "industrial"
    add_url: HttpUrl
    search_url: HttpUrl
    health_url: HttpUrl
    auth_method: AuthMethod = "bearer"
    memory_system_key: MemorySystemKey | None = None
    capacity: Capacity = Capacity()

    @model_validator(mode="after")
    def _key(self) -> VersionRegistration:
        check_memory_system_key(self.auth_method, self.memory_system_key)
        return self


def check_memory_system_key(auth_method: AuthMethod, key: SecretStr | None) -> None:
    """A key exactly when the auth method sends one (R-3.1, R-4.2)."""
    if auth_method != "none" and (key is None or not key.get_secret_value().strip()):
        raise PydanticCustomError(
            "memory_system_key_missing",
            "memory_system_key is required unless auth_method is `none`",
        )
    if auth_method == "none" and key is not None:
        # A key that is never sent should not be stored either.
        raise PydanticCustomError(
            "memory_system_key_unused",
            "auth_method `none` sends no key: leave memory_system_key out",
        )


class VersionRegistered(BaseModel):
    version_id: str
    team_id: str
    leaderboard_api_key: str | None = Field(
        default=None, description="Shown exactly once, when a new team key is issued."
    )


class FullRunChecklist(BaseModel):
    """What a team confirms before a full run (R-3.5). Every item must be ticked; the platform
    also verifies the first one itself (a passed smoke for the same version and track)."""

    model_config = ConfigDict(extra="forbid")
    smoke_passed: StrictBool = False
    api_contract_correct: StrictBool = False
    run_instructions_complete: StrictBool = False
    originality_disclosed: StrictBool = False
    integrity_pledge: StrictBool = False

    def unticked(self) -> list[str]:
        return [name for name, ticked in self.model_dump().items() if not ticked]


class JobSubmission(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"version_id": "ver-0123456789ab", "mode": "smoke", "run_label": "smoke-1"},
                {
                    "version_id": "ver-0123456789ab",
                    "mode": "full",
                    "track": "textual",
                    "run_label": "full-2026-12",
                    "checklist": {
                        "smoke_passed": True,
                        "api_contract_correct": True,
                        "run_instructions_complete": True,
                        "originality_disclosed": True,
                        "integrity_pledge": True,
                    },
                },
            ]
        },
    )
    version_id: Annotated[str, Field(min_length=1, max_length=100)]
    mode: Mode = "smoke"
    track: Track = "textual"
    run_label: Label = Field(description="Unique per Leaderboard API Key.")
    datasets: (
        Annotated[list[Annotated[str, Field(max_length=100)]], Field(min_length=1, max_length=20)]
        | None
    ) = Field(
        default=None,
        description="Smoke only: dataset ids, default the smoke sample. Full runs always use "
        "the fixed suite.",
    )
    checklist: FullRunChecklist | None = Field(
        default=None, description="Required for full runs, every item ticked (R-3.5)."
    )


class QuotaDetail(BaseModel):
    reason: str
    next_allowed_at: datetime | None = Field(
        description="When a submission like this one will be accepted; null when it depends "
        "on something still running, or no later season is configured."
    )


class QuotaExceeded(BaseModel):
    """HTTP 429 (R-3.4, R-3.5, R-5.2)."""

    detail: QuotaDetail


class StageProgress(BaseModel):
    total: int
    done: int
    failed: int


class JobError(BaseModel):
    stage: Stage
    kind: str = Field(description="contract_error, participant_outage, platform_error, ...")
    item: str | None
    reason: str


class JobStatus(BaseModel):
    job_id: str
    state: JobState
    stage: Stage | None = Field(description="The earliest stage that has not finished.")
    mode: Mode
    track: Track
    version_id: str
    run_label: str
    datasets: list[str]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    elapsed_seconds: float
    stages: dict[Stage, StageProgress]
    errors: list[JobError]
    spec: dict[str, str] = Field(description="Versions and hashes of everything held constant.")
    spec_hash: str | None = Field(
        default=None, description="sha256 of the evaluation spec document (R-6.4)."
    )
    dataset_bundle_hash: str | None = Field(
        default=None, description="sha256 over the job's dataset bundles (manifests + files)."
    )
    dataset_bundles: dict[str, str] = Field(
        default_factory=dict, description="Each dataset's bundle hash."
    )
    code_hash: str | None = Field(default=None, description="sha256 of the pipeline code.")
    review_state: ReviewState | None = Field(
        default=None,
        description="Publication (R-3.8): set once a finished job has been through the gate; "
        "null for a job not gated (yet).",
    )
    gate: PublicationGate | None = Field(
        default=None, description="The automatic publication gate's checks, once it ran."
    )
    review_reason: str | None = Field(
        default=None, description="Why an admin rejected the job's publication."
    )
    system_name: str | None = Field(
        default=None, description="The version's system; null when the version is gone."
    )
    version_label: str | None = Field(default=None, description="The version's label.")
    board: Board | None = Field(default=None, description="The version's board.")
    answer_model: str | None = Field(
        default=None, description="The answer model the job ran with (from `spec`)."
    )
    duration_seconds: float | None = Field(
        default=None, description="From start to finish; null until the job has finished."
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


class JobResults(BaseModel):
    job_id: str
    state: JobState
    overall: Metrics
    datasets: dict[str, DatasetResults]


AuditStage = Literal["add", "search"]


class AuditRecord(BaseModel):
    """One HTTP attempt the platform made to the participant (R-7.3)."""

    record_id: str
    stage: AuditStage
    request_id: str = Field(description="The Add request_id, or the question id of a Search.")
    delivery: int = Field(description="Which delivery of the work item made the attempt.")
    operation: Literal["add", "add_status", "search", "health"]
    attempt: int
    started_at: datetime
    latency_ms: float = Field(
        description="Request sent to response received: the participant's time."
    )
    queued_ms: float = Field(
        default=0.0,
        description="The platform's wait for the version's declared capacity before sending.",
    )
    status: int | None = Field(description="HTTP status; null when no response arrived.")
    error_class: str | None
    outcome: Literal["ok", "retry", "final"]
    validation: str | None = Field(
        default=None,
        description="`valid`, or the contract violation, on the attempt whose answer was judged.",
    )
    response_bytes: int | None = Field(
        default=None,
        description="Bytes of the answer read (reading stops just past the operation's limit).",
    )


class AuditPage(BaseModel):
    records: list[AuditRecord]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")


class SearchAudit(BaseModel):
    """What one Search returned, in the participant's order (R-7.3)."""

    request_id: str
    state: Literal["done", "failed"]
    candidates: list[dict[str, Any]]
    isolation_violations: int
    failure: str | None = None


# --- Evaluation Access Requests (R-3.1, R-3.2) ------------------------------------------------

AccessKind = Literal["new_key", "add_version"]
AccessState = Literal["pending", "approved", "rejected"]
# A new_key request's Leaderboard API Key on its way to the requester: `held` (sealed, from
# approval until the first read with the request token), then `delivered` (no copy kept).
KeyDelivery = Literal["held", "delivered"]
# The academic board holds the models fixed so that only the memory method differs.
ACADEMIC_EMBEDDING_MODEL = "text-embedding-v4"
ACADEMIC_LLM = "gpt-4o-mini"

# Deliberately loose: one `@`, no spaces, a dotted domain. Whether the address works is only
# known by writing to it; a stricter pattern would refuse valid international addresses.
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s.]+")


class Contact(BaseModel):
    """Who to reach about a request. The name and email are never public; the organisation
    becomes the new team's name (`new_key`), which the public leaderboard shows beside every
    entry as its team."""

    model_config = ConfigDict(extra="forbid")
    name: Text = Field(description="Never public.")
    email: Annotated[str, StringConstraints(strip_whitespace=True, max_length=254)] = Field(
        description="Never public."
    )
    organisation: Text = Field(
        description="Public: a new_key request's team is named after it on the leaderboard."
    )

    @field_validator("email")
    @classmethod
    def _email(cls, value: str) -> str:
        if not _EMAIL.fullmatch(value):
            raise PydanticCustomError("email", "value is not a valid email address")
        return value


class SourceDisclosure(BaseModel):
    """Where an academic method comes from (R-3.1, R-3.9): kept to detect copied code."""

    model_config = ConfigDict(extra="forbid")
    original_authors: Annotated[list[Text], Field(min_length=1, max_length=100)]
    papers: Annotated[list[LongText], Field(max_length=100)] = Field(
        default_factory=list, description="Citations or links of the method's papers."
    )
    changes: LongText = Field(description="What was changed from the original method.")


class DeclaredModels(BaseModel):
    """The models inside the memory system, shown on the leaderboard (R-2.2)."""

    model_config = ConfigDict(extra="forbid")
    embedding_model: Text | None = Field(
        default=None, description="None when the system embeds nothing (e.g. BM25)."
    )
    llms: Annotated[list[Text], Field(max_length=50)] = Field(default_factory=list)
    reranker: Text | None = Field(default=None, description="Free on every board.")


class RunLimits(BaseModel):
    """Limits the participant sets on one run, beside its capacity (R-3.1)."""

    model_config = ConfigDict(extra="forbid")
    max_run_hours: Annotated[float, Field(gt=0, le=24 * 30)] | None = Field(
        default=None, description="Longest a run may keep calling the system; None: no limit."
    )
    max_requests_per_run: Annotated[int, Field(ge=1, le=MAX_REQUESTS_PER_RUN)] | None = None


class AccessRequest(BaseModel):
    """An Evaluation Access Request: a new Leaderboard API Key with its first version, or one
    more version for the key that sends the request (R-3.1)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "kind": "new_key",
                    "contact": {
                        "name": "Ada Lovelace",
                        "email": "ada@example.org",
                        "organisation": "Example University",
                    },
                    "system_name": "recall-graph",
                    "version_label": "1.0",
                    "tracks": ["textual"],
                    "board": "academic",
                    "add_url": "https://memory.example.org/add",
                    "search_url": "https://memory.example.org/search",
                    "health_url": "https://memory.example.org/health",
                    "add_status_url_template": "https://memory.example.org/tasks/{task_id}",
                    "auth_method": "bearer",
                    "memory_system_key": "msk-REPLACE-ME",
                    "capacity": {"max_concurrency": 4, "max_rps": 10.0},
                    "run_limits": {"max_run_hours": 48},
                    "repository_url": "https://github.com/example/recall-graph",
                    "source_disclosure": {
                        "original_authors": ["A. Author", "B. Author"],
                        "papers": ["https://arxiv.org/abs/0000.00000"],
                        "changes": "Replaced the summariser prompt; added time decay.",
                    },
                    "declared_models": {
                        "embedding_model": ACADEMIC_EMBEDDING_MODEL,
                        "llms": [ACADEMIC_LLM],
                        "reranker": "bge-reranker-v2-m3",
                    },
                },
                {
                    "kind": "add_version",
                    "contact": {
                        "name": "Grace Hopper",
                        "email": "grace@example.com",
                        "organisation": "Example Corp",
                    },
                    "system_name": "example-memory",
                    "version_label": "2.1",
                    "tracks": ["textual", "coding"],
                    "board": "industrial",
                    "add_url": "https://api.example.com/memory/add",
                    "search_url": "https://api.example.com/memory/search",
                    "health_url": "https://api.example.com/memory/health",
                    "auth_method": "x-api-key",
                    "memory_system_key": "msk-REPLACE-ME",
                },
            ]
        },
    )
    kind: AccessKind = Field(
        description="`add_version` must be sent with the team's Leaderboard API Key (Bearer)."
    )
    contact: Contact
    system_name: Text
    version_label: Label
    tracks: Annotated[list[Track], Field(min_length=1, max_length=3)]
    board: Board
    add_url: HttpUrl
    search_url: HttpUrl
    health_url: HttpUrl
    add_status_url_template: Annotated[str, StringConstraints(max_length=2000)] | None = Field(
        default=None, description="Polled after an Add answered 202; must contain `{task_id}`."
    )
    auth_method: AuthMethod
    memory_system_key: MemorySystemKey | None = Field(
        default=None, description="Required unless auth_method is `none`; never shown again."
    )
    capacity: Capacity = Capacity()
    run_limits: RunLimits = RunLimits()
    repository_url: HttpUrl | None = Field(default=None, description="Required on academic.")
    source_disclosure: SourceDisclosure | None = Field(
        default=None, description="Required on academic."
    )
    declared_models: DeclaredModels | None = Field(
        default=None, description="Required on academic, where the models are fixed (R-2.2)."
    )

    @field_validator("tracks")
    @classmethod
    def _distinct_tracks(cls, tracks: list[Track]) -> list[Track]:
        if len(set(tracks)) != len(tracks):
            raise PydanticCustomError("duplicate_track", "each track may be listed once")
        return tracks

    @field_validator("add_status_url_template")
    @classmethod
    def _task_placeholder(cls, template: str | None) -> str | None:
        if template is not None and "{task_id}" not in template:
            # Without the placeholder every task would poll the same URL.
            raise PydanticCustomError(
                "task_id_placeholder",
                "the template must contain the {placeholder} placeholder",
                {"placeholder": "{task_id}"},
            )
        return template

    @model_validator(mode="after")
    def _consistent(self) -> AccessRequest:
        check_memory_system_key(self.auth_method, self.memory_system_key)
        if self.board == "academic":
            self._check_academic()
        return self

    def _check_academic(self) -> None:
        missing = [
            name
            for name in ("repository_url", "source_disclosure", "declared_models")
            if getattr(self, name) is None
        ]
        if missing:
            raise PydanticCustomError(
                "academic_disclosure",
                "the academic board requires {missing}",
                {"missing": ", ".join(missing)},
            )
        models = self.declared_models
        assert models is not None  # checked just above
        if models.embedding_model not in (None, ACADEMIC_EMBEDDING_MODEL):
            raise PydanticCustomError(
                "academic_models",
                "the academic board requires the embedding model {required}",
                {"required": ACADEMIC_EMBEDDING_MODEL},
            )
        if any(llm != ACADEMIC_LLM for llm in models.llms):
            raise PydanticCustomError(
                "academic_models",
                "the academic board requires every LLM to be {required}",
                {"required": ACADEMIC_LLM},
            )


class ReasonBody(BaseModel):
    """A decision's body: only its reason. Subclasses give their own example."""

    model_config = ConfigDict(extra="forbid")
    reason: LongText


class AccessRejection(ReasonBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"reason": "The Health URL did not answer; please resubmit."}]
        },
    )


class HealthCheck(BaseModel):
    ok: bool = Field(description="Whether the Health URL answered 2xx (R-4.3).")
    checked_at: datetime


class AccessRequestView(BaseModel):
    """An access request as the submitter and the admins see it; the Memory System Key is
    never part of it (R-5.1)."""

    id: str
    kind: AccessKind
    state: AccessState
    team_id: str | None = Field(
        description="The team the version is bound to: the sender's for add_version, the new "
        "team once a new_key request is approved."
    )
    contact: Contact
    system_name: str
    version_label: str
    tracks: list[Track]
    board: Board
    add_url: str
    search_url: str
    health_url: str
    add_status_url_template: str | None
    auth_method: AuthMethod
    has_memory_system_key: bool
    capacity: Capacity
    run_limits: RunLimits
    repository_url: str | None
    source_disclosure: SourceDisclosure | None
    declared_models: DeclaredModels | None
    health_check: HealthCheck
    warnings: list[str] = Field(description="Accepted but discouraged, e.g. plain http URLs.")
    created_at: datetime
    decided_at: datetime | None
    reason: str | None = Field(description="Why the request was rejected.")
    version_id: str | None = Field(description="The version created on approval.")
    key_delivery: KeyDelivery | None = Field(
        default=None,
        description="new_key requests sent with a request token, once approved: `held` until "
        "the requester's first read with the token returns the key, then `delivered`.",
    )


class AccessRequestCreated(AccessRequestView):
    """The answer to a submitted access request: the request, and for `new_key` the request
    token that reads it (there is no Leaderboard API Key yet)."""

    request_token: str | None = Field(
        default=None,
        description="new_key only: shown exactly once, stored hashed. Send it as a Bearer "
        "token to `GET /v1/access-requests/{id}` to follow the request; the first read after "
        "approval returns the new Leaderboard API Key.",
    )


class AccessRequestStatus(AccessRequestView):
    """An access request as its requester reads it (request token or team key)."""

    leaderboard_api_key: str | None = Field(
        default=None,
        description="The new team's key: only in the first read with the request token after "
        "approval (key_delivery then becomes `delivered`); never again.",
    )


class AccessApproved(BaseModel):
    request_id: str
    version_id: str
    team_id: str
    leaderboard_api_key: str | None = Field(
        default=None,
        description="Only when a new_key request is approved; shown once to the approving "
        "admin, stored hashed. The requester receives it too, once, through its request token.",
    )


class VersionView(BaseModel):
    """A version bound to the calling key (R-3.2), as its team sees it. The Memory System Key
    is never shown, only whether one is stored."""

    version_id: str
    system_name: str
    version_label: str
    tracks: list[Track]
    board: Board
    add_url: str
    search_url: str
    health_url: str
    auth_method: AuthMethod
    has_memory_system_key: bool
    capacity: Capacity
    created_at: datetime


class DatasetCategory(BaseModel):
    number: int
    name: str
    questions: int | None = Field(
        description="Questions of the category; null when this gateway cannot read the files."
    )
    in_overall: bool = Field(description="False: reported apart, not counted in Overall.")


class DatasetInfo(BaseModel):
    """A dataset a job may run (`GET /v1/datasets`)."""

    dataset_id: str
    version: str
    track: Track
    questions: int | None = Field(
        description="Every question of the dataset (excluded categories included); null when "
        "this gateway cannot read the dataset's files (licensed data not mounted here)."
    )
    categories: list[DatasetCategory]
    smoke_default: bool = Field(description="Part of the smoke sample a run that names none uses.")
    smoke: bool = Field(description="May be named in a smoke run's `datasets`.")
    full_suite: bool = Field(description="Part of the fixed suite every full run uses.")


# --- Publication (R-3.8, R-3.9, R-5.3, R-7.4) ------------------------------------------------

GateCheckName = Literal[
    "mode_full",
    "all_items_succeeded",
    "answer_model",
    "spec_hash",
    "code_hash",
    "dataset_bundle_hash",
    "question_counts",
    "not_duplicate",
]
ReviewState = Literal["gate_failed", "pending_review", "approved", "rejected", "disqualified"]


class GateCheck(BaseModel):
    name: GateCheckName
    passed: bool
    reason: str = Field(description="Why it passed or failed, with the values compared.")


class ReleaseBaseline(BaseModel):
    """What a publishable job must have been evaluated with: the operator's current release."""

    answer_model: str
    spec_hash: str
    code_hash: str
    dataset_bundle_hash: str
    question_counts: dict[str, int] = Field(description="Questions per dataset id.")


class LeaderboardEntry(BaseModel):
    """A public leaderboard submission record (R-3.8): only approved, not disqualified."""

    entry_id: str
    system_name: str
    version_label: str
    team_name: str
    board: Board
    track: Track
    overall: Metrics
    datasets: dict[str, DatasetResults]
    spec_hash: str
    code_hash: str
    dataset_bundle_hash: str
    answer_model: str
    published_at: datetime
    declared_models: DeclaredModels | None = Field(
        default=None, description="The models inside the system, as its team declared (R-2.2)."
    )
    repository_url: str | None = Field(
        default=None, description="The method's repository (academic board)."
    )


class PublicationGate(BaseModel):
    """The automatic publication gate's outcome on a finished job (R-3.8), as the publisher
    stores it on the job."""

    checks: list[GateCheck]
    passed: bool
    at: datetime


class ReviewView(BaseModel):
    """A gated job as the admins review it (R-3.8): what was run, by whom, the gate's checks
    and the headline result."""

    job_id: str
    review_state: ReviewState
    gate: PublicationGate | None
    mode: Mode
    track: Track
    run_label: str
    version_id: str
    system_name: str | None
    version_label: str | None
    board: Board | None
    team_id: str
    team_name: str | None
    finished_at: datetime | None
    overall: Metrics | None = Field(description="The job's Overall; null without results.")
    answer_model: str | None
    spec_hash: str | None
    code_hash: str | None
    dataset_bundle_hash: str | None
    reviewed_at: datetime | None
    reason: str | None = Field(description="Why the publication was rejected.")
    entry_id: str | None = Field(description="The leaderboard entry created on approval.")


class ReviewRejection(ReasonBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"reason": "The run used an outdated memory-system build; rerun."}]
        },
    )


class Disqualification(ReasonBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"reason": "Results copied from another team's submission (R-3.9)."}]
        },
    )


class PublicationRecord(LeaderboardEntry):
    """A leaderboard submission record as the admins see it: the public entry plus what binds
    it to its job, and whether it was disqualified (kept, but no longer public, R-3.9)."""

    job_id: str
    version_id: str
    team_id: str
    results_fingerprint: str = Field(
        description="sha256 of the canonical JSON of the job's per-dataset results."
    )
    disqualified: bool
    disqualified_reason: str | None = None
    disqualified_at: datetime | None = None


class Leaderboard(BaseModel):
    """One public board (R-2.4, R-5.3): approved, not disqualified entries of one track."""

    track: Track
    board: Board | None = Field(description="null: the entries of every board of the track.")
    entries: list[LeaderboardEntry] = Field(
        description="Best Overall first (accuracy, else judge accuracy; none last), then the "
        "earlier publication."
    )


class SystemHistory(BaseModel):
    """Every public entry of one system, across its versions, tracks and boards (R-5.3)."""

    system_name: str
    entries: list[LeaderboardEntry] = Field(description="Oldest publication first.")


# JobStatus names the publication models defined after it.
JobStatus.model_rebuild()


class RetentionExtension(BaseModel):
    """An admin keeps a run's derived data past the 30 days of R-7.5."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"keep_until": "2027-06-30T00:00:00Z", "reason": "integrity review"}]
        },
    )
    keep_until: datetime
    reason: LongText


class RetentionView(BaseModel):
    job_id: str
    keep_until: datetime
    reason: str
