"""`aml baseline` and the embedded stack's own baseline equal what the scheduler records on a
job it plans (planned for real against nx-27017), so a full run of this deployment passes the
publication gate's baseline checks."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from aml_contract.api.publication import ReleaseBaseline
from aml_devtools.cli import main as aml
from aml_devtools.platform import own_release_baseline
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_runtime.codehash import code_hash
from aml_runtime.db import Document
from aml_runtime.stores import Stores
from aml_scheduler.baseline import release_baseline
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.integration


async def _planned_job(settings: SchedulerSettings, datasets: list[str]) -> Document:
    """A job planned by the scheduler's own `_plan` (it needs only the database, the evaluation
    spec and the code hash: broker, participant client and keys are not touched while
    planning)."""
    client: AsyncMongoClient[Document] = AsyncMongoClient(settings.mongo_url)
    db = client[settings.mongo_db]
    unused: Any = None
    scheduler = ScheduleJobs(
        settings,
        Stores.over(db),
        unused,
        unused,
        unused,
        build_evaluation_spec(settings),
        code_hash(),
    )
    job_id = f"j{uuid.uuid4().hex[:12]}"
    job = {"_id": job_id, "planned": False, "state": "queued", "datasets": datasets}
    await db.jobs.insert_one(job)
    await scheduler._plan(job)
    planned = await db.jobs.find_one({"_id": job_id})
    await client.close()
    assert planned is not None
    return planned


async def test_baseline_equals_what_a_planned_job_records(
    mongo_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    settings = SchedulerSettings(mongo_url=mongo_url, mongo_db=f"bl_{uuid.uuid4().hex[:8]}")
    job = await _planned_job(settings, ["synthetic"])
    baseline = release_baseline(settings, ["synthetic"]).release

    assert baseline.spec_hash == job["spec_hash"]
    assert baseline.code_hash == job["code_hash"]
    assert baseline.dataset_bundle_hash == job["dataset_bundle_hash"]
    assert baseline.answer_model == job["spec"]["answer_model"]
    assert baseline.question_counts == {"synthetic": job["totals"]["questions"]}
    assert job["totals"]["questions"] > 0

    # The CLI prints the same document, and --store writes it for AML_RELEASE_BASELINE.
    stored = tmp_path / "baseline.json"
    capsys.readouterr()  # the planning's log lines
    assert aml(["baseline", "--dataset", "synthetic", "--json", "--store", str(stored)]) == 0
    printed = ReleaseBaseline.model_validate_json(capsys.readouterr().out)
    assert printed == baseline
    assert ReleaseBaseline.model_validate(json.loads(stored.read_text())) == baseline


async def test_a_different_spec_setting_is_a_different_baseline(mongo_url: str) -> None:
    settings = SchedulerSettings(mongo_url=mongo_url, mongo_db=f"bl_{uuid.uuid4().hex[:8]}",
                                 answer_model="another-model")  # fmt: skip
    job = await _planned_job(settings, ["synthetic"])
    default = release_baseline(SchedulerSettings(), ["synthetic"]).release
    changed = release_baseline(settings, ["synthetic"]).release
    assert changed.spec_hash == job["spec_hash"] != default.spec_hash
    assert changed.answer_model == "another-model"


def test_the_embedded_stack_computes_its_own_baseline_from_its_environment() -> None:
    env = {"AML_ANSWER_MODEL": "local-model", "AML_FULL_SUITE": '["synthetic"]',
           "AML_TOKEN_COUNTER": "llama.cpp"}  # fmt: skip
    baseline = own_release_baseline(env)
    assert baseline is not None
    expected = SchedulerSettings(answer_model="local-model", token_counter="llama.cpp")
    assert baseline == release_baseline(expected, ["synthetic"]).release
    # Datasets that cannot be read leave the baseline unset instead of failing the start.
    missing = {**env, "AML_FULL_SUITE": '["no-such-dataset"]'}
    assert own_release_baseline(missing) is None
