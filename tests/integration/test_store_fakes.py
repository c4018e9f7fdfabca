"""The in-memory stores the handlers' fast tests use (tests/unit/fake_stores.py) against the real
stores on a real nx-27017: every scenario runs twice, over `Stores.over` a real database and over
the fakes, with the same assertions. What a handler's unit test sees of a fake is thus what it
would see of the real store: the guards of each transition (a second `mark_chunk`, a duplicate
`store_outcome`, a `complete` of a job not running, ...), counters under concurrent increments,
the order of sorted look-ups and exactly the fields of each projection. A fake method the real
store does not have, or with another signature, fails here too; a method the fake does not
implement raises NotImplementedError.

Two differences of nx-27017 from MongoDB are read past rather than asserted, since the fakes
keep to MongoDB and every reader takes both: a datetime written through `$set` comes back as a
naive ISO string (`read_time` reads either: `like` below), and a boolean written through `$set`
as 1 or 0 (equal to True and False in Python). A look-up without a sort is compared as a set:
MongoDB promises no order. The database is shared by the module's tests, so each one uses ids
of its own and looks only at those in a look-up over a whole collection."""

from __future__ import annotations

import asyncio
import copy
import inspect
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from bson import ObjectId
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_contract.participant import user_chunk_id
from aml_runtime.clock import micros, now
from aml_runtime.db import CLIENT_OPTIONS, Document, read_time
from aml_runtime.documents import (
    AddChunkDocument,
    FailureKind,
    JobDocument,
    QuestionDocument,
    ScoreDocument,
    StageRecord,
    code_hashes_of,
    ensure_indexes,
)
from aml_runtime.stores import Stores
from aml_runtime.stores.jobs import RetentionFacts
from aml_runtime.stores.leaderboard import OUTCOMES_ENCODING, HeadlineOutcomes

# The fakes live beside the unit tests that use them, which import them by name from there.
sys.path.append(str(Path(__file__).resolve().parents[1] / "unit"))
from fake_stores import (
    MemoryAccessRequestStore,
    MemoryAccountStore,
    MemoryAuditStore,
    MemoryJobStore,
    MemoryLeaderboardStore,
    MemoryLimitStore,
    MemoryOutageStore,
    MemoryPlanStore,
    MemorySlotStore,
    MemoryStageRecordStore,
    MemoryStores,
    memory_stores,
)

pytestmark = pytest.mark.integration

# Whole milliseconds: what a BSON date keeps of a datetime.
T0 = datetime(2026, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)
T1, T2, T3 = (T0 + timedelta(seconds=n) for n in (1, 2, 3))

# Where each collection lives in the fakes: (field of `MemoryStores`, dict of that fake).
_MEMORY: dict[str, tuple[str, str]] = {
    "jobs": ("jobs", "jobs"),
    "job_errors": ("jobs", "errors"),
    "add_chunks": ("plans", "chunks"),
    "questions": ("plans", "questions"),
    "question_releases": ("plans", "releases"),
    "written_texts": ("plans", "written"),
    "specs": ("plans", "specs"),
    "searches": ("records", "searches"),
    "answers": ("records", "answers"),
    "scores": ("records", "scores"),
    "calls": ("audit", "calls"),
    "lane_pauses": ("outages", "lane_pauses"),
    "outages": ("outages", "outages"),
    "leaderboard": ("leaderboard", "leaderboard"),
    "headline_outcomes": ("leaderboard", "headline_outcomes"),
    "versions": ("accounts", "versions"),
    "secrets": ("accounts", "secrets"),
}


@dataclass
class World:
    """One side of the contract: the stores, and the collections behind them (to seed what
    other writers would have stored, and to look at what a method stored)."""

    stores: Stores
    db: AsyncDatabase[Document] | None = None
    fakes: MemoryStores | None = None

    def _memory(self, collection: str) -> dict[Any, Document]:
        store, documents = _MEMORY[collection]
        found: dict[Any, Document] = getattr(getattr(self.fakes, store), documents)
        return found

    async def seed(self, collection: str, *documents: Document) -> None:
        for document in documents:
            if self.db is not None:
                await self.db[collection].insert_one(copy.deepcopy(document))
            else:
                self._memory(collection)[document["_id"]] = copy.deepcopy(document)

    async def stored(self, collection: str, key: Any) -> Document | None:
        if self.db is not None:
            return await self.db[collection].find_one({"_id": key})
        return copy.deepcopy(self._memory(collection).get(key))


@pytest.fixture(scope="module")
async def database(mongo_url: str) -> AsyncIterator[AsyncDatabase[Document]]:
    # With the services' own client options (majority writes and reads, journaling, retries:
    # `aml_runtime.db.connect`), which nx-27017 accepts.
    client: AsyncMongoClient[Document] = AsyncMongoClient(
        mongo_url, tz_aware=True, **CLIENT_OPTIONS
    )
    db = client["aml_store_fakes_it"]
    await ensure_indexes(db)
    yield db
    await client.close()


@pytest.fixture(params=["mongo", "memory"])
def world(request: pytest.FixtureRequest) -> World:
    if request.param == "mongo":
        # Only here: the fakes' side needs no server.
        db: AsyncDatabase[Document] = request.getfixturevalue("database")
        return World(Stores.over(db), db=db)
    fakes = memory_stores()
    return World(fakes.typed(), fakes=fakes)


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid4().hex[:12]}"


def like(actual: Any, expected: Any) -> Any:
    """`actual`, with a string read as a datetime where `expected` has one (nx-27017 keeps a
    datetime written through `$set` as a naive ISO string; MongoDB and the fakes a date)."""
    if isinstance(expected, datetime) and isinstance(actual, str):
        return read_time(actual)
    if isinstance(expected, dict) and isinstance(actual, dict):
        return {key: like(value, expected.get(key)) for key, value in actual.items()}
    if isinstance(expected, list) and isinstance(actual, list) and len(actual) == len(expected):
        return [like(a, e) for a, e in zip(actual, expected, strict=True)]
    return actual


def by_id(documents: Iterable[Document]) -> list[Document]:
    return sorted(documents, key=lambda document: str(document["_id"]))


async def listed(found: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in found]


# -- jobs ------------------------------------------------------------------------------------------


def a_job(job_id: str, **extra: Any) -> Document:
    """A job as the gateway's submission stores it (`JobDocument` reads it), with `extra`."""
    return {
        "_id": job_id,
        "team_id": "team-1",
        "version_id": "ver-1",
        "mode": "full",
        "track": "textual",
        "run_label": job_id,
        "datasets": ["synthetic"],
        "state": "queued",
        "planned": False,
        "created_at": T0,
        **extra,
    }


