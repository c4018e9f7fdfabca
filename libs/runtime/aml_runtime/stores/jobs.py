"""Jobs and their error summaries (`jobs`, `job_errors`): the only code that reads or writes them.

A job is inserted `queued` by the gateway's submission (`create`), planned and started by the
scheduler (`start`: not planned -> running), counted by the stages (`count`, with the repair's
recount: `aml_pipeline.progress`), ended once by `complete` or `fail` (each guarded by the
state it leaves), gated by the publisher (`record_gate`), reviewed and published by the gateway
(`approve`, `reject`, `disqualify`), and its run data deleted by retention (`mark_purged`).

Every filter, update, projection, sort and option below is the one its caller sent before this
store existed: the hot ones are served by the indexes of `aml_runtime.documents` on nx-27017,
and each method is one database operation (or the one cursor it iterates), as before.

Returned as `JobDocument` where the caller reads the whole job through the model. Returned as a
`Document` (as stored) where the caller hands the stored job on to readers of the stored form:
the progress counters by dotted path (`aml_pipeline.progress`), the status (`job_status`), the
gate's facts, the review view; those tolerate a job written by something other than the
gateway's submission (an older release, a test's fixture) that lacks a field the model
requires. Projections return exactly the fields asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from typing import Any, NamedTuple

from pymongo import DESCENDING, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_contract.api.publication import ReviewState
from aml_contract.api.vocabulary import Stage
from aml_runtime.clock import micros
from aml_runtime.db import Document, read_time
from aml_runtime.documents import ACTIVE_JOB_STATES, FINISHED_JOB_STATES, FailureKind, JobDocument

# -- the progress counters' bookkeeping (the counters themselves: aml_pipeline.progress) --------

# Bumped by every increment: the repair's guard against a concurrent increment.
EVENTS = "progress.events"
# Time (µs) of the latest counted outcome, and of the latest repair: when counters last moved.
LAST_US = "progress.last_us"
REPAIRED_US = "progress.repaired_us"
# Every document with `at_us` at or under this is in the counters through a repair's recount.
COUNTED_TO = "progress.counted_to"


def counting_filters(job_id: str, at_us: int) -> tuple[Document, Document]:
    """The job while no repair has counted records as recent as `at_us`: no watermark yet, or
    one below it. Two plain filters tried in turn, not one `$or`: nx-27017 applies a top-level
    `$or` of a *write* filter without the filter's other conditions (it would update another
    job). The watermark is never removed once written, so when the first filter does not match
    the second alone decides, atomically."""
    return (
        {"_id": job_id, COUNTED_TO: {"$exists": False}},
        {"_id": job_id, COUNTED_TO: {"$lt": at_us}},
    )


# What the scheduler's reconciliation reads of every unfinished job.
_ACTIVE_FIELDS = {
    "_id": 1,
    "version_id": 1,
    "started_at": 1,
    "planned": 1,
    "progress": 1,
    "state": 1,
    "totals": 1,
    "created_at": 1,
}
# What the publisher's duplicate check reads of a published job.
_PUBLISHED_FIELDS = {"version_id": 1, "track": 1, "results": 1, "disqualified": 1}


class RetentionFacts(NamedTuple):
    """What retention reads of an ended job whose run data is still kept."""

    job_id: str
    finished_at: datetime | None
    keep_until: datetime | None


class JobStore:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    # -- whole jobs ----------------------------------------------------------------------------

    async def create(self, job: JobDocument) -> Document:
        """Insert a submitted job; the document as stored. `DuplicateKeyError` when its Run
        Label or submission number is taken (the gateway's unique indexes)."""
        document = job.stored()
        await self._db.jobs.insert_one(document)
        return document

    async def get(self, job_id: str) -> JobDocument | None:
        """The job through its model (one job, read by id: cheap to validate)."""
        stored = await self._db.jobs.find_one({"_id": job_id})
        return None if stored is None else JobDocument.model_validate(stored)

    async def document(self, job_id: str) -> Document | None:
        """The job as stored (see the module's docstring for who reads it so)."""
        return await self._db.jobs.find_one({"_id": job_id})

    async def team_job(self, job_id: str, team_id: str) -> Document | None:
        """The job as stored if it is the team's (another team's job is as good as missing)."""
        return await self._db.jobs.find_one({"_id": job_id, "team_id": team_id})

    async def team_jobs(self, team_id: str) -> list[JobDocument]:
        """Every job of the team (what the submission rules judge a new one against)."""
        jobs = await self._db.jobs.find({"team_id": team_id}).to_list()
        return [JobDocument.model_validate(job) for job in jobs]

    async def latest_of_team(self, team_id: str) -> AsyncIterator[Document]:
        """The team's 100 newest jobs as stored, newest first: the (team_id, created_at) index."""
        async for job in self._db.jobs.find({"team_id": team_id}).sort("created_at", -1).limit(100):
            yield job

    async def in_review(self, state: ReviewState, limit: int) -> AsyncIterator[Document]:
        """The jobs in a review state as stored, oldest first, at most `limit`."""
        found = self._db.jobs.find({"review_state": state}).sort("created_at", 1).limit(limit)
        async for job in found:
            yield job

    async def approved(self) -> AsyncIterator[Document]:
        """Every approved job as stored (the leaderboard's repair of a missing entry)."""
        async for job in self._db.jobs.find({"review_state": "approved"}):
            yield job

    # -- projections ---------------------------------------------------------------------------

    async def state_of(self, job_id: str) -> str | None:
        """The job's state; None when there is no such job."""
        job = await self._db.jobs.find_one({"_id": job_id}, {"state": 1})
        return None if job is None else str(job["state"])

    async def stage_view(self, job_id: str) -> Document | None:
        """The job's `state` and `top_k`: what a stage checks before each call. Hot (once a
        second per job and stage process), and kept by `aml_pipeline.jobs.JobStates` beside
        the `{"state": ...}` it learns from announcements: a plain projection."""
        return await self._db.jobs.find_one({"_id": job_id}, {"state": 1, "top_k": 1})

    async def search_view(self, job_id: str) -> Document | None:
        """The job's `top_k` (the searcher's read when its item carries no job): a projection,
        read where the stage's view would be."""
        return await self._db.jobs.find_one({"_id": job_id}, {"top_k": 1})

    async def running_version(self, job_id: str) -> str | None:
        """The job's version while the job is running, else None (read on every Add
        confirmation: by id, two fields)."""
        job = await self._db.jobs.find_one({"_id": job_id}, {"state": 1, "version_id": 1})
        if job is None or job["state"] != "running":
            return None
        return str(job["version_id"])

    async def users_of(self, job_id: str) -> list[str]:
        """The job's users in the order their Adds start (none for an unknown job)."""
        job = await self._db.jobs.find_one({"_id": job_id}, {"users": 1})
        users: list[str] = (job or {}).get("users", [])
        return users

    async def active_jobs(self) -> AsyncIterator[Document]:
        """Every queued or running job: the fields the reconciliation's rules read (by path:
        the progress counters, the stall watchdog), not the whole job."""
        active = {"state": {"$in": list(ACTIVE_JOB_STATES)}}
        async for job in self._db.jobs.find(active, _ACTIVE_FIELDS):
            yield job

    async def count_by_state(self) -> dict[str, int]:
        """How many jobs are in each state (the states no job is in are absent)."""
        counts: dict[str, int] = {}
        async for row in await self._db.jobs.aggregate(
            [{"$group": {"_id": "$state", "n": {"$sum": 1}}}]
        ):
            counts[str(row["_id"])] = int(row["n"])
        return counts

    async def ungated(self) -> AsyncIterator[str]:
        """The ids of the ended jobs the publisher has not gated yet."""
        ungated = {"state": {"$in": list(FINISHED_JOB_STATES)}, "gate": {"$exists": False}}
        async for job in self._db.jobs.find(ungated, {"_id": 1}):
            yield job["_id"]

    async def published_facts(self, job_id: str) -> Document | None:
        """What the gate's duplicate check takes from a published entry's job (read with
        `.get`, a projection)."""
        return await self._db.jobs.find_one({"_id": job_id}, _PUBLISHED_FIELDS)

    async def approved_facts(self) -> AsyncIterator[Document]:
        """The same fields of every approved job."""
        async for job in self._db.jobs.find({"review_state": "approved"}, _PUBLISHED_FIELDS):
            yield job

    async def approved_among(self, job_ids: Iterable[str]) -> set[str]:
        """Which of these jobs are approved."""
        approved = {"_id": {"$in": list(job_ids)}, "review_state": "approved"}
        return {job["_id"] async for job in self._db.jobs.find(approved, {"_id": 1})}

    async def unpurged_ended(self) -> AsyncIterator[RetentionFacts]:
        """Every ended job whose run data retention has not deleted yet."""
        projection = {"finished_at": 1, "retention_keep_until": 1, "retention_purged_at": 1}
        async for job in self._db.jobs.find(
            {"state": {"$in": list(FINISHED_JOB_STATES)}}, projection
        ):
            if job.get("retention_purged_at") is not None:
                continue
            yield RetentionFacts(
                job["_id"],
                read_time(job.get("finished_at")),
                read_time(job.get("retention_keep_until")),
            )

    async def purged(self, job_id: str) -> bool | None:
        """Whether retention deleted the job's run data; None when there is no such job."""
        job = await self._db.jobs.find_one({"_id": job_id}, {"retention_purged_at": 1})
        return None if job is None else job.get("retention_purged_at") is not None

    # -- transitions (each guarded by the state it leaves, where it leaves one) -----------------

    async def start(
        self,
        job_id: str,
        *,
        started_at: datetime,
        top_k: int,
        spec: dict[str, Any],
        spec_hash: str,
        code_hash: str,
        dataset_bundles: dict[str, str],
        dataset_bundle_hash: str,
        users: list[str],
        excluded_categories: dict[str, list[str]],
        f1_variants: dict[str, str],
        chunkers: dict[str, str],
        totals: dict[str, int],
    ) -> None:
        """The plan is stored: the job, not planned yet, runs (once, whoever planned it)."""
        await self._db.jobs.update_one(
            {"_id": job_id, "planned": False},
            {
                "$set": {
                    "planned": True,
                    "state": "running",
                    "started_at": started_at,
                    "top_k": top_k,
                    "spec": spec,
                    "spec_hash": spec_hash,
                    "code_hash": code_hash,
                    "dataset_bundles": dataset_bundles,
                    "dataset_bundle_hash": dataset_bundle_hash,
                    "users": users,
                    "excluded_categories": excluded_categories,
                    "f1_variants": f1_variants,
                    "chunkers": chunkers,
                    "totals": totals,
                }
            },
        )

    async def record_code_hash(self, job_id: str, code_hash: str) -> None:
        """`code_hash`'s build processes the job's items (`JobDocument.code_hashes`): written
        before the first item it processes, so no item's outcome is stored without it."""
        await self._db.jobs.update_one(
            {"_id": job_id}, {"$set": {f"code_hashes.{code_hash}": True}}
        )

    async def complete(
        self,
        job_id: str,
        *,
        finished_at: datetime,
        results: Document,
        platform_failures: int,
        platform_failure_reason: str | None,
        code_hash: str | None = None,
    ) -> bool:
        """Running -> completed with its results; False when it was not running (any more).
        `code_hash`: the build that computed the results, recorded with them."""
        fields: Document = {
            "state": "completed",
            "finished_at": finished_at,
            "results": results,
            "platform_failures": platform_failures,
        }
        if code_hash is not None:
            fields[f"code_hashes.{code_hash}"] = True
        if platform_failure_reason is not None:
            fields["platform_failure_reason"] = platform_failure_reason
        updated = await self._db.jobs.update_one(
            {"_id": job_id, "state": "running"}, {"$set": fields}
        )
        return bool(updated.modified_count)

    async def fail(
        self, job_id: str, stage: Stage, kind: FailureKind, reason: str, finished_at: datetime
    ) -> str | None:
        """Queued or running -> failed; the job's version when this call failed it, else None
        (it had ended already, or there is no such job)."""
        failed = await self._db.jobs.find_one_and_update(
            {"_id": job_id, "state": {"$in": list(ACTIVE_JOB_STATES)}},
            {
                "$set": {
                    "state": "failed",
                    "failed_stage": stage,
                    "failure_kind": kind,
                    "failure": reason,
                    "finished_at": finished_at,
                }
            },
            {"version_id": 1},
        )
        return None if failed is None else str(failed["version_id"])

    async def record_gate(
        self, job_id: str, gate: Document, review_state: ReviewState | None
    ) -> bool:
        """Store the gate's outcome (and `review_state`, unless None) once: False when a gate
        is stored already. `$exists: false` matches a missing field on MongoDB and on nx-27017
        alike (the field is never written as null); of two concurrent gates exactly one is
        stored."""
        fields: Document = {"gate": gate}
        if review_state is not None:
            fields["review_state"] = review_state
        stored = await self._db.jobs.update_one(
            {"_id": job_id, "gate": {"$exists": False}}, {"$set": fields}
        )
        return bool(stored.modified_count)

    async def approve(self, job_id: str, entry_id: str, reviewed_at: datetime) -> bool:
        """Pending review -> approved, naming the entry to be created; False when the job was
        not pending review (any more)."""
        decision = {"review_state": "approved", "reviewed_at": reviewed_at, "entry_id": entry_id}
        return await self._decide_review(job_id, decision)

    async def name_entry(self, job_id: str, entry_id: str) -> None:
        """The job's entry is this one (an entry of the job existed already)."""
        await self._db.jobs.update_one({"_id": job_id}, {"$set": {"entry_id": entry_id}})

    async def undo_approval(self, job_id: str, entry_id: str) -> None:
        """Approved (naming `entry_id`, which was not created) -> pending review again."""
        await self._db.jobs.update_one(
            {"_id": job_id, "review_state": "approved", "entry_id": entry_id},
            {"$set": {"review_state": "pending_review", "reviewed_at": None, "entry_id": None}},
        )

    async def reject(self, job_id: str, reason: str, reviewed_at: datetime) -> bool:
        """Pending review -> rejected; False when the job was not pending review (any more)."""
        decision = {"review_state": "rejected", "review_reason": reason, "reviewed_at": reviewed_at}
        return await self._decide_review(job_id, decision)

    async def _decide_review(self, job_id: str, decision: Document) -> bool:
        """The review's decision, taken once: only a job still pending review changes."""
        decided = await self._db.jobs.update_one(
            {"_id": job_id, "review_state": "pending_review"}, {"$set": decision}
        )
        return bool(decided.modified_count)

    async def disqualify(self, job_id: str, reason: str) -> None:
        """Approved -> disqualified (its entry was)."""
        await self._db.jobs.update_one(
            {"_id": job_id, "review_state": "approved"},
            {"$set": {"review_state": "disqualified", "review_reason": reason}},
        )

    async def keep_run_data(self, job_id: str, keep_until: datetime, reason: str) -> None:
        """An admin keeps the job's run data past its retention."""
        await self._db.jobs.update_one(
            {"_id": job_id},
            {"$set": {"retention_keep_until": keep_until, "retention_reason": reason}},
        )

    async def mark_purged(self, job_id: str, purged_at: datetime) -> None:
        """Retention deleted the job's run data."""
        await self._db.jobs.update_one(
            {"_id": job_id}, {"$set": {"retention_purged_at": purged_at}}
        )

    # -- progress counters (aml_pipeline.progress) ---------------------------------------------

    async def count(self, job_id: str, inc: dict[str, int], at_us: int) -> Document | None:
        """Apply the counters' increment for outcomes stamped from `at_us` on; the job's
        `totals` and `progress` just before it (the pre-image of the same atomic update), or
        None when a repair had counted them already (or there is no such job). The hottest
        write of a run (once per batch of outcomes): the projection as is, not validated."""
        update = {"$inc": {**inc, EVENTS: 1}, "$set": {LAST_US: at_us}}
        fields = {"totals": 1, "progress": 1}
        for only_if in counting_filters(job_id, at_us):
            job = await self._db.jobs.find_one_and_update(
                only_if, update, fields, return_document=ReturnDocument.BEFORE
            )
            if job is not None:
                return job
        return None

    async def progress_of(self, job_id: str) -> Document | None:
        """The job's `progress` (counters and bookkeeping, read by path) and its `totals`, for a
        recount or a check of the counters."""
        return await self._db.jobs.find_one({"_id": job_id}, {"progress": 1, "totals": 1})

    async def stamp_repaired(self, job_id: str, repaired_us: int) -> None:
        """A recount found the counters exact: only its time is written."""
        await self._db.jobs.update_one({"_id": job_id}, {"$set": {REPAIRED_US: repaired_us}})

    async def store_recount(
        self, job_id: str, events: int, counted: dict[str, int], watermark: int, repaired_us: int
    ) -> bool:
        """Write the recounted counters and raise the watermark, only if no increment landed
        since `progress.events` was read as `events`; False when one did."""
        unchanged: Document = {EVENTS: events} if events else {EVENTS: {"$exists": False}}
        updated = await self._db.jobs.update_one(
            {"_id": job_id, **unchanged},
            {
                "$set": {**counted, COUNTED_TO: watermark, REPAIRED_US: repaired_us},
                "$inc": {EVENTS: 1},
            },
        )
        return bool(updated.matched_count)

    # -- error summaries (`job_errors`) ---------------------------------------------------------

    async def record_error(
        self,
        job_id: str,
        stage: Stage,
        kind: FailureKind,
        item: str | None,
        reason: str,
        at: datetime,
    ) -> bool:
        """One entry per failed item, keyed, so a redelivery records it once: False when it
        was recorded already."""
        key = f"{job_id}/{stage}/{item or '-'}"
        try:
            await self._db.job_errors.insert_one(
                {
                    "_id": key,
                    "job_id": job_id,
                    "stage": stage,
                    "kind": kind,
                    "item": item,
                    "reason": reason,
                    "at": at,
                    # The repair's watermark compares record times as integers (see progress).
                    "at_us": micros(at),
                }
            )
        except DuplicateKeyError:
            return False
        return True

    async def first_errors(self, job_id: str) -> AsyncIterator[Document]:
        """The job's first 100 entries by time, as stored (the status builds its errors from
        them): the (job_id, at) index serves the filter, order and limit."""
        async for error in self._db.job_errors.find({"job_id": job_id}).sort("at", 1).limit(100):
            yield error

    async def error_stamps(self, job_id: str) -> list[Document]:
        """Every entry of the job, only its `at_us` (a recount: their number and newest time)."""
        return await self._db.job_errors.find({"job_id": job_id}, {"at_us": 1}).to_list()

    async def latest_error_since(self, job_id: str, since_us: int) -> Document | None:
        """The job's newest entry recorded at or after `since_us`, as stored (read with `.get`).
        Once per stalled job: a sort over the job's entries is fine."""
        return await self._db.job_errors.find_one(
            {"job_id": job_id, "at_us": {"$gte": since_us}}, sort=[("at_us", DESCENDING)]
        )

    async def flawed_by_participant(self, job_ids: list[str]) -> set[str]:
        """Which of these jobs have an entry that is not the platform's own failure."""
        return {
            error["job_id"]
            async for error in self._db.job_errors.find(
                {"job_id": {"$in": job_ids}, "kind": {"$ne": FailureKind.PLATFORM_ERROR}},
                {"job_id": 1},
            )
        }
