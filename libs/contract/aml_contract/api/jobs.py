"""Submitting a job and following it (R-3.4, R-3.5, R-5.2): the submission, the quota refusal, the
status."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from aml_contract.api.publication import PublicationGate, ReviewState
from aml_contract.api.vocabulary import Board, JobState, Label, Mode, Stage, Track


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


class JobPause(BaseModel):
    """An outage the running job waits out (R-4.13): its work for that side is paused, not
    failed, and resumes when the side answers again."""

    kind: Literal["participant", "llm"] = Field(
        description="Whose outage: the participant's memory system, or the answer/judge model."
    )
    since: datetime = Field(description="When the first of the failing calls was sent.")
    reason: str = Field(description="The last failure: a network error's class or an HTTP status.")
    window_seconds: float = Field(
        description="How long an outage may last before it fails the waiting work "
        "(AML_PARTICIPANT_OUTAGE_SECONDS, AML_LLM_OUTAGE_SECONDS)."
    )
    message: str = Field(
        description="In words, e.g. "
        "`paused: participant unreachable since 2026-12-05 10:01:02 UTC`."
    )


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
    # What the platform's own failures mean for the run.
    state_summary: str = Field(
        default="",
        description="The state in words, as the job page and `aml team` show it: the state "
        "itself, or e.g. `completed — not publishable: 3 questions failed by the platform "
        "(platform_error); not charged` when the platform spoiled the run.",
    )
    platform_failures: int = Field(
        default=0,
        description="Items of a completed job that the platform itself failed "
        "(`platform_error`, e.g. its answer model was down); 0 while the job runs.",
    )
    publishable: bool | None = Field(
        default=None,
        description="False when the job failed, completed with platform failures, or failed "
        "the publication gate; true when the gate passed; null until it is known (running, "
        "or completed and not gated yet).",
    )
    not_publishable_reason: str | None = Field(
        default=None, description="Why `publishable` is false; null otherwise."
    )
    charged: bool = Field(
        default=True,
        description="Whether the job counts against the team's quota (R-3.5): false when the "
        "platform failed the job or some of its items, which also starts no wait for the "
        "next full run. A queued or running job counts until it ends.",
    )
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
    code_hashes: list[str] = Field(
        default_factory=list,
        description="The pipeline code hash of every build that processed the job's items, "
        "sorted: one (equal to `code_hash`) unless the services were replaced by another build "
        "mid-job, in which case the job is not publishable.",
    )
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
    paused: list[JobPause] = Field(
        default_factory=list,
        description="Outages the running job is waiting out (its participant's, the answer "
        "model's); empty when nothing is paused.",
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
