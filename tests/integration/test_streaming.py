"""A streaming dataset through every service as separate processes, on real components
(nats-server with JetStream, nx-27017) with the participant simulator and the LLM stand-in: a
question asked at several points of its conversation is searched at each, after the Adds up to
that point and before any later one, each point is scored, and the results split the dataset by
point; the same conversations without points run as before (every search after every Add)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from job_support import submit_and_wait
from llm_support import standin_in_stack
from pymongo import AsyncMongoClient

from aml_devtools.platform import Platform, PlatformConfig, register_participant, start_platform
from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_evaluation.registration import register_dataset
from aml_participant_simulator import Script, Simulator, running_simulator
from aml_participant_simulator.recording import RequestRecord

pytestmark = pytest.mark.integration

_MISSING = [name for name in ("nats-server", "nx-27017") if find_executable(name) is None]
if _MISSING:
    pytest.skip(f"embedded components missing: {', '.join(_MISSING)}", allow_module_level=True)

DATA = Path(__file__).parents[1] / "data" / "streaming" / "streaming_v1.json"
STREAMING, PLAIN = "streaming_test", "streaming_plain"
JOB_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    root = tmp_path_factory.mktemp("datasets")
    shutil.copy(DATA, root / "streaming_v1.json")
    register_dataset(root / "streaming_v1.json", "locomo", STREAMING, root)
    # The same conversations and questions without their points: a plain dataset.
    samples = json.loads(DATA.read_text(encoding="utf-8"))
    for sample in samples:
        for item in sample["qa"]:
            item.pop("asked_at", None)
    (root / "plain_v1.json").write_text(json.dumps(samples), encoding="utf-8")
    register_dataset(root / "plain_v1.json", "locomo", PLAIN, root)
    data_dir = tmp_path_factory.mktemp("platform")
    with EmbeddedStack(StackConfig(data_dir=data_dir, start_llm=False)) as stack:
        stack.start_infra()
        llm = standin_in_stack(stack, latency=0.05, capacity=4, name="llm-standin")
        config = PlatformConfig(
            datasets_root=root,
            llm_concurrency=4,
            extra_env={
                "AML_LLM_BASE_URL": f"{llm}/v1",
                # The stand-in has no /tokenize.
                "AML_TOKEN_COUNTER": "estimate",
                # Operator datasets a smoke run may name.
                "AML_SMOKE_DATASETS": json.dumps([STREAMING, PLAIN]),
            },
        )
        yield start_platform(stack, config)


@pytest.fixture
async def db(platform: Platform) -> AsyncIterator[Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        platform.stack.mongo_url, tz_aware=True
    )
    yield client["aml"]
    await client.close()


def _run(platform: Platform, team: str, dataset_id: str) -> tuple[str, str, list[RequestRecord]]:
    """A smoke job on `dataset_id` for a simulated participant: (job id, key, its requests)."""
    simulator = Simulator(Script())
    with running_simulator(simulator) as url:
        version_id, key = register_participant(platform, url, team, f"sim-{team}")
        job = {"version_id": version_id, "run_label": team, "datasets": [dataset_id]}
        job_id, status = submit_and_wait(platform.gateway_url, key, job, JOB_TIMEOUT)
        assert status["state"] == "completed", status
    return job_id, key, list(simulator.requests)


def _arrivals(requests: list[RequestRecord]) -> list[tuple[str, dict[str, Any]]]:
    """The successful Add and Search requests in arrival order, with their bodies."""
    kept = [r for r in requests if r.endpoint in ("add", "search") and r.status == 200]
    kept.sort(key=lambda r: r.arrived_monotonic)
    return [(r.endpoint, json.loads(r.body)) for r in kept]


def _results(platform: Platform, job_id: str, key: str) -> dict[str, Any]:
    response = httpx.get(
        f"{platform.gateway_url}/v1/jobs/{job_id}/results",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_question_is_searched_at_each_of_its_points(platform: Platform, db: Any) -> None:
    job_id, key, requests = _run(platform, "team-stream", STREAMING)
    arrivals = _arrivals(requests)
    user = f"eval:{job_id}:{STREAMING}:str-1"
    # What str-1's participant saw, in order: its Adds by seq, its Searches by question.
    seen = [
        (kind, body["request_id"].rsplit("-", 1)[1] if kind == "add" else body["query"])
        for kind, body in arrivals
        if body["user_id"] == user
    ]
    where = "Where does Ana work?"
    assert seen[:6] == [
        ("add", "1"), ("search", where), ("add", "2"), ("add", "3"), ("search", where), ("add", "4")
    ]  # fmt: skip
    assert sorted(seen[6:]) == [
        ("search", "What does Ana bake on Fridays?"), ("search", "What is the name of Ben's dog?")
    ]  # fmt: skip
    # The same Search body at both points: only the memory differs.
    searches = [body for kind, body in arrivals if kind == "search" and body["query"] == where]
    assert len(searches) == 2 and searches[0] == searches[1]
    # str-2's question before anything was written, and again after its one Add.
    other = [
        kind for kind, body in arrivals if body["user_id"] == f"eval:{job_id}:{STREAMING}:str-2"
    ]
    assert other == ["search", "add", "search"]

    # The participant answered each point from what it held then.
    prefix = f"{job_id}/{STREAMING}/str-1:q0000"
    early = await db.searches.find_one({"_id": f"{prefix}@2"})
    late = await db.searches.find_one({"_id": f"{prefix}@6"})
    assert early["state"] == late["state"] == "done"
    assert not any("bakery" in c["content"] for c in early["candidates"])
    assert any("bakery" in c["content"] for c in late["candidates"])

    # Every point scored; the results split the dataset by point.
    questions = await db.questions.find({"job_id": job_id}).to_list()
    assert len(questions) == 6
    scores = await db.scores.find({"job_id": job_id}).to_list()
    assert sorted(s["_id"] for s in scores) == sorted(q["_id"] for q in questions)
    assert all(s["state"] == "done" for s in scores)
    dataset = _results(platform, job_id, key)["datasets"][STREAMING]
    points = dataset["points"]
    # First points: str-1's q0 at 2, q2 at 8, str-2's at 0; second: q0 at 6, str-2's at 3.
    assert {name: m["questions"] for name, m in points.items()} == {"1": 3, "2": 2}
    assert all(m["scored"] == m["questions"] for m in points.values())
    assert dataset["overall"]["questions"] == 6


async def test_the_same_conversations_without_points_run_as_before(
    platform: Platform, db: Any
) -> None:
    job_id, key, requests = _run(platform, "team-plain", PLAIN)
    arrivals = _arrivals(requests)
    for user in ("str-1", "str-2"):
        kinds = [kind for kind, body in arrivals if body["user_id"].endswith(f":{user}")]
        adds = kinds.count("add")
        # Whole sessions per Add, every search after every Add.
        assert adds == {"str-1": 2, "str-2": 1}[user]
        assert kinds == ["add"] * adds + ["search"] * (len(kinds) - adds)
    questions = await db.questions.find({"job_id": job_id}).to_list()
    assert len(questions) == 4 and not any("@" in q["_id"] or "point" in q for q in questions)
    chunks = await db.add_chunks.find({"job_id": job_id}).to_list()
    assert not any("searched_before" in c for c in chunks)
    dataset = _results(platform, job_id, key)["datasets"][PLAIN]
    assert "points" not in dataset
    assert dataset["overall"]["questions"] == 4