async def test_a_job_is_read_whole_or_as_exactly_the_fields_asked_for(world: World) -> None:
    jobs = world.stores.jobs
    running, queued, missing = fresh("job"), fresh("job"), fresh("job")
    progress = {"add": {"done": 1}, "events": 1}
    job = a_job(
        running,
        state="running",
        planned=True,
        started_at=T0,
        top_k=5,
        users=["u-2", "u-1"],
        totals={"add": 2, "questions": 3},
        progress=progress,
        results={"datasets": {}},
    )
    await world.seed("jobs", job, a_job(queued))

    assert await jobs.document(running) == job
    assert await jobs.get(running) == JobDocument.model_validate(job)
    assert await jobs.state_of(running) == "running"
    assert await jobs.stage_view(running) == {"_id": running, "state": "running", "top_k": 5}
    assert await jobs.running_version(running) == "ver-1"
    # In the order stored (the order their Adds start).
    assert await jobs.users_of(running) == ["u-2", "u-1"]
    assert await jobs.progress_of(running) == {
        "_id": running,
        "progress": progress,
        "totals": {"add": 2, "questions": 3},
    }
    # A field the job does not have is not returned (`disqualified` here).
    assert await jobs.published_facts(running) == {
        "_id": running,
        "version_id": "ver-1",
        "track": "textual",
        "results": {"datasets": {}},
    }

    assert await jobs.stage_view(queued) == {"_id": queued, "state": "queued"}
    assert await jobs.running_version(queued) is None
    assert await jobs.users_of(queued) == []
    assert await jobs.progress_of(queued) == {"_id": queued}

    assert await jobs.document(missing) is None
    assert await jobs.get(missing) is None
    assert await jobs.state_of(missing) is None
    assert await jobs.stage_view(missing) is None
    assert await jobs.running_version(missing) is None
    assert await jobs.users_of(missing) == []
    assert await jobs.progress_of(missing) is None
    assert await jobs.published_facts(missing) is None


async def test_active_ungated_and_approved_jobs_are_found_by_state(world: World) -> None:
    jobs = world.stores.jobs
    ids = {name: fresh(name) for name in ("queued", "running", "ended", "gated", "approved")}
    totals, progress = {"add": 1, "questions": 1}, {"add": {"done": 1}}
    await world.seed(
        "jobs",
        a_job(ids["queued"]),
        a_job(
            ids["running"],
            state="running",
            planned=True,
            started_at=T0,
            totals=totals,
            progress=progress,
            top_k=5,
            users=["u-1"],
        ),
        a_job(ids["ended"], state="completed", finished_at=T1),
        a_job(ids["gated"], state="failed", finished_at=T1, gate={"passed": False}),
        a_job(
            ids["approved"],
            state="completed",
            gate={"passed": True},
            review_state="approved",
            results={"datasets": {}},
            disqualified=True,
        ),
    )
    mine = set(ids.values())

    # Only what the reconciliation reads (no `top_k`, no `users`).
    active = [job async for job in jobs.active_jobs() if job["_id"] in mine]
    assert by_id(active) == by_id(
        [
            {
                "_id": ids["queued"],
                "version_id": "ver-1",
                "planned": False,
                "state": "queued",
                "created_at": T0,
            },
            {
                "_id": ids["running"],
                "version_id": "ver-1",
                "started_at": T0,
                "planned": True,
                "progress": progress,
                "state": "running",
                "totals": totals,
                "created_at": T0,
            },
        ]
    )
    assert {job_id async for job_id in jobs.ungated() if job_id in mine} == {ids["ended"]}
    approved = [job async for job in jobs.approved_facts() if job["_id"] in mine]
    assert approved == [
        {
            "_id": ids["approved"],
            "version_id": "ver-1",
            "track": "textual",
            "results": {"datasets": {}},
            "disqualified": True,
        }
    ]


PLAN: dict[str, Any] = {
    "started_at": T1,
    "top_k": 7,
    "spec": {"top_k": 7},
    "spec_hash": "spec-1",
    "code_hash": "code-1",
    "dataset_bundles": {"synthetic": "bundle-1"},
    "dataset_bundle_hash": "bundles-1",
    "users": ["u-1"],
    "excluded_categories": {"synthetic": []},
    "f1_variants": {"synthetic": "f1"},
    "chunkers": {"synthetic": "chunk-v1"},
    "totals": {"add": 1, "questions": 2},
}


async def test_a_job_is_started_once_and_only_when_it_says_it_is_not_planned(world: World) -> None:
    jobs = world.stores.jobs
    job_id, unmarked = fresh("job"), fresh("job")
    # Not marked `planned: False` (an older writer's): `planned: False` matches only the boolean.
    bare = {key: value for key, value in a_job(unmarked).items() if key != "planned"}
    await world.seed("jobs", a_job(job_id), bare)

    await jobs.start(job_id, **PLAN)
    started = {**a_job(job_id), **PLAN, "planned": True, "state": "running"}
    assert like(await world.stored("jobs", job_id), started) == started
    await jobs.start(job_id, **{**PLAN, "top_k": 99, "started_at": T3})
    assert like(await world.stored("jobs", job_id), started) == started

    await jobs.start(unmarked, **PLAN)
    assert await world.stored("jobs", unmarked) == bare


async def test_complete_and_fail_change_only_a_job_they_may_end(world: World) -> None:
    jobs = world.stores.jobs
    queued, running, failing = fresh("job"), fresh("job"), fresh("job")
    await world.seed(
        "jobs",
        a_job(queued),
        a_job(running, state="running", planned=True),
        a_job(failing, state="running", planned=True),
    )
    results = {"overall": {"questions": 3}}
    ending: Document = {"results": results, "platform_failures": 0, "platform_failure_reason": None}

    assert await jobs.complete(queued, finished_at=T1, **ending) is False
    assert await world.stored("jobs", queued) == a_job(queued)
    assert await jobs.complete(running, finished_at=T1, **ending) is True
    # No reason given: none stored (not a null one).
    completed = {
        **a_job(running, state="running", planned=True),
        "state": "completed",
        "finished_at": T1,
        "results": results,
        "platform_failures": 0,
    }
    assert like(await world.stored("jobs", running), completed) == completed
    again: Document = {**ending, "platform_failure_reason": "late"}
    assert await jobs.complete(running, finished_at=T2, **again) is False
    assert like(await world.stored("jobs", running), completed) == completed

    reason = "1 question failed by the platform (platform_error)"
    failures: Document = {
        "results": results,
        "platform_failures": 1,
        "platform_failure_reason": reason,
    }
    assert await jobs.complete(failing, finished_at=T1, **failures) is True
    stored = await world.stored("jobs", failing)
    assert stored is not None and stored["platform_failure_reason"] == reason

    kind = FailureKind.PLATFORM_ERROR
    assert await jobs.fail(queued, "add", kind, "dataset missing", T2) == "ver-1"
    failed = {
        **a_job(queued),
        "state": "failed",
        "failed_stage": "add",
        "failure_kind": "platform_error",
        "failure": "dataset missing",
        "finished_at": T2,
    }
    assert like(await world.stored("jobs", queued), failed) == failed
    assert await jobs.fail(queued, "search", FailureKind.JOB_STALLED, "stalled", T3) is None
    assert like(await world.stored("jobs", queued), failed) == failed
    assert await jobs.fail(running, "add", kind, "too late", T3) is None
    assert like(await world.stored("jobs", running), completed) == completed
    assert await jobs.fail(fresh("job"), "add", kind, "no such job", T3) is None


async def test_each_build_that_touches_a_job_is_recorded_once(world: World) -> None:
    jobs = world.stores.jobs
    job_id = fresh("job")
    await world.seed("jobs", a_job(job_id, state="running", planned=True))

    await jobs.record_code_hash(job_id, "code-1")
    await jobs.record_code_hash(job_id, "code-1")
    stored = await world.stored("jobs", job_id)
    assert stored is not None and code_hashes_of(stored) == ["code-1"]
    await jobs.record_code_hash(job_id, "code-2")
    ending: Document = {"results": {}, "platform_failures": 0, "platform_failure_reason": None}
    assert await jobs.complete(job_id, finished_at=T1, code_hash="code-3", **ending) is True
    stored = await world.stored("jobs", job_id)
    assert stored is not None and code_hashes_of(stored) == ["code-1", "code-2", "code-3"]


