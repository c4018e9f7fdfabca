"""Publication (R-3.8, R-3.9, R-7.4): the automatic gate and the release it checks against, the
admins' review, disqualification."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.results import Metrics
from aml_contract.api.vocabulary import Board, Mode, ReasonBody, Track

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
