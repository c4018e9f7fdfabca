"""What the platform sent a participant and what came back (R-7.3)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

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