async def test_of_concurrent_endings_of_a_job_one_takes(world: World) -> None:
    jobs = world.stores.jobs
    completing, failing = fresh("job"), fresh("job")
    await world.seed(
        "jobs",
        a_job(completing, state="running", planned=True),
        a_job(failing, state="running", planned=True),
    )
    completed = await asyncio.gather(
        *(
            jobs.complete(
                completing,
                finished_at=T1,
                results={"n": n},
                platform_failures=0,
                platform_failure_reason=None,
            )
            for n in range(5)
        )
    )
    assert sorted(completed) == [False] * 4 + [True]
    stored = await world.stored("jobs", completing)
    assert stored is not None and stored["results"] == {"n": completed.index(True)}

    kind = FailureKind.JOB_STALLED
    failed = await asyncio.gather(*(jobs.fail(failing, "add", kind, "x", T1) for _ in range(5)))
    assert (failed.count("ver-1"), failed.count(None)) == (1, 4)


async def test_a_gate_is_recorded_once(world: World) -> None:
    jobs = world.stores.jobs
    gated, reviewed = fresh("job"), fresh("job")
    await world.seed(
        "jobs",
        a_job(gated, state="completed"),
        a_job(reviewed, state="completed", review_state="disqualified"),
    )
    gate = {"checks": [], "passed": True, "at": T1}

    stored = await asyncio.gather(
        *(jobs.record_gate(gated, {**gate, "n": n}, "pending_review") for n in range(5))
    )
    assert sorted(stored) == [False] * 4 + [True]
    first = {
        **a_job(gated, state="completed"),
        "gate": {**gate, "n": stored.index(True)},
        "review_state": "pending_review",
    }
    assert like(await world.stored("jobs", gated), first) == first
    assert await jobs.record_gate(gated, gate, "gate_failed") is False
    assert like(await world.stored("jobs", gated), first) == first

    # No review state given: the admin's stands.
    assert await jobs.record_gate(reviewed, gate, None) is True
    expected = {**a_job(reviewed, state="completed", review_state="disqualified"), "gate": gate}
    assert like(await world.stored("jobs", reviewed), expected) == expected
    assert await jobs.record_gate(fresh("job"), gate, "pending_review") is False


def _events(before: Document) -> int:
    events: int = before.get("progress", {}).get("events", 0)
    return events


async def test_concurrent_increments_are_each_counted_once(world: World) -> None:
    jobs = world.stores.jobs
    job_id = fresh("job")
    totals = {"add": 20, "questions": 0}
    await world.seed("jobs", a_job(job_id, state="running", planned=True, totals=totals))
    stamps = range(1000, 1020)

    befores = await asyncio.gather(
        *(jobs.count(job_id, {"progress.add.done": 1}, at_us) for at_us in stamps)
    )
    # Each returns the job just before its own increment (`totals` and `progress` only): every
    # number of earlier increments exactly once.
    assert sorted(_events(before) for before in befores if before is not None) == list(range(20))
    assert min(befores, key=lambda b: _events(b or {})) == {"_id": job_id, "totals": totals}
    assert all(
        before is not None and set(before) <= {"_id", "totals", "progress"} for before in befores
    )
    stored = await world.stored("jobs", job_id)
    assert stored is not None
    progress = stored["progress"]
    assert (progress["add"], progress["events"]) == ({"done": 20}, 20)
    assert progress["last_us"] in stamps
    assert await jobs.count(fresh("job"), {"progress.add.done": 1}, 1) is None


async def test_a_recount_stores_only_if_no_increment_landed_and_guards_what_it_counted(
    world: World,
) -> None:
    jobs = world.stores.jobs
    job_id, never_counted = fresh("job"), fresh("job")
    await world.seed(
        "jobs",
        a_job(job_id, state="running", progress={"add": {"done": 1}, "events": 3}),
        a_job(never_counted, state="running"),
    )
    counted = {"progress.add.done": 2, "progress.add.failed": 0}

    # Read at 2 events, now 3: an increment landed meanwhile.
    assert await jobs.store_recount(job_id, 2, counted, 500, 9) is False
    assert (await world.stored("jobs", job_id) or {})["progress"]["events"] == 3
    assert await jobs.store_recount(job_id, 3, counted, 500, 9) is True
    recounted = {"add": {"done": 2, "failed": 0}, "events": 4, "counted_to": 500, "repaired_us": 9}
    assert await jobs.progress_of(job_id) == {"_id": job_id, "progress": recounted}

    # Outcomes stamped up to the watermark were in the recount: not counted again.
    assert await jobs.count(job_id, {"progress.add.done": 1}, 500) is None
    assert await jobs.count(job_id, {"progress.add.done": 1}, 499) is None
    before = await jobs.count(job_id, {"progress.add.done": 1}, 501)
    assert before == {"_id": job_id, "progress": recounted}
    await jobs.stamp_repaired(job_id, 77)
    assert await jobs.progress_of(job_id) == {
        "_id": job_id,
        "progress": {
            **recounted,
            "add": {"done": 3, "failed": 0},
            "events": 5,
            "last_us": 501,
            "repaired_us": 77,
        },
    }

    # Never counted: read as 0 events, which holds only while the field is absent.
    assert await jobs.store_recount(never_counted, 0, counted, 10, 11) is True
    assert await jobs.progress_of(never_counted) == {
        "_id": never_counted,
        "progress": {
            "add": {"done": 2, "failed": 0},
            "counted_to": 10,
            "repaired_us": 11,
            "events": 1,
        },
    }
    assert await jobs.store_recount(never_counted, 0, counted, 12, 13) is False
    assert await jobs.store_recount(fresh("job"), 0, counted, 10, 11) is False


async def test_an_error_is_summarised_once_per_item(world: World) -> None:
    jobs = world.stores.jobs
    job_id = fresh("job")
    contract, outage = FailureKind.CONTRACT_ERROR, FailureKind.PARTICIPANT_OUTAGE

    recorded = await asyncio.gather(
        *(jobs.record_error(job_id, "add", contract, "c1", f"bad {n}", T1) for n in range(5))
    )
    assert sorted(recorded) == [False] * 4 + [True]
    assert await jobs.record_error(job_id, "add", outage, "c1", "again", T3) is False
    assert await jobs.record_error(job_id, "search", outage, None, "down", T2) is True

    first = f"{job_id}/add/c1"
    assert await world.stored("job_errors", first) == {
        "_id": first,
        "job_id": job_id,
        "stage": "add",
        "kind": "contract_error",
        "item": "c1",
        "reason": f"bad {recorded.index(True)}",
        "at": T1,
        "at_us": micros(T1),
    }
    search = f"{job_id}/search/-"
    assert by_id(await jobs.error_stamps(job_id)) == [
        {"_id": first, "at_us": micros(T1)},
        {"_id": search, "at_us": micros(T2)},
    ]
    latest = await jobs.latest_error_since(job_id, micros(T0))
    assert latest is not None and latest["_id"] == search
    assert latest == await world.stored("job_errors", search)
    # From `since_us` on, inclusive.
    assert (await jobs.latest_error_since(job_id, micros(T2)) or {}).get("_id") == search
    assert await jobs.latest_error_since(job_id, micros(T2) + 1) is None
    assert await jobs.error_stamps(fresh("job")) == []


