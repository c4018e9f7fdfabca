"""Job progress counters (`aml_pipeline.progress`) on the real nx-27017 MongoDB wire server (and
a real nats-server for the scheduler's completion): an item's terminal outcome is counted
exactly once by the stage writers themselves however often and however concurrently they store
it, a crash between the stage document and its increment is repaired, the writer that makes
every question final says so, the scheduler completes a job from its counter, and the
gateway's status reads the counters alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
import structlog
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase
from structlog.testing import capture_logs

from aml_adder.handlers import SendChunk
from aml_contract.messages import AddWork, QuestionStage, QuestionWork
from aml_gateway.progress import job_status
from aml_pipeline import progress
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.jobs import JobStates, record_error
from aml_pipeline.progress import (
    Counted,
    ItemStage,
    OutcomeCounter,
    _count,
    count_final,
    counters_of,
    repair_counters,
)
from aml_pipeline.question_stage import QuestionStageWorker
from aml_runtime.broker import JetStreamBus
from aml_runtime.clock import micros, now_us
from aml_runtime.db import Document
from aml_runtime.documents import ensure_indexes
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.integration

ITEM = "synthetic/s1:q"


@pytest.fixture(scope="module")
async def db(mongo_url: str) -> AsyncIterator[AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    database = client["aml_progress_it"]
    await ensure_indexes(database)
    yield database
    await client.close()


async def planned_job(
    db: AsyncDatabase[Document], job_id: str, questions: int = 4, **fields: Any
) -> None:
    """A job as the scheduler leaves it after planning: totals set, no counters yet."""
    await db.jobs.insert_one(
        {
            "_id": job_id,
            "team_id": "team-1",
            "version_id": "ver-1",
            "mode": "smoke",
            "track": "textual",
            "run_label": f"label-{job_id}",
            "datasets": ["synthetic"],
            "state": "running",
            "planned": True,
            "created_at": datetime.now(UTC),
            "started_at": datetime.now(UTC),
            "totals": {"add": 2, "questions": questions},
            **fields,
        }
    )


async def counters(db: AsyncDatabase[Document], job_id: str) -> dict[str, int]:
    job = await db.jobs.find_one({"_id": job_id})
    assert job is not None
    return {field: value for field, value in counters_of(job).items() if value}


def stage_worker(
    db: AsyncDatabase[Document], broker: NatsBroker, stage: QuestionStage
) -> QuestionStageWorker:
    async def unused(*_: Any) -> Document:
        raise AssertionError("store only")

    return QuestionStageWorker(
        stage, CommonSettings(), Stores.over(db), broker, JetStreamBus(broker), unused
    )


def announcer(announced: list[Counted]) -> Callable[[Counted], Awaitable[None]]:
    """An `all_final` callback that keeps what it was told instead of publishing it."""

    async def all_final(counted: Counted) -> None:
        announced.append(counted)

    return all_final


def work(job_id: str, i: int) -> QuestionWork:
    return QuestionWork(job_id=job_id, version_id="ver-1", item_id=f"{job_id}/{ITEM}{i}")


async def finished(
    db: AsyncDatabase[Document], stage: ItemStage, job_id: str, item_id: str, state: str
) -> bool:
    """A terminal stage document written and counted as its writer does (no worker at hand)."""
    collection = {"add": "add_chunks", "search": "searches", "answer": "answers"}.get(
        stage, "scores"
    )
    at_us = now_us()
    await db[collection].insert_one(
        {"_id": item_id, "job_id": job_id, "state": state, "at_us": at_us}
    )
    outcome = "done" if state == "done" else "failed"
    return await count_final(Stores.over(db), job_id, stage, outcome, at_us)


async def test_an_outcome_counts_once_however_often_it_is_stored(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    await planned_job(db, "jonce", questions=2)
    search, score = stage_worker(db, broker, "search"), stage_worker(db, broker, "score")
    announced: list[Counted] = []
    all_final = announcer(announced)
    score.counter.all_final = all_final
    # A redelivery stores the same outcome again: the stored one stands, counted once.
    assert await search.store(work("jonce", 0), {"state": "done"}) == ("done", True)
    assert await search.store(work("jonce", 0), {"state": "failed"}) == ("done", False)
    # Ten concurrent deliveries (or replicas) of one message: one writes, all see its state.
    stores = await asyncio.gather(
        *[search.store(work("jonce", 1), {"state": "failed"}) for _ in range(10)]
    )
    assert {stored.state for stored in stores} == {"failed"}
    assert sorted(stored.written for stored in stores) == [False] * 9 + [True]
    await search.counter.drain()
    # The score that makes every question final says so, once, whoever wins the race.
    scores = [score.store(work("jonce", 0), {"state": "done"}) for _ in range(10)]
    assert sorted(stored.written for stored in await asyncio.gather(*scores)) == [False] * 9 + [
        True
    ]
    await score.counter.drain()
    assert [counted.item_id for counted in announced] == [work("jonce", 0).item_id]
    # The adder's guarded update: ten concurrent finishes of one chunk count one.
    await db.add_chunks.insert_one({"_id": "jonce/u/0", "job_id": "jonce", "state": "pending"})
    over = Stores.over(db)
    adder = SendChunk(
        CommonSettings(),
        over,
        JetStreamBus(broker),
        cast(Any, None),
        cast(Any, None),
        JobStates(over, broker),
    )
    add = AddWork(job_id="jonce", version_id="ver-1", request_id="jonce/u/0")
    await asyncio.gather(*[adder.finish(add, "done", {}) for _ in range(10)])
    await adder.counter.drain()
    errors = [record_error(over, "jonce", "search", "outage", "jonce/x", "down") for _ in range(10)]
    await asyncio.gather(*errors)

    assert await counters(db, "jonce") == {
        "progress.add.done": 1,
        "progress.search.done": 1,
        "progress.search.failed": 1,
        "progress.score.done": 1,
        "progress.questions_final": 2,
        "progress.errors": 1,
    }
    # Nothing to repair: the counters are what the documents say.
    assert await repair_counters(Stores.over(db), "jonce") is False
    assert (await counters(db, "jonce"))["progress.questions_final"] == 2


async def events(db: AsyncDatabase[Document], job_id: str) -> int:
    """How many increments reached the job document (each bumps `progress.events`)."""
    job = await db.jobs.find_one({"_id": job_id}, {"progress": 1})
    return int(((job or {}).get("progress") or {}).get("events", 0))


def outcome(job_id: str, i: int, stage: ItemStage = "score", state: str = "done") -> Counted:
    return Counted(job_id, f"{job_id}/{ITEM}{i}", stage, "done" if state == "done" else "failed",
                   now_us())  # fmt: skip


async def test_a_stage_counts_a_jobs_outcomes_in_one_increment_per_window(
    db: AsyncDatabase[Document],
) -> None:
    await planned_job(db, "jbatch", questions=10)
    announced: list[Counted] = []
    counter = OutcomeCounter(Stores.over(db), announcer(announced), window=0.3)
    # The first outcome of a job is counted at once: the counter learns where the job stands.
    counter.count(outcome("jbatch", 0))
    await counter.drain()
    assert await events(db, "jbatch") == 1
    # The next ones, within the window, are summed and applied together.
    counter.count(outcome("jbatch", 1, "search", "failed"))
    for i in range(2, 6):
        counter.count(outcome("jbatch", i, "answer"))
        counter.count(outcome("jbatch", i))
    assert await events(db, "jbatch") == 1
    # Applied by the window's timer, not by a drain (bounded wait: a loaded machine is slow).
    deadline = asyncio.get_running_loop().time() + 10
    while await events(db, "jbatch") < 2 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert await events(db, "jbatch") == 2
    assert await counters(db, "jbatch") == {
        "progress.score.done": 5,
        "progress.search.failed": 1,
        "progress.answer.done": 4,
        "progress.questions_final": 6,
    }
    assert announced == []


async def test_the_adder_counts_a_jobs_adds_in_one_increment_per_window(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    """The job document holds every user's order, so an update of it per Add cost more the
    larger the job: the adder's outcomes are summed like a question stage's."""
    await planned_job(db, "jadds", questions=1)
    ids = [f"jadds/u/{seq}" for seq in range(12)]
    await db.add_chunks.insert_many(
        [{"_id": chunk_id, "job_id": "jadds", "state": "pending"} for chunk_id in ids]
    )
    over = Stores.over(db)
    adder = SendChunk(CommonSettings(), over, JetStreamBus(broker), cast(Any, None),
                      cast(Any, None), JobStates(over, broker))  # fmt: skip
    adder.counter.window = 0.3

    def add(chunk_id: str) -> AddWork:
        return AddWork(job_id="jadds", version_id="ver-1", request_id=chunk_id)

    # The first is counted at once (the counter learns where the job stands), the next ten
    # together, each written once however often it is finished.
    await adder.finish(add(ids[0]), "done", {})
    await asyncio.gather(*[adder.finish(add(chunk_id), "done", {}) for chunk_id in ids[1:11]])
    await asyncio.gather(*[adder.finish(add(chunk_id), "done", {}) for chunk_id in ids[1:11]])
    await adder.finish(add(ids[11]), "failed", {"failure": "refused"})
    deadline = asyncio.get_running_loop().time() + 10
    while await events(db, "jadds") < 2 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert await events(db, "jadds") == 2
    assert await counters(db, "jadds") == {"progress.add.done": 11, "progress.add.failed": 1}
    # A stopping adder has nothing left to count.
    await adder.close()
    assert await events(db, "jadds") == 2


async def test_the_batch_that_may_complete_the_job_is_not_held(
    db: AsyncDatabase[Document],
) -> None:
    await planned_job(db, "jlast", questions=4)
    announced: list[Counted] = []
    counter = OutcomeCounter(Stores.over(db), announcer(announced), window=60.0)
    counter.count(outcome("jlast", 0))
    await counter.drain()
    counter.count(outcome("jlast", 1))
    counter.count(outcome("jlast", 2, "answer"))  # ends no question
    counter.count(outcome("jlast", 2, "search", "failed"))
    await asyncio.sleep(0.3)
    assert (await counters(db, "jlast"))["progress.questions_final"] == 1  # held: 3 of 4
    counter.count(outcome("jlast", 3))
    deadline = asyncio.get_running_loop().time() + 10
    while not announced and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    # Well before the 60 s window: the last outcome's batch went at once, and said so once.
    assert [counted.item_id for counted in announced] == [f"jlast/{ITEM}3"]
    assert await counters(db, "jlast") == {
        "progress.score.done": 3,
        "progress.answer.done": 1,
        "progress.search.failed": 1,
        "progress.questions_final": 4,
    }
    await counter.drain()
    assert await events(db, "jlast") == 2


async def test_a_batch_partly_counted_by_a_repair_counts_only_the_rest(
    db: AsyncDatabase[Document],
) -> None:
    await planned_job(db, "jrace", questions=5)

    async def all_final(counted: Counted) -> None:
        raise AssertionError("not every question is final")

    counter = OutcomeCounter(Stores.over(db), all_final, window=60.0)
    counter.count(outcome("jrace", 0, "search"))
    await counter.drain()
    # An outcome stored and waiting in the batch while a repair recounts the job from its
    # documents (the repair sees it and counts it).
    old = outcome("jrace", 1)
    await db.scores.insert_one({"_id": old.item_id, "job_id": "jrace", "state": "done",
                                "at_us": old.at_us})  # fmt: skip
    await db.searches.insert_one({"_id": f"jrace/{ITEM}0", "job_id": "jrace", "state": "done",
                                  "at_us": old.at_us - 1})  # fmt: skip
    counter.count(old)
    assert await repair_counters(Stores.over(db), "jrace") is True
    newer = outcome("jrace", 2)
    counter.count(newer)
    await counter.drain()
    # The repaired outcome is not counted again by its batch; the newer one is counted.
    assert await counters(db, "jrace") == {
        "progress.search.done": 1,
        "progress.score.done": 2,
        "progress.questions_final": 2,
    }


async def test_a_stopping_stage_counts_what_it_holds(db: AsyncDatabase[Document]) -> None:
    await planned_job(db, "jstop", questions=3)

    async def all_final(counted: Counted) -> None:
        return None

    counter = OutcomeCounter(Stores.over(db), all_final, window=3600.0)
    counter.count(outcome("jstop", 0))
    await counter.drain()
    counter.count(outcome("jstop", 1))
    await asyncio.sleep(0.2)
    assert (await counters(db, "jstop"))["progress.questions_final"] == 1
    await counter.drain()
    assert (await counters(db, "jstop"))["progress.questions_final"] == 2


async def test_repair_counts_what_a_crash_left_uncounted(db: AsyncDatabase[Document]) -> None:
    await planned_job(db, "jcrash")
    assert await finished(db, "search", "jcrash", f"jcrash/{ITEM}0", "done") is False
    # Writers that died after their stage document, before their increment.
    lost = f"jcrash/{ITEM}1"
    at_us = micros(datetime.now(UTC))
    await db.searches.insert_one(
        {"_id": lost, "job_id": "jcrash", "state": "failed", "at_us": at_us}
    )
    unrecorded = f"jcrash/{ITEM}2"
    await db.scores.insert_one({"_id": unrecorded, "job_id": "jcrash", "state": "done"})
    await db.searches.insert_one({"_id": f"jcrash/{ITEM}3", "job_id": "jcrash", "state": "x"})
    # And an error-summary entry whose count was lost.
    await db.job_errors.insert_one({"_id": "jcrash/search/x", "job_id": "jcrash", "at_us": 1})
    assert await counters(db, "jcrash") == {"progress.search.done": 1}

    assert await repair_counters(Stores.over(db), "jcrash") is True
    repaired = {
        "progress.search.done": 1,
        "progress.search.failed": 1,
        "progress.score.done": 1,
        "progress.questions_final": 2,
        "progress.errors": 1,
    }
    assert await counters(db, "jcrash") == repaired
    assert await repair_counters(Stores.over(db), "jcrash") is False
    # The writer of the lost increment was only slow, not dead: its late increment finds the
    # document already counted by the repair (watermark) and changes nothing.
    late = {"progress.search.failed": 1, "progress.questions_final": 1}
    assert await _count(Stores.over(db), "jcrash", late, at_us) is None
    assert await counters(db, "jcrash") == repaired
    # Outcomes written after the repair count as usual.
    assert await finished(db, "score", "jcrash", f"jcrash/{ITEM}0", "done") is False
    assert await counters(db, "jcrash") == {
        **repaired,
        "progress.score.done": 2,
        "progress.questions_final": 3,
    }
    job = await db.jobs.find_one({"_id": "jcrash"})
    assert job is not None and job["progress"]["repaired_us"] >= at_us
    # Another job, without a watermark, is counted on its own document and on no other (the
    # guard is not an `$or`, which nx-27017 would apply to another job's document).
    await planned_job(db, "jother")
    assert await finished(db, "search", "jother", f"jother/{ITEM}0", "done") is False
    assert await counters(db, "jother") == {"progress.search.done": 1}
    assert await counters(db, "jcrash") == {
        **repaired,
        "progress.score.done": 2,
        "progress.questions_final": 3,
    }


async def test_job_status_reads_the_counters(db: AsyncDatabase[Document]) -> None:
    await planned_job(db, "jstatus")
    stores = Stores.over(db)
    for _ in range(3):
        await count_final(stores, "jstatus", "search", "done", now_us())
    await count_final(stores, "jstatus", "search", "failed", now_us())
    await record_error(stores, "jstatus", "search", "participant_outage", f"jstatus/{ITEM}3", "503")
    await count_final(stores, "jstatus", "add", "done", now_us())
    await count_final(stores, "jstatus", "add", "done", now_us())
    job = await db.jobs.find_one({"_id": "jstatus"})
    assert job is not None
    # No stage document exists at all: the figures come from the job document alone.
    for collection in ("add_chunks", "searches", "answers", "scores"):
        assert await db[collection].find_one({"job_id": "jstatus"}) is None

    status = await job_status(stores, job)
    figures: dict[str, Any] = {s: p.model_dump() for s, p in status.stages.items()}
    assert figures["add"] == {"total": 2, "done": 2, "failed": 0}
    assert figures["search"] == {"total": 4, "done": 3, "failed": 1}
    assert figures["answer"] == {"total": 4, "done": 0, "failed": 0}
    assert status.stage == "answer"  # every search is done or failed
    assert [(e.kind, e.item) for e in status.errors] == [("participant_outage", f"jstatus/{ITEM}3")]


def scheduler(db: AsyncDatabase[Document], broker: NatsBroker) -> ScheduleJobs:
    settings = SchedulerSettings(reconcile_interval_seconds=20)
    # The participant client and the secrets are used only to plan and release, not here.
    unused = cast(Any, None)
    return ScheduleJobs(
        settings,
        Stores.over(db),
        JetStreamBus(broker),
        unused,
        unused,
        build_evaluation_spec(settings),
        "code",
    )


async def question(db: AsyncDatabase[Document], job_id: str, i: int) -> str:
    item = f"{job_id}/{ITEM}{i}"
    await db.questions.insert_one(
        {
            "_id": item,
            "job_id": job_id,
            "dataset_id": "synthetic",
            "category_name": "facts",
            "question_id": f"s1:q{i}",
        }
    )
    return item


async def scored(db: AsyncDatabase[Document], job_id: str, item: str) -> None:
    """A score document as the scorer writes it (the record is the caller's business)."""
    await db.scores.insert_one(
        {
            "_id": item,
            "job_id": job_id,
            "state": "done",
            "category_name": "facts",
            "judge_label": "CORRECT",
            "judge_labels": ["CORRECT"],
            "f1": 1.0,
            "bleu1": 1.0,
        }
    )


async def test_scheduler_completes_a_job_from_its_counter(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    await planned_job(db, "jdone", questions=2)
    run = scheduler(db, broker)
    first, second = await question(db, "jdone", 0), await question(db, "jdone", 1)
    # An Add chunk confirmed whose writer died before recording it: the completion repairs it.
    await db.add_chunks.insert_one({"_id": "jdone/u/0", "job_id": "jdone", "state": "done"})
    await scored(db, "jdone", first)
    assert await count_final(Stores.over(db), "jdone", "score", "done", now_us()) is False
    await run.complete_if_done("jdone")
    assert (await db.jobs.find_one({"_id": "jdone"}) or {})["state"] == "running"

    assert await finished(db, "search", "jdone", second, "failed") is True
    await run.complete_if_done("jdone")
    job = await db.jobs.find_one({"_id": "jdone"})
    assert job is not None and job["state"] == "completed"
    assert job["results"]["overall"]["judge_accuracy"] is not None
    assert await counters(db, "jdone") == {
        "progress.add.done": 1,
        "progress.search.failed": 1,
        "progress.score.done": 1,
        "progress.questions_final": 2,
    }


async def test_reconciliation_repairs_a_stalled_job_and_completes_it(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    # The scorer died after storing the last score and before recording it; its redelivery
    # only re-announces it. Nothing has moved for longer than three reconciliation intervals.
    long_ago = datetime.now(UTC) - timedelta(minutes=5)
    await planned_job(db, "jstall", questions=1, started_at=long_ago)
    item = await question(db, "jstall", 0)
    await scored(db, "jstall", item)
    run = scheduler(db, broker)
    await run.complete_if_done("jstall")
    assert (await db.jobs.find_one({"_id": "jstall"}) or {})["state"] == "running"

    await run.reconcile()
    job = await db.jobs.find_one({"_id": "jstall"})
    assert job is not None and job["state"] == "completed", job
    assert (await counters(db, "jstall"))["progress.questions_final"] == 1
    # A job that moved recently is left alone by the reconciliation's repair.
    await planned_job(db, "jbusy", questions=1)
    busy = await question(db, "jbusy", 0)
    await scored(db, "jbusy", busy)
    await run.reconcile()
    assert (await db.jobs.find_one({"_id": "jbusy"}) or {})["state"] == "running"
    assert await counters(db, "jbusy") == {}


@contextmanager
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """The progress module's log entries, each with its `log_level`. Its logger is replaced by
    a fresh one for the capture: a logger cached by an earlier configuration (the services
    cache theirs on first use) would not see the capturing processor."""
    with capture_logs() as entries:
        monkeypatch.setattr(progress, "log", structlog.get_logger())
        yield entries


async def test_the_recount_at_completion_is_quiet_and_a_stalled_jobs_repair_warns(
    db: AsyncDatabase[Document], broker: NatsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = scheduler(db, broker)
    # An undisturbed job: the last score is counted at once, while the searcher's batch of the
    # same question is still in its window. The completion's recount finds it: normal, info.
    await planned_job(db, "jquiet", questions=1)
    item = await question(db, "jquiet", 0)
    await db.searches.insert_one({"_id": item, "job_id": "jquiet", "state": "done",
                                  "at_us": now_us()})  # fmt: skip
    await scored(db, "jquiet", item)
    assert await count_final(Stores.over(db), "jquiet", "score", "done", now_us()) is True
    with captured(monkeypatch) as entries:
        await run.complete_if_done("jquiet")
    assert (await db.jobs.find_one({"_id": "jquiet"}) or {})["state"] == "completed"
    mine = [(e["event"], e["log_level"]) for e in entries if e.get("job_id") == "jquiet"]
    assert ("progress.recounted", "info") in mine
    assert not [entry for entry in mine if entry[1] in ("warning", "error")], mine
    recounted = next(e for e in entries if e["event"] == "progress.recounted")
    assert recounted["changed"] == {"progress.search.done": (0, 1)}

    # A stalled job: an increment was lost (the scorer died after its score document): the
    # reconciliation's repair is an anomaly, a warning.
    long_ago = datetime.now(UTC) - timedelta(minutes=5)
    await planned_job(db, "jlost", questions=1, started_at=long_ago)
    await scored(db, "jlost", await question(db, "jlost", 0))
    with captured(monkeypatch) as entries:
        await run.reconcile()
    assert (await db.jobs.find_one({"_id": "jlost"}) or {})["state"] == "completed"
    mine = [(e["event"], e["log_level"]) for e in entries if e.get("job_id") == "jlost"]
    assert ("progress.repaired", "warning") in mine
    assert "progress.recounted" not in {event for event, _ in mine}  # nothing left to recount


async def counted_in_full(db: AsyncDatabase[Document], job_id: str, *, hold_search: bool) -> str:
    """A one-question job whose Adds, search, answer and score are all written and counted by
    their writers, except, with `hold_search`, the search's count (the caller counts it, as a
    searcher's batch leaving its window would). Returns the question's id."""
    await planned_job(db, job_id, questions=1)
    for seq in range(2):
        assert await finished(db, "add", job_id, f"{job_id}/u/{seq}", "done") is False
    item = await question(db, job_id, 0)
    search_at = now_us()
    await db.searches.insert_one({"_id": item, "job_id": job_id, "state": "done",
                                  "at_us": search_at})  # fmt: skip
    if not hold_search:
        await count_final(Stores.over(db), job_id, "search", "done", search_at)
    assert await finished(db, "answer", job_id, item, "done") is False
    await db.scores.insert_one({"_id": item, "job_id": job_id, "state": "done",
                                "category_name": "facts", "judge_label": "CORRECT",
                                "judge_labels": ["CORRECT"], "f1": 1.0, "bleu1": 1.0,
                                "at_us": (score_at := now_us())})  # fmt: skip
    assert await count_final(Stores.over(db), job_id, "score", "done", score_at) is True
    return item


async def test_counters_already_exact_are_not_recounted_at_completion(
    db: AsyncDatabase[Document], broker: NatsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every counter at the most the job's totals allow is exact (counters are never above the
    truth): the completion does not read every stage document again (at LoCoMo-10 that read
    took 1.8 s of a job's wall, a search document holding its candidates), so no recount is
    stamped; nor when the last batch of another stage lands within its window meanwhile."""
    run = scheduler(db, broker)
    await counted_in_full(db, "jexact", hold_search=False)
    with captured(monkeypatch) as entries:
        await run.complete_if_done("jexact")
    job = await db.jobs.find_one({"_id": "jexact"})
    assert job is not None and job["state"] == "completed"
    assert "repaired_us" not in job["progress"]
    assert not [e for e in entries if e["event"].startswith("progress.")]

    item = await counted_in_full(db, "jwindow", hold_search=True)
    at_us = (await db.searches.find_one({"_id": item}) or {})["at_us"]

    async def batch_leaves_its_window() -> None:
        await asyncio.sleep(0.4)
        await count_final(Stores.over(db), "jwindow", "search", "done", at_us)

    landing = asyncio.create_task(batch_leaves_its_window())
    with captured(monkeypatch) as entries:
        await run.complete_if_done("jwindow")
    await landing
    job = await db.jobs.find_one({"_id": "jwindow"})
    assert job is not None and job["state"] == "completed"
    assert "repaired_us" not in job["progress"]
    assert job["progress"]["search"]["done"] == 1
    assert "progress.recounted" not in {e["event"] for e in entries}


async def test_an_error_entry_left_uncounted_is_recounted_at_completion(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    """Every stage at its totals is not enough when an error entry's increment was lost (its
    writer died): the completion recounts, so the error shows in the stored counters."""
    await counted_in_full(db, "jerror", hold_search=False)
    await db.job_errors.insert_one({"job_id": "jerror", "stage": "search", "kind": "http_500",
                                    "item": "x", "at_us": now_us()})  # fmt: skip
    await scheduler(db, broker).complete_if_done("jerror")
    job = await db.jobs.find_one({"_id": "jerror"})
    assert job is not None and job["state"] == "completed"
    assert job["progress"]["errors"] == 1
    assert "repaired_us" in job["progress"]
