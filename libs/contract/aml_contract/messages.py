"""Internal messages carried over NATS JetStream. They carry ids, and otherwise only what never
changes once written (a question's facts, a stage's stored outcome handed to the next stage), so
a message can be redelivered or replayed without carrying stale state: the documents they point
to live in MongoDB."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from aml_contract.questions import PlannedQuestion

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
    # The Add's user and place in its chain, when the adder read them: the scheduler then moves
    # the user on without reading the chunk (the next Add is found by id).
    user_id: str | None = None
    seq: int | None = None
    # The adder published the user's next Add itself (nothing gates it): the scheduler has
    # nothing to release for this user.
    next_released: bool = False


class QuestionFacts(_Message, PlannedQuestion):
    """What the stages need of a planned question (`PlannedQuestion`). The scheduler sends them
    with the work, so no stage reads the question document."""

    @classmethod
    def of(cls, question: Mapping[str, Any]) -> QuestionFacts:
        """The facts of a planned question document."""
        return cls.model_validate({field: question.get(field) for field in cls.model_fields})


class QuestionWork(_Message):
    """Run one question through one stage: search, answer or score."""

    job_id: str
    version_id: str
    item_id: str
    # Set by the scheduler when it releases the question (older releases: from the answer stage
    # on), so no stage reads the question document.
    facts: QuestionFacts | None = None
    # For the search stage only: the exact Search request bytes as planned (UTF-8 JSON), sent
    # unchanged on every attempt; dropped when the question is handed on.
    search_body: str | None = None
    # Set for the score stage: the answer as stored (a short text; the scorer reads the stored
    # document only without it).
    answer: str | None = None
    # Set for the answer stage: the candidates as the search stored them, when they are small
    # enough to travel (`CARRIED_CANDIDATES_BYTES`); the answerer reads the stored document
    # only without them.
    candidates: list[dict[str, Any]] | None = None
    # Set by the scheduler on a streaming question searched mid-conversation: its user's next
    # Add waits for this search, so the search stage announces it final (`SearchDone`).
    holds_add: bool = False
    # Set from the search stage on, for a question whose evidence the platform recognises:
    # the rank at which the Search returned each piece (evidence id -> 1-based rank, or None),
    # computed where the candidates are in hand; the scorer reads the stored candidates only
    # without it.
    evidence_ranks: dict[str, int | None] | None = None


class QuestionDone(_Message):
    """A question reached its terminal state (scored, or failed in some stage) and with it every
    question of the job is final, or a redelivery re-announces a terminal question: the job may
    be complete. Not sent for every question: the scheduler looks at the job only when it may
    be done (and its reconciliation catches an announcement lost in a crash)."""

    job_id: str
    item_id: str
    stage: QuestionStage
    outcome: Outcome


class SearchDone(_Message):
    """The search of a question that holds back its user's next Add (a streaming dataset's
    question asked mid-conversation) is final, done or failed: the scheduler may send the Add.
    Sent for those questions only; the reconciliation covers a lost announcement."""

    job_id: str
    item_id: str
    user_id: str


class JobFinished(_Message):
    job_id: str
    state: Literal["completed", "failed"]


def message_id(kind: str, *parts: str) -> str:
    """The Nats-Msg-Id of a publish: deterministic, so a re-publish after a crash is de-duplicated
    by the broker instead of doing the work twice."""
    return ":".join((kind, *parts))