async def test_retention_finds_each_ended_job_until_it_is_purged(world: World) -> None:
    jobs = world.stores.jobs
    kept, unfinished, purged, running = (fresh("job") for _ in range(4))
    await world.seed(
        "jobs",
        a_job(kept, state="completed", finished_at=T1, retention_keep_until=T2),
        a_job(unfinished, state="failed"),
        a_job(purged, state="failed", finished_at=T1, retention_purged_at=T2),
        a_job(running, state="running"),
    )
    mine = {kept, unfinished, purged, running}

    facts = [fact async for fact in jobs.unpurged_ended() if fact.job_id in mine]
    assert sorted(facts) == sorted(
        [RetentionFacts(kept, T1, T2), RetentionFacts(unfinished, None, None)]
    )
    await jobs.mark_purged(kept, T3)
    assert [fact.job_id async for fact in jobs.unpurged_ended() if fact.job_id in mine] == [
        unfinished
    ]
    assert read_time((await world.stored("jobs", kept) or {})["retention_purged_at"]) == T3


# -- the plan --------------------------------------------------------------------------------------


def a_chunk(job_id: str, user: str, seq: int, **extra: Any) -> AddChunkDocument:
    return AddChunkDocument.model_validate(
        {
            "_id": user_chunk_id(user, seq),
            "job_id": job_id,
            "dataset_id": "synthetic",
            "conversation_id": "conv-1",
            "user_id": user,
            "session_id": "s1",
            "seq": seq,
            "messages": 2,
            "body": b'{"messages":[]}',
            "state": "pending",
            **extra,
        }
    )


def a_question(job_id: str, user: str, n: int, **extra: Any) -> QuestionDocument:
    return QuestionDocument.model_validate(
        {
            "_id": f"{job_id}/synthetic/q{n}",
            "job_id": job_id,
            "conversation_id": "conv-1",
            "dataset_id": "synthetic",
            "question_id": f"q{n}",
            "user_id": user,
            "question": "Where?",
            "category": 1,
            "category_name": "facts",
            "gold_answer": "Here",
            "f1_variant": "f1",
            "search_body": b'{"query":"Where?"}',
            **extra,
        }
    )


async def test_a_plan_is_inserted_once(world: World) -> None:
    plans = world.stores.plans
    job_id, user = fresh("job"), fresh("user")
    first, second = a_chunk(job_id, user, 1), a_chunk(job_id, user, 2, searched_before=["q"])
    await plans.insert_chunks([first, second])
    # A re-plan (an interrupted plan's chunks exist): what is stored stays, the rest is added.
    await plans.insert_chunks([a_chunk(job_id, user, 1, state="done"), a_chunk(job_id, user, 3)])
    assert await plans.chunk(first.id) == first.stored()
    assert await plans.chunk(second.id) == second.stored()
    assert await plans.chunk(user_chunk_id(user, 3)) == a_chunk(job_id, user, 3).stored()
    assert await plans.chunk(fresh("chunk")) is None

    question = a_question(job_id, user, 1)
    await plans.insert_questions([question])
    await plans.insert_questions(
        [a_question(job_id, "someone else", 1), a_question(job_id, user, 2)]
    )
    assert await plans.question(question.id) == question.stored()
    assert await plans.question_user(question.id) == user
    assert await plans.question(f"{job_id}/synthetic/q2") == a_question(job_id, user, 2).stored()
    assert await plans.question(fresh("item")) is None
    assert await plans.question_user(fresh("item")) == ""

    spec_hash = fresh("spec")
    await plans.store_spec(spec_hash, {"top_k": 10})
    await plans.store_spec(spec_hash, {"top_k": 99})
    assert await world.stored("specs", spec_hash) == {"_id": spec_hash, "spec": {"top_k": 10}}


async def test_a_written_text_keeps_every_user_it_was_written_for(world: World) -> None:
    plans = world.stores.plans
    job_id, other_job = fresh("job"), fresh("job")

    def text(job: str, digest: str, *users: str) -> Document:
        return {"_id": f"{job}/{digest}", "job_id": job, "users": list(users)}

    await plans.store_written([[text(job_id, "d1", "u2"), text(job_id, "d2", "u1")]])
    await plans.store_written(
        [[text(job_id, "d1", "u1"), text(job_id, "d3", "u3")], [text(job_id, "d2", "u1")]]
    )
    await plans.store_written(iter([[text(other_job, "d1", "u9")]]))
    assert await world.stored("written_texts", f"{job_id}/d1") == text(job_id, "d1", "u1", "u2")
    assert await world.stored("written_texts", f"{job_id}/d2") == text(job_id, "d2", "u1")
    assert await world.stored("written_texts", f"{job_id}/d3") == text(job_id, "d3", "u3")

    await plans.drop_written(job_id)
    for digest in ("d1", "d2", "d3"):
        assert await world.stored("written_texts", f"{job_id}/{digest}") is None
    assert await world.stored("written_texts", f"{other_job}/d1") == text(other_job, "d1", "u9")


async def test_a_chunk_is_finished_once(world: World) -> None:
    plans = world.stores.plans
    job_id, user = fresh("job"), fresh("user")
    chunk = a_chunk(job_id, user, 1)
    await plans.insert_chunks([chunk])
    outcomes: list[tuple[Any, Document]] = [("done", {})] + [
        ("failed", {"failure_kind": FailureKind.CONTRACT_ERROR, "failure": f"bad {n}"})
        for n in range(1, 5)
    ]

    start = now() - timedelta(milliseconds=1)
    marked = await asyncio.gather(
        *(
            plans.mark_chunk(chunk.id, outcome, 100 + n, why)
            for n, (outcome, why) in enumerate(outcomes)
        )
    )
    end = now()
    assert sorted(marked) == [False] * 4 + [True]
    n = marked.index(True)
    outcome, why = outcomes[n]
    stored = await world.stored("add_chunks", chunk.id)
    assert stored is not None
    finished_at = read_time(stored.pop("finished_at"))
    assert finished_at is not None and start <= finished_at <= end
    assert stored == {**chunk.stored(), "state": outcome, "at_us": 100 + n, **why}

    # Its outcome stands.
    assert await plans.mark_chunk(chunk.id, "done", 999, {}) is False
    after = await world.stored("add_chunks", chunk.id)
    assert after is not None and (after["state"], after["at_us"]) == (outcome, 100 + n)
    assert await plans.mark_chunk(fresh("chunk"), "done", 1, {}) is False


