"""The scheduler's stall watchdog and its handling of missing dataset files, with a real
scheduler (`aml_scheduler.handlers.ScheduleJobs`) on nx-27017 and nats-server: a running job that
nothing moves is failed within its stall limit, naming the stage it is stuck in and whether the
participant or the platform stalled it; a slow declared rate is never mistaken for a stall; a
job whose dataset files are missing is failed once, with the path, instead of staying queued."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.messages import JobSubmitted
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.outages import ABANDONED_GRACE_SECONDS, LanePause, Outages, record_outage
from aml_runtime.broker import JetStreamBus
from aml_runtime.clock import micros
from aml_runtime.db import Document
from aml_runtime.documents import STAGE_COLLECTIONS, FailureKind, ensure_indexes
from aml_runtime.secrets import SecretBox
from aml_runtime.stores import Stores
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings
from aml_scheduler.watchdog import STALL_PERIODS

# Mostly waits for processes and deadlines: runs beside the other tests (dev.py).
pytestmark = [pytest.mark.integration, pytest.mark.wallclock]

STALL = 60.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
async def db(mongo_url: str) -> AsyncIterator[AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    database = client["aml_watchdog_it"]
    await ensure_indexes(database)
    yield database
    await client.close()


class Clock:
    def __init__(self) -> None:
        self.moment = T0

    def __call__(self) -> datetime:
        return self.moment

    def at(self, seconds: float) -> None:
        self.moment = T0 + timedelta(seconds=seconds)


def scheduler(
    db: AsyncDatabase[Document], broker: NatsBroker, clock: Clock, root: Path = Path(".")
) -> ScheduleJobs:
    settings = SchedulerSettings(
        job_stall_seconds=STALL,
        participant_timeout_seconds=5,
        reconcile_interval_seconds=20,
        datasets_root=root,
    )
    unused = cast(Any, None)
    run = ScheduleJobs(
        settings,
        Stores.over(db),
        JetStreamBus(broker),
        unused,
        unused,
        build_evaluation_spec(settings),
        "code",
        clock,
    )

    async def healthy(job: Document) -> bool:
        return True

    run._participant_healthy = healthy  # type: ignore[method-assign]
    return run


async def version(db: AsyncDatabase[Document], version_id: str, max_rps: float = 10.0) -> None:
    await db.versions.update_one(
        {"_id": version_id},
        {"$set": {"capacity": {"max_concurrency": 2, "max_rps": max_rps}}},
        upsert=True,
    )


async def running_job(
    db: AsyncDatabase[Document], job_id: str, version_id: str, progress: Document
) -> None:
    """Planned at T0 with 2 Add requests and 3 questions; `progress` as the stages counted it
    (its `last_us` is when it last moved), with the stage documents it counted (so that the
    reconciliation's repair finds the counters exact)."""
    for stage, collection in STAGE_COLLECTIONS.items():
        done = (progress.get(stage) or {}).get("done", 0)
        documents = [
            {"_id": f"{job_id}/{stage}/{i}", "job_id": job_id, "state": "done", "at_us": us(0)}
            for i in range(done)
        ]
        if documents:
            await db[collection].insert_many(documents)
    await db.jobs.insert_one(
        {
            "_id": job_id,
            "team_id": "team-w",
            "version_id": version_id,
            "mode": "smoke",
            "run_label": job_id,
            "datasets": ["synthetic"],
            "state": "running",
            "planned": True,
            "created_at": T0,
            "started_at": T0,
            "totals": {"add": 2, "questions": 3},
            "progress": progress,
        }
    )


async def job(db: AsyncDatabase[Document], job_id: str) -> Document:
    found = await db.jobs.find_one({"_id": job_id})
    assert found is not None
    return found


def us(seconds: float) -> int:
    return micros(T0 + timedelta(seconds=seconds))


async def test_a_job_the_participant_stalls_fails_naming_the_stage_and_the_participant(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    clock = Clock()
    run = scheduler(db, broker, clock)
    await version(db, "ver-w1")
    # Both Adds confirmed, one question searched (at t=10s); then the participant fails.
    await running_job(
        db, "jw1", "ver-w1", {"add": {"done": 2}, "search": {"done": 1}, "last_us": us(10)}
    )
    await db.calls.insert_one(
        {
            "job_id": "jw1",
            "stage": "search",
            "item_id": "jw1/q2",
            "operation": "search",
            "attempt": 3,
            "started_at": T0 + timedelta(seconds=40),
            "status": 503,
            "error_class": None,
            "outcome": "retry",
        }
    )
    clock.at(10 + STALL - 1)
    await run.reconcile()
    assert (await job(db, "jw1"))["state"] == "running"

    clock.at(10 + STALL + 1)
    await run.reconcile()
    failed = await job(db, "jw1")
    assert failed["state"] == "failed"
    assert failed["failed_stage"] == "search"
    assert failed["failure_kind"] == FailureKind.JOB_STALLED
    assert "stage search" in failed["failure"] and "cause: participant" in failed["failure"]
    assert "503" in failed["failure"] and "1 of 3 questions searched" in failed["failure"]
    errors = await db.job_errors.find({"job_id": "jw1"}).to_list()
    assert [(e["stage"], e["kind"]) for e in errors] == [("search", FailureKind.JOB_STALLED)]
    # Failed once: a later pass changes nothing.
    clock.at(10 * STALL)
    await run.reconcile()
    assert await db.job_errors.count_documents({"job_id": "jw1"}) == 1


async def test_a_job_nothing_was_sent_for_is_the_platforms_stall(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    clock = Clock()
    run = scheduler(db, broker, clock)
    await version(db, "ver-w2")
    await running_job(db, "jw2", "ver-w2", {})
    clock.at(STALL + 1)
    await run.reconcile()
    failed = await job(db, "jw2")
    assert failed["state"] == "failed" and failed["failed_stage"] == "add"
    assert failed["failure_kind"] == FailureKind.PLATFORM_ERROR  # the team's quota is not charged
    assert "cause: platform" in failed["failure"] and "0 of 2 Add requests" in failed["failure"]


async def test_a_job_stuck_at_the_llm_is_the_platforms_stall(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    clock = Clock()
    run = scheduler(db, broker, clock)
    await version(db, "ver-w3")
    progress = {"add": {"done": 2}, "search": {"done": 3}, "answer": {"done": 1}, "last_us": us(5)}
    await running_job(db, "jw3", "ver-w3", progress)
    clock.at(5 + STALL + 1)
    await run.reconcile()
    failed = await job(db, "jw3")
    assert failed["state"] == "failed" and failed["failed_stage"] == "answer"
    assert failed["failure_kind"] == FailureKind.PLATFORM_ERROR
    assert "1 of 3 answered" in failed["failure"]


async def test_a_slow_declared_rate_is_not_a_stall(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    """max_rps 0.001 is one call per 1000 s: the job may sit still for ten periods."""
    clock = Clock()
    run = scheduler(db, broker, clock)
    await version(db, "ver-slow", max_rps=0.001)
    await running_job(db, "jslow", "ver-slow", {"add": {"done": 1}, "last_us": us(0)})
    limit = STALL_PERIODS * 1000.0
    for seconds in (STALL * 10, 3 * 1000.0, limit - 1):
        clock.at(seconds)
        await run.reconcile()
        assert (await job(db, "jslow"))["state"] == "running", seconds
    clock.at(limit + 1)
    await run.reconcile()
    failed = await job(db, "jslow")
    assert failed["state"] == "failed" and failed["failed_stage"] == "add"
    assert f"limit {limit:.0f}s" in failed["failure"]


async def test_a_moving_job_is_left_alone(db: AsyncDatabase[Document], broker: NatsBroker) -> None:
    clock = Clock()
    run = scheduler(db, broker, clock)
    await version(db, "ver-w4")
    await running_job(db, "jw4", "ver-w4", {"add": {"done": 1}, "last_us": us(1000)})
    clock.at(1000 + STALL / 2)
    await run.reconcile()
    assert (await job(db, "jw4"))["state"] == "running"


async def test_missing_dataset_files_fail_the_job_once_with_the_path(
    db: AsyncDatabase[Document], broker: NatsBroker, tmp_path: Path
) -> None:
    clock = Clock()
    run = scheduler(db, broker, clock, root=tmp_path)
    await version(db, "ver-w5")
    await db.jobs.insert_one(
        {
            "_id": "jw5",
            "team_id": "team-w",
            "version_id": "ver-w5",
            "mode": "smoke",
            "run_label": "jw5",
            "datasets": ["locomo"],
            "state": "queued",
            "planned": False,
            "created_at": T0,
        }
    )
    await run.on_job_submitted(JobSubmitted(job_id="jw5"))
    failed = await job(db, "jw5")
    assert failed["state"] == "failed", failed
    assert failed["failure_kind"] == FailureKind.PLATFORM_ERROR
    assert str(tmp_path / "locomo" / "locomo10.json") in failed["failure"]
    await run.reconcile()
    await run.on_job_submitted(JobSubmitted(job_id="jw5"))
    errors = await db.job_errors.find({"job_id": "jw5"}).to_list()
    assert [e["kind"] for e in errors] == [FailureKind.DATASET_MISSING]
    assert await db.add_chunks.count_documents({"job_id": "jw5"}) == 0


async def test_a_job_is_planned_once_when_its_event_and_a_redrive_meet(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    """The submission event and the reconciliation's re-drive of a new job often arrive
    together: the second waits for the first's plan instead of planning it again."""
    run = scheduler(db, broker, Clock())
    await version(db, "ver-w7")
    await db.jobs.insert_one(
        {
            "_id": "jw7", "team_id": "team-w", "version_id": "ver-w7", "mode": "smoke",
            "run_label": "jw7", "datasets": ["synthetic"], "state": "queued",
            "planned": False, "created_at": T0,
        }
    )  # fmt: skip
    plans = []
    plan = run._plan

    async def counted(job: Document) -> None:
        plans.append(job["_id"])
        await asyncio.sleep(0.3)  # a plan takes a while: the other arrival comes meanwhile
        await plan(job)

    run._plan = counted  # type: ignore[method-assign]
    submitted = JobSubmitted(job_id="jw7")
    await asyncio.gather(run.on_job_submitted(submitted), run.on_job_submitted(submitted))
    assert plans == ["jw7"]
    planned = await job(db, "jw7")
    assert planned["planned"] and planned["state"] == "running"
    # Once planned, a later event re-drives it without a plan.
    await run.on_job_submitted(submitted)
    assert plans == ["jw7"]


# -- the invariant with the scheduler process itself -------------------------------------------


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def participant() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


async def test_the_scheduler_process_fails_what_would_hang(
    mongo_url: str, nats_url: str, participant: str, tmp_path: Path
) -> None:
    """`python -m aml_scheduler` with a short stall setting: a running job nothing moves, and a
    queued job whose dataset files are missing, both end `failed` with their reasons."""
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    db = client["aml_watchdog_process"]
    try:
        await db.versions.insert_one(
            {
                "_id": "ver-p",
                "add_url": f"{participant}/add",
                "search_url": f"{participant}/search",
                "health_url": f"{participant}/health",
                "auth_method": "none",
                "capacity": {"max_concurrency": 1, "max_rps": 10},
            }
        )
        now = datetime.now(UTC)
        await running_job(db, "jp-stuck", "ver-p", {"add": {"done": 1}, "last_us": micros(now)})
        await db.jobs.insert_one(
            {
                "_id": "jp-nodata",
                "team_id": "team-w",
                "version_id": "ver-p",
                "mode": "smoke",
                "run_label": "jp-nodata",
                "datasets": ["locomo"],
                "state": "queued",
                "planned": False,
                "created_at": now,
            }
        )
        env = {
            **os.environ,
            "AML_NATS_URL": nats_url,
            "AML_MONGO_URL": mongo_url,
            "AML_MONGO_DB": "aml_watchdog_process",
            "AML_SECRET_KEYS": SecretBox.new_key(),
            "AML_METRICS_PORT": "0",
            "AML_ALLOW_LOOPBACK_TARGETS": "true",
            "AML_DATASETS_ROOT": str(tmp_path),
            "AML_RECONCILE_INTERVAL_SECONDS": "0.5",
            "AML_JOB_STALL_SECONDS": "3",
            "AML_PARTICIPANT_TIMEOUT_SECONDS": "1",
        }
        log = (tmp_path / "scheduler.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "aml_scheduler"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 60
            states: dict[str, str] = {}
            while time.monotonic() < deadline:
                states = {
                    job["_id"]: job["state"]
                    async for job in db.jobs.find({"_id": {"$in": ["jp-stuck", "jp-nodata"]}})
                }
                if set(states.values()) == {"failed"}:
                    break
                assert proc.poll() is None, (tmp_path / "scheduler.log").read_text()[-3000:]
                await asyncio.sleep(0.3)
            assert states == {"jp-stuck": "failed", "jp-nodata": "failed"}, states
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        stuck = await job(db, "jp-stuck")
        assert stuck["failed_stage"] == "add" and "stage add" in stuck["failure"]
        # Nothing was sent to the participant.
        assert stuck["failure_kind"] == FailureKind.PLATFORM_ERROR
        nodata = await job(db, "jp-nodata")
        assert str(tmp_path / "locomo" / "locomo10.json") in nodata["failure"]
        kinds = [e["kind"] async for e in db.job_errors.find({"job_id": "jp-nodata"})]
        assert kinds == [FailureKind.DATASET_MISSING]
    finally:
        await client.drop_database("aml_watchdog_process")
        await client.close()


async def test_a_job_that_cannot_be_planned_does_not_stay_queued(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    clock = Clock()
    run = scheduler(db, broker, clock)
    # Its version is gone: planning raises every time (LookupError), the job would stay queued.
    await db.jobs.insert_one(
        {
            "_id": "jw6",
            "team_id": "team-w",
            "version_id": "ver-gone",
            "mode": "smoke",
            "run_label": "jw6",
            "datasets": ["synthetic"],
            "state": "queued",
            "planned": False,
            "created_at": T0,
        }
    )
    run._participant_healthy = ScheduleJobs._participant_healthy.__get__(run)  # type: ignore[method-assign]
    clock.at(STALL - 1)
    await run.reconcile()
    assert (await job(db, "jw6"))["state"] == "queued"
    clock.at(STALL + 1)
    await run.reconcile()
    failed = await job(db, "jw6")
    assert failed["state"] == "failed" and failed["failure_kind"] == FailureKind.PLATFORM_ERROR
    assert "could not be planned" in failed["failure"]


async def test_a_job_waiting_out_an_outage_is_not_stalled(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    """R-4.13: while its participant's lane is paused the job is left alone however long it
    sits still (the outage has its own window); the outage's end counts as movement; a pause
    that no call waits for any more is closed a grace after its window, and then the watchdog
    is back."""
    clock = Clock()
    run = scheduler(db, broker, clock)
    await version(db, "ver-w8")
    await running_job(db, "jw8", "ver-w8", {"add": {"done": 2}, "last_us": us(0)})
    window = 10 * STALL
    await Outages(Stores.over(db), clock=lambda: clock().timestamp()).declare(
        "ver-w8", "participant", (T0 + timedelta(seconds=5)).timestamp(), "HTTP 503", window
    )
    for seconds in (STALL + 1, 5 * STALL, window):
        clock.at(seconds)
        await run.reconcile()
        assert (await job(db, "jw8"))["state"] == "running", seconds
    # Resumed, then ended at t = window: the job has moved then.
    pause = await db.lane_pauses.find_one_and_delete({"_id": "ver-w8"})
    assert pause is not None
    await record_outage(Stores.over(db), LanePause.model_validate(pause), us(window) / 1e6, "ended")
    clock.at(window + STALL - 1)
    await run.reconcile()
    assert (await job(db, "jw8"))["state"] == "running"
    clock.at(window + STALL + 1)
    await run.reconcile()
    assert (await job(db, "jw8"))["state"] == "failed"


async def test_an_abandoned_pause_lifts_and_the_watchdog_is_back(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    clock = Clock()
    run = scheduler(db, broker, clock)
    await version(db, "ver-w9")
    await running_job(db, "jw9", "ver-w9", {"add": {"done": 2}, "last_us": us(0)})
    window = 2 * STALL
    await Outages(Stores.over(db), clock=lambda: clock().timestamp()).declare(
        "ver-w9", "participant", T0.timestamp(), "network error: ConnectError", window
    )
    clock.at(window + ABANDONED_GRACE_SECONDS - 1)
    await run.reconcile()
    assert await db.lane_pauses.find_one({"_id": "ver-w9"}) is not None
    assert (await job(db, "jw9"))["state"] == "running"
    clock.at(window + ABANDONED_GRACE_SECONDS + 1)
    await run.reconcile()
    assert await db.lane_pauses.find_one({"_id": "ver-w9"}) is None
    expired = await db.outages.find_one({"key": "ver-w9"})
    assert expired is not None and expired["how"] == "expired"
    # Closed at the grace's end, which counts as movement: stalled one limit later.
    clock.at(window + ABANDONED_GRACE_SECONDS + STALL + 2)
    await run.reconcile()
    assert (await job(db, "jw9"))["state"] == "failed"


async def _queued(db: AsyncDatabase[Document], job_id: str, version_id: str) -> None:
    await version(db, version_id)
    await db.jobs.insert_one(
        {"_id": job_id, "team_id": "team-w", "version_id": version_id, "mode": "smoke",
         "run_label": job_id, "datasets": ["synthetic"], "state": "queued", "planned": False,
         "created_at": T0, "track": "textual"}
    )  # fmt: skip


async def test_a_participant_down_when_its_job_starts_is_waited_for(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    """R-4.13 at the start: Health not answering pauses the participant's lane and keeps the job
    queued (shown as paused, not stalled); it is planned as soon as Health answers, and the
    outage is over."""
    clock = Clock()
    run = scheduler(db, broker, clock)
    run.outages = Outages(Stores.over(db), clock=lambda: clock().timestamp())
    healthy = False

    async def health(job: Document) -> bool:
        return healthy

    run._participant_healthy = health  # type: ignore[method-assign]
    await _queued(db, "jst1", "ver-st1")
    for seconds in (0, STALL + 1, 4 * STALL):
        clock.at(seconds)
        await run.reconcile()
        assert (await job(db, "jst1"))["state"] == "queued", seconds
    pause = await db.lane_pauses.find_one({"_id": "ver-st1"})
    assert pause is not None and pause["paused"] and pause["since"] == T0.timestamp()
    healthy = True
    clock.at(5 * STALL)
    await run.reconcile()
    started = await job(db, "jst1")
    assert started["state"] == "running" and started["planned"]
    assert await db.lane_pauses.find_one({"_id": "ver-st1"}) is None
    (outage,) = await db.outages.find({"key": "ver-st1"}).to_list()
    assert outage["how"] == "ended" and outage["seconds"] == 5 * STALL


async def test_a_participant_down_past_its_window_at_the_start_fails_the_job(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    clock = Clock()
    run = scheduler(db, broker, clock)
    run.outages = Outages(Stores.over(db), clock=lambda: clock().timestamp())

    async def unhealthy(job: Document) -> bool:
        return False

    run._participant_healthy = unhealthy  # type: ignore[method-assign]
    await _queued(db, "jst2", "ver-st2")
    window = run.settings.participant_outage_seconds
    await run.reconcile()  # as the submission's event would, at once
    clock.at(window - 1)
    await run.reconcile()
    assert (await job(db, "jst2"))["state"] == "queued"
    clock.at(window + 1)
    await run.reconcile()
    failed = await job(db, "jst2")
    assert failed["state"] == "failed" and failed["failure_kind"] == FailureKind.PARTICIPANT_OUTAGE
    assert "participant unreachable from 2026-01-01 00:00:00 UTC to " in failed["failure"]
    assert "AML_PARTICIPANT_OUTAGE_SECONDS = 600 s" in failed["failure"]
    assert "Health endpoint did not answer 2xx" in failed["failure"]
    expired = await db.lane_pauses.find_one({"_id": "ver-st2"})
    assert expired is not None and not expired["paused"] and expired["expired_at"]
