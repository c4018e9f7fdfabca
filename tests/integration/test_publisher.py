"""The publisher on a real nats-server with JetStream and the nx-27017 MongoDB wire server: every
finished job is gated once, from the `aml.jobs.finished` event the scheduler publishes; a
redelivered or replayed event never changes a stored outcome (nor an admin's decision since)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract import subjects
from aml_contract.api.publication import ReleaseBaseline
from aml_contract.messages import JobFinished
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_pipeline.jobs import publish_finished, record_error
from aml_pipeline.progress import ItemStage, count_final
from aml_publisher.handlers import GateFinishedJobs
from aml_publisher.main import DURABLE
from aml_publisher.settings import PublisherSettings
from aml_runtime.broker import JetStreamBus, publish
from aml_runtime.clock import now_us
from aml_runtime.db import Document
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

DB = "aml_publisher_it"
BASELINE = ReleaseBaseline(
    answer_model="gpt-4o-mini",
    spec_hash="spec-1",
    code_hash="code-1",
    dataset_bundle_hash="bundle-1",
    question_counts={"synthetic": 3},
)
QUESTIONS = 3
CHUNKS = 2


def results(job_id: str, f1: float) -> Document:
    """Aggregated as the scheduler does it; `f1` makes one job's numbers differ from another's."""
    outcomes = [
        QuestionOutcome(
            question_id=f"s1:q{i}",
            dataset_id="synthetic",
            category_name="facts" if i else "adversarial",
            scored=True,
            judge_label="CORRECT",
            judge_labels=["CORRECT"],
            f1=f1,
            bleu1=f1,
        )
        for i in range(QUESTIONS)
    ]
    excluded = {"synthetic": ["adversarial"]}
    return aggregate(job_id, "completed", outcomes, excluded).model_dump(mode="json")


async def insert_job(
    db: AsyncDatabase[Document],
    job_id: str,
    *,
    mode: str = "full",
    version_id: str = "ver-1",
    f1: float = 0.5,
    failed: bool = False,
    **fields: Any,
) -> None:
    """A finished job as the gateway and the scheduler write it, with its stage documents and
    their counters; a `failed` one lost a search to an outage and was failed by a contract
    violation."""
    item = f"{job_id}/synthetic/s1:q"
    await db.jobs.insert_one(
        {
            "_id": job_id,
            "team_id": "team-1",
            "version_id": version_id,
            "mode": mode,
            "track": "textual",
            "run_label": f"label-{job_id}",
            "datasets": ["synthetic"],
            "state": "failed" if failed else "completed",
            "planned": True,
            "spec": {"spec_hash": "spec-1", "answer_model": "gpt-4o-mini", "top_k": "100"},
            "spec_hash": "spec-1",
            "code_hash": "code-1",
            "dataset_bundles": {"synthetic": "b-synthetic"},
            "dataset_bundle_hash": "bundle-1",
            "totals": {"add": CHUNKS, "questions": QUESTIONS},
            **({"failure": "search s1:q2: contract violation"} if failed else {}),
            **({} if failed else {"results": results(job_id, f1)}),
            **fields,
        }
    )
    at_us = now_us()
    chunks = [
        {"_id": f"{job_id}/a{i}", "job_id": job_id, "state": "done", "at_us": at_us}
        for i in range(CHUNKS)
    ]
    await db.add_chunks.insert_many(chunks)
    for _ in chunks:
        await count_final(Stores.over(db), job_id, "add", "done", at_us)
    stages: dict[ItemStage, str] = {"search": "searches", "answer": "answers", "score": "scores"}
    for stage, collection in stages.items():
        last = QUESTIONS - 1 if failed else QUESTIONS
        docs = [
            {"_id": f"{item}{i}", "job_id": job_id, "state": "done", "at_us": at_us}
            for i in range(last)
        ]
        if failed and stage == "search":
            docs.append(
                {"_id": f"{item}{last}", "job_id": job_id, "state": "failed", "at_us": at_us}
            )
        if docs:
            await db[collection].insert_many(docs)
        # Counted on the job as the stage workers count them (the gate reads the counters).
        for doc in docs:
            await count_final(Stores.over(db), job_id, stage, doc["state"], at_us)
    if failed:
        await record_error(
            Stores.over(db), job_id, "search", "contract_error", f"{item}2", "bad body"
        )


@pytest.fixture(scope="module")
async def db(mongo_url: str) -> AsyncIterator[AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    yield client[DB]
    await client.close()


class PublisherProcess:
    """`python -m aml_publisher`, configured through AML_* variables as in production."""

    def __init__(self, nats_url: str, mongo_url: str, log: Path) -> None:
        self.env = {
            **os.environ,
            "AML_NATS_URL": nats_url,
            "AML_MONGO_URL": mongo_url,
            "AML_MONGO_DB": DB,
            "AML_RELEASE_BASELINE": BASELINE.model_dump_json(),
            # Only the event path gates here; the reconciliation is tested on its own.
            "AML_RECONCILE_INTERVAL_SECONDS": "3600",
            "AML_REDELIVERY_DELAY_SECONDS": "0.1",
            # No metrics port: the fixed default could be taken on a shared test machine
            # (the endpoint itself is tested in test_metrics.py).
            "AML_METRICS_PORT": "0",
        }
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "aml_publisher"],
                env=self.env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None


@pytest.fixture(scope="module")
def publisher(
    nats_url: str, mongo_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PublisherProcess]:
    process = PublisherProcess(nats_url, mongo_url, tmp_path_factory.mktemp("pub") / "pub.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


async def gate_of(db: AsyncDatabase[Document], job_id: str, timeout: float = 30.0) -> Document:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        job = await db.jobs.find_one({"_id": job_id})
        if job is not None and job.get("gate") is not None:
            return job
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job_id} was not gated within {timeout}s")


async def caught_up(broker: NatsBroker, timeout: float = 30.0) -> None:
    """Until the publisher has acknowledged everything in AML_FINISHED."""
    js = broker.connection.jetstream()
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        last = (await js.stream_info(subjects.FINISHED_STREAM)).state.last_seq
        try:
            info = await js.consumer_info(subjects.FINISHED_STREAM, DURABLE)
        except Exception:
            info = None
        if info is not None and info.ack_floor is not None:
            done = info.ack_floor.stream_seq == last and not info.num_ack_pending
            if done and not info.num_pending:
                return
        await asyncio.sleep(0.1)
    raise AssertionError("the publisher did not acknowledge every aml.jobs.finished message")


def failing(job: Document) -> dict[str, str]:
    return {c["name"]: c["reason"] for c in job["gate"]["checks"] if not c["passed"]}


async def test_finished_jobs_are_gated_once(
    db: AsyncDatabase[Document], broker: NatsBroker, publisher: PublisherProcess
) -> None:
    # Already published: job `jpub` (version ver-0) with its leaderboard entry; `jcopy` reports
    # exactly its numbers under another version.
    await insert_job(db, "jpub", version_id="ver-0", f1=0.9, review_state="approved")
    await db.leaderboard.insert_one({"_id": "lb-1", "job_id": "jpub", "disqualified": False})
    await insert_job(db, "jfull", f1=0.5)
    await insert_job(db, "jsmoke", mode="smoke", f1=0.6)
    await insert_job(db, "jcopy", version_id="ver-2", f1=0.9)
    await insert_job(db, "jfailed", version_id="ver-3", failed=True)
    for job_id in ("jfull", "jsmoke", "jcopy"):
        await publish_finished(JetStreamBus(broker), job_id, "completed")
    await publish_finished(JetStreamBus(broker), "jfailed", "failed")

    full = await gate_of(db, "jfull")
    assert full["review_state"] == "pending_review"
    assert full["gate"]["passed"] is True
    assert [c["name"] for c in full["gate"]["checks"]] == [
        "mode_full",
        "all_items_succeeded",
        "answer_model",
        "spec_hash",
        "code_hash",
        "dataset_bundle_hash",
        "question_counts",
        "not_duplicate",
    ]
    assert failing(full) == {}

    smoke = await gate_of(db, "jsmoke")
    assert smoke["review_state"] == "gate_failed" and smoke["gate"]["passed"] is False
    assert failing(smoke) == {
        "mode_full": "mode is 'smoke', not 'full': only full runs are published"
    }

    copy = await gate_of(db, "jcopy")
    assert copy["review_state"] == "gate_failed"
    assert list(failing(copy)) == ["not_duplicate"]
    assert "equals that of published entry lb-1" in failing(copy)["not_duplicate"]

    failed = await gate_of(db, "jfailed")
    assert failed["review_state"] == "gate_failed"
    assert failing(failed)["all_items_succeeded"] == (
        "job state is 'failed', not 'completed' (search s1:q2: contract violation); "
        "search: 2 of 3 done, 1 failed; answer: 2 of 3 done, 0 failed; "
        "score: 2 of 3 done, 0 failed; 1 entries in the error summary"
    )
    assert set(failing(failed)) == {"all_items_succeeded", "question_counts", "not_duplicate"}
    await caught_up(broker)

    # Redelivery: the same event again, under a new message id (the broker drops a repeated
    # one), after an admin approved `jfull` meanwhile.
    await db.jobs.update_one({"_id": "jfull"}, {"$set": {"review_state": "approved"}})
    stored = {job_id: (await gate_of(db, job_id))["gate"] for job_id in ("jfull", "jsmoke")}
    for job_id in ("jfull", "jsmoke"):
        event = JobFinished(job_id=job_id, state="completed")
        await publish(
            JetStreamBus(broker), subjects.JOB_FINISHED, event, f"finished:{job_id}:again"
        )
    await caught_up(broker)

    # Replay: a new durable consumer reads the limits stream from its first message.
    publisher.stop()
    await broker.connection.jetstream().delete_consumer(subjects.FINISHED_STREAM, DURABLE)
    publisher.start()
    await caught_up(broker)

    for job_id, gate in stored.items():
        job = await gate_of(db, job_id)
        assert job["gate"] == gate
    assert (await gate_of(db, "jfull"))["review_state"] == "approved"
    assert (await gate_of(db, "jsmoke"))["review_state"] == "gate_failed"
    # The published job itself finished before the publisher ran and got no event: untouched.
    assert (await db.jobs.find_one({"_id": "jpub"}) or {}).get("gate") is None


async def test_concurrent_gates_store_one_outcome(db: AsyncDatabase[Document]) -> None:
    await insert_job(db, "jrace", version_id="ver-race", f1=0.31)
    replicas = [
        GateFinishedJobs(PublisherSettings(release_baseline=BASELINE), Stores.over(db))
        for _ in range(4)
    ]
    stored = await asyncio.gather(*(p.gate_job("jrace") for p in replicas))
    assert sorted(stored) == [False, False, False, True]
    job = await gate_of(db, "jrace")
    assert job["review_state"] == "pending_review"
    assert not await replicas[0].gate_job("jrace")


async def test_reconciliation_gates_what_no_event_announced(db: AsyncDatabase[Document]) -> None:
    await insert_job(db, "jsilent", version_id="ver-silent", f1=0.41)
    await db.jobs.insert_one({"_id": "jrunning", "state": "running", "mode": "full"})
    publisher = GateFinishedJobs(PublisherSettings(release_baseline=None), Stores.over(db))
    await publisher.reconcile()
    job = await gate_of(db, "jsilent")
    assert job["review_state"] == "gate_failed"
    assert set(failing(job)) == {
        "answer_model",
        "spec_hash",
        "code_hash",
        "dataset_bundle_hash",
        "question_counts",
    }
    assert set(failing(job).values()) == {"no release baseline configured"}
    assert (await db.jobs.find_one({"_id": "jrunning"}) or {}).get("gate") is None