async def test_chunks_are_read_for_the_chain_the_release_the_recount_and_the_watchdog(
    world: World,
) -> None:
    plans = world.stores.plans
    job_id, other_job, user, other_user = fresh("job"), fresh("job"), fresh("u"), fresh("u")
    platform = FailureKind.PLATFORM_ERROR
    done = a_chunk(job_id, user, 1, state="done", at_us=10)
    held = a_chunk(job_id, user, 2, searched_before=["q1", "q2"])
    down = a_chunk(job_id, user, 3, state="failed", failure_kind=platform, failure="down", at_us=30)
    refused = a_chunk(
        job_id,
        other_user,
        1,
        state="failed",
        failure_kind=FailureKind.CONTRACT_ERROR,
        failure="bad",
        at_us=40,
    )
    elsewhere = a_chunk(other_job, fresh("u"), 1, state="failed", failure_kind=platform)
    await plans.insert_chunks([done, held, down, refused, elsewhere])

    assert await plans.chain_chunk(user, 1) == {"_id": done.id, "state": "done", "seq": 1}
    assert await plans.chain_chunk(user, 2) == {
        "_id": held.id,
        "state": "pending",
        "seq": 2,
        "searched_before": ["q1", "q2"],
    }
    assert await plans.chain_chunk(user, 4) is None
    assert await plans.announced_chunk(down.id) == {
        "_id": down.id,
        "user_id": user,
        "seq": 3,
        "failure": "down",
        "failure_kind": "platform_error",
    }
    assert await plans.announced_chunk(done.id) == {"_id": done.id, "user_id": user, "seq": 1}
    assert await plans.announced_chunk(fresh("chunk")) is None

    assert await listed(plans.pending_chunks(job_id)) == [
        {"_id": held.id, "user_id": user, "seq": 2, "searched_before": ["q1", "q2"]}
    ]
    assert by_id(await listed(plans.chunk_states(job_id))) == by_id(
        [
            {"_id": done.id, "state": "done", "at_us": 10},
            {"_id": held.id, "state": "pending"},
            {"_id": down.id, "state": "failed", "at_us": 30},
            {"_id": refused.id, "state": "failed", "at_us": 40},
        ]
    )
    assert await plans.platform_failed_chunks(job_id) == 1
    assert await plans.platform_failed_chunks(fresh("job")) == 0


async def test_questions_are_read_by_user_by_id_and_by_job(world: World) -> None:
    plans = world.stores.plans
    job_id, user, other_user = fresh("job"), fresh("user"), fresh("user")
    first = a_question(job_id, user, 1)
    streaming = a_question(job_id, user, 2, point=2, point_index=1, after_seq=1, holds_add=2)
    others = a_question(job_id, other_user, 3)
    elsewhere = a_question(fresh("job"), fresh("user"), 1)
    await plans.insert_questions([first, streaming, others, elsewhere])

    assert by_id(await listed(plans.user_questions(user))) == [first.stored(), streaming.stored()]
    among = await listed(plans.questions_among([first.id, first.id, others.id, fresh("item")]))
    assert by_id(among) == [first.stored(), others.stored()]
    outcome = {"dataset_id": "synthetic", "category_name": "facts"}
    assert by_id(await listed(plans.questions_of(job_id))) == [
        {"_id": first.id, **outcome, "question_id": "q1"},
        {"_id": streaming.id, **outcome, "question_id": "q2", "point_index": 1},
        {"_id": others.id, **outcome, "question_id": "q3"},
    ]


async def test_a_release_marker_is_written_once(world: World) -> None:
    plans = world.stores.plans
    job_id = fresh("job")
    marker, plain = f"{job_id}/u1@1", f"{job_id}/u1"
    assert await plans.released(marker) is False
    await plans.mark_released(marker, job_id, held=2)
    await plans.mark_released(marker, job_id, held=5)
    await plans.mark_released(plain, job_id)
    assert await plans.released(marker) is True
    assert await world.stored("question_releases", marker) == {
        "_id": marker,
        "job_id": job_id,
        "held": 2,
    }
    assert await world.stored("question_releases", plain) == {"_id": plain, "job_id": job_id}


async def test_retention_empties_the_bodies_of_its_job_only(world: World) -> None:
    plans, records = world.stores.plans, world.stores.records
    job_id, other_job = fresh("job"), fresh("job")
    chunks = [a_chunk(job, fresh("user"), 1) for job in (job_id, other_job)]
    questions = [a_question(job, fresh("user"), 1) for job in (job_id, other_job)]
    await plans.insert_chunks(chunks)
    await plans.insert_questions(questions)
    bodies: dict[str, Document] = {
        "searches": {"candidates": [{"text": "memory"}]},
        "answers": {"answer": "Paris"},
        "scores": {"judge_replies": ["CORRECT"]},
    }
    for collection, body in bodies.items():
        for question in questions:
            record = {"_id": question.id, "job_id": question.job_id, "state": "done", **body}
            await world.seed(collection, record)

    for _ in range(2):  # repeatable
        await plans.purge_bodies(job_id)
        await records.purge_bodies(job_id)

    purged, kept = chunks
    assert await world.stored("add_chunks", purged.id) == {**purged.stored(), "body": None}
    assert await world.stored("add_chunks", kept.id) == kept.stored()
    purged_q, kept_q = questions
    assert await world.stored("questions", purged_q.id) == {
        **purged_q.stored(),
        "search_body": None,
    }
    assert await world.stored("questions", kept_q.id) == kept_q.stored()
    emptied: dict[str, Document] = {
        "searches": {"candidates": []},
        "answers": {"answer": None},
        "scores": {"judge_replies": []},
    }
    for collection, body in bodies.items():
        base = {"job_id": job_id, "state": "done"}
        assert await world.stored(collection, purged_q.id) == {
            "_id": purged_q.id,
            **base,
            **emptied[collection],
        }
        assert await world.stored(collection, kept_q.id) == {
            "_id": kept_q.id,
            "job_id": other_job,
            "state": "done",
            **body,
        }


async def test_retention_empties_a_coding_attempts_bodies(world: World) -> None:
    """A coding attempt's answer is its patch and its answer record also holds the agent's
    trajectory, its score the test log: all bodies (R-7.5), emptied; what they say stays."""
    records = world.stores.records
    job_id, other_job = fresh("job"), fresh("job")
    answer = {
        "state": "done",
        "answer": "diff --git a/x b/x",
        "end_reason": "submitted",
        "trajectory": [{"role": "user", "content": "memories"}],
        "steps": 3,
    }
    score = {
        "state": "done",
        "resolved": True,
        "test_log": "Ran 3 tests\nOK",
        "judge_replies": [],
        "report": {"FAIL_TO_PASS": {"success": ["t"], "failure": []}},
    }
    ids = {job: fresh("q") for job in (job_id, other_job)}
    for job, item in ids.items():
        await world.seed("answers", {"_id": item, "job_id": job, **answer})
        await world.seed("scores", {"_id": item, "job_id": job, **score})

    for _ in range(2):  # repeatable
        await records.purge_bodies(job_id)

    mine, theirs = ids[job_id], ids[other_job]
    assert await world.stored("answers", mine) == {
        "_id": mine, "job_id": job_id, **answer, "answer": None, "trajectory": [],
    }  # fmt: skip
    assert await world.stored("scores", mine) == {
        "_id": mine, "job_id": job_id, **score, "test_log": None,
    }  # fmt: skip
    assert await world.stored("answers", theirs) == {"_id": theirs, "job_id": other_job, **answer}
    assert await world.stored("scores", theirs) == {"_id": theirs, "job_id": other_job, **score}


# -- the question stages' records ------------------------------------------------------------------

_COLLECTION = {"search": "searches", "answer": "answers", "score": "scores"}


