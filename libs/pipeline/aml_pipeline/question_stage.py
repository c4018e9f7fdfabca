"""The shared shape of the three per-question stages (search, answer, score).

Each stage writes one document per question into its own collection, keyed by the question's
item id, and then hands the question on. A redelivered message finds the document and only
re-announces the hand-off (de-duplicated by the broker), so no question is searched, answered or
scored twice. A question that cannot pass a stage gets a `failed` document with the reason and
counts as final, so the job never waits for it. The writer of a terminal document counts it on
the job (`aml_pipeline.progress`, in batches: `OutcomeCounter`); the batch whose count makes
every question final tells the scheduler. The question's facts travel with the work (the
scheduler sends them), and so does what a stage stored that the next one uses (the search's
candidates when small enough, the answer), so the next stage reads no document for them. A
search that holds back its user's next Add (a streaming dataset's question asked
mid-conversation, work flagged `holds_add`) is announced final on `aml.done.search`, done or
failed, every time it is handed on (de-duplicated by the broker). A coding attempt's score work
is queued on the verify lane, not the LLM's (`score_queue`); the scorer serves both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import pydantic_core
from faststream.nats import NatsBroker

from aml_contract import subjects
from aml_contract.messages import (
    QuestionDone,
    QuestionFacts,
    QuestionStage,
    QuestionWork,
    SearchDone,
    message_id,
)
from aml_contract.subjects import WorkStage
from aml_evaluation.scoring import scoring_method
from aml_pipeline.capacity import turn
from aml_pipeline.jobs import JobStates, fail_job, record_error
from aml_pipeline.progress import Counted, OutcomeCounter, outcome_of
from aml_pipeline.stage_worker import StageCall, WorkItem
from aml_runtime.broker import Bus, FinalFailure, publish, publish_work
from aml_runtime.clock import now, now_us
from aml_runtime.db import Document
from aml_runtime.documents import ACTIVE_JOB_STATES, FailureKind
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores

# A contract violation stops the whole job; other failures stay with their question.
_FATAL_KINDS = frozenset(
    {
        FailureKind.CONTRACT_ERROR,
        FailureKind.AUTHENTICATION_ERROR,
        FailureKind.ACCESS_DENIED,
        FailureKind.WRONG_URL,
        FailureKind.RUN_LIMIT_REACHED,
    }
)

# The largest candidate list (as compact JSON) the search hands to the answer stage with the
# work, saving the answer stage a read of the search document; a larger one is read there. Well
# under the broker's 1 MiB message limit, with the question's facts beside it.
CARRIED_CANDIDATES_BYTES = 64 * 1024
# The same for the answer handed to the score stage: a model's answer always travels (it is a
# few hundred tokens at most); a coding attempt's answer is its patch, which may not.
CARRIED_ANSWER_BYTES = 64 * 1024

Compute = Callable[[QuestionWork, Document, StageCall], Awaitable[Document]]


def carried_candidates(candidates: list[Document]) -> list[Document] | None:
    """`candidates` if they are small enough to travel with the work, else None."""
    # Measured as compact UTF-8 JSON (the broker's encoding may escape non-ASCII and be larger,
    # by a factor well inside the margin between this limit and the broker's).
    size = len(pydantic_core.to_json(candidates))
    return candidates if size <= CARRIED_CANDIDATES_BYTES else None


def carried_answer(answer: str | None) -> str | None:
    """`answer` if it is small enough to travel with the work, else None (the score stage then
    reads the answer document)."""
    if answer is None or len(pydantic_core.to_json(answer)) > CARRIED_ANSWER_BYTES:
        return None
    return answer


class Stored(NamedTuple):
    """The outcome that stands for an item at a stage after a store."""

    state: str
    # Whether this store wrote it (else an earlier or concurrent delivery did).
    written: bool


@dataclass(frozen=True)
class StageShape:
    """What tells one per-question stage from another; the stage's work itself is its
    `Compute`. Nothing else in this module depends on which stage it runs."""

    # The stage the question goes to next when done here (None: it is final).
    following: WorkStage | None
    # It calls the participant: even a first delivery looks for its stored outcome (a second
    # call would reach the participant), it needs the question's planned Search body, and an
    # Add held back for it (`holds_add`) waits for its announcement on `aml.done.search`.
    calls_participant: bool
    # What it hands on to the next stage of what it stored (so that stage reads no document).
    carry: Callable[[Document], Document]
    # Where the next stage's work of a question is queued, when that depends on the question
    # (None: `following`'s own work subject).
    queue: Callable[[QuestionWork], WorkStage] | None = None


def score_queue(work: QuestionWork) -> WorkStage:
    """Where a question's score work is queued: a coding attempt's on the verify lane, which the
    scorer admits under its sandboxes' bound (its test run calls no LLM, and must hold none of
    the LLM budget's slots), any other question's on the LLM's lane. A message without the
    question's facts (an older release's) stays on the LLM's lane, which verifies it as well."""
    facts = work.facts
    if facts is not None and scoring_method(facts.options, facts.scorer) == "resolved":
        return "verify"
    return "score"


