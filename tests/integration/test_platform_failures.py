"""A run the platform spoiled is void (R-3.5, R-3.8): when the platform's answer model is down
for a question, the real scheduler completes the job with its results and records the
platform's failure, and the real gateway (on a real nx-27017 and nats-server) shows the job as
not publishable and not charged. Such a smoke qualifies no full run; such a full run uses
neither one of the two full runs of the season nor starts the 30-day wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from faststream.nats import NatsBroker
from gateway_support import Clock, Gateway
from test_gateway_jobs import CHECKLIST, end_job, new_team, refusal, started, submit

from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_pipeline.jobs import record_error
from aml_runtime.broker import JetStreamBus
from aml_runtime.clock import now_us
from aml_runtime.documents import FailureKind
from aml_runtime.stores import Stores
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.integration

SPOILED = "1 question failed by the platform (platform_error)"


def scheduler(db: Any, broker: NatsBroker) -> ScheduleJobs:
    settings = SchedulerSettings()
    # The participant client and the secrets serve planning and release only, not completion.
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


async def answer_model_down(db: Any, run: ScheduleJobs, job_id: str) -> None:
    """What the stages leave when the answer model is down for one of a job's two questions
    (its answer failed `platform_error`, retries exhausted), then the scheduler's completion."""
    await db.jobs.update_one(
        {"_id": job_id},
        {
            "$set": {
                "state": "running",
                "planned": True,
                "started_at": datetime.now(UTC),
                "totals": {"add": 0, "questions": 2},
                "progress.questions_final": 2,
            }
        },
    )
    for i, answered in enumerate((True, False)):
        item = f"{job_id}/synthetic/q{i}"
        question = {"_id": item, "job_id": job_id, "dataset_id": "synthetic",
                    "category_name": "single-hop", "question_id": f"q{i}"}  # fmt: skip
        await db.questions.insert_one(question)
        done = {"_id": item, "job_id": job_id, "state": "done", "at_us": now_us()}
        await db.searches.insert_one(done)
        if answered:
            await db.answers.insert_one(done)
            verdict = {"judge_label": "CORRECT", "judge_labels": ["CORRECT"], "f1": 1.0}
            await db.scores.insert_one(done | verdict)
            continue
        reason = "the answer model did not answer: HTTP 503 (attempts exhausted)"
        kind = FailureKind.PLATFORM_ERROR
        await db.answers.insert_one(done | {"state": "failed", "failure_kind": kind,
                                            "failure": reason})  # fmt: skip
        await record_error(Stores.over(db), job_id, "answer", kind, item, reason)
    await run.complete_if_done(job_id)


async def test_a_run_the_platform_spoiled_is_not_publishable_nor_charged(
    gateway: Gateway, participant: str, clock: Clock, db: Any, broker: NatsBroker
) -> None:
    gw, run = gateway, scheduler(db, broker)
    team = await new_team(gw, participant, "spoiled")

    smoke_1 = await started(gw, team, "spoiled-smoke-1")
    await answer_model_down(db, run, smoke_1)
    status = (await gw.client.get(f"/v1/jobs/{smoke_1}", headers=team.auth)).json()
    assert status["state"] == "completed" and status["platform_failures"] == 1
    assert status["publishable"] is False and status["charged"] is False
    assert status["not_publishable_reason"] == (
        f"{SPOILED}: not publishable; this run is not charged to your quota"
    )
    assert status["state_summary"] == f"completed — not publishable: {SPOILED}; not charged"
    assert [(e["stage"], e["kind"]) for e in status["errors"]] == [("answer", "platform_error")]
    # Not a passed smoke, and free: another smoke may start at once, without the hour's wait.
    reason = refusal(await submit(gw, team, "f-1", mode="full", checklist=CHECKLIST), 422)
    assert f"smoke {smoke_1} completed with items failed by the platform" in reason["reason"]
    smoke_2 = await started(gw, team, "spoiled-smoke-2")
    await end_job(db, smoke_2, "completed", clock())
    clean = (await gw.client.get(f"/v1/jobs/{smoke_2}", headers=team.auth)).json()
    assert (clean["state_summary"], clean["charged"], clean["platform_failures"]) == (
        "completed",
        True,
        0,
    )

    full_1 = await started(gw, team, "f-1", mode="full", checklist=CHECKLIST)
    await answer_model_down(db, run, full_1)
    status = (await gw.client.get(f"/v1/jobs/{full_1}", headers=team.auth)).json()
    assert (status["state"], status["publishable"], status["charged"]) == (
        "completed",
        False,
        False,
    )
    # Its results stay visible, the platform's failure counted as such.
    results = (await gw.client.get(f"/v1/jobs/{full_1}/results", headers=team.auth)).json()
    assert results["overall"]["failures"] == {"platform_error": 1}
    assert results["overall"]["judge_correct"] == 1
    listed = {j["job_id"]: j for j in (await gw.client.get("/v1/jobs", headers=team.auth)).json()}
    assert listed[full_1]["charged"] is False and listed[smoke_2]["charged"] is True

    # The next full run at once; the 30-day wait counts from it, and after that the team still
    # has its second full run: the spoiled one used neither.
    full_2 = await started(gw, team, "f-2", mode="full", checklist=CHECKLIST)
    await end_job(db, full_2, "completed", clock())
    detail = refusal(await submit(gw, team, "f-3", mode="full", checklist=CHECKLIST), 429)
    assert full_2 in detail["reason"]
    assert datetime.fromisoformat(detail["next_allowed_at"]) == clock() + timedelta(days=30)
    clock.advance(timedelta(days=30))
    await started(gw, team, "f-3", mode="full", checklist=CHECKLIST)
