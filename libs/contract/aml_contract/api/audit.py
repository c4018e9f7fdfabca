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
    item_id: str = Field(
        description="The work item: an Add's request_id, or a question's id (what "
        "`audit/searches/{item_id}` takes)."
    )
    request_id: str | None = Field(
        default=None,
        description="The Add's contract request_id (equal to item_id) on an Add's attempts "
        "(`add`, `add_status`); null on any other (a Search).",
    )
    delivery: int = Field(description="Which delivery of the work item made the attempt.")
    operation: Literal["add", "add_status", "search", "health"]
    attempt: int
    started_at: datetime = Field(
        description="When the request's headers started going out (when it was handed to the "
        "HTTP client, if it never got that far)."
    )
    latency_ms: float = Field(
        description="Request sent to response received: the participant's time."
    )
    queued_ms: float = Field(
        default=0.0,
        description="The platform's own time before the request left: its wait for the "
        "version's declared capacity and, on a fresh connection, the connect.",
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

    item_id: str = Field(description="The question's id, as the audit records name it.")
    state: Literal["done", "failed"]
    candidates: list[dict[str, Any]]
    isolation_violations: int
    failure: str | None = None
