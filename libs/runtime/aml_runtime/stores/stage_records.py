"""The per-question stages' records (`searches`, `answers`, `scores`): the only code that reads
or writes them.

A record is inserted once per question and stage by `aml_pipeline.question_stage`, terminal
(`done` with the stage's fields, or `failed` with why): the unique `_id` (the question's item
id) settles a redelivery or a concurrent delivery, whose insert fails with `DuplicateKeyError`
and reads the state that stands (`store_outcome`, `state_of`). The next stage reads what it
was not handed with its work (the answerer a search's candidates, the scorer an answer), the
scheduler reads whether held searches are final and each question's final record (and its
answer's figures) when the job completes, the stall watchdog reads held searches too, the
progress repair recounts the records' states and times, the gateway shows a search and a
coding job's attempts to their team, and retention empties their bodies.

Every filter, update, projection and option below is the one its caller sent before this
store existed: the hot ones are served by the indexes of `aml_runtime.documents` on nx-27017
(`_id`, `job_id`, `(job_id, state)`), and each method is one database operation per
collection it reads (or the one cursor it iterates), as before.

Returned through the models of `aml_runtime.documents` (`SearchDocument`, `AnswerDocument`,
`StageRecord`, `ScoreDocument`) where the caller reads a whole record; as the projected fields
where the caller asked for a projection (a stage's look-up of a state, once per question, and
the recount's states and times, once per record)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_contract.messages import QuestionStage
from aml_runtime.db import Document
from aml_runtime.documents import (
    ANSWERS,
    SCORES,
    SEARCHES,
    AnswerDocument,
    ScoreDocument,
    SearchDocument,
    StageRecord,
)

# Each question stage's collection (`STAGE_COLLECTIONS` without the Adds': not this store's).
_COLLECTIONS: dict[QuestionStage, str] = {"search": SEARCHES, "answer": ANSWERS, "score": SCORES}

# What retention empties of each record (the records stay: counts and outcomes survive): the
# collection, which of its records (besides the job's), and the fields emptied. A coding
# attempt's own bodies (its trajectory, its test log) are emptied only where they are, so no
# other record gains a field.
_BODIES: tuple[tuple[str, Document, Document], ...] = (
    (SEARCHES, {}, {"candidates": []}),
    (ANSWERS, {}, {"answer": None}),
    (ANSWERS, {"trajectory": {"$exists": True}}, {"trajectory": []}),
    (SCORES, {}, {"judge_replies": []}),
    (SCORES, {"test_log": {"$exists": True}}, {"test_log": None}),
)


# What a coding job's page shows of an attempt at each stage: how the record ended, the agent's
# end and steps, the verdict and why; never a body (the patch, the trajectory, the test log).
_ATTEMPT_FIELDS: dict[QuestionStage, Document] = {
    "search": {"state": 1, "failure_kind": 1, "failure": 1},
    "answer": {
        "state": 1,
        "failure_kind": 1,
        "failure": 1,
        "end_reason": 1,
        "steps": 1,
        "patch_rejected": 1,
    },
    "score": {"state": 1, "failure_kind": 1, "failure": 1, "resolved": 1, "reason": 1},
}


# What the efficiency figures read of an answer (aml_evaluation.efficiency.AnswerUse).
ANSWER_FIGURES = {
    "state": 1,
    "candidates_returned": 1,
    "candidates_used": 1,
    "retrieved_tokens": 1,
    "retrieved_bytes": 1,
    "used_tokens": 1,
    "tokens_in": 1,
    "tokens_out": 1,
}


class StageRecordStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    # -- the stage's own record (aml_pipeline.question_stage) -----------------------------------

    async def store_outcome(
        self,
        stage: QuestionStage,
        item_id: str,
        job_id: str,
        finished_at: datetime,
        at_us: int,
        fields: Document,
    ) -> bool:
        """Insert the question's record at `stage` (`fields` hold its `state` and the stage's
        results) unless one is stored; False when one was (an earlier or concurrent delivery
        stored it first, and its record stands: `state_of`). A plain document, not a model: the
        stage's fields are stored exactly as it computed them (a model would add its defaults),
        once per question and stage."""
        try:
            await self._db[_COLLECTIONS[stage]].insert_one(
                {
                    "_id": item_id,
                    "job_id": job_id,
                    "finished_at": finished_at,
                    "at_us": at_us,
                    **fields,
                }
            )
        except DuplicateKeyError:
            return False
        return True

    async def state_of(self, stage: QuestionStage, item_id: str) -> str | None:
        """The state of the question's record at `stage`; None when it has none. Read before
        every participant call and on every redelivery: the `state` alone (by `_id`), not the
        record."""
        stored = await self._db[_COLLECTIONS[stage]].find_one({"_id": item_id}, {"state": 1})
        return None if stored is None else str(stored["state"])

    # -- what the next stage reads when its work did not carry it -------------------------------

    async def candidates_of(self, item_id: str) -> list[Document] | None:
        """The candidates of the question's `done` search; None when it has no search record
        or a failed one. Only `state` and `candidates` are read (the answerer's read of
        candidates too large to travel with the work), not the record."""
        search = await self._db.searches.find_one({"_id": item_id}, {"state": 1, "candidates": 1})
        if search is None or search["state"] != "done":
            return None
        candidates: list[Document] = search["candidates"]
        return candidates

    async def answer_of(self, item_id: str) -> AnswerDocument | None:
        """The question's answer record (one record, read by id: cheap to validate)."""
        stored = await self._db.answers.find_one({"_id": item_id})
        return None if stored is None else AnswerDocument.model_validate(stored)

    async def search_of(self, job_id: str, item_id: str) -> SearchDocument | None:
        """The question's search record if it is the job's (the gateway's audit of a search:
        one record, by id)."""
        stored = await self._db.searches.find_one({"_id": item_id, "job_id": job_id})
        return None if stored is None else SearchDocument.model_validate(stored)

    async def attempt_records(
        self, item_ids: list[str]
    ) -> dict[QuestionStage, dict[str, Document]]:
        """Per stage, these coding attempts' records by item id (those without one absent),
        only the fields of `_ATTEMPT_FIELDS` (the gateway's page of a job's attempts: one read
        per stage, by `_id`, for a page of ids)."""
        found: dict[QuestionStage, dict[str, Document]] = {}
        for stage, collection in _COLLECTIONS.items():
            records = self._db[collection].find({"_id": {"$in": item_ids}}, _ATTEMPT_FIELDS[stage])
            found[stage] = {record["_id"]: record async for record in records}
        return found

    # -- the scheduler and the stall watchdog ---------------------------------------------------

    async def searches_final(self, item_ids: list[str]) -> int:
        """How many of these questions' searches are final (done or failed: a search record is
        written once, terminal). Only the `_id`s are read."""
        final = await self._db.searches.find({"_id": {"$in": item_ids}}, {"_id": 1}).to_list()
        return len(final)

    async def final_records(self, job_id: str) -> dict[str, StageRecord]:
        """Each question's final record by item id, where it has one: its failed search, else
        its failed answer, else its score (a `ScoreDocument`, done or failed). Once per job, at
        its completion (three reads: the failed searches, the failed answers, every score),
        each record validated as before."""
        final: dict[str, StageRecord] = {}
        for collection in (SEARCHES, ANSWERS):
            async for doc in self._db[collection].find({"job_id": job_id, "state": "failed"}):
                final.setdefault(doc["_id"], StageRecord.model_validate(doc))
        # Without a coding attempt's test log (up to 256 KiB each): the aggregation never reads it.
        async for doc in self._db.scores.find({"job_id": job_id}, {"test_log": 0}):
            final.setdefault(doc["_id"], ScoreDocument.model_validate(doc))
        return final

    async def answer_figures(self, job_id: str) -> AsyncIterator[Document]:
        """The job's `done` answers, only `ANSWER_FIGURES` (the efficiency figures, once per
        completed job: the `job_id` index, streamed; a failed answer holds none of them)."""
        found = self._db.answers.find({"job_id": job_id}, ANSWER_FIGURES)
        async for doc in found:
            if doc.get("state") == "done":
                yield doc

    async def stamps(self, job_id: str) -> AsyncIterator[tuple[QuestionStage, Document]]:
        """Every record of the job with its stage, only its `state` and `at_us` (the progress
        repair's recount: O(the job's records), so a projection, not validated), stage by
        stage in the order of `STAGE_COLLECTIONS`."""
        for stage, collection in _COLLECTIONS.items():
            found = self._db[collection].find({"job_id": job_id}, {"state": 1, "at_us": 1})
            async for doc in found:
                yield stage, doc

    # -- retention ------------------------------------------------------------------------------

    async def purge_bodies(self, job_id: str) -> None:
        """Empty what the job's records hold of the participant's memory and the models'
        replies: the searches' candidates, the answers (a coding attempt's: its patch), the
        judge's replies, a coding attempt's trajectory and test log. Repeatable."""
        for collection, which, emptied in _BODIES:
            await self._db[collection].update_many({"job_id": job_id, **which}, {"$set": emptied})
