"""The publisher's handler against in-memory stores, fed through FastStream's in-memory NATS
broker: what it records for a job the scheduler completed, that an outcome or an admin's review
state already stored stands, and which published entries a new job is compared against (approved
jobs whose entry is not written yet; facts an entry does not record taken from its job)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from fake_stores import MemoryStores, memory_stores
from fakes import Document, TestBrokerBus
from faststream.nats import JStream, NatsBroker, TestNatsBroker

from aml_contract import subjects
from aml_contract.api.publication import ReleaseBaseline
from aml_contract.messages import JobFinished
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.jobs import publish_finished
from aml_publisher.gate import CHECK_NAMES
from aml_publisher.handlers import GateFinishedJobs
from aml_publisher.settings import PublisherSettings
from aml_runtime.broker import publish
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

QUESTIONS = 3
BASELINE = ReleaseBaseline(
    answer_model="answer-model",
    spec_hash="spec-1",
    code_hash="code-1",
    dataset_bundle_hash="bundle-1",
    question_counts={"synthetic": QUESTIONS},
)


@dataclass
class Rig:
    stores: MemoryStores
    broker: NatsBroker
    publisher: GateFinishedJobs


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """The publisher's subscriber wired as in `aml_publisher.main` (minus the delivery budget)."""
    stores = memory_stores()
    broker = NatsBroker(logger=None)
    publisher = GateFinishedJobs(PublisherSettings(release_baseline=BASELINE), stores.typed())

    finished = JStream(subjects.FINISHED_STREAM, declare=False)

    @broker.subscriber(subjects.JOB_FINISHED, stream=finished)
    async def on_job_finished(event: JobFinished) -> None:
        await publisher.on_job_finished(event)

    async with TestNatsBroker(broker):
        yield Rig(stores, broker, publisher)


def results(job_id: str, f1: float) -> Document:
    outcomes = [
        QuestionOutcome(
            question_id=f"q{i}",
            dataset_id="synthetic",
            category_name="facts",
            scored=True,
            judge_label="CORRECT",
            judge_labels=["CORRECT"],
            f1=f1,
            bleu1=f1,
        )
        for i in range(QUESTIONS)
    ]
    return aggregate(job_id, "completed", outcomes, {}).model_dump(mode="json")


def job(job_id: str, *, state: str = "completed", f1: float = 0.5, **fields: Any) -> Document:
    """A job as the gateway and the scheduler leave it: publishable against `BASELINE` unless
    `fields` say otherwise."""
    done = {"done": QUESTIONS}
    return {
        "_id": job_id,
        "state": state,
        "planned": True,
        "mode": "full",
        "version_id": "ver-1",
        "track": "textual",
        "team_id": "team-1",
        "run_label": f"label-{job_id}",
        "datasets": ["synthetic"],
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "spec": {"answer_model": BASELINE.answer_model},
        "spec_hash": BASELINE.spec_hash,
        "code_hash": BASELINE.code_hash,
        "dataset_bundle_hash": BASELINE.dataset_bundle_hash,
        "totals": {"add": 2, "questions": QUESTIONS},
        "progress": {
            "add": {"done": 2},
            "search": done,
            "answer": done,
            "score": done,
            "questions_final": QUESTIONS,
        },
        **({"results": results(job_id, f1)} if state == "completed" else {}),
        **fields,
    }


def failing(stored: Document) -> dict[str, str]:
    return {c["name"]: c["reason"] for c in stored["gate"]["checks"] if not c["passed"]}


async def test_a_job_the_scheduler_completes_is_gated_once(rig: Rig) -> None:
    # Running, every question final, with the stage documents the completion recounts.
    rig.stores.jobs.jobs["j1"] = job("j1", state="running")
    for i in range(2):
        rig.stores.plans.chunks[f"a{i}"] = {"_id": f"a{i}", "job_id": "j1", "state": "done"}
    for i in range(QUESTIONS):
        item = f"j1/synthetic/q{i}"
        rig.stores.plans.questions[item] = {
            "_id": item,
            "job_id": "j1",
            "question_id": f"q{i}",
            "dataset_id": "synthetic",
            "category_name": "facts",
        }
        for records in (rig.stores.records.searches, rig.stores.records.answers):
            records[item] = {"_id": item, "job_id": "j1", "state": "done"}
        rig.stores.records.scores[item] = {
            "_id": item,
            "job_id": "j1",
            "state": "done",
            "category_name": "facts",
            "judge_label": "CORRECT",
            "judge_labels": ["CORRECT"],
            "f1": 1.0,
            "bleu1": 1.0,
        }
    settings = SchedulerSettings()
    unused = cast(Any, None)
    evaluation_spec = build_evaluation_spec(settings)
    scheduler = ScheduleJobs(
        settings,
        rig.stores.typed(),
        TestBrokerBus(rig.broker),
        unused,
        unused,
        evaluation_spec,
        # The build the job was submitted under: the completion records it on the job.
        BASELINE.code_hash,
    )

    await scheduler.complete_if_done("j1")
    stored = rig.stores.jobs.jobs["j1"]
    assert stored["state"] == "completed"
    assert stored["review_state"] == "pending_review"
    assert stored["gate"]["passed"] is True
    assert [c["name"] for c in stored["gate"]["checks"]] == list(CHECK_NAMES)
    assert failing(stored) == {}

    # Redelivered, or replayed by a new consumer: the stored outcome stands.
    gate = stored["gate"]
    again = JobFinished(job_id="j1", state="completed")
    await publish(TestBrokerBus(rig.broker), subjects.JOB_FINISHED, again, "finished:j1:again")
    assert rig.stores.jobs.jobs["j1"]["gate"] == gate


