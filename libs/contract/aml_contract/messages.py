"""Internal messages carried over NATS JetStream. They carry ids only: the documents they point to
live in MongoDB, so a message can be redelivered or replayed without carrying stale state."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Outcome = Literal["done", "failed"]
QuestionStage = Literal["search", "answer", "score"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSubmitted(_Message):
    job_id: str


class AddWork(_Message):
    """Write one Add chunk (its body is stored, built once, by the scheduler)."""

    job_id: str
    # The participant version the job evaluates: its work goes to that version's lane.
    version_id: str
    request_id: str


class AddDone(_Message):
    job_id: str
    request_id: str
    outcome: Outcome


class QuestionWork(_Message):
    """Run one question through one stage: search, answer or score."""

    job_id: str
    version_id: str
    item_id: str


class QuestionDone(_Message):
    """A question reached a terminal state: scored, or failed in some stage."""

    job_id: str
    item_id: str
    stage: QuestionStage
    outcome: Outcome


class JobFinished(_Message):
    job_id: str
    state: Literal["completed", "failed"]


def message_id(kind: str, *parts: str) -> str:
    """The Nats-Msg-Id of a publish: deterministic, so a re-publish after a crash is de-duplicated
    by the broker instead of doing the work twice."""
    return ":".join((kind, *parts))
