"""What a job's efficiency figures add to its completion on the embedded MongoDB (nx-27017): a
completed job of `--questions` questions (default 2,000, one dataset, five categories) with one
Add per five questions, an audit record per call (one Search in twenty retried once) and its
answers and scores, first alone in the database, then beside `--others` audit records of other
jobs (the trail is kept, so it grows with every job ever run).

Measured, median of a few runs: the completion's read of the outcomes as before
(`ScheduleJobs.outcomes`), and the same read feeding the figures plus the figures' own reads
(the job's audit records streamed by item, its answers streamed: `job_efficiency`), the
difference being what the figures add; and the Python memory the figures hold at their peak
(tracemalloc), which must not grow with the records.

    .venv/bin/python benchmarks/efficiency_cost.py [--questions 2000] [--others 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_pipeline.capacity import Capacity
from aml_runtime.clock import now
from aml_runtime.db import Document
from aml_runtime.documents import JobDocument, ensure_indexes
from aml_runtime.stores import Stores
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.job_efficiency import EfficiencyReading, job_efficiency
from aml_scheduler.settings import SchedulerSettings

JOB = "jcost"
DATASET = "locomo"
CATEGORIES = ("single-hop", "multi-hop", "temporal", "open-domain", "adversarial")
BATCH = 5000


def call(job_id: str, item: str, operation: str, attempt: int, status: int | None) -> Document:
    """An audit record as `aml_pipeline.audit.CallRecorder` writes it."""
    return {
        "job_id": job_id,
        "stage": "add" if operation == "add" else "search",
        "item_id": item,
        "delivery": 1,
        "operation": operation,
        "attempt": attempt,
        "started_at": now(),
        "latency_ms": random.uniform(20, 400),
        "queued_ms": 1.0,
        "status": status,
        "error_class": None,
        "outcome": "ok" if status == 200 else "retry",
        "validation": "valid" if status == 200 else None,
        "response_bytes": 2048,
    }


async def insert(db: AsyncDatabase[Document], collection: str, docs: list[Document]) -> None:
    for start in range(0, len(docs), BATCH):
        await db[collection].insert_many(docs[start : start + BATCH])


async def target_job(db: AsyncDatabase[Document], questions: int) -> None:
    await db.jobs.insert_one(
        {
            "_id": JOB, "team_id": "t", "version_id": "v", "mode": "full", "track": "textual",
            "run_label": "cost", "datasets": [DATASET], "state": "running", "planned": True,
            "created_at": now(), "top_k": 100,
            "totals": {"add": questions // 5, "questions": questions},
        }
    )  # fmt: skip
    items = [f"{JOB}/{DATASET}/conv-{i // 200}:q{i:04d}" for i in range(questions)]
    await insert(
        db,
        "questions",
        [
            {
                "_id": item,
                "job_id": JOB,
                "dataset_id": DATASET,
                "question_id": item[-10:],
                "category_name": CATEGORIES[i % len(CATEGORIES)],
                "search_body": b"x" * 300,
            }
            for i, item in enumerate(items)
        ],
    )
    calls = [
        call(JOB, f"eval:{JOB}:{DATASET}:c:chunk-{i}", "add", 1, 200) for i in range(questions // 5)
    ]
    for i, item in enumerate(items):
        if i % 20 == 0:
            calls.append(call(JOB, item, "search", 1, 503))
        calls.append(call(JOB, item, "search", 1 + (i % 20 == 0), 200))
    random.shuffle(calls)
    await insert(db, "calls", calls)
    answer = {
        "state": "done",
        "answer": "x" * 40,
        "candidates_returned": 30,
        "candidates_used": 6,
        "context_tokens": 1900,
        "retrieved_tokens": 2400,
        "retrieved_bytes": 14000,
        "used_tokens": 480,
        "tokens_in": 2300,
        "tokens_out": 9,
    }
    await insert(db, "answers", [{"_id": item, "job_id": JOB, **answer} for item in items])
    score = {
        "state": "done",
        "judge_label": "CORRECT",
        "judge_labels": ["CORRECT"],
        "judge_replies": ['{"label": "CORRECT"}'],
        "judge_calls": 1,
        "f1": 0.5,
        "bleu1": 0.4,
        "judge_tokens_in": 250,
        "judge_tokens_out": 6,
    }
    await insert(db, "scores", [{"_id": item, "job_id": JOB, **score} for item in items])


async def other_calls(db: AsyncDatabase[Document], count: int) -> None:
    """`count` audit records of 100 other jobs."""
    for start in range(0, count, BATCH):
        docs = [
            call(f"other{i % 100}", f"other{i % 100}/d/q{i}", "search", 1, 200)
            for i in range(start, min(count, start + BATCH))
        ]
        await db.calls.insert_many(docs)


async def median_ms(run: Callable[[], Awaitable[Any]], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def measure(db: AsyncDatabase[Document], label: str) -> None:
    stores = Stores.over(db)
    unused = cast(Any, None)
    scheduler = ScheduleJobs(SchedulerSettings(), stores, unused, unused, unused, unused, "")
    stored = await db.jobs.find_one({"_id": JOB})
    job = JobDocument.model_validate(stored)
    capacity = Capacity(key="v", max_concurrency=8, max_rps=10.0)

    async def outcomes() -> None:
        await scheduler.outcomes(JOB)

    async def with_figures() -> None:
        reading = EfficiencyReading(job.top_k)
        await scheduler.outcomes(JOB, reading)
        figures = await job_efficiency(stores, job, reading, capacity, "bench")
        assert figures is not None and figures.overall.search is not None

    before = await median_ms(outcomes)
    after = await median_ms(with_figures)
    tracemalloc.start()
    reading = EfficiencyReading(job.top_k)
    await scheduler.outcomes(JOB, reading)
    tracemalloc.reset_peak()
    baseline = tracemalloc.get_traced_memory()[0]
    await job_efficiency(stores, job, reading, capacity, "bench")
    peak = tracemalloc.get_traced_memory()[1] - baseline
    tracemalloc.stop()
    print(f"-- {label}")
    print(f"   outcomes read (before):           {before:8.1f} ms")
    print(f"   outcomes read + figures (now):    {after:8.1f} ms   (+{after - before:.1f} ms)")
    print(f"   figures' reads, peak Python memory: {peak / 1024:.0f} KiB above the outcomes")


async def run(mongo_url: str, questions: int, others: int) -> None:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    db = client["bench"]
    await ensure_indexes(db)
    await target_job(db, questions)
    await measure(db, f"{questions} questions, the job alone")
    started = time.perf_counter()
    await other_calls(db, others)
    print(f"(inserted {others} other audit records in {time.perf_counter() - started:.0f} s)")
    await measure(db, f"{questions} questions beside {others} other jobs' audit records")
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--others", type=int, default=200_000)
    args = parser.parse_args()
    random.seed(7)
    with tempfile.TemporaryDirectory() as folder:
        config = StackConfig(data_dir=Path(folder), start_nats=False, start_llm=False)
        with EmbeddedStack(config) as stack:
            stack.start_infra()
            asyncio.run(run(stack.mongo_url, args.questions, args.others))


if __name__ == "__main__":
    main()
