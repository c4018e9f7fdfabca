"""What the scheduler plans for a job (`add_chunks`, `questions`, `question_releases`,
`written_texts`, `specs`): the only code that reads or writes them.

A job's plan is written once by the scheduler (`insert_chunks`, `insert_questions`,
`store_written`, `store_spec`; an interrupted plan's documents are kept, so a re-plan changes
nothing). The scheduler then releases the Adds in each user's order (`chain_chunk`,
`announced_chunk`) and the questions behind markers written once (`released`, `mark_released`,
`user_questions`, `questions_among`); the adder sends each chunk and finishes it once
(`chunk`, `mark_chunk`, guarded by `pending`); the question stages read a question's planned
facts and Search body (`question`, `question_user`, `search_body`); the searcher looks up who a
returned text was written for (`written_owners`); the progress repair and the stall watchdog
read the chunks' states (`chunk_states`, `pending_chunks`); the completion reads what an outcome
names of every question (`questions_of`, `platform_failed_chunks`) and which dataset each Add
was of (`chunk_datasets`); the gateway pages through
a coding job's attempts for its owner (`attempts_page`); retention empties the bodies and drops
the written texts (`purge_bodies`, `drop_written`).

Every filter, update, projection and option below is the one its caller sent before this store
existed: the hot ones (a chunk or question by `_id`, a user's questions by `user_id`, a job's
documents by `job_id`) are served by the indexes of `aml_runtime.documents` on nx-27017, and each
method is the same database operations (or the one cursor it iterates), as before.

Planned documents come in as the typed models of `aml_runtime.documents` (`AddChunkDocument`,
`QuestionDocument`). They are returned as stored (a `Document`), not validated: every read of a
whole chunk or question is on a hot path (once per Add, once per released or worked question)
and hands the stored form on (the Add's body, `QuestionFacts.of`, a stage's compute), and the
others are projections returning exactly the fields asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from aml_contract.messages import Outcome
from aml_contract.participant import user_chunk_id
from aml_runtime.clock import now
from aml_runtime.db import Document
from aml_runtime.documents import AddChunkDocument, FailureKind, QuestionDocument

_DUPLICATE_KEY = 11000

# What a release needs to know of a user's next chunk (`aml_pipeline.chains`): read on every
# Add's confirmation, by `_id`, so a projection, not the whole chunk (its body is the session).
NEXT_CHUNK_FIELDS = {"state": 1, "seq": 1, "searched_before": 1}
# What the scheduler reads of an announced chunk: not the body, only what the release needs.
_ANNOUNCED_FIELDS = {"user_id": 1, "seq": 1, "failure": 1, "failure_kind": 1}
# What a question's outcome names (the completion's aggregation reads every question of a job).
_OUTCOME_FIELDS = {
    "dataset_id": 1,
    "category_name": 1,
    "question_id": 1,
    "point_index": 1,
    # A coding attempt's task type (absent elsewhere): results split by it.
    "task_type": 1,
    # The Search top_k a dataset declares (absent: the job's): what efficiency was measured under.
    "top_k": 1,
}
# What names a coding attempt on its job's page (never its Search body or problem statement).
_ATTEMPT_FIELDS = {
    "dataset_id": 1,
    "question_id": 1,
    "category_name": 1,
    "coding_task": 1,
    "task_type": 1,
}
# What the stall watchdog reads of a pending chunk: where it is in its chain, what it waits for.
_PENDING_FIELDS = {"user_id": 1, "seq": 1, "searched_before": 1}


class PlanStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    # -- the plan (written once per job by the scheduler) ----------------------------------------

    async def insert_chunks(self, chunks: Iterable[AddChunkDocument]) -> None:
        """Insert planned Adds; ones that exist already (an earlier, interrupted plan) are kept."""
        await self._insert_new(self._db.add_chunks, [chunk.stored() for chunk in chunks])

    async def insert_questions(self, questions: Iterable[QuestionDocument]) -> None:
        """Insert planned questions; ones that exist already are kept."""
        await self._insert_new(self._db.questions, [q.stored() for q in questions])

    async def store_written(self, batches: Iterable[list[Document]]) -> None:
        """Store written-text documents (`WrittenOwners.take`): inserted, or, for a text stored
        already (met earlier in the plan, or by an interrupted plan), its users merged into the
        stored ones. `users` stays sorted, and a re-plan changes nothing."""
        for docs in batches:
            stored = await self._insert_new(self._db.written_texts, docs)
            if stored:
                await self._merge_written(stored)

    async def _merge_written(self, docs: list[Document]) -> None:
        """Add each document's users to its stored one, sorted (by `_id`: one read, one write).
        Users are only ever added, so a stored list that still has the length read has not
        changed since: the write is guarded by it, and whatever another writer (a second
        planner, should one run) changed in between is merged again from a new read."""
        while True:
            wanted = {doc["_id"]: doc["users"] for doc in docs}
            merges: list[UpdateOne] = []
            async for stored in self._db.written_texts.find(
                {"_id": {"$in": list(wanted)}}, {"users": 1}
            ):
                users = list(stored["users"])
                merged = sorted({*users, *wanted.pop(stored["_id"])})
                if merged != users:
                    guard = {"_id": stored["_id"], "users": {"$size": len(users)}}
                    merges.append(UpdateOne(guard, {"$set": {"users": merged}}))
            # Not found (none is removed while its job is planned): inserted, unless one is now.
            missing = [doc for doc in docs if doc["_id"] in wanted]
            changed = bool(await self._insert_new(self._db.written_texts, missing))
            if merges:
                result = await self._db.written_texts.bulk_write(merges, ordered=False)
                changed |= result.matched_count < len(merges)
            if not changed:
                return

    async def store_spec(self, spec_hash: str, spec: dict[str, Any]) -> None:
        """The whole evaluation spec, stored once per content hash (the job records the hash)."""
        await self._db.specs.update_one(
            {"_id": spec_hash}, {"$setOnInsert": {"spec": spec}}, upsert=True
        )

    @staticmethod
    async def _insert_new(
        collection: AsyncCollection[Document], docs: list[Document]
    ) -> list[Document]:
        """Insert documents; those whose `_id` exists already are returned, not inserted."""
        if not docs:
            return []
        try:
            await collection.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(e.get("code") != _DUPLICATE_KEY for e in errors):
                raise
            return [docs[e["index"]] for e in errors]
        return []

    # -- Add chunks -----------------------------------------------------------------------------

    async def chunk(self, request_id: str) -> Document | None:
        """The whole chunk as stored (the adder sends its body): once per Add, by `_id`."""
        return await self._db.add_chunks.find_one({"_id": request_id})

    async def chain_chunk(self, user_id: str, seq: int) -> Document | None:
        """The user's `seq`-th chunk, only `NEXT_CHUNK_FIELDS` (None: the user has no more)."""
        return await self._db.add_chunks.find_one(
            {"_id": user_chunk_id(user_id, seq)}, NEXT_CHUNK_FIELDS
        )

    async def announced_chunk(self, request_id: str) -> Document | None:
        """An announced chunk's `user_id`, `seq`, `failure` and `failure_kind` (not its body)."""
        return await self._db.add_chunks.find_one({"_id": request_id}, _ANNOUNCED_FIELDS)

    async def mark_chunk(
        self, request_id: str, outcome: Outcome, at_us: int, fields: Document
    ) -> bool:
        """Finish a pending chunk with its outcome (and `fields`: why it failed), once: False
        when an earlier delivery finished it first (its outcome stands)."""
        updated = await self._db.add_chunks.update_one(
            {"_id": request_id, "state": "pending"},
            {"$set": {"state": outcome, "finished_at": now(), "at_us": at_us, **fields}},
        )
        return bool(updated.modified_count)

    async def pending_chunks(self, job_id: str) -> AsyncIterator[Document]:
        """The job's pending chunks, only `user_id`, `seq` and `searched_before` (the stall
        watchdog, once per stalled job: the (job_id, state) index)."""
        pending = self._db.add_chunks.find({"job_id": job_id, "state": "pending"}, _PENDING_FIELDS)
        async for chunk in pending:
            yield chunk

    async def chunk_states(self, job_id: str) -> AsyncIterator[Document]:
        """Every chunk of the job, only `state` and `at_us` (the progress repair's recount)."""
        async for chunk in self._db.add_chunks.find({"job_id": job_id}, {"state": 1, "at_us": 1}):
            yield chunk

    async def chunk_datasets(self, job_id: str) -> AsyncIterator[Document]:
        """Every chunk of the job, only its `dataset_id` (which dataset an Add's calls count in:
        once per completed job of several datasets, the `job_id` index)."""
        async for chunk in self._db.add_chunks.find({"job_id": job_id}, {"dataset_id": 1}):
            yield chunk

    async def platform_failed_chunks(self, job_id: str) -> int:
        """How many of the job's chunks failed by the platform itself (`platform_error`)."""
        failed = self._db.add_chunks.find(
            {"job_id": job_id, "state": "failed", "failure_kind": FailureKind.PLATFORM_ERROR},
            {"_id": 1},
        )
        return len(await failed.to_list())

    # -- questions ------------------------------------------------------------------------------

    async def question(self, item_id: str) -> Document | None:
        """The whole planned question as stored (a stage's compute reads it): by `_id`."""
        return await self._db.questions.find_one({"_id": item_id})

    async def question_user(self, item_id: str) -> str:
        """The question's memory user ("" when it is not planned): by `_id`, one field."""
        question = await self._db.questions.find_one({"_id": item_id}, {"user_id": 1})
        return str((question or {}).get("user_id", ""))

    async def search_body(self, item_id: str) -> bytes | None:
        """The question's planned Search body (None: not planned, or emptied by retention)."""
        planned = await self._db.questions.find_one({"_id": item_id}, {"search_body": 1})
        body: bytes | None = None if planned is None else planned.get("search_body")
        return body

    async def user_questions(self, user_id: str) -> AsyncIterator[Document]:
        """Every question of a memory user, whole, as stored (released with their facts and
        Search bodies). A memory user_id belongs to one job: by it alone, so the single-field
        index serves it (nx-27017 serves an equality filter only from a single-field index)."""
        async for question in self._db.questions.find({"user_id": user_id}):
            yield question

    async def questions_among(self, item_ids: list[str]) -> AsyncIterator[Document]:
        """These questions, whole, as stored (the ones asked right before a held Add)."""
        async for question in self._db.questions.find({"_id": {"$in": item_ids}}):
            yield question

    async def questions_of(self, job_id: str) -> AsyncIterator[Document]:
        """Every question of the job, only what its outcome names (`dataset_id`,
        `category_name`, `question_id`, `point_index`, `task_type`) and its Search `top_k`
        where the dataset declares one: once per job, the `job_id` index."""
        async for question in self._db.questions.find({"job_id": job_id}, _OUTCOME_FIELDS):
            yield question

    async def attempts_page(self, job_id: str, after: str | None, limit: int) -> list[Document]:
        """The job's questions in item-id order from after the item `after`, only what names a
        coding attempt (`dataset_id`, `question_id`, `category_name`, `coding_task`,
        `task_type`): at most `limit` + 1, the last one there only to tell that there is a next
        page. The job's owner reads a coding job's attempts a page at a time (the `job_id`
        index; a coding job has a few hundred)."""
        query: Document = {"job_id": job_id}
        if after is not None:
            query["_id"] = {"$gt": after}
        found = self._db.questions.find(query, _ATTEMPT_FIELDS).sort("_id", 1).limit(limit + 1)
        return await found.to_list()

    # -- question releases (a marker per user, and per point a held Add waits at) ---------------

    async def released(self, marker: str) -> bool:
        """Whether the questions behind `marker` were all published."""
        return await self._db.question_releases.find_one({"_id": marker}) is not None

    async def mark_released(self, marker: str, job_id: str, held: int | None = None) -> None:
        """The questions behind `marker` are all published (`held`: how many held an Add
        back); written once, a second write keeps the first."""
        marker_doc: Document = {"_id": marker, "job_id": job_id}
        if held is not None:
            marker_doc["held"] = held
        await self._insert_new(self._db.question_releases, [marker_doc])

    # -- written texts --------------------------------------------------------------------------

    async def written_owners(self, job_id: str, digests: list[str]) -> dict[str, list[str]]:
        """Per digest of a text written in the job, the users it was written for (digests of no
        text are absent): only these texts, by id, never the job's whole map."""
        return {
            doc["_id"].rsplit("/", 1)[1]: doc["users"]
            async for doc in self._db.written_texts.find(
                {"_id": {"$in": [f"{job_id}/{d}" for d in digests]}}, {"users": 1}
            )
        }

    # -- retention ------------------------------------------------------------------------------

    async def purge_bodies(self, job_id: str) -> None:
        """Empty the job's Add bodies and Search bodies; the documents stay. Repeatable."""
        await self._db.add_chunks.update_many({"job_id": job_id}, {"$set": {"body": None}})
        await self._db.questions.update_many({"job_id": job_id}, {"$set": {"search_body": None}})

    async def drop_written(self, job_id: str) -> None:
        """Delete the job's written texts (kept only to detect leaks while it ran)."""
        await self._db.written_texts.delete_many({"job_id": job_id})
