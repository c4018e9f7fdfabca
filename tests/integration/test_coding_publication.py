"""The coding track published (R-2.4, R-2.5, R-3.7, R-5.3): the real gateway app on a real
nx-27017 and nats-server. Finished, gated coding jobs are written as the scheduler and the
publisher leave them (their attempts planned and recorded through the stores, as the stages
write them); approval, the public API, the board and system pages and the team's view of a
job's attempts go through the gateway's own routes."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import httpx
import pytest
from gateway_support import ADMIN, Clock, Gateway
from leaderboard_support import (
    CODING_DATASET,
    SeedAttempt,
    coding_attempts,
    finished_coding_job,
    finished_job,
    seed_attempts,
    version_body,
)

from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

# 10 and 9 of 16 attempts resolved (62.5%, 56.25%).
ALPHA = {"relevant": 7, "noisy": 3}
BETA = {"relevant": 5, "noisy": 4}


async def register(gw: Gateway, team: str, system: str, track: str) -> dict[str, Any]:
    body = version_body(team, system, "1.0", track=track)
    response = await gw.client.post("/v1/admin/versions", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    version: dict[str, Any] = response.json()
    version["auth"] = {"Authorization": f"Bearer {version['leaderboard_api_key']}"}
    return version


async def publish(gw: Gateway, db: Any, job: dict[str, Any]) -> None:
    await db.jobs.insert_one(job)
    approved = await gw.client.post(f"/v1/admin/reviews/{job['_id']}/approve", headers=ADMIN)
    assert approved.status_code == 200, approved.text


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def page_text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


async def test_the_coding_board_ranks_and_shows_resolved_shares(
    gateway: Gateway, db: Any, clock: Clock
) -> None:
    gw = gateway
    alpha = await register(gw, "team-alpha", "code-alpha", "coding")
    beta = await register(gw, "team-beta", "code-beta", "coding")
    text = await register(gw, "team-text", "text-mem", "textual")
    # Beta published first: the order is the resolved share's, not the publication's.
    for version, resolved in ((beta, BETA), (alpha, ALPHA)):
        clock.advance(timedelta(minutes=1))
        job = finished_coding_job(
            version["team_id"], version["version_id"], coding_attempts(resolved), clock()
        )
        await publish(gw, db, job)
    textual = finished_job(
        text["team_id"], text["version_id"], {"single-hop": 10, "multi-hop": 10}, clock()
    )
    await publish(gw, db, textual)

    # The API: the coding board ranks by resolved_rate; every figure is in the entry.
    board = ok(await gw.client.get("/v1/leaderboard", params={"track": "coding"}))
    assert board["track"] == "coding"
    assert [e["system_name"] for e in board["entries"]] == ["code-alpha", "code-beta"]
    best = board["entries"][0]
    overall = best["overall"]
    assert overall["headline"] == "resolved_rate"
    assert (overall["attempts"], overall["resolved"], overall["resolved_rate"]) == (16, 10, 0.625)
    assert overall["accuracy"] is None and overall["f1_mean"] is None
    dataset = best["datasets"][CODING_DATASET]
    conditions = {
        name: (cell["attempts"], cell["resolved"], cell["resolved_rate"])
        for name, cell in dataset["categories"].items()
    }
    assert conditions == {"relevant": (8, 7, 0.875), "noisy": (8, 3, 0.375)}
    # Tasks 0-3 are debug ones: 4 relevant and 3 noisy attempts of them resolved.
    task_types = {
        name: (cell["attempts"], cell["resolved"]) for name, cell in dataset["task_types"].items()
    }
    assert task_types == {"debug": (8, 7), "development": (8, 3)}
    assert board["entries"][1]["overall"]["resolved_rate"] == 0.5625
    industrial = ok(
        await gw.client.get("/v1/leaderboard", params={"track": "coding", "board": "industrial"})
    )
    assert [e["entry_id"] for e in industrial["entries"]] == [
        e["entry_id"] for e in board["entries"]
    ]
    # Never beside the other tracks' entries (R-2.1).
    others = ok(await gw.client.get("/v1/leaderboard", params={"track": "textual"}))
    assert [e["system_name"] for e in others["entries"]] == ["text-mem"]
    history = ok(await gw.client.get("/v1/leaderboard/systems/code-alpha"))
    assert history["entries"][0]["overall"]["resolved_rate"] == 0.625

    # The board page: resolved shares, the metric explained, conditions then task types.
    html = (await gw.client.get("/leaderboard?track=coding&board=industrial")).text
    words = page_text(html)
    assert "share of tasks the fixed coding agent resolved with the memories it retrieved" in words
    assert "relevant" in words and "noisy" in words
    headers = re.findall(r'<th scope="col"[^>]*>\s*(?:<button[^>]*>)?([^<]+)', html)
    headers = [h.strip() for h in headers]
    assert headers[:5] == ["Rank", "System", "Version", "Overall", "Resolved"]
    assert "Overall F1" not in headers and "Questions" not in headers
    assert [h for h in headers if h.startswith(CODING_DATASET)] == [
        CODING_DATASET,
        f"{CODING_DATASET}: relevant",
        f"{CODING_DATASET}: noisy",
        f"{CODING_DATASET}: debug tasks",
        f"{CODING_DATASET}: development tasks",
    ]
    rows = re.findall(r"<tr>(.*?)</tr>", html, re.S)[1:]
    first = [page_text(cell) for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", rows[0], re.S)]
    assert first[:3] + first[4:5] == ["1", "code-alpha", "1.0", "10 of 16"]
    # Overall, then its 95% interval (a seeded bootstrap over the attempts).
    assert first[3].startswith("62.5% 95% interval ")
    assert first[headers.index(f"{CODING_DATASET}: relevant")] == "87.5%"
    assert first[headers.index(f"{CODING_DATASET}: noisy")] == "37.5%"
    assert first[headers.index("Attempts")] == "16"
    assert "text-mem" not in html
    assert "Resolved per memory condition" in words
    data = re.search(r'<script type="application/json" id="chart-data">(.*?)</script>', html, re.S)
    assert data is not None
    charts = json.loads(data.group(1))
    assert charts[0]["axis"] == "Resolved (%)" and charts[0]["labels"] == ["relevant", "noisy"]
    assert charts[0]["series"][0] == {"label": "code-alpha 1.0", "values": [87.5, 37.5]}

    # The system page: its coding history in resolved shares.
    system = page_text((await gw.client.get("/systems/code-alpha")).text)
    assert "Coding track" in system and "Resolved" in system and "62.5%" in system
    assert "Overall F1" not in system


MIXED = [
    SeedAttempt("task-01", "relevant", "debug", True, "every FAIL_TO_PASS test passes"),
    SeedAttempt("task-01", "noisy", "debug", False, "the patch does not apply", steps=31),
    SeedAttempt(
        "task-02", "relevant", "development", False, "no patch to verify", "step_limit", 250
    ),
    SeedAttempt(
        "task-02",
        "noisy",
        "development",
        None,
        "sandbox fault: bwrap exited 1",
        "submitted",
        failed_at="score",
    ),
    SeedAttempt(
        "task-03",
        "relevant",
        "debug",
        None,
        "participant unreachable (HTTP 503)",
        failed_at="search",
        failure_kind="participant_outage",
    ),
]


async def test_a_coding_jobs_attempts_are_read_page_by_page(
    gateway: Gateway, db: Any, clock: Clock
) -> None:
    gw = gateway
    owner = await register(gw, "team-attempts", "code-attempts", "coding")
    other = await register(gw, "team-other", "code-other", "coding")
    job = finished_coding_job(
        owner["team_id"], owner["version_id"], MIXED, clock(), review_state=None
    )
    await db.jobs.insert_one(job)
    job_id = job["_id"]
    items = await seed_attempts(Stores.over(db), job_id, MIXED, clock())

    # The results: resolved per condition and task type; failed attempts apart.
    results = ok(await gw.client.get(f"/v1/jobs/{job_id}/results", headers=owner["auth"]))
    assert results["track"] == "coding"
    relevant = results["datasets"][CODING_DATASET]["categories"]["relevant"]
    assert (relevant["questions"], relevant["attempts"], relevant["resolved"]) == (3, 2, 1)
    assert relevant["failures"] == {"participant_outage": 1}

    # Two at a time, task by task, each attempt once.
    seen: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        response = await gw.client.get(
            f"/v1/jobs/{job_id}/attempts", params=params, headers=owner["auth"]
        )
        page = ok(response)
        pages += 1
        assert len(page["attempts"]) <= 2
        # No body of the records ever reaches the page: patch, trajectory, test log.
        assert "SECRET" not in response.text
        seen += page["attempts"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert [a["item_id"] for a in seen] == sorted(items)
    by_id = {(a["task"], a["condition"]): a for a in seen}
    assert by_id[("task-01", "relevant")] | {"item_id": None} == {
        "item_id": None,
        "dataset_id": CODING_DATASET,
        "task": "task-01",
        "condition": "relevant",
        "task_type": "debug",
        "outcome": "resolved",
        "end_reason": "submitted",
        "steps": 9,
        "resolved": True,
        "reason": "every FAIL_TO_PASS test passes",
        "failed_at": None,
        "failure_kind": None,
    }
    unresolved = by_id[("task-01", "noisy")]
    assert (unresolved["outcome"], unresolved["steps"], unresolved["reason"]) == (
        "unresolved",
        31,
        "the patch does not apply",
    )
    limit = by_id[("task-02", "relevant")]
    assert (limit["end_reason"], limit["steps"], limit["resolved"]) == ("step_limit", 250, False)
    verify = by_id[("task-02", "noisy")]
    assert (verify["outcome"], verify["failed_at"], verify["failure_kind"]) == (
        "failed",
        "score",
        "platform_error",
    )
    assert verify["resolved"] is None and verify["reason"] == "sandbox fault: bwrap exited 1"
    search = by_id[("task-03", "relevant")]
    assert (search["outcome"], search["failed_at"], search["end_reason"]) == (
        "failed",
        "search",
        None,
    )

    # Only the owner reads them; a job of another track has none; bounds are enforced.
    hidden = await gw.client.get(f"/v1/jobs/{job_id}/attempts", headers=other["auth"])
    assert hidden.status_code == 404
    text = await register(gw, "team-textual", "text-attempts", "textual")
    textual = finished_job(text["team_id"], text["version_id"], {}, clock(), review_state=None)
    await db.jobs.insert_one(textual)
    refused = await gw.client.get(f"/v1/jobs/{textual['_id']}/attempts", headers=text["auth"])
    assert refused.status_code == 409
    assert "textual track" in refused.json()["detail"]["reason"]
    too_many = await gw.client.get(
        f"/v1/jobs/{job_id}/attempts", params={"limit": 201}, headers=owner["auth"]
    )
    assert too_many.status_code == 422
    # A cursor past the last attempt: an empty last page.
    past = ok(
        await gw.client.get(
            f"/v1/jobs/{job_id}/attempts", params={"cursor": "~"}, headers=owner["auth"]
        )
    )
    assert past == {"attempts": [], "next_cursor": None}

    # The job page: the same for every job, its coding sections filled in by its script.
    html = (await gw.client.get(f"/jobs/{job_id}")).text
    for element in ('id="coding-block"', 'id="coding-table"', 'id="attempts-table"'):
        assert element in html
    assert "Show more attempts" in html
    assert job_id not in html and "task-01" not in html
