"""`GET /v1/datasets` and the dataset errors of a job submission: the real gateway app on a real
nx-27017 and nats-server, with the shared benchmark files (counted) and without them (null)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from gateway_support import ADMIN, open_gateway, request_body

from aml_evaluation.registration import register_dataset
from aml_evaluation.registry import (
    MANIFESTS_DIR,
    DatasetFileError,
    load_dataset,
    manifest_path,
    read_manifest,
)

pytestmark = pytest.mark.integration

IDS = [
    "synthetic",
    "locomo",
    "locomo_refined",
    "synthetic_multimodal",
    "synthetic_atm",
    "synthetic-coding",
]
TRACKS = {
    "synthetic_multimodal": "multimodal",
    "synthetic_atm": "multimodal",
    "synthetic-coding": "coding",
}


def _expected_counts(dataset_id: str, root: Path) -> dict[int, int] | None:
    try:
        dataset = load_dataset(dataset_id, root)
    except (DatasetFileError, OSError):
        return None
    return dict(Counter(question.category for question in dataset.questions))


async def test_datasets_are_listed_with_tracks_categories_and_counts(
    mongo_url: str, nats_url: str, datasets_root: Path
) -> None:
    async with open_gateway(mongo_url, nats_url, datasets_root=datasets_root) as gw:
        # Public: no key needed.
        response = await gw.client.get("/v1/datasets")
        assert response.status_code == 200, response.text
        listed = {d["dataset_id"]: d for d in response.json()}
        assert list(listed) == IDS
        assert [d for d in IDS if listed[d]["smoke_default"]] == ["synthetic"]
        assert [d for d in IDS if listed[d]["smoke"]] == IDS
        assert [d for d in IDS if listed[d]["full_suite"]] == ["locomo_refined"]
        for dataset_id, info in listed.items():
            manifest = read_manifest(manifest_path(dataset_id, None))
            assert info["track"] == TRACKS.get(dataset_id, "textual")
            assert info["version"] == manifest.version
            numbers = [(c["number"], c["name"]) for c in info["categories"]]
            assert numbers == sorted(manifest.categories.items())
            excluded = [c["number"] for c in info["categories"] if not c["in_overall"]]
            assert excluded == manifest.excluded_from_overall
            counts = _expected_counts(dataset_id, datasets_root)
            if counts is None:
                assert info["questions"] is None
                assert {c["questions"] for c in info["categories"]} == {None}
            else:
                assert info["questions"] == sum(counts.values()) > 0
                assert {c["number"]: c["questions"] for c in info["categories"]} == {
                    number: counts.get(number, 0) for number in manifest.categories
                }
        # The synthetic datasets ship with the package: always counted.
        assert listed["synthetic"]["questions"]
        assert listed["synthetic_multimodal"]["questions"] == 11
        # One attempt per task and memory condition: 8 tasks, relevant and noisy.
        assert listed["synthetic-coding"]["questions"] == 16
        # The second read is served from what the first counted, with the same answer.
        assert (await gw.client.get("/v1/datasets")).json() == response.json()


async def test_without_the_files_the_counts_are_null(
    mongo_url: str, nats_url: str, tmp_path: Path
) -> None:
    async with open_gateway(
        mongo_url, nats_url, datasets_root=tmp_path, smoke_datasets=["synthetic", "locomo", "nope"]
    ) as gw:
        listed = {d["dataset_id"]: d for d in (await gw.client.get("/v1/datasets")).json()}
    # A configured id without a manifest is left out: no job could run it either.
    assert list(listed) == ["synthetic", "locomo", "locomo_refined"]
    assert listed["synthetic"]["questions"] and listed["locomo"]["questions"] is None


async def test_an_unknown_dataset_is_refused_with_the_valid_ids(
    mongo_url: str, nats_url: str, participant: str
) -> None:
    async with open_gateway(mongo_url, nats_url) as gw:
        created = await gw.client.post(
            "/v1/access-requests", json=request_body(participant, system_name="datasets")
        )
        approved = await gw.client.post(
            f"/v1/admin/access-requests/{created.json()['id']}/approve", headers=ADMIN
        )
        grant: dict[str, Any] = approved.json()
        auth = {"Authorization": f"Bearer {grant['leaderboard_api_key']}"}
        body = {"version_id": grant["version_id"], "run_label": "s1"}

        unknown = await gw.client.post(
            "/v1/jobs", json=body | {"datasets": ["synthetic", "locomo-typo"]}, headers=auth
        )
        assert unknown.status_code == 422, unknown.text
        detail = unknown.json()["detail"]
        assert detail["reason"] == (
            "unknown dataset(s): locomo-typo; a smoke run may name synthetic, locomo, "
            "locomo_refined, synthetic_multimodal, synthetic_atm, synthetic-coding "
            "(GET /v1/datasets)"
        )
        assert detail["valid_datasets"] == IDS

        checklist = dict.fromkeys(
            ("smoke_passed", "api_contract_correct", "run_instructions_complete",
             "originality_disclosed", "integrity_pledge"),
            True,
        )  # fmt: skip
        full = body | {"mode": "full", "checklist": checklist, "datasets": ["locomo"]}
        refused = await gw.client.post("/v1/jobs", json=full, headers=auth)
        assert refused.status_code == 422
        assert refused.json()["detail"]["reason"] == (
            "full runs use the fixed suite (locomo_refined); leave `datasets` out"
        )
        assert refused.json()["detail"]["valid_datasets"] == ["locomo_refined"]

        # Nothing was started by the refusals: the run label is still free.
        accepted = await gw.client.post("/v1/jobs", json=body, headers=auth)
        assert accepted.status_code == 201, accepted.text


async def test_operator_datasets_are_listed_with_their_manifests_track_and_counts(
    mongo_url: str, nats_url: str, tmp_path: Path
) -> None:
    """`aml dataset add` under the gateway's datasets root: listed from its manifest (track,
    counts), not runnable until configured, then runnable once named in AML_SMOKE_DATASETS."""
    synthetic = MANIFESTS_DIR.parent / "synthetic" / "synthetic_v1.json"
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "convs.json").write_bytes(synthetic.read_bytes())
    register_dataset(tmp_path / "team" / "convs.json", "locomo", "ops", tmp_path, track="coding")
    # The counts come from the manifest: the gateway need not read the file.
    (tmp_path / "team" / "convs.json").unlink()
    async with open_gateway(mongo_url, nats_url, datasets_root=tmp_path) as gw:
        listed = {d["dataset_id"]: d for d in (await gw.client.get("/v1/datasets")).json()}
    assert list(listed) == [*IDS, "ops"]
    ops = listed["ops"]
    assert (ops["track"], ops["runnable"], ops["smoke"], ops["full_suite"]) == (
        "coding", False, False, False,
    )  # fmt: skip
    assert ops["questions"] == 30
    assert {c["number"]: c["questions"] for c in ops["categories"]} == {
        1: 6, 2: 7, 3: 4, 4: 9, 5: 4,
    }  # fmt: skip
    assert all(listed[d]["runnable"] for d in IDS)

    async with open_gateway(
        mongo_url, nats_url, datasets_root=tmp_path, smoke_datasets=["synthetic", "ops"]
    ) as gw:
        listed = {d["dataset_id"]: d for d in (await gw.client.get("/v1/datasets")).json()}
    assert list(listed) == ["synthetic", "ops", "locomo_refined"]
    assert listed["ops"]["runnable"] and listed["ops"]["smoke"]
