"""Ties on the public board (docs/evaluation.md, "How sure a score is"): the real gateway app
on a real nx-27017 and nats-server, entries published through the admin review as in
test_leaderboard_api.py, each job's per-question headline values kept as the scheduler keeps
them at completion (`LeaderboardStore.keep_headline_outcomes`).

Each entry says whether it is distinguishable from the entry ranked just above it on the board
as shown (a paired bootstrap over the questions both answered): a half-point gap over the same
questions is a tie, a large one is not, and an entry without kept values, or the first one,
says nothing."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from gateway_support import ADMIN, Clock, Gateway
from leaderboard_support import finished_job, outcomes, version_body

from aml_evaluation.aggregate import headline_values
from aml_runtime.stores import Stores
from aml_runtime.stores.leaderboard import HeadlineOutcomes

pytestmark = pytest.mark.integration

# Of 40 questions: 31 (77.5%) and 30 (75%), the same answers but one: a tie. 10 (25%): not.
NEAR_BEST = {"single-hop": 9, "multi-hop": 8, "temporal": 8, "open-domain": 6}
NEAR = {"single-hop": 9, "multi-hop": 7, "temporal": 8, "open-domain": 6}
FAR = {"single-hop": 3, "multi-hop": 3, "temporal": 2, "open-domain": 2}
# 20 of 40 (50%), on the academic board, kept no values (published before they were kept).
MIDDLE = {"single-hop": 5, "multi-hop": 5, "temporal": 5, "open-domain": 5}


async def publish(
    gw: Gateway, db: Any, clock: Clock, system: str, correct: Mapping[str, int], **version: Any
) -> str:
    """A version registered, its full run finished and gated, approved; with its values kept
    unless `keep` is False. Returns the job's id."""
    keep = version.pop("keep", True)
    response = await gw.client.post(
        "/v1/admin/versions", json=version_body(f"team-{system}", system, "1.0", **version),
        headers=ADMIN,
    )  # fmt: skip
    assert response.status_code == 201, response.text
    registered = response.json()
    clock.advance(timedelta(minutes=1))
    job = finished_job(registered["team_id"], registered["version_id"], correct, clock())
    await db.jobs.insert_one(job)
    if keep:
        values = headline_values(outcomes(correct), {}, "accuracy")
        assert len(values) == 40
        kept = HeadlineOutcomes(job_id=job["_id"], headline="accuracy", values=values)
        await Stores.over(db).leaderboard.keep_headline_outcomes(kept)
    approved = await gw.client.post(f"/v1/admin/reviews/{job['_id']}/approve", headers=ADMIN)
    assert approved.status_code == 200, approved.text
    return str(job["_id"])


async def board(gw: Gateway, **params: str) -> list[tuple[str, float, bool | None]]:
    response = await gw.client.get("/v1/leaderboard", params=params)
    assert response.status_code == 200, response.text
    return [
        (entry["system_name"], entry["overall"]["accuracy"], entry["tied_with_above"])
        for entry in response.json()["entries"]
    ]


async def test_adjacent_entries_with_near_equal_scores_are_tied(
    gateway: Gateway, db: Any, clock: Clock
) -> None:
    gw = gateway
    await publish(gw, db, clock, "near-mem", NEAR)
    # One entry: nothing above it.
    assert await board(gw) == [("near-mem", 0.75, None)]

    await publish(gw, db, clock, "best-mem", NEAR_BEST)
    # 77.5% against 75% over the same 40 questions: indistinguishable.
    assert await board(gw) == [("best-mem", 0.775, None), ("near-mem", 0.75, True)]
    # Asked again: the same answer (kept by the gateway for this board).
    assert await board(gw) == [("best-mem", 0.775, None), ("near-mem", 0.75, True)]

    await publish(gw, db, clock, "far-mem", FAR)
    assert await board(gw) == [
        ("best-mem", 0.775, None),
        ("near-mem", 0.75, True),
        # 25% against 75%: told apart.
        ("far-mem", 0.25, False),
    ]

    # On the academic board, with no per-question values kept: no comparison is possible,
    # neither for it nor for the entry below it on the whole track's board.
    await publish(gw, db, clock, "middle-mem", MIDDLE, board="academic", keep=False)
    assert await board(gw) == [
        ("best-mem", 0.775, None),
        ("near-mem", 0.75, True),
        ("middle-mem", 0.5, None),
        ("far-mem", 0.25, None),
    ]
    # Ties are between adjacent entries as shown: each board has its own.
    assert await board(gw, board="industrial") == [
        ("best-mem", 0.775, None),
        ("near-mem", 0.75, True),
        ("far-mem", 0.25, False),
    ]
    assert await board(gw, board="academic") == [("middle-mem", 0.5, None)]
    # A system's history is no board: no ties there.
    history = await gw.client.get("/v1/leaderboard/systems/near-mem")
    assert [entry["tied_with_above"] for entry in history.json()["entries"]] == [None]
    # The page reads the same entries, ties included.
    page = await gw.client.get("/leaderboard", params={"board": "industrial"})
    assert page.status_code == 200
    assert "best-mem" in page.text and "far-mem" in page.text
