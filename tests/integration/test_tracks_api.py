"""Scores are never compared across tracks (R-2.1): a job runs the datasets of its own track only,
its status and results name that track, and each track's board ranks its own entries alone. The
real gateway app on a real nx-27017 and nats-server, with an operator dataset registered on the
coding track under a fresh datasets root."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gateway_support import ADMIN, T0, Gateway, open_gateway
from leaderboard_support import finished_job, version_body
from pymongo import AsyncMongoClient

from aml_evaluation.registration import register_dataset
from aml_evaluation.registry import MANIFESTS_DIR

pytestmark = pytest.mark.integration

CODING = "ops-coding"
# 30, 34 and 39 of 40 correct.
GOOD = {"single-hop": 9, "multi-hop": 7, "temporal": 8, "open-domain": 6}
BETTER = {"single-hop": 10, "multi-hop": 8, "temporal": 9, "open-domain": 7}
BEST = {"single-hop": 10, "multi-hop": 10, "temporal": 10, "open-domain": 9}


@pytest.fixture(scope="module")
async def gw(
    mongo_url: str, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    root = tmp_path_factory.mktemp("datasets")
    data = root / "coding" / "convs.json"
    data.parent.mkdir()
    data.write_bytes((MANIFESTS_DIR.parent / "synthetic" / "synthetic_v1.json").read_bytes())
    register_dataset(data, "locomo", CODING, root, track="coding")
    async with open_gateway(
        mongo_url,
        nats_url,
        lambda: T0,
        datasets_root=root,
        smoke_datasets=["synthetic", CODING],
    ) as gateway:
        yield gateway


async def _version(gw: Gateway, team: str, system: str, track: str) -> dict[str, Any]:
    body = version_body(team, system, "1.0", track=track, auth_method="bearer")
    created = await gw.client.post("/v1/admin/versions", json=body, headers=ADMIN)
    assert created.status_code == 201, created.text
    grant: dict[str, Any] = created.json()
    grant["auth"] = {"Authorization": f"Bearer {grant['leaderboard_api_key']}"}
    return grant


async def test_a_job_mixing_tracks_is_refused_and_nothing_starts(gw: Gateway) -> None:
    textual = await _version(gw, "team-tracks", "tracks-mem", "textual")
    submit = {"version_id": textual["version_id"], "run_label": "r1"}
    listed = {d["dataset_id"]: d["track"] for d in (await gw.client.get("/v1/datasets")).json()}
    assert listed[CODING] == "coding" and listed["synthetic"] == "textual"

    for body in (
        submit | {"datasets": ["synthetic", CODING]},
        submit | {"datasets": [CODING]},
    ):
        refused = await gw.client.post("/v1/jobs", json=body, headers=textual["auth"])
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert detail["reason"].startswith("a job on track textual runs datasets of track textual")
        assert f"{CODING} is coding" in detail["reason"]
        assert "never compared across tracks" in detail["reason"]
        assert detail["valid_datasets"] == (["synthetic"] if len(body["datasets"]) == 2 else [])
    # Naming the coding track instead: the version is not registered for it.
    wrong = await gw.client.post(
        "/v1/jobs", json=submit | {"track": "coding", "datasets": [CODING]}, headers=textual["auth"]
    )
    assert wrong.status_code == 422 and "not registered for track coding" in wrong.text
    # Nothing was started by the refusals: no job, the run label is still free.
    assert (await gw.client.get("/v1/jobs", headers=textual["auth"])).json() == []
    accepted = await gw.client.post(
        "/v1/jobs", json=submit | {"datasets": ["synthetic"]}, headers=textual["auth"]
    )
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["track"] == "textual"


async def test_a_coding_version_runs_the_coding_dataset_on_its_track(gw: Gateway) -> None:
    coding = await _version(gw, "team-coder", "coder-mem", "coding")
    body = {"version_id": coding["version_id"], "run_label": "c1", "track": "coding"}
    mixed = await gw.client.post(
        "/v1/jobs", json=body | {"datasets": [CODING, "synthetic"]}, headers=coding["auth"]
    )
    assert mixed.status_code == 422 and mixed.json()["detail"]["valid_datasets"] == [CODING]
    # The smoke sample (synthetic) is textual: a coding job names its datasets.
    default = await gw.client.post("/v1/jobs", json=body, headers=coding["auth"])
    assert default.status_code == 422 and "synthetic is textual" in default.text
    accepted = await gw.client.post(
        "/v1/jobs", json=body | {"datasets": [CODING]}, headers=coding["auth"]
    )
    assert accepted.status_code == 201, accepted.text
    job = accepted.json()
    assert job["track"] == "coding"
    stored = await gw.client.get(f"/v1/jobs/{job['job_id']}", headers=coding["auth"])
    assert stored.json()["track"] == "coding"


async def _published(
    gw: Gateway, db: Any, version: dict[str, Any], track: str, correct: Any
) -> str:
    job = finished_job(version["team_id"], version["version_id"], correct, T0, track=track)
    await db.jobs.insert_one(job)
    approved = await gw.client.post(f"/v1/admin/reviews/{job['_id']}/approve", headers=ADMIN)
    assert approved.status_code == 200, approved.text
    job_id: str = job["_id"]
    return job_id


async def test_each_track_ranks_its_own_entries_alone(gw: Gateway) -> None:
    mongo: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(gw.settings.mongo_url, tz_aware=True)
    db = mongo[gw.settings.mongo_db]
    try:
        textual_a = await _version(gw, "team-a", "a-mem", "textual")
        textual_b = await _version(gw, "team-b", "b-mem", "textual")
        coding_c = await _version(gw, "team-c", "c-mem", "coding")
        await _published(gw, db, textual_a, "textual", GOOD)
        await _published(gw, db, textual_b, "textual", BETTER)
        coding_job = await _published(gw, db, coding_c, "coding", BEST)
    finally:
        await mongo.close()

    # The results of a job name its track.
    results = await gw.client.get(f"/v1/jobs/{coding_job}/results", headers=coding_c["auth"])
    assert results.status_code == 200 and results.json()["track"] == "coding"

    # The coding entry scores best of all, yet is on no textual board, and the other way round.
    textual = (await gw.client.get("/v1/leaderboard?track=textual")).json()
    assert textual["track"] == "textual"
    assert [e["system_name"] for e in textual["entries"]] == ["b-mem", "a-mem"]
    assert {e["track"] for e in textual["entries"]} == {"textual"}
    coding = (await gw.client.get("/v1/leaderboard?track=coding")).json()
    assert [(e["system_name"], e["track"]) for e in coding["entries"]] == [("c-mem", "coding")]
    assert (await gw.client.get("/v1/leaderboard?track=multimodal")).json()["entries"] == []

    # The pages: one board per track, named in the title, ranked within it.
    page = (await gw.client.get("/leaderboard?track=textual&board=industrial")).text
    assert "<title>Textual track, Industrial board ·" in page
    assert "b-mem" in page and "a-mem" in page and "c-mem" not in page
    text = " ".join(re.sub(r"<[^>]+>", "", page).split())
    assert "Textual (2 entries)" in text and "Coding (1 entry)" in text
    coding_page = (await gw.client.get("/leaderboard?track=coding&board=industrial")).text
    assert "<title>Coding track, Industrial board ·" in coding_page
    assert "c-mem" in coding_page and "b-mem" not in coding_page
    # A system's page shows its history per track.
    system = (await gw.client.get("/systems/c-mem")).text
    assert "Coding track" in system and "Textual track" not in system
