"""What a job's progress costs on the embedded MongoDB (nx-27017) as the database's history grows:
`GET /v1/jobs/{id}` (the job read plus `job_status`) and the scheduler's per-event
`complete_if_done`, for one job alone in the database, then for the same job with `--others`
unrelated stage documents (and some error entries) of other jobs.
Each is measured as now (the job's counters, `aml_pipeline.progress`) and as before (the
`count_documents` queries it replaced, reproduced here). Prints the median of a few runs.

    .venv/bin/python benchmarks/progress_reads.py [--others 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_gateway.progress import job_status
from aml_pipeline.jobs import record_error
from aml_pipeline.progress import ItemStage, count_final, outcome_of, repair_counters
from aml_runtime.clock import micros, now, now_us
from aml_runtime.db import Document
from aml_runtime.documents import ensure_indexes
from aml_runtime.stores import Stores
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

JOB = "jtarget"
CHUNKS, QUESTIONS = 12, 40
COLLECTIONS: dict[ItemStage, str] = {
    "add": "add_chunks",
    "search": "searches",
    "answer": "answers",
    "score": "scores",
}


async def target_job(db: AsyncDatabase[Document]) -> None:
    """A running job half-way: every chunk added, every question searched, a few failed."""
    await db.jobs.insert_one(
        {
            "_id": JOB,
            "team_id": "t",
            "version_id": "v",
            "mode": "smoke",
            "track": "textual",
            "run_label": "bench",
            "datasets": ["synthetic"],
            "state": "running",
            "planned": True,
            "created_at": now(),
            "started_at": now(),
            "totals": {"add": CHUNKS, "questions": QUESTIONS},
        }
    )
    for i in range(CHUNKS):
        await write(db, "add", f"{JOB}/u/{i}", "done")
    for i in range(QUESTIONS):
        item = f"{JOB}/synthetic/s1:q{i}"
        failed = i % 10 == 0
        await write(db, "search", item, "failed" if failed else "done")
        if failed:
            await record_error(Stores.over(db), JOB, "search", "participant_outage", item, "503")
        elif i % 2:
            await write(db, "answer", item, "done")
            await write(db, "score", item, "done")


async def write(db: AsyncDatabase[Document], stage: ItemStage, item: str, state: str) -> None:
    """A terminal stage document, counted on the job as its writer counts it."""
    at_us = now_us()
    await db[COLLECTIONS[stage]].insert_one(
        {"_id": item, "job_id": JOB, "state": state, "at_us": at_us}
    )
    outcome = outcome_of(state)
    assert outcome is not None
    await count_final(Stores.over(db), JOB, stage, outcome, at_us)


async def other_jobs(db: AsyncDatabase[Document], count: int) -> None:
    """`count` stage documents of 100 other jobs, as their workers leave them (and, for one in
    ten, an error entry)."""
    batch = 5000
    stages = list(COLLECTIONS.items())
    at_us = micros(now())
    for start in range(0, count, batch):
        ids = range(start, min(count, start + batch))
        for stage, collection in stages:
            docs = [
                {
                    "_id": f"o{i}",
                    "job_id": f"other{i % 100}",
                    "state": "done",
                    "at_us": at_us,
                    "body": "x" * 200,
                }
                for i in ids
                if i % len(stages) == stages.index((stage, collection))
            ]
            await db[collection].insert_many(docs)
        errors = [
            {
                "_id": f"other{i % 100}/search/o{i}",
                "job_id": f"other{i % 100}",
                "stage": "search",
                "kind": "participant_outage",
                "item": f"o{i}",
                "reason": "503",
                "at": now(),
                "at_us": at_us,
            }
            for i in ids
            if i % 10 == 0
        ]
        await db.job_errors.insert_many(errors)


async def old_job_status(db: AsyncDatabase[Document], job: Document) -> None:
    """What `job_status` read before: 8 counts over the stage collections, then the errors."""
    for collection in COLLECTIONS.values():
        await db[collection].count_documents({"job_id": job["_id"], "state": "done"})
        await db[collection].count_documents({"job_id": job["_id"], "state": "failed"})
    await db.job_errors.find({"job_id": job["_id"]}).sort("at", 1).limit(100).to_list()


async def old_complete_if_done(db: AsyncDatabase[Document]) -> None:
    """What `complete_if_done` read per event before (the job not complete yet)."""
    job = await db.jobs.find_one({"_id": JOB})
    assert job is not None
    finished = (
        await db.scores.count_documents({"job_id": JOB})
        + await db.searches.count_documents({"job_id": JOB, "state": "failed"})
        + await db.answers.count_documents({"job_id": JOB, "state": "failed"})
    )
    assert finished < job["totals"]["questions"]


async def median_ms(call: Callable[[], Awaitable[Any]], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def measure(db: AsyncDatabase[Document], scheduler: ScheduleJobs, label: str) -> None:
    async def get_job() -> None:
        job = await db.jobs.find_one({"_id": JOB})
        assert job is not None
        status = await job_status(Stores.over(db), job)
        assert status.stages["search"].failed == QUESTIONS // 10

    async def get_job_old() -> None:
        job = await db.jobs.find_one({"_id": JOB})
        assert job is not None
        await old_job_status(db, job)

    async def complete() -> None:
        await scheduler.complete_if_done(JOB)

    new_runs = 50
    old_runs = 3 if label != "alone" else 20
    rows = [
        ("GET /v1/jobs/{id}  (job read + job_status)", get_job, get_job_old),
        ("complete_if_done   (per question event)", complete, lambda: old_complete_if_done(db)),
    ]
    print(f"-- {label}")
    for name, new, old in rows:
        after = await median_ms(new, new_runs)
        before = await median_ms(old, old_runs)
        print(f"   {name}: now {after:8.2f} ms   before {before:9.2f} ms")
    repair = await median_ms(lambda: repair_counters(Stores.over(db), JOB), 3)
    print(f"   repair_counters    (reconciliation, when due): {repair:8.2f} ms")


async def run(mongo_url: str, others: int) -> None:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    db = client["bench"]
    await ensure_indexes(db)
    await target_job(db)
    # Only the stores and the settings are used on the path measured (job not complete).
    unused = cast(Any, None)
    stores = Stores.over(db)
    scheduler = ScheduleJobs(SchedulerSettings(), stores, unused, unused, unused, unused, "")
    await measure(db, scheduler, "alone")
    started = time.perf_counter()
    await other_jobs(db, others)
    print(f"(inserted {others} other stage documents in {time.perf_counter() - started:.0f} s)")
    await measure(db, scheduler, f"with {others} unrelated stage documents")
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--others", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        config = StackConfig(data_dir=Path(folder), start_nats=False, start_llm=False)
        with EmbeddedStack(config) as stack:
            stack.start_infra()
            asyncio.run(run(stack.mongo_url, args.others))


if __name__ == "__main__":
    main()