@pytest.mark.parametrize("stage", ["search", "answer", "score"])
async def test_a_stage_record_is_stored_once(world: World, stage: Any) -> None:
    records = world.stores.records
    job_id, item = fresh("job"), fresh("item")

    stored = await asyncio.gather(
        *(
            records.store_outcome(
                stage, item, job_id, T1, 100 + n, {"state": "done" if n == 0 else "failed", "n": n}
            )
            for n in range(5)
        )
    )
    assert sorted(stored) == [False] * 4 + [True]
    n = stored.index(True)
    state = "done" if n == 0 else "failed"
    record = {
        "_id": item,
        "job_id": job_id,
        "finished_at": T1,
        "at_us": 100 + n,
        "state": state,
        "n": n,
    }
    assert await world.stored(_COLLECTION[stage], item) == record
    assert await records.state_of(stage, item) == state

    assert await records.store_outcome(stage, item, job_id, T2, 1, {"state": "done"}) is False
    assert await world.stored(_COLLECTION[stage], item) == record
    assert await records.state_of(stage, fresh("item")) is None


async def test_held_searches_and_each_questions_final_record(world: World) -> None:
    records = world.stores.records
    job_id = fresh("job")
    scored, failed_search, failed_answer, failed_score = (fresh("item") for _ in range(4))

    def record(item: str, state: str, **extra: Any) -> Document:
        return {"_id": item, "job_id": job_id, "state": state, "finished_at": T1, **extra}

    failure = {"failure_kind": "platform_error", "failure": "down"}
    search_failure = record(failed_search, "failed", **failure)
    answer_failure = record(failed_answer, "failed", **failure)
    score = record(scored, "done", category_name="facts", judge_label="CORRECT", f1=1.0)
    score_failure = record(failed_score, "failed", **failure)
    await world.seed(
        "searches",
        record(scored, "done"),
        search_failure,
        record(failed_answer, "done"),
        record(failed_score, "done"),
        {"_id": fresh("item"), "job_id": fresh("job"), "state": "failed"},
    )
    await world.seed(
        "answers", record(scored, "done"), answer_failure, record(failed_score, "done")
    )
    # A score beside a failed search (never written so): the failed search is the final record.
    await world.seed("scores", score, score_failure, record(failed_search, "done"))

    held = [scored, scored, failed_search, fresh("item")]
    assert await records.searches_final(held) == 2
    assert await records.searches_final([]) == 0
    assert await records.final_records(job_id) == {
        failed_search: StageRecord.model_validate(search_failure),
        failed_answer: StageRecord.model_validate(answer_failure),
        scored: ScoreDocument.model_validate(score),
        failed_score: ScoreDocument.model_validate(score_failure),
    }
    final = await records.final_records(job_id)
    assert type(final[failed_search]) is StageRecord and type(final[scored]) is ScoreDocument
    assert await records.final_records(fresh("job")) == {}


async def test_the_recount_reads_each_records_state_and_time_stage_by_stage(world: World) -> None:
    records = world.stores.records
    job_id, first, second = fresh("job"), fresh("item"), fresh("item")
    await world.seed(
        "searches",
        {"_id": first, "job_id": job_id, "state": "done", "at_us": 1, "candidates": []},
        {"_id": second, "job_id": job_id, "state": "failed", "at_us": 2},
        {"_id": fresh("item"), "job_id": fresh("job"), "state": "done", "at_us": 3},
    )
    await world.seed("answers", {"_id": first, "job_id": job_id, "state": "done", "at_us": 4})
    await world.seed("scores", {"_id": first, "job_id": job_id, "state": "done"})

    stamps = await listed(records.stamps(job_id))
    assert [stage for stage, _ in stamps] == ["search", "search", "answer", "score"]
    assert {(stage, doc["_id"]): doc for stage, doc in stamps} == {
        ("search", first): {"_id": first, "state": "done", "at_us": 1},
        ("search", second): {"_id": second, "state": "failed", "at_us": 2},
        ("answer", first): {"_id": first, "state": "done", "at_us": 4},
        ("score", first): {"_id": first, "state": "done"},
    }


# -- the audit trail -------------------------------------------------------------------------------


async def test_a_call_is_recorded_and_the_latest_one_found(world: World) -> None:
    audit = world.stores.audit
    job_id = fresh("job")
    add = {
        "job_id": job_id,
        "stage": "add",
        "item_id": "c1",
        "attempt": 1,
        "outcome": "ok",
        "started_at": T1,
    }

    record_id = await audit.record_attempt(add)
    # Like PyMongo's insert_one, it gives the caller's record its new `_id`.
    assert isinstance(record_id, ObjectId) and add["_id"] == record_id
    assert await world.stored("calls", record_id) == add
    await audit.record_validation(record_id, "valid")
    assert await world.stored("calls", record_id) == {**add, "validation": "valid"}

    named = {
        "_id": fresh("call"),
        "job_id": job_id,
        "stage": "search",
        "attempt": 1,
        "outcome": "retry",
        "status": 503,
        "started_at": T2,
    }
    assert await audit.record_attempt(dict(named)) == named["_id"]
    with pytest.raises(DuplicateKeyError):
        await audit.record_attempt(dict(named))
    later = {"job_id": job_id, "stage": "search", "attempt": 2, "outcome": "ok", "started_at": T3}
    unstarted = {"job_id": job_id, "stage": "search", "attempt": 3}
    earlier = {"job_id": job_id, "stage": "search", "attempt": 0, "started_at": T0}
    for record in (later, unstarted, earlier):
        await audit.record_attempt(record)

    # Started last; one without a start time sorts below every other.
    assert await audit.latest_call(job_id, "search") == later
    assert await audit.latest_call(job_id, "add") == {**add, "validation": "valid"}
    assert await audit.latest_call(job_id, "answer") is None


async def test_a_jobs_calls_are_read_item_by_item_in_attempt_order(world: World) -> None:
    """The efficiency figures' read: only the fields they use, without `_id`, each item's
    records together and in attempt order, whatever order they were written in."""
    audit = world.stores.audit
    job_id = fresh("job")
    answered = {"latency_ms": 12.5, "status": 200, "error_class": None, "validation": "valid"}

    def attempt(item: str, n: int, outcome: str, **fields: Any) -> Document:
        return {
            "job_id": job_id,
            "stage": "search",
            "item_id": item,
            "delivery": 1,
            "operation": "search",
            "attempt": n,
            "started_at": T1,
            "queued_ms": 3.0,
            "outcome": outcome,
            **fields,
        }

    retried = attempt("q-b", 1, "retry", latency_ms=30.0, status=503, error_class=None)
    second = attempt("q-b", 2, "ok", **answered)
    first = attempt("q-a", 1, "ok", **answered)
    poll = {**attempt("c-1", 2, "ok", **answered), "stage": "add", "operation": "add_status"}
    add = {**attempt("c-1", 1, "ok", latency_ms=7.0, status=202), "stage": "add"}
    add["operation"] = "add"
    elsewhere = {**attempt("q-c", 1, "ok", **answered), "job_id": fresh("job")}
    for record in (second, poll, first, retried, elsewhere, add):
        await audit.record_attempt(dict(record))

    kept = ("item_id", "operation", "attempt", "latency_ms", "status", "error_class")
    found = await listed(audit.attempts_by_item(job_id))
    assert [(r["item_id"], r["attempt"]) for r in found] == [
        ("c-1", 1), ("c-1", 2), ("q-a", 1), ("q-b", 1), ("q-b", 2)
    ]  # fmt: skip
    assert found[3] == {**{name: retried[name] for name in kept}, "outcome": "retry"}
    valid = {"outcome": "ok", "validation": "valid"}
    assert found[2] == {**{name: first[name] for name in kept}, **valid}
    assert await listed(audit.attempts_by_item(fresh("job"))) == []