async def test_a_review_state_set_before_the_gate_stands(rig: Rig) -> None:
    rig.stores.jobs.jobs["j1"] = job("j1", mode="smoke", review_state="disqualified")
    await publish_finished(TestBrokerBus(rig.broker), "j1", "completed")
    stored = rig.stores.jobs.jobs["j1"]
    assert list(failing(stored)) == ["mode_full"]
    assert stored["review_state"] == "disqualified"


async def test_an_approved_job_counts_as_published_before_its_entry_exists(rig: Rig) -> None:
    rig.stores.jobs.jobs["jpub"] = job("jpub", f1=0.9, review_state="approved")
    rig.stores.jobs.jobs["jlisted"] = job("jlisted", f1=0.8, track="other", review_state="approved")
    rig.stores.leaderboard.leaderboard["lb-1"] = {"_id": "lb-1", "job_id": "jlisted"}
    rig.stores.jobs.jobs["j1"] = job("j1", f1=0.5)
    await publish_finished(TestBrokerBus(rig.broker), "j1", "completed")
    assert failing(rig.stores.jobs.jobs["j1"]) == {
        "not_duplicate": "version ver-1 on track textual is already published (entry job:jpub)"
    }

    # Same results as the listed job: named once, by its entry.
    rig.stores.jobs.jobs["j2"] = job("j2", f1=0.8, version_id="ver-2")
    await publish_finished(TestBrokerBus(rig.broker), "j2", "completed")
    reason = failing(rig.stores.jobs.jobs["j2"])["not_duplicate"]
    assert "published entry lb-1" in reason and "job:jlisted" not in reason


async def test_an_entry_takes_what_it_does_not_record_from_its_job(rig: Rig) -> None:
    # Disqualified on its job only; its results identical to the new job's.
    rig.stores.jobs.jobs["jold"] = job("jold", f1=0.5, disqualified=True)
    rig.stores.leaderboard.leaderboard["lb-old"] = {"_id": "lb-old", "job_id": "jold"}
    rig.stores.jobs.jobs["j1"] = job("j1", f1=0.5)
    await publish_finished(TestBrokerBus(rig.broker), "j1", "completed")
    reason = failing(rig.stores.jobs.jobs["j1"])["not_duplicate"]
    # A disqualified entry frees its version and track, but copied results stay copies.
    assert "already published" not in reason
    assert reason.endswith("equals that of disqualified published entry lb-old")


@pytest.mark.parametrize("stored", [None, "running", "queued"])
async def test_only_a_finished_job_is_gated(rig: Rig, stored: str | None) -> None:
    if stored is not None:
        rig.stores.jobs.jobs["j1"] = job("j1", state=stored)
    await publish_finished(TestBrokerBus(rig.broker), "j1", "completed")
    assert await rig.publisher.gate_job("j1") is False
    assert "gate" not in rig.stores.jobs.jobs.get("j1", {})
    assert "review_state" not in rig.stores.jobs.jobs.get("j1", {})


async def test_of_two_concurrent_gates_one_outcome_is_stored(rig: Rig) -> None:
    rig.stores.jobs.jobs["j1"] = job("j1")
    stored = await asyncio.gather(rig.publisher.gate_job("j1"), rig.publisher.gate_job("j1"))
    assert sorted(stored) == [False, True]
    gate = dict(rig.stores.jobs.jobs["j1"]["gate"])
    assert await rig.publisher.gate_job("j1") is False
    assert rig.stores.jobs.jobs["j1"]["gate"] == gate
