"""A team's journey through the gateway's job API, with the quota and conflict rules at their
boundaries (R-3.3 - R-3.7, R-5.2, R-7.3, R-7.4): the real gateway app on a real nx-27017 and
nats-server, its clock moved by the test.

No pipeline runs here: where a job must end, the test writes what the scheduler writes when a
job ends (state, end time, failure kind, results). tests/integration/test_pipeline.py runs the
same journey with every service and the local model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from gateway_support import ADMIN, T0, Clock, Gateway, open_gateway, record_calls, request_body

from aml_contract.api.vocabulary import JobState
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_gateway.refusals import ECHO_MAX
from aml_gateway.submissions import QuotaPolicy, Season
from aml_runtime.db import Document

pytestmark = pytest.mark.integration

CHECKLIST = {
    "smoke_passed": True,
    "api_contract_correct": True,
    "run_instructions_complete": True,
    "originality_disclosed": True,
    "integrity_pledge": True,
}


@dataclass
class Team:
    key: str
    team_id: str
    version_id: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


async def new_team(gw: Gateway, participant: str, name: str, **changes: Any) -> Team:
    """Access request → admin approval → the key, shown once."""
    created = await gw.client.post(
        "/v1/access-requests", json=request_body(participant, system_name=name, **changes)
    )
    assert created.status_code == 201, created.text
    approved = await gw.client.post(
        f"/v1/admin/access-requests/{created.json()['id']}/approve", headers=ADMIN
    )
    assert approved.status_code == 200, approved.text
    grant = approved.json()
    return Team(grant["leaderboard_api_key"], grant["team_id"], grant["version_id"])


async def submit(gw: Gateway, team: Team, label: str, **fields: Any) -> httpx.Response:
    body = {"version_id": team.version_id, "run_label": label, **fields}
    return await gw.client.post("/v1/jobs", json=body, headers=team.auth)


async def started(gw: Gateway, team: Team, label: str, **fields: Any) -> str:
    response = await submit(gw, team, label, **fields)
    assert response.status_code == 201, response.text
    job_id: str = response.json()["job_id"]
    return job_id


async def end_job(
    db: Any, job_id: str, state: JobState, at: datetime, failure_kind: str | None = None
) -> None:
    """What the scheduler writes when a job ends (see aml_scheduler.handlers)."""
    fields: Document = {"state": state, "finished_at": at}
    if state == "completed":
        outcomes = [
            QuestionOutcome(
                dataset_id="synthetic", category_name=c, scored=True, judge_label=label, f1=f1
            )
            for c, label, f1 in (("single-hop", "CORRECT", 1.0), ("multi-hop", "WRONG", 0.5))
        ]
        fields["results"] = aggregate(job_id, "completed", outcomes, {}).model_dump(mode="json")
    else:
        fields |= {"failure_kind": failure_kind, "failure": "stopped", "failed_stage": "add"}
    await db.jobs.update_one({"_id": job_id}, {"$set": fields})


def refusal(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    detail: dict[str, Any] = response.json()["detail"]
    assert detail["reason"]
    return detail


async def test_one_team_from_access_request_to_full_results(
    gateway: Gateway, participant: str, clock: Clock, db: Any
) -> None:
    gw = gateway
    team = await new_team(gw, participant, "journey")
    versions = (await gw.client.get("/v1/versions", headers=team.auth)).json()
    assert [v["version_id"] for v in versions] == [team.version_id]
    assert versions[0]["tracks"] == ["textual"] and versions[0]["has_memory_system_key"]

    # A full run first: the checklist, then a passed smoke of this version and track.
    assert "checklist" in refusal(await submit(gw, team, "f0", mode="full"), 422)["reason"]
    partial = {**CHECKLIST, "integrity_pledge": False, "originality_disclosed": False}
    reason = refusal(await submit(gw, team, "f0", mode="full", checklist=partial), 422)["reason"]
    assert "originality_disclosed, integrity_pledge" in reason
    reason = refusal(await submit(gw, team, "f0", mode="full", checklist=CHECKLIST), 422)["reason"]
    assert "no passed smoke" in reason
    # Tracks the version was not registered for, and a chosen dataset list for a full run.
    assert "coding" in refusal(await submit(gw, team, "s0", track="coding"), 422)["reason"]
    fixed = await submit(gw, team, "f0", mode="full", checklist=CHECKLIST, datasets=["locomo"])
    assert "fixed suite" in refusal(fixed, 422)["reason"]

    # Smoke 1; a second for the same version and track while it runs is a conflict.
    smoke_1 = await started(gw, team, "smoke-1")
    status = (await gw.client.get(f"/v1/jobs/{smoke_1}", headers=team.auth)).json()
    assert status["state"] == "queued" and status["datasets"] == ["synthetic"]
    assert smoke_1 in refusal(await submit(gw, team, "smoke-2"), 409)["reason"]
    await end_job(db, smoke_1, "completed", T0 + timedelta(minutes=5))

    # One smoke per hour, counted from the first one's submission.
    clock.advance(timedelta(minutes=59, seconds=59))
    early = await submit(gw, team, "smoke-2")
    detail = refusal(early, 429)
    assert datetime.fromisoformat(detail["next_allowed_at"]) == T0 + timedelta(hours=1)
    assert early.headers["Retry-After"] == "1"
    clock.advance(timedelta(seconds=1))
    smoke_2 = await started(gw, team, "smoke-2")
    # Failed by the platform itself: does not count, so another may start at once.
    await end_job(db, smoke_2, "failed", clock() + timedelta(minutes=1), "platform_error")
    clock.advance(timedelta(minutes=2))
    smoke_3 = await started(gw, team, "smoke-3")
    await end_job(db, smoke_3, "failed", clock() + timedelta(minutes=1), "contract_error")
    clock.advance(timedelta(minutes=2))
    refusal(await submit(gw, team, "smoke-4"), 429)  # smoke-3 counted: the participant's fault

    # The full run: the passed smoke-1 qualifies it.
    full_1 = await started(gw, team, "full-1", mode="full", checklist=CHECKLIST)
    status = (await gw.client.get(f"/v1/jobs/{full_1}", headers=team.auth)).json()
    assert status["mode"] == "full" and status["datasets"] == ["locomo_refined"]
    running = await submit(gw, team, "full-2", mode="full", checklist=CHECKLIST)
    assert full_1 in refusal(running, 409)["reason"]
    completed_at = clock() + timedelta(days=2)
    await end_job(db, full_1, "completed", completed_at)

    # The second full run exactly 30 days after the first completed, not a second earlier.
    clock.at = completed_at + timedelta(days=30) - timedelta(seconds=1)
    detail = refusal(await submit(gw, team, "full-2", mode="full", checklist=CHECKLIST), 429)
    assert datetime.fromisoformat(detail["next_allowed_at"]) == completed_at + timedelta(days=30)
    clock.advance(timedelta(seconds=1))
    full_2 = await started(gw, team, "full-2", mode="full", checklist=CHECKLIST)
    await end_job(db, full_2, "completed", clock() + timedelta(days=1))
    clock.advance(timedelta(days=60))
    detail = refusal(await submit(gw, team, "full-3", mode="full", checklist=CHECKLIST), 429)
    assert "2 full runs" in detail["reason"] and detail["next_allowed_at"] is None

    # A Run Label is unique per key for ever.
    assert "'smoke-1'" in refusal(await submit(gw, team, "smoke-1"), 409)["reason"]

    # Results and the job list.
    results = await gw.client.get(f"/v1/jobs/{full_1}/results", headers=team.auth)
    assert results.status_code == 200, results.text
    body = results.json()
    assert body["overall"]["questions"] == 2 and body["overall"]["judge_correct"] == 1
    assert set(body["datasets"]["synthetic"]["categories"]) == {"single-hop", "multi-hop"}
    listed = (await gw.client.get("/v1/jobs", headers=team.auth)).json()
    assert {j["job_id"] for j in listed} == {smoke_1, smoke_2, smoke_3, full_1, full_2}


async def test_auth_none_is_for_smoke_runs_only(gateway: Gateway, participant: str) -> None:
    team = await new_team(
        gateway, participant, "open-door", auth_method="none", memory_system_key=None
    )
    reason = refusal(await submit(gateway, team, "f", mode="full", checklist=CHECKLIST), 422)[
        "reason"
    ]
    assert "none" in reason
    await started(gateway, team, "s")


async def test_concurrent_submissions_of_one_team_start_one_job(
    gateway: Gateway, participant: str
) -> None:
    team = await new_team(gateway, participant, "racer")
    responses = await asyncio.gather(*(submit(gateway, team, f"race-{i}") for i in range(6)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(201) == 1, [r.text for r in responses]
    assert all(s in (409, 429) for s in statuses if s != 201)
    assert len((await gateway.client.get("/v1/jobs", headers=team.auth)).json()) == 1


async def test_audit_records_are_paginated_and_filtered(
    gateway: Gateway, participant: str, db: Any
) -> None:
    team = await new_team(gateway, participant, "audited")
    job_id = await started(gateway, team, "audit-1")
    # Written by the same recorder the adder and searcher use.
    calls = [("add", "r1", [503, 200]), ("add", "r2", [200]), ("search", "q1", [500, 500, 200])]
    await record_calls(db, job_id, calls)
    await db.searches.insert_one(
        {"_id": "q1", "job_id": job_id, "state": "done", "leaks": 0,
         "candidates": [{"id": "m2", "content": "b"}, {"id": "m1", "content": "a"}]}
    )  # fmt: skip

    url = f"/v1/jobs/{job_id}/audit"
    pages: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await gateway.client.get(url, params=params, headers=team.auth)).json()
        pages.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    records = [r for page in pages for r in page["records"]]
    assert [len(p["records"]) for p in pages] == [2, 2, 2]
    assert [(r["item_id"], r["attempt"], r["status"]) for r in records] == [
        ("r1", 1, 503), ("r1", 2, 200), ("r2", 1, 200),
        ("q1", 1, 500), ("q1", 2, 500), ("q1", 3, 200),
    ]  # fmt: skip
    # Only an Add has a contract request_id; a Search's item is its question.
    assert [r["request_id"] for r in records] == ["r1", "r1", "r2", None, None, None]
    assert [r["validation"] for r in records if r["status"] == 200] == ["valid"] * 3

    search = await gateway.client.get(url, params={"stage": "search"}, headers=team.auth)
    assert [r["attempt"] for r in search.json()["records"]] == [1, 2, 3]
    one = await gateway.client.get(url, params={"item_id": "r1"}, headers=team.auth)
    assert [r["status"] for r in one.json()["records"]] == [503, 200]
    assert one.json()["next_cursor"] is None
    question = await gateway.client.get(url, params={"item_id": "q1"}, headers=team.auth)
    assert [r["status"] for r in question.json()["records"]] == [500, 500, 200]
    # `request_id`, the filter's older name, still finds an Add, and only an Add.
    for request_id, statuses in (("r1", [503, 200]), ("q1", [])):
        alias = await gateway.client.get(url, params={"request_id": request_id}, headers=team.auth)
        assert [r["status"] for r in alias.json()["records"]] == statuses
    refusal(await gateway.client.get(url, params={"stage": "answer"}, headers=team.auth), 422)
    refusal(await gateway.client.get(url, params={"cursor": "zz"}, headers=team.auth), 422)

    candidates = await gateway.client.get(f"{url}/searches/q1", headers=team.auth)
    assert candidates.json()["item_id"] == "q1"
    assert [c["id"] for c in candidates.json()["candidates"]] == ["m2", "m1"]
    refusal(await gateway.client.get(f"{url}/searches/q9", headers=team.auth), 404)


async def test_audit_records_written_before_item_id_are_read(
    gateway: Gateway, participant: str, db: Any
) -> None:
    """Records of a database written before the rename name the work item `request_id`, for
    an Add and for a Search alike."""
    team = await new_team(gateway, participant, "legacy")
    job_id = await started(gateway, team, "legacy-1")
    await db.calls.insert_many(
        [
            {"job_id": job_id, "stage": stage, "request_id": item, "delivery": 1,
             "operation": stage, "attempt": 1, "started_at": datetime.now(UTC),
             "latency_ms": 3.0, "status": 200, "error_class": None, "outcome": "ok"}
            for stage, item in (("add", "r1"), ("search", "q1"))
        ]
    )  # fmt: skip
    url = f"/v1/jobs/{job_id}/audit"
    records = (await gateway.client.get(url, headers=team.auth)).json()["records"]
    assert [(r["item_id"], r["request_id"]) for r in records] == [("r1", "r1"), ("q1", None)]
    for params, items in (
        ({"item_id": "q1"}, ["q1"]),
        ({"item_id": "r1"}, ["r1"]),
        ({"request_id": "r1"}, ["r1"]),
        ({"request_id": "q1"}, []),
    ):
        found = (await gateway.client.get(url, params=params, headers=team.auth)).json()
        assert [r["item_id"] for r in found["records"]] == items, params


async def test_another_team_sees_nothing_of_the_first(
    gateway: Gateway, participant: str, db: Any
) -> None:
    a = await new_team(gateway, participant, "team-a")
    b = await new_team(gateway, participant, "team-b")
    job_a = await started(gateway, a, "a-1")
    await end_job(db, job_a, "completed", T0)
    # What the owner gets (the job has no search q1, so that one is 404 for everybody).
    for path, owner_status in (
        (f"/v1/jobs/{job_a}", 200),
        (f"/v1/jobs/{job_a}/results", 200),
        (f"/v1/jobs/{job_a}/audit", 200),
        (f"/v1/jobs/{job_a}/audit/searches/q1", 404),
        (f"/v1/versions/{a.version_id}", 200),
    ):
        assert (await gateway.client.get(path, headers=a.auth)).status_code == owner_status, path
        response = await gateway.client.get(path, headers=b.auth)
        # Answered like a resource that does not exist: existence is not revealed.
        assert response.status_code == 404, path
        assert response.json()["detail"]["reason"].endswith("not found"), path
    assert (
        await gateway.client.get(f"/v1/jobs/{job_a}/results", headers=a.auth)
    ).status_code == 200
    refusal(await submit(gateway, Team(b.key, b.team_id, a.version_id), "b-1"), 404)
    assert [
        v["version_id"] for v in (await gateway.client.get("/v1/versions", headers=b.auth)).json()
    ] == [b.version_id]
    assert (await gateway.client.get("/v1/jobs", headers=b.auth)).json() == []
    # A's label does not block B (labels are unique per key).
    await started(gateway, b, "a-1")
    # Participant keys open no admin endpoint.
    for method, path in (
        ("GET", "/v1/admin/access-requests"),
        ("POST", "/v1/admin/access-requests/acc-x/approve"),
        ("POST", "/v1/admin/versions"),
    ):
        response = await gateway.client.request(method, path, headers=a.auth, json={})
        assert response.status_code == 403, (method, path)


async def test_an_id_from_the_path_comes_back_bounded(gateway: Gateway, participant: str) -> None:
    # A reason names the id asked for by its start: a 5,000-character path is not echoed whole.
    team = await new_team(gateway, participant, "long-ids")
    long_id = ("j-" + "0123456789" * 500)[:5000]
    start = long_id[:ECHO_MAX] + "…"
    later = {"keep_until": (T0 + timedelta(days=3650)).isoformat(), "reason": "appeal"}
    for method, path, headers, body, reason in (
        ("GET", f"/v1/jobs/{long_id}", team.auth, None, f"job {start} not found"),
        ("GET", f"/v1/jobs/{long_id}/results", team.auth, None, f"job {start} not found"),
        ("GET", f"/v1/versions/{long_id}", team.auth, None, f"version {start} not found"),
        (
            "POST",
            f"/v1/admin/access-requests/{long_id}/approve",
            ADMIN,
            None,
            f"access request {start} not found",
        ),
        ("POST", f"/v1/admin/reviews/{long_id}/approve", ADMIN, None, f"job {start} not found"),
        (
            "POST",
            f"/v1/admin/leaderboard/{long_id}/disqualify",
            ADMIN,
            {"reason": "cheating"},
            f"leaderboard entry {start} not found",
        ),
        ("POST", f"/v1/admin/jobs/{long_id}/retention", ADMIN, later, f"job {start} not found"),
    ):
        response = await gateway.client.request(method, path, headers=headers, json=body)
        assert refusal(response, 404) == {"reason": reason}, path[:40]
    # An id from the body too: a version_id as long as validation allows is cut all the same.
    version_id = "ver-" + "9" * 96
    detail = refusal(await submit(gateway, Team(team.key, team.team_id, version_id), "l-1"), 404)
    assert detail == {"reason": f"version {version_id[:ECHO_MAX]}… not found"}


async def test_seasons_from_settings_bound_the_quota(
    mongo_url: str, nats_url: str, participant: str
) -> None:
    clock = Clock(T0)
    quotas = QuotaPolicy(
        seasons=[
            Season(name="S1", starts_at=T0 + timedelta(days=1), ends_at=T0 + timedelta(days=90))
        ]
    )
    async with open_gateway(mongo_url, nats_url, clock, quotas=quotas) as gw:
        team = await new_team(gw, participant, "seasonal")
        detail = refusal(await submit(gw, team, "s-1"), 429)
        assert "no season" in detail["reason"]
        assert datetime.fromisoformat(detail["next_allowed_at"]) == T0 + timedelta(days=1)
        clock.advance(timedelta(days=1))
        await started(gw, team, "s-1")