async def test_a_jobs_answer_figures_and_chunk_datasets_are_read_as_projections(
    world: World,
) -> None:
    records, plans = world.stores.records, world.stores.plans
    job_id, user = fresh("job"), fresh("user")
    figures = {
        "candidates_returned": 5,
        "candidates_used": 2,
        "retrieved_tokens": 120,
        "retrieved_bytes": 700,
        "used_tokens": 40,
        "tokens_in": 300,
        "tokens_out": 9,
    }
    done, older, failed = fresh("item"), fresh("item"), fresh("item")
    await world.seed(
        "answers",
        {"_id": done, "job_id": job_id, "state": "done", "answer": "Paris", **figures},
        {"_id": older, "job_id": job_id, "state": "done", "answer": "Rome", "context_tokens": 3},
        {"_id": failed, "job_id": job_id, "state": "failed", "failure": "down"},
        {"_id": fresh("item"), "job_id": fresh("job"), "state": "done", **figures},
    )
    assert by_id(await listed(records.answer_figures(job_id))) == by_id(
        [{"_id": done, "state": "done", **figures}, {"_id": older, "state": "done"}]
    )

    first, second = a_chunk(job_id, user, 1), a_chunk(job_id, user, 2, dataset_id="other")
    await plans.insert_chunks([first, second, a_chunk(fresh("job"), fresh("user"), 1)])
    assert by_id(await listed(plans.chunk_datasets(job_id))) == [
        {"_id": first.id, "dataset_id": "synthetic"},
        {"_id": second.id, "dataset_id": "other"},
    ]
    # A dataset's own Search top_k travels with what the completion reads of each question.
    coding = a_question(job_id, user, 7, top_k=100)
    await plans.insert_questions([coding])
    assert await listed(plans.questions_of(job_id)) == [
        {
            "_id": coding.id,
            "dataset_id": "synthetic",
            "category_name": "facts",
            "question_id": "q7",
            "top_k": 100,
        }
    ]


# -- outages ---------------------------------------------------------------------------------------


def a_pause(key: str, **extra: Any) -> Document:
    """A pause as `aml_pipeline.outages.LanePause` dumps it."""
    return {
        "_id": key,
        "kind": "participant",
        "paused": True,
        "since": 100.5,
        "reason": "ConnectError",
        "window": 60.0,
        "probe_at": 102.5,
        "interval": 2.0,
        "probes": 0,
        "resumed_at": None,
        "expired_at": None,
        **extra,
    }


async def test_a_pause_is_opened_once_and_paused_again_until_it_expires(world: World) -> None:
    outages = world.stores.outages
    key, unmarked, missing = fresh("ver"), fresh("ver"), fresh("ver")
    pause = a_pause(key)
    assert await outages.open_pause(dict(pause)) is True
    assert await outages.open_pause(a_pause(key, reason="another")) is False
    assert await outages.pause(key) == pause
    assert await outages.pause(missing) is None

    again = await outages.pause_again(key, "503", 110.0)
    assert again == {**pause, "reason": "503", "probe_at": 110.0}
    # No probe time given: it stays.
    again = await outages.pause_again(key, "504")
    assert again == {**pause, "reason": "504", "probe_at": 110.0}
    assert await outages.expire(key, 99.0, 170.0) is None
    expired = await outages.expire(key, 100.5, 170.0)
    assert expired == {**again, "paused": False, "expired_at": 170.0}
    assert await outages.expire(key, 100.5, 171.0) is None
    assert await outages.pause_again(key, "505") is None
    assert await outages.pause(key) == expired
    assert await outages.pause_again(missing, "503") is None

    # Stored without `expired_at` (an older writer): `expired_at: None` matches it too.
    bare = {field: value for field, value in a_pause(unmarked).items() if field != "expired_at"}
    assert await outages.open_pause(dict(bare)) is True
    assert await outages.pause_again(unmarked, "503") == {**bare, "reason": "503"}
    assert await outages.expire(unmarked, 100.5, 170.0) == {
        **bare,
        "reason": "503",
        "paused": False,
        "expired_at": 170.0,
    }


async def test_a_probe_is_claimed_once_and_its_answer_resumes_the_pause(world: World) -> None:
    outages = world.stores.outages
    key = fresh("ver")
    await outages.open_pause(a_pause(key))

    claims = await asyncio.gather(
        *(outages.claim_probe(key, 100.5, 102.5, 106.5, 4.0) for _ in range(3))
    )
    claimed = {**a_pause(key), "probe_at": 106.5, "interval": 4.0, "probes": 1}
    assert [claim for claim in claims if claim is not None] == [claimed]
    assert await outages.claim_probe(key, 99.0, 106.5, 114.5, 8.0) is None

    assert await outages.resume(key, 99.0, 107.0) is None
    resumed = {**claimed, "paused": False, "resumed_at": 107.0}
    assert await outages.resume(key, 100.5, 107.0) == resumed
    # Not paused any more: nothing to probe.
    assert await outages.claim_probe(key, 100.5, 106.5, 114.5, 8.0) is None
    assert await outages.pause(key) == resumed
    assert await outages.resume(fresh("ver"), 100.5, 107.0) is None


async def test_a_pause_is_closed_once_and_its_outage_recorded_once(world: World) -> None:
    outages = world.stores.outages
    first, second, never = fresh("ver"), fresh("ver"), fresh("ver")
    await outages.open_pause(a_pause(first))
    await outages.open_pause(a_pause(second, kind="llm"))

    mine = {first, second}
    assert by_id([pause async for pause in outages.pauses() if pause["_id"] in mine]) == by_id(
        [a_pause(first), a_pause(second, kind="llm")]
    )
    assert await listed(outages.pauses_of([first, never, first])) == [a_pause(first)]
    assert await outages.close_if_since(first, 99.0) is None
    assert await outages.close_if_since(first, 100.5) == a_pause(first)
    assert await outages.close_if_since(first, 100.5) is None
    assert await outages.close(second) == a_pause(second, kind="llm")
    assert await outages.close(second) is None
    assert await outages.pause(second) is None
    assert await listed(outages.pauses_of([first, second])) == []

    await outages.record(first, "participant", 100.5, 130.25, "503", 3, "ended")
    await outages.record(first, "participant", 100.5, 999.0, "another", 9, "expired")
    await outages.record(first, "participant", 200.0, 260.0, "down", 1, "expired")
    await outages.record(first, "participant", 150.0, 180.0, "down", 1, "ended")
    assert await world.stored("outages", f"{first}/100.500000") == {
        "_id": f"{first}/100.500000",
        "key": first,
        "kind": "participant",
        "since": 100.5,
        "until": 130.25,
        "seconds": 29.75,
        "reason": "503",
        "probes": 3,
        "how": "ended",
    }
    assert await outages.last_end(first) == 260.0
    assert await outages.last_end(never) is None


# -- the leaderboard and the versions --------------------------------------------------------------


