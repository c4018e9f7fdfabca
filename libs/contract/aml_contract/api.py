"""Request and response bodies of the gateway's REST API (the participant-facing contract)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, SecretStr

Track = Literal["textual", "multimodal", "coding"]
Board = Literal["academic", "industrial"]
AuthMethod = Literal["token", "bearer", "x-api-key", "none"]
Mode = Literal["smoke", "full"]
JobState = Literal["queued", "running", "completed", "failed"]
Stage = Literal["add", "search", "answer", "score", "aggregate"]
STAGES: tuple[Stage, ...] = ("add", "search", "answer", "score", "aggregate")


class Capacity(BaseModel):
    """What the participant allows AML to send (R-4.12)."""

    model_config = ConfigDict(extra="forbid")
    max_concurrency: Annotated[int, Field(ge=1, le=1024)] = 4
    max_rps: Annotated[float, Field(gt=0, le=10_000)] = 10.0


class VersionRegistration(BaseModel):
    """A system version bound to a team (the admin-side shortcut until access requests land)."""

    model_config = ConfigDict(extra="forbid")
    team: Annotated[str, Field(min_length=1, max_length=200)]
    system_name: Annotated[str, Field(min_length=1, max_length=200)]
    version_label: Annotated[str, Field(min_length=1, max_length=100)]
    track: Track = "textual"
    board: Board = "industrial"
    add_url: HttpUrl
    search_url: HttpUrl
    health_url: HttpUrl
    auth_method: AuthMethod = "bearer"
    memory_system_key: SecretStr | None = None
    capacity: Capacity = Capacity()


class VersionRegistered(BaseModel):
    version_id: str
    team_id: str
    leaderboard_api_key: str | None = Field(
        default=None, description="Shown exactly once, when a new team key is issued."
    )


class JobSubmission(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version_id: Annotated[str, Field(min_length=1)]
    mode: Mode = "smoke"
    track: Track = "textual"
    run_label: Annotated[str, Field(min_length=1, max_length=100)]
    datasets: Annotated[list[str], Field(min_length=1)] | None = Field(
        default=None, description="Dataset ids; defaults to the mode's suite."
    )


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


class Metrics(BaseModel):
    """One cell of the results table. Failed questions (participant outage, contract error,
    judge failure) are counted apart and never scored as wrong."""

    questions: int
    scored: int
    failed: int
    judge_correct: int
    judge_accuracy: float | None
    f1_mean: float | None


class DatasetResults(BaseModel):
    dataset_id: str
    overall: Metrics
    categories: dict[str, Metrics]
    excluded_from_overall: list[str]


class JobResults(BaseModel):
    job_id: str
    state: JobState
    overall: Metrics
    datasets: dict[str, DatasetResults]
