"""A coding job's attempts (R-2.5, R-3.7): one per task and memory condition, as the job's owner
reads them on its page and through `GET /v1/jobs/{id}/attempts`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# Where an attempt stands: verified (resolved or not), failed by the platform or the
# participant at some stage (never counted as unresolved), or not finished yet.
AttemptOutcome = Literal["resolved", "unresolved", "failed", "pending"]
AttemptStage = Literal["search", "answer", "score"]


class CodingAttempt(BaseModel):
    item_id: str = Field(description="The attempt's work item, as the audit records name it.")
    dataset_id: str
    task: str = Field(description="The task attempted.")
    condition: str = Field(description="The memory condition: `relevant` or `noisy`.")
    task_type: str | None = Field(
        default=None, description="The task's type as its dataset declares it (`debug`, ...)."
    )
    outcome: AttemptOutcome
    end_reason: str | None = Field(
        default=None,
        description="How the agent's attempt ended (`submitted`, `step_limit`, `wall_limit`, "
        "`context_limit`, `format_error`); null before it ended or when it failed.",
    )
    steps: int | None = Field(default=None, description="The agent's steps (model calls).")
    resolved: bool | None = Field(
        default=None, description="The verdict of a verified attempt; null otherwise."
    )
    reason: str | None = Field(
        default=None,
        description="Why: the verdict's reason (a patch that does not apply, the tests that "
        "failed, ...), or the failure's.",
    )
    failed_at: AttemptStage | None = Field(
        default=None, description="The stage a failed attempt failed at (`score`: verify)."
    )
    failure_kind: str | None = Field(
        default=None, description="A failed attempt's kind (`platform_error`, ...)."
    )


class AttemptPage(BaseModel):
    attempts: list[CodingAttempt] = Field(description="In item-id order: task, then condition.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")