async def test_every_leaderboard_entry_is_read(world: World) -> None:
    entries = [
        {"_id": fresh("lb"), "job_id": fresh("job"), "disqualified": False},
        {"_id": fresh("lb"), "job_id": fresh("job"), "disqualified": True, "track": "textual"},
    ]
    await world.seed("leaderboard", *entries)
    mine = {entry["_id"] for entry in entries}
    found = [entry async for entry in world.stores.leaderboard.entries() if entry["_id"] in mine]
    assert by_id(found) == by_id(entries)


async def test_a_runs_headline_values_are_kept_compact_and_read_back_whole(world: World) -> None:
    leaderboard = world.stores.leaderboard
    job_id, empty_id = fresh("job"), fresh("job")
    values = {f"locomo/conv-{n // 7}:q{n:04d}": float(n % 3 == 0) for n in range(50)}
    values["str.1/q0@2"] = 0.375  # a streaming item; a dot, which no BSON key could hold
    kept = HeadlineOutcomes(job_id=job_id, headline="accuracy", values=values)
    await leaderboard.keep_headline_outcomes(kept)
    # A completion repeated (redelivery, another replica) writes the same document again.
    await leaderboard.keep_headline_outcomes(kept)
    assert await leaderboard.headline_outcomes_of(job_id) == kept
    stored = await world.stored("headline_outcomes", job_id)
    assert stored is not None
    assert (stored["questions"], stored["encoding"]) == (51, OUTCOMES_ENCODING)
    assert isinstance(stored["keys"], bytes) and isinstance(stored["values"], bytes)
    none = HeadlineOutcomes(job_id=empty_id, headline="f1_mean", values={})
    await leaderboard.keep_headline_outcomes(none)
    assert await leaderboard.headline_outcomes_of(empty_id) == none
    assert await leaderboard.headline_outcomes_of(fresh("job")) is None


async def test_a_version_is_read_whole_or_as_its_capacity_and_limits(world: World) -> None:
    accounts = world.stores.accounts
    version_id, bare_id, secret_ref, missing = (fresh(name) for name in ("v", "v", "key", "v"))
    capacity = {"max_concurrency": 2, "max_rps": 10.0}
    version = {
        "_id": version_id,
        "team_id": "team-1",
        "add_url": "http://p.test/add",
        "capacity": capacity,
        "run_limits": {"max_run_hours": 1.0},
        "secret_ref": secret_ref,
    }
    await world.seed("versions", version, {"_id": bare_id, "team_id": "team-1"})
    await world.seed("secrets", {"_id": secret_ref, "sealed": b"\x00sealed\xff"})

    assert await accounts.version(version_id) == version
    assert await accounts.capacity_of(version_id) == {"_id": version_id, "capacity": capacity}
    assert await accounts.limits_of(version_id) == {
        "_id": version_id,
        "run_limits": {"max_run_hours": 1.0},
        "capacity": capacity,
    }
    assert await accounts.capacity_of(bare_id) == {"_id": bare_id}
    assert await accounts.limits_of(bare_id) == {"_id": bare_id}
    assert await accounts.version(missing) is None
    assert await accounts.capacity_of(missing) is None
    assert await accounts.limits_of(missing) is None
    assert await accounts.sealed_key(secret_ref) == b"\x00sealed\xff"
    assert await accounts.sealed_key(fresh("key")) is None


# -- the fakes themselves --------------------------------------------------------------------------

# -- rate limits ----------------------------------------------------------------------------------


async def test_a_bucket_only_grows_and_gives_at_most_its_tokens_to_concurrent_takes(
    world: World,
) -> None:
    """The two operations `aml_gateway.limits.SharedRateLimiter` takes a token with: a bucket
    at 100 s of burst 3 and a token every 2 s has tokens while `tat` is at most 104."""
    limits = world.stores.limits
    key, created = fresh("auth_failures/192.0.2.1"), fresh("access_requests/192.0.2.2")
    keep = now() + timedelta(hours=1)
    assert await limits.bucket(key) is None
    assert await limits.take(key, 1000.0, 2.0, keep) is None  # no bucket: nothing to take from
    assert await limits.catch_up(key, 100.0, keep) == 100.0
    assert await limits.catch_up(key, 90.0, keep) == 100.0  # never moved back
    assert await limits.bucket(key) == 100.0
    taken = await asyncio.gather(*(limits.take(key, 104.0, 2.0, keep) for _ in range(12)))
    assert sorted(tat for tat in taken if tat is not None) == [102.0, 104.0, 106.0]
    assert await limits.bucket(key) == 106.0
    assert await limits.catch_up(key, 105.0, keep) == 106.0
    assert await limits.catch_up(key, 200.0, keep) == 200.0
    # Created by many at once: one bucket, each of them sees it.
    caught = await asyncio.gather(*(limits.catch_up(created, 50.0, keep) for _ in range(8)))
    assert caught == [50.0] * 8
    assert await limits.bucket(created) == 50.0


FAKES = [
    MemoryJobStore,
    MemoryPlanStore,
    MemoryStageRecordStore,
    MemoryAuditStore,
    MemoryOutageStore,
    MemoryLeaderboardStore,
    MemoryAccountStore,
    MemorySlotStore,
    MemoryAccessRequestStore,
    MemoryLimitStore,
]


def _methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }


@pytest.mark.parametrize("fake", FAKES, ids=lambda fake: fake.__name__)
def test_a_fake_method_is_its_real_stores_by_name_and_signature_and_one_round_trip(
    fake: Any,
) -> None:
    for name, method in _methods(fake).items():
        real = _methods(fake.real).get(name)
        assert real is not None, f"{fake.real.__name__} has no method {name}"
        assert inspect.signature(method) == inspect.signature(real), name
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(real), name
        assert inspect.isasyncgenfunction(method) == inspect.isasyncgenfunction(real), name
        # One yield to the event loop each, as one operation on a server: concurrent callers
        # interleave between operations (no assertion above can tell it is missing).
        assert inspect.getsource(method).count("await _round_trip()") == 1, name


@pytest.mark.parametrize("fake", FAKES, ids=lambda fake: fake.__name__)
def test_a_method_a_fake_does_not_implement_raises_when_called(fake: Any) -> None:
    store = fake()
    for name in _methods(fake.real).keys() - _methods(fake).keys():
        with pytest.raises(NotImplementedError, match=rf"^{fake.__name__}\.{name}$"):
            getattr(store, name)("any", "arguments")
    with pytest.raises(AttributeError):
        _ = store.no_such_method


def test_the_fakes_fill_every_field_of_stores() -> None:
    fakes = memory_stores()
    typed = fakes.typed()
    names = [field.name for field in fields(Stores)]
    assert [field.name for field in fields(MemoryStores)] == names
    for field in fields(Stores):
        fake = getattr(fakes, field.name)
        assert getattr(typed, field.name) is fake
        assert type(fake).real.__name__ == field.type


async def test_the_final_records_leave_a_coding_attempts_test_log_behind(world: World) -> None:
    records = world.stores.records
    job_id, attempt = fresh("job"), fresh("item")
    verified = {"_id": attempt, "job_id": job_id, "state": "done", "category_name": "noisy",
                "resolved": True, "test_log": "test_a ... ok\n" * 100}  # fmt: skip
    await world.seed("scores", verified)
    final = await records.final_records(job_id)
    dumped = final[attempt].model_dump()
    assert dumped.get("resolved") is True
    assert dumped.get("test_log") is None  # stored, but not read