STAGES: dict[QuestionStage, StageShape] = {
    "search": StageShape(
        "answer",
        True,
        lambda fields: {
            "candidates": carried_candidates(fields["candidates"]),
            "evidence_ranks": fields.get("evidence_ranks"),
        },
    ),
    "answer": StageShape(
        "score",
        False,
        lambda fields: {"answer": carried_answer(fields.get("answer"))},
        queue=score_queue,
    ),
    "score": StageShape(None, False, lambda fields: {}),
}


@dataclass
class QuestionStageWorker:
    stage: QuestionStage
    settings: CommonSettings
    # The planned questions (`plans`) and the stage's records, one per question (`records`).
    stores: Stores
    # Subscriptions (`JobStates`) on the broker's connection; work and events handed on by `bus`.
    broker: NatsBroker
    bus: Bus
    compute: Compute
    shape: StageShape = field(init=False)
    counter: OutcomeCounter = field(init=False)
    jobs: JobStates = field(init=False)

    def __post_init__(self) -> None:
        self.shape = STAGES[self.stage]
        self.counter = OutcomeCounter(self.stores, self._all_final)
        self.jobs = JobStates(self.stores, self.broker)

    @property
    def work(self) -> type[QuestionWork]:
        return QuestionWork

    async def close(self) -> None:
        """Count what is still pending (a stopping worker)."""
        await self.counter.drain()

    async def handle(self, work: QuestionWork, item: WorkItem) -> None:
        async def attempt() -> None:
            await self._process(work, item)

        async def give_up(kind: FailureKind, reason: str) -> None:
            failure = {"state": "failed", "failure_kind": kind, "failure": reason}
            stored = await self.store(work, failure)
            await record_error(self.stores, work.job_id, self.stage, kind, work.item_id, reason)
            if kind in _FATAL_KINDS:
                await fail_job(self.stores, self.bus, work.job_id, self.stage, kind, reason)
            await self._hand_on(work, stored.state, announce=False)

        ids = {"job_id": work.job_id, "item_id": work.item_id, "stage": self.stage}
        await item.run(self.settings, f"aml.{self.stage}", ids, attempt, give_up)

    async def _process(self, work: QuestionWork, item: WorkItem) -> None:
        # A first delivery cannot find its document: the broker drops a re-published hand-off
        # (same message id) within its duplicate window. An LLM stage skips that read then; a
        # stage calling the participant keeps it, since a second call would reach it.
        looked_up = self.shape.calls_participant or item.delivered > 1
        existing = (
            await self.stores.records.state_of(self.stage, work.item_id) if looked_up else None
        )
        if existing is not None:
            # Its writer counted it (or died first: the repair counts it); hand on again, and
            # re-announce a terminal question, which the scheduler may not have seen.
            await self._hand_on(work, existing, announce=True)
            return
        question = await self._question(work)
        # The call under the slot's turn: the item served next under the same admission gets
        # ready meanwhile and waits here, and it sees a job this call failed as failed.
        async with turn(item.admission):
            # Checked right before the call: a failed job's work is dropped here.
            job = await self.jobs.get(work.job_id)
            if job is None or job["state"] not in ACTIVE_JOB_STATES:
                return
            try:
                fields = await self.compute(work, question, item.call(job))
            except FinalFailure as exc:
                if exc.ends_job or exc.kind in _FATAL_KINDS:
                    # The question's own failure is recorded by the delivery's give-up; the
                    # job stops now, its queued work purged.
                    await fail_job(
                        self.stores, self.bus, work.job_id, self.stage, exc.kind, exc.reason
                    )
                    self.jobs.ended(work.job_id, "failed")
                raise
        stored = await self.store(work, {"state": "done", **fields})
        carried: Document = {
            "facts": work.facts or QuestionFacts.of(question),
            "search_body": None,
            "candidates": None,
        }
        # Only what this delivery stored: the next stage works on what the audit shows.
        if stored.written:
            carried.update(self.shape.carry(fields))
        await self._hand_on(work.model_copy(update=carried), stored.state, announce=False)

    async def _question(self, work: QuestionWork) -> Document:
        if work.facts is not None and work.search_body is not None:
            return {**work.facts.model_dump(), "search_body": work.search_body.encode()}
        if work.facts is not None and not self.shape.calls_participant:
            return work.facts.model_dump()
        question = await self.stores.plans.question(work.item_id)
        if question is None:
            raise FinalFailure(
                FailureKind.PLATFORM_ERROR, f"question {work.item_id} is not planned"
            )
        return question

    async def store(self, work: QuestionWork, fields: Document) -> Stored:
        """Store the stage's outcome unless one is stored; returns the state that stands."""
        at_us = now_us()
        if not await self.stores.records.store_outcome(
            self.stage, work.item_id, work.job_id, now(), at_us, fields
        ):
            # A concurrent or earlier delivery stored (and counted) it first; its result stands.
            stored = await self.stores.records.state_of(self.stage, work.item_id)
            return Stored(str(stored), written=False)
        state = str(fields["state"])
        outcome = outcome_of(state)
        if outcome is not None:
            self.counter.count(Counted(work.job_id, work.item_id, self.stage, outcome, at_us))
        return Stored(state, written=True)

    async def _hand_on(self, work: QuestionWork, state: str, announce: bool) -> None:
        if self.shape.calls_participant and work.holds_add:
            # Every time, like the hand-on (de-duplicated): the scheduler may not have heard it.
            await self._announce_search_final(work)
        following = self.shape.following
        if state == "done" and following is not None:
            queue = following if self.shape.queue is None else self.shape.queue(work)
            await publish_work(self.bus, queue, work, work.item_id)
            return
        if not announce:
            return
        outcome = "done" if state == "done" else "failed"
        done = QuestionDone(
            job_id=work.job_id, item_id=work.item_id, stage=self.stage, outcome=outcome
        )
        await publish(
            self.bus, subjects.QUESTION_DONE, done, message_id("question-done", work.item_id)
        )

    async def _all_final(self, counted: Counted) -> None:
        """Every question of the job is final with `counted`'s batch: the scheduler completes it."""
        done = QuestionDone(job_id=counted.job_id, item_id=counted.item_id,
                            stage=self.stage, outcome=counted.outcome)  # fmt: skip
        await publish(
            self.bus, subjects.QUESTION_DONE, done, message_id("question-done", counted.item_id)
        )

    async def _announce_search_final(self, work: QuestionWork) -> None:
        user_id = work.facts.user_id if work.facts is not None else None
        if user_id is None:
            user_id = await self.stores.plans.question_user(work.item_id)
        done = SearchDone(job_id=work.job_id, item_id=work.item_id, user_id=user_id)
        await publish(self.bus, subjects.SEARCH_DONE, done, message_id("search-done", work.item_id))
