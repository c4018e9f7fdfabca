"""The shared shape of the three per-question stages (search, answer, score).

Each stage writes one document per question into its own collection, keyed by the question's
item id, and then hands the question on. A redelivered message finds the document and only
re-announces the hand-off (de-duplicated by the broker), so no question is searched, answered or
scored twice. A question that cannot pass a stage gets a `failed` document with the reason and
is reported as finished, so the job never waits for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from faststream.nats import NatsBroker
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_contract import subjects
from aml_contract.messages import QuestionDone, QuestionStage, QuestionWork, message_id
from aml_contract.subjects import WorkStage
from aml_runtime.broker import Exhausted, publish, publish_work, run_delivery
from aml_runtime.db import Document
from aml_runtime.jobs import ACTIVE, fail_job, now, record_error
from aml_runtime.progress import record_final
from aml_runtime.settings import CommonSettings
from aml_runtime.stage_worker import StageCall, WorkItem
from aml_runtime.telemetry import stage_span

_NEXT: dict[QuestionStage, WorkStage | None] = {
    "search": "answer",
    "answer": "score",
    "score": None,
}
# A contract violation stops the whole job; other failures stay with their question.
_FATAL_KINDS = frozenset(
    {"contract_error", "authentication_error", "access_denied", "wrong_url", "run_limit_reached"}
)

Compute = Callable[[QuestionWork, Document, StageCall], Awaitable[Document]]


@dataclass
class QuestionStageWorker:
    stage: QuestionStage
    settings: CommonSettings
    db: AsyncDatabase[Document]
    broker: NatsBroker
    compute: Compute

    @property
    def collection(self) -> str:
        return {"search": "searches", "answer": "answers", "score": "scores"}[self.stage]

    async def handle(self, work: QuestionWork, item: WorkItem) -> None:
        async def attempt() -> None:
            await self._process(work, item)

        async def give_up(kind: str, reason: str) -> None:
            await self._store(work, {"state": "failed", "failure_kind": kind, "failure": reason})
            await record_error(self.db, work.job_id, self.stage, kind, work.item_id, reason)
            if kind in _FATAL_KINDS:
                await fail_job(self.db, self.broker, work.job_id, self.stage, kind, reason)
            await self._hand_on(work, "failed")

        ids = {"job_id": work.job_id, "request_id": work.item_id, "stage": self.stage}
        with stage_span(f"aml.{self.stage}", delivery=item.delivered, **ids):
            await run_delivery(item.delivery, self.settings, attempt, give_up)

    async def _process(self, work: QuestionWork, item: WorkItem) -> None:
        # A first delivery cannot find its document: the broker drops a re-published hand-off
        # (same message id) within its duplicate window. An LLM stage skips that read then; the
        # search keeps it, since a second Search would reach the participant.
        looked_up = self.stage == "search" or item.delivered > 1
        existing = (
            await self.db[self.collection].find_one({"_id": work.item_id}, {"state": 1})
            if looked_up
            else None
        )
        if existing is not None:
            # Its writer may have died before recording it: record (once) and hand on again.
            await record_final(self.db, work.job_id, self.stage, work.item_id, existing["state"])
            await self._hand_on(work, existing["state"])
            return
        # Checked after admission, right before the call: a failed job's work is dropped here.
        job = await self.db.jobs.find_one({"_id": work.job_id}, {"state": 1, "top_k": 1})
        if job is None or job["state"] not in ACTIVE:
            return
        question = await self.db.questions.find_one({"_id": work.item_id})
        if question is None:
            raise Exhausted("platform_error", f"question {work.item_id} is not planned")
        fields = await self.compute(work, question, item.call(job))
        await self._hand_on(work, await self._store(work, {"state": "done", **fields}))

    async def _store(self, work: QuestionWork, fields: Document) -> str:
        """Store the stage's outcome unless one is stored; returns the state that stands."""
        # A concurrent or earlier delivery may have stored it first; its result stands, so the
        # outcome recorded is the stored one (its writer may have died before recording it).
        state = fields.get("state")
        try:
            await self.db[self.collection].insert_one(
                {"_id": work.item_id, "job_id": work.job_id, "finished_at": now(), **fields}
            )
        except DuplicateKeyError:
            stored = await self.db[self.collection].find_one({"_id": work.item_id}, {"state": 1})
            state = (stored or {}).get("state")
        await record_final(self.db, work.job_id, self.stage, work.item_id, state)
        return str(state)

    async def _hand_on(self, work: QuestionWork, state: str) -> None:
        following = _NEXT[self.stage]
        if state == "done" and following is not None:
            await publish_work(self.broker, following, work, work.item_id)
            return
        outcome = "done" if state == "done" else "failed"
        done = QuestionDone(
            job_id=work.job_id, item_id=work.item_id, stage=self.stage, outcome=outcome
        )
        await publish(
            self.broker, subjects.QUESTION_DONE, done, message_id("question-done", work.item_id)
        )
