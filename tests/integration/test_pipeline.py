"""Whole jobs through every service as separate processes, on real components: nats-server with
JetStream, the nx-27017 MongoDB wire server, the llama.cpp server with SmolLM2 and the reference
memory server over HTTP. Answers come from the local model at temperature 0 with one slot, which
is deterministic on this machine (checked by tests/integration/test_embedded_stack.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import httpx
import pytest
from pymongo import AsyncMongoClient

from aml_devtools import install_model
from aml_devtools.cli import main
from aml_devtools.platform import (
    MemoryServer,
    Platform,
    PlatformConfig,
    register_memory_server,
    register_participant,
    start_memory_server,
    start_platform,
)
from aml_devtools.processes import find_executable, free_port
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_devtools.tracefiles import TraceSpan, read_spans, traces_of
from aml_participant_simulator import Outcome, Script, Simulator, running_simulator
from aml_participant_simulator.script import EndpointScript
from aml_runtime.db import read_time
from aml_runtime.stores import Stores

# Whole jobs on the real model, several waiting out a killed service's redelivery (about five
# minutes together): run beside the other tests (dev.py).
pytestmark = [pytest.mark.integration, pytest.mark.wallclock]

_MISSING = [
    name
    for name, present in {
        "nats-server": find_executable("nats-server") is not None,
        "nx-27017": find_executable("nx-27017") is not None,
        "xllamacpp": find_spec("xllamacpp") is not None,
        f"the local model ({install_model.INSTALL_COMMAND})": install_model.model_file().is_file(),
    }.items()
    if not present
]
if _MISSING:
    pytest.skip(f"embedded components missing: {', '.join(_MISSING)}", allow_module_level=True)

JOB_TIMEOUT = 900.0


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    data_dir = tmp_path_factory.mktemp("platform")
    with EmbeddedStack(StackConfig(data_dir=data_dir)) as stack:
        stack.start_infra()
        # The release's full suite is LoCoMo; here the full run uses the small sample, so the
        # whole journey (smoke, then full) fits in the test's time.
        config = PlatformConfig(
            datasets_root=Path("/nonexistent"),
            extra_env={
                "AML_FULL_SUITE": '["synthetic"]',
                # A participant down at its job's start fails the job after this.
                "AML_PARTICIPANT_OUTAGE_SECONDS": "15",
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


def _access_granted(platform: Platform, memory: MemoryServer, name: str) -> tuple[str, str]:
    """An Evaluation Access Request for the memory server, approved: (version id, key)."""
    request = {
        "kind": "new_key",
        "contact": {"name": "Ada", "email": "ada@example.org", "organisation": name},
        "system_name": name,
        "version_label": "1.0",
        "tracks": ["textual"],
        "board": "industrial",
        "add_url": f"{memory.url}/add",
        "search_url": f"{memory.url}/search",
        "health_url": f"{memory.url}/health",
        "auth_method": "bearer",
        "memory_system_key": memory.key,
        "capacity": {"max_concurrency": 4, "max_rps": 50},
    }
    with httpx.Client(base_url=platform.gateway_url, timeout=30) as api:
        created = api.post("/v1/access-requests", json=request)
        assert created.status_code == 201, created.text
        assert created.json()["health_check"]["ok"] is True
        approved = api.post(
            f"/v1/admin/access-requests/{created.json()['id']}/approve",
            headers={"Authorization": f"Bearer {platform.admin_token}"},
        )
        assert approved.status_code == 200, approved.text
    grant = approved.json()
    return grant["version_id"], grant["leaderboard_api_key"]


FULL_CHECKLIST = {
    "smoke_passed": True,
    "api_contract_correct": True,
    "run_instructions_complete": True,
    "originality_disclosed": True,
    "integrity_pledge": True,
}


def _submit_job(
    platform: Platform, version_id: str, key: str, label: str, mode: str = "smoke"
) -> str:
    job: dict[str, Any] = {"version_id": version_id, "mode": mode, "run_label": label}
    if mode == "full":
        job["checklist"] = FULL_CHECKLIST
    response = httpx.post(
        f"{platform.gateway_url}/v1/jobs",
        headers={"Authorization": f"Bearer {key}"},
        json=job,
        timeout=30,
    )
    assert response.status_code == 201, response.text
    job_id: str = response.json()["job_id"]
    return job_id


def _wait(platform: Platform, job_id: str, key: str, until: Any = None) -> dict[str, Any]:
    """Poll the job through the API until it ends (or `until(status)` holds)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    with httpx.Client(
        base_url=platform.gateway_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as api:
        while True:
            status: dict[str, Any] = api.get(f"/v1/jobs/{job_id}").json()
            if status["state"] in ("completed", "failed") or (until and until(status)):
                return status
            assert time.monotonic() < deadline, f"job {job_id} stuck: {status}"
            time.sleep(1.0)


def _results(platform: Platform, job_id: str, key: str) -> dict[str, Any]:
    response = httpx.get(
        f"{platform.gateway_url}/v1/jobs/{job_id}/results",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _recompute(
    questions: list[dict[str, Any]], scores: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The results table recomputed independently from the per-question records."""
    cells: dict[str, Counter[str]] = defaultdict(Counter)
    f1: dict[str, list[float]] = defaultdict(list)
    bleu: dict[str, list[float]] = defaultdict(list)
    for question in questions:
        score = scores.get(question["_id"])
        for cell in (question["category_name"], "overall"):
            if cell == "overall" and question["category_name"] == "adversarial":
                continue
            cells[cell]["questions"] += 1
            if score is None or score["state"] != "done" or score["judge_label"] is None:
                cells[cell]["failed"] += 1
                continue
            cells[cell]["scored"] += 1
            cells[cell]["correct"] += score["judge_label"] == "CORRECT"
            f1[cell].append(score["f1"])
            # An adversarial question has no gold answer, so no BLEU-1 (docs/evaluation.md).
            if score["bleu1"] is not None:
                bleu[cell].append(score["bleu1"])
    return {
        cell: {
            "questions": c["questions"],
            "scored": c["scored"],
            "failed": c["failed"],
            "judge_correct": c["correct"],
            "f1_mean": sum(f1[cell]) / len(f1[cell]) if f1[cell] else None,
            "bleu1_mean": sum(bleu[cell]) / len(bleu[cell]) if bleu[cell] else None,
        }
        for cell, c in cells.items()
    }


def _table(results: dict[str, Any]) -> dict[str, Any]:
    """The stored results in the shape of `_recompute` (job ids and ratios left out)."""
    keep = ("questions", "scored", "failed", "judge_correct", "f1_mean", "bleu1_mean")
    dataset = results["datasets"]["synthetic"]
    table = {name: {k: m[k] for k in keep} for name, m in dataset["categories"].items()}
    table["overall"] = {k: dataset["overall"][k] for k in keep}
    return table


def _approx(table: dict[str, Any]) -> dict[str, Any]:
    return {
        cell: {k: (pytest.approx(v) if isinstance(v, float) else v) for k, v in m.items()}
        for cell, m in table.items()
    }


async def _assert_exactly_once(db: Any, job_id: str) -> None:
    job = await db.jobs.find_one({"_id": job_id})
    n_chunks, n_questions = job["totals"]["add"], job["totals"]["questions"]
    assert (n_chunks, n_questions) == (12, 30)  # the synthetic dataset's golden plan

    # Every chunk was confirmed by exactly one successful Add call...
    chunks = await db.add_chunks.find({"job_id": job_id}).to_list()
    assert len(chunks) == n_chunks and all(c["state"] == "done" for c in chunks)
    ok_adds = await db.calls.find({"job_id": job_id, "stage": "add", "outcome": "ok"}).to_list()
    assert Counter(c["item_id"] for c in ok_adds) == Counter(c["_id"] for c in chunks)
    assert all(c["validation"] == "valid" for c in ok_adds)

    # ...and per user the calls ran in chunk order, each after the previous one had returned.
    seq = {c["_id"]: (c["user_id"], c["seq"]) for c in chunks}
    by_user: dict[str, list[tuple[int, Any, float]]] = defaultdict(list)
    for call in ok_adds:
        user, n = seq[call["item_id"]]
        by_user[user].append((n, read_time(call["started_at"]), call["latency_ms"]))
    assert len(by_user) == 3
    for calls in by_user.values():
        calls.sort(key=lambda c: c[1])
        assert [n for n, _, _ in calls] == list(range(1, len(calls) + 1))
        for (_, start, latency), (_, next_start, _) in itertools.pairwise(calls):
            assert (next_start - start).total_seconds() * 1000 >= latency - 1

    # Every question was searched (one successful call), answered and scored exactly once.
    ok_searches = await db.calls.find(
        {"job_id": job_id, "stage": "search", "outcome": "ok"}
    ).to_list()
    questions = await db.questions.find({"job_id": job_id}).to_list()
    assert Counter(c["item_id"] for c in ok_searches) == Counter(q["_id"] for q in questions)
    for stage in ("searches", "answers", "scores"):
        docs = await db[stage].find({"job_id": job_id}).to_list()
        assert sorted(d["_id"] for d in docs) == sorted(q["_id"] for q in questions), stage
        assert all(d["state"] == "done" for d in docs), stage

    # Questions were searched only after all Adds of their conversation had succeeded.
    last_add = {}
    for call in ok_adds:
        user = seq[call["item_id"]][0]
        last_add[user] = max(
            last_add.get(user, read_time(call["started_at"])), read_time(call["started_at"])
        )
    user_of = {q["_id"]: q["user_id"] for q in questions}
    for call in ok_searches:
        assert read_time(call["started_at"]) > last_add[user_of[call["item_id"]]]


async def _assert_results_recompute(db: Any, job_id: str, results: dict[str, Any]) -> None:
    questions = await db.questions.find({"job_id": job_id}).to_list()
    scores = {s["_id"]: s async for s in db.scores.find({"job_id": job_id})}
    assert _table(results) == _approx(_recompute(questions, scores))
    assert results["overall"]["questions"] == 26  # 30 minus the 4 adversarial ones


@pytest.fixture(scope="module")
def baseline(platform: Platform) -> dict[str, Any]:
    """A team's first steps: access request, approval, then an undisturbed smoke run, which
    the other tests compare against."""
    memory = start_memory_server(platform.stack, name="memory-baseline")
    version_id, key = _access_granted(platform, memory, "team-baseline")
    job_id = _submit_job(platform, version_id, key, "baseline")
    status = _wait(platform, job_id, key)
    assert status["state"] == "completed", status
    return {
        "job_id": job_id,
        "key": key,
        "version_id": version_id,
        "memory": memory,
        "status": status,
        "results": _results(platform, job_id, key),
    }


async def test_job_runs_every_stage_exactly_once(
    platform: Platform, baseline: dict[str, Any], db: Any
) -> None:
    status = baseline["status"]
    assert status["errors"] == []
    for stage in ("add", "search", "answer", "score"):
        progress = status["stages"][stage]
        assert progress["done"] == progress["total"] > 0 and progress["failed"] == 0
    assert status["spec"]["chunker"] == "chunk-v1"
    # Every job names what it was evaluated with.
    job = await db.jobs.find_one({"_id": baseline["job_id"]})
    evaluation_spec = await db.specs.find_one({"_id": status["spec_hash"]})
    assert evaluation_spec is not None and status["spec"]["spec_hash"] == status["spec_hash"]
    assert evaluation_spec["spec"]["context"]["counter"].startswith("context-v1/llama.cpp-tokenize")
    assert len(status["code_hash"]) == len(status["dataset_bundle_hash"]) == 64
    assert list(status["dataset_bundles"]) == ["synthetic"] == list(job["dataset_bundles"])
    # The context each answer used: within the token budget unless one candidate is over it.
    answers = await db.answers.find({"job_id": baseline["job_id"]}).to_list()
    assert answers and all(a["context_tokens"] <= 200 or a["candidates_used"] == 1 for a in answers)
    assert all(a["candidates_used"] <= a["candidates_returned"] for a in answers)
    await _assert_exactly_once(db, baseline["job_id"])
    await _assert_results_recompute(db, baseline["job_id"], baseline["results"])


async def test_full_run_after_the_smoke_survives_a_killed_answerer(
    platform: Platform, baseline: dict[str, Any], db: Any
) -> None:
    """The journey goes on: the same team's full run of the same version (the smoke passed),
    with the answerer SIGKILLed mid-question. User ids are per job, so the memory server holds
    for this run exactly what it held for the smoke's, and the results must match."""
    key = baseline["key"]
    job_id = _submit_job(platform, baseline["version_id"], key, "full-1", mode="full")

    def answering(status: dict[str, Any]) -> bool:
        return bool(status["stages"]["answer"]["done"] >= 3)

    status = _wait(platform, job_id, key, until=answering)
    assert status["state"] == "running" and status["mode"] == "full", status
    platform.stack.kill("answerer")  # SIGKILL, mid-question: its message is unacknowledged
    await asyncio.sleep(2)
    platform.stack.restart("answerer")

    status = _wait(platform, job_id, key)
    assert status["state"] == "completed", status
    await _assert_exactly_once(db, job_id)
    results = _results(platform, job_id, key)
    await _assert_results_recompute(db, job_id, results)
    assert _table(results) == _approx(_table(baseline["results"]))
    # A full run keeps its questions' values in Overall for the board's ties; the smoke none.
    kept = await Stores.over(db).leaderboard.headline_outcomes_of(job_id)
    assert kept is not None and len(kept.values) == results["overall"]["scored"]
    assert await Stores.over(db).leaderboard.headline_outcomes_of(baseline["job_id"]) is None
    for held_constant in ("spec_hash", "code_hash", "dataset_bundle_hash"):
        assert status[held_constant] == baseline["status"][held_constant]
    # The second full run of the season waits 30 days after this one completed.
    again = httpx.post(
        f"{platform.gateway_url}/v1/jobs",
        headers={"Authorization": f"Bearer {key}"},
        json={"version_id": baseline["version_id"], "mode": "full", "run_label": "full-2",
              "checklist": FULL_CHECKLIST},
        timeout=30,
    )  # fmt: skip
    assert again.status_code == 429, again.text
    assert again.json()["detail"]["next_allowed_at"]


async def test_results_of_another_team_are_not_visible(
    platform: Platform, baseline: dict[str, Any]
) -> None:
    memory = start_memory_server(platform.stack, name="memory-other")
    _, other_key = register_memory_server(platform, memory, team="team-other")
    for path in ("", "/results"):
        response = httpx.get(
            f"{platform.gateway_url}/v1/jobs/{baseline['job_id']}{path}",
            headers={"Authorization": f"Bearer {other_key}"},
            timeout=30,
        )
        assert response.status_code == 404
        assert "reason" in response.json()["detail"]


def test_gateway_rejects_bad_requests_with_reasons(platform: Platform) -> None:
    # A participant whose Health endpoint is down: the job waits for it, shown as paused, and
    # fails with its reason once the outage outlives its window (R-4.13; 15 s here).
    down = MemoryServer(url=f"http://127.0.0.1:{free_port()}", key="unused-key")
    version_id, key = register_memory_server(platform, down, team="team-api")
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=platform.gateway_url, timeout=30) as api:
        job = {"version_id": version_id, "mode": "smoke", "run_label": "api-1"}
        assert api.post("/v1/jobs", json=job).status_code == 401
        wrong = api.post("/v1/jobs", json=job, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["detail"]["reason"]

        unknown = api.post("/v1/jobs", json={**job, "datasets": ["nope"]}, headers=auth)
        assert unknown.status_code == 422 and "nope" in unknown.json()["detail"]["reason"]
        extra = api.post("/v1/jobs", json={**job, "top_k": 5}, headers=auth)
        assert extra.status_code == 422
        foreign = api.post("/v1/jobs", json={**job, "version_id": "ver-x"}, headers=auth)
        assert foreign.status_code == 404

        first = api.post("/v1/jobs", json=job, headers=auth)
        assert first.status_code == 201
        body = first.json()
        assert body["state"] == "queued" and body["run_label"] == "api-1"
        again = api.post("/v1/jobs", json=job, headers=auth)
        assert again.status_code == 409 and "api-1" in again.json()["detail"]["reason"]
        listed = api.get("/v1/jobs", headers=auth).json()
        assert [j["job_id"] for j in listed] == [body["job_id"]]

        # Admin endpoints refuse participant keys.
        assert api.post("/v1/admin/versions", json={}, headers=auth).status_code == 403

    waiting = httpx.get(
        f"{platform.gateway_url}/v1/jobs/{body['job_id']}", headers=auth, timeout=30
    ).json()
    deadline = time.monotonic() + 30
    while not waiting["paused"] and waiting["state"] == "queued":
        assert time.monotonic() < deadline, waiting
        time.sleep(0.2)
        waiting = httpx.get(
            f"{platform.gateway_url}/v1/jobs/{body['job_id']}", headers=auth, timeout=30
        ).json()
    assert waiting["state"] == "queued"
    assert waiting["paused"][0]["message"].startswith("paused: participant unreachable since ")
    status = _wait(platform, body["job_id"], key)
    assert status["state"] == "failed"
    assert [e["kind"] for e in status["errors"]] == ["participant_outage"]
    assert "Health" in status["errors"][0]["reason"]
    assert "longer than AML_PARTICIPANT_OUTAGE_SECONDS = 15 s" in status["errors"][0]["reason"]
    early = httpx.get(
        f"{platform.gateway_url}/v1/jobs/{body['job_id']}/results", headers=auth, timeout=30
    )
    assert early.status_code == 409


def test_secret_is_not_stored_or_logged_in_the_clear(
    platform: Platform, baseline: dict[str, Any]
) -> None:
    """The baseline team's Memory System Key went in through an access request and was sent
    with every Add and Search of its smoke run: it must appear in no database file, broker
    file, service log or API response."""
    canary = baseline["memory"].key.encode()
    key, job_id = baseline["key"], baseline["job_id"]
    with httpx.Client(
        base_url=platform.gateway_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as api:
        responses = [
            api.get(path)
            for path in (
                "/v1/jobs",
                f"/v1/jobs/{job_id}",
                f"/v1/jobs/{job_id}/results",
                f"/v1/jobs/{job_id}/audit?limit=500",
                "/v1/versions",
            )
        ]
    assert all(r.status_code == 200 for r in responses)
    for response in responses:
        assert canary not in response.content
    scanned = 0
    for folder in ("mongo", "nats", "logs", "traces"):
        for path in (platform.stack.data_dir / folder).rglob("*"):
            if path.is_file():
                scanned += 1
                assert canary not in path.read_bytes(), path
    logs = {p.stem for p in (platform.stack.data_dir / "logs").glob("*.log")}
    assert {"gateway", "scheduler", "adder", "searcher", "answerer", "scorer"} <= logs
    assert list((platform.stack.data_dir / "traces").glob("*.jsonl")), "no span files"
    assert scanned > 10


def test_declared_capacity_holds_across_replicas(platform: Platform) -> None:
    """Two adder and two searcher processes against one participant that declared room for two
    requests at a time: the participant never sees more than two at once (R-4.12)."""
    platform.start_worker("adder", replica=1)
    platform.start_worker("searcher", replica=1)
    slow = EndpointScript(latency=0.2)
    simulator = Simulator(Script(add=slow, search=slow))
    with running_simulator(simulator) as url:
        job_id, key = _simulated_job(
            platform, url, "team-capacity", {"max_concurrency": 2, "max_rps": 50}
        )

        def searched(status: dict[str, Any]) -> bool:
            search = status["stages"]["search"]
            return bool(search["total"] and search["done"] + search["failed"] == search["total"])

        status = _wait(platform, job_id, key, until=searched)
        assert status["stages"]["add"]["done"] == 12, status
        records = [r for r in simulator.requests if r.endpoint in ("add", "search")]
        assert len(records) == 12 + 30
        # Concurrency at arrival, counted over Add and Search together, this request included.
        assert max(r.total_concurrency_at_arrival for r in records) <= 2
        assert (
            max(r.total_concurrency_at_arrival for r in records) == 2
        )  # the limit was actually reached


def _simulated_job(
    platform: Platform, url: str, team: str, capacity: dict[str, float] | None = None
) -> tuple[str, str]:
    """Register the simulator at `url` as a team's version and submit a smoke job for it."""
    # A system name belongs to one team.
    version_id, key = register_participant(platform, url, team, f"sim-{team}", capacity=capacity)
    return _submit_job(platform, version_id, key, team), key


async def test_add_authentication_error_fails_the_job_at_once(platform: Platform, db: Any) -> None:
    script = Script(add=EndpointScript(then=Outcome(status=401)))
    simulator = Simulator(script)
    with running_simulator(simulator) as url:
        job_id, key = _simulated_job(platform, url, "team-401")
        status = _wait(platform, job_id, key)
    assert status["state"] == "failed"
    assert {e["kind"] for e in status["errors"]} == {"authentication_error"}
    assert all("HTTP 401" in e["reason"] for e in status["errors"])
    # 401 is final: one request per chunk that was sent, never a retry, no search.
    adds = [r for r in simulator.requests if r.endpoint == "add"]
    assert len({r.body for r in adds}) == len(adds) <= 3
    assert not [r for r in simulator.requests if r.endpoint == "search"]
    calls = await db.calls.find({"job_id": job_id}).to_list()
    seen = [(c["item_id"], c["status"], c["outcome"], c.get("error_class")) for c in calls]
    assert calls and all((c["status"], c["outcome"]) == (401, "final") for c in calls), seen


async def test_search_contract_violation_fails_the_job_with_its_reason(
    platform: Platform, db: Any
) -> None:
    retried_add = [Outcome(status=503), Outcome(status=503)]
    script = Script(
        add=EndpointScript(responses=retried_add),
        search=EndpointScript(then=Outcome(mode="items_wrapper")),
    )
    simulator = Simulator(script)
    with running_simulator(simulator) as url:
        job_id, key = _simulated_job(platform, url, "team-items")
        status = _wait(platform, job_id, key)
    assert status["state"] == "failed"
    reasons = {e["reason"] for e in status["errors"] if e["kind"] == "contract_error"}
    assert reasons == {"search response: `data` is missing (an `items` wrapper is not allowed)"}
    # Every Add was answered 503 twice before being accepted: the accepted ones took three
    # attempts, all with the same bytes (Adds still retrying when the job failed are cut off).
    adds: dict[str, list[bytes]] = defaultdict(list)
    for record in simulator.requests:
        if record.endpoint == "add":
            adds[record.sequence_key or ""].append(record.body)
    accepted = await db.calls.find({"job_id": job_id, "stage": "add", "outcome": "ok"}).to_list()
    assert accepted and all(c["validation"] == "valid" for c in accepted)
    for call in accepted:
        assert len(adds[call["item_id"]]) == 3
    assert all(len(set(bodies)) == 1 for bodies in adds.values())
    judged = await db.calls.find({"job_id": job_id, "stage": "search", "outcome": "ok"}).to_list()
    assert judged and all(c.get("validation") in reasons for c in judged)


async def test_no_request_reaches_the_participant_after_its_job_failed(
    platform: Platform,
) -> None:
    """Declared concurrency 1: once the Search whose answer broke the contract has arrived,
    nothing more arrives — the job's queued Searches and Adds were dropped before any call."""
    script = Script(search=EndpointScript(then=Outcome(mode="items_wrapper")))
    simulator = Simulator(script)
    with running_simulator(simulator) as url:
        capacity = {"max_concurrency": 1, "max_rps": 50}
        job_id, key = _simulated_job(platform, url, "team-stopped", capacity)
        status = _wait(platform, job_id, key)
        time.sleep(2.0)  # anything still queued or admitted would arrive by now
    assert status["state"] == "failed"
    searches = [r for r in simulator.requests if r.endpoint == "search"]
    assert len(searches) == 1, [r.sequence_key for r in searches]
    failing = searches[0]
    assert [r for r in simulator.requests if r.arrived_monotonic > failing.arrived_monotonic] == []


async def test_add_resent_byte_identical_after_the_adder_is_killed(platform: Platform) -> None:
    # Every chunk's first Add attempt takes 5 s; the adder is killed while it waits, so the
    # broker redelivers the work and a restarted adder sends the chunk again.
    script = Script(add=EndpointScript(responses=[Outcome(mode="slow", delay_s=5)]))
    simulator = Simulator(script)
    with running_simulator(simulator) as url:
        job_id, key = _simulated_job(platform, url, "team-restart")
        deadline = time.monotonic() + 60
        while not simulator.peak_concurrency.get("add"):
            assert time.monotonic() < deadline, "no Add arrived"
            await asyncio.sleep(0.1)
        for name in ("adder", "adder-1"):
            if name in platform.stack.processes and platform.stack.process(name).is_running():
                platform.stack.kill(name)
        await asyncio.sleep(1)
        platform.start_worker("adder", replica=2)

        def added(status: dict[str, Any]) -> bool:
            return bool(status["stages"]["add"]["done"] == 12)

        status = _wait(platform, job_id, key, until=added)
        assert status["stages"]["add"]["done"] == 12, status
    by_key: dict[str, list[bytes]] = defaultdict(list)
    for record in simulator.requests:
        if record.endpoint == "add":
            by_key[record.sequence_key or ""].append(record.body)
    resent = [bodies for bodies in by_key.values() if len(bodies) > 1]
    assert resent, "no chunk was sent twice"
    assert all(len(set(bodies)) == 1 for bodies in by_key.values())


STAGE_SPANS = {"aml.release", "aml.add", "aml.search", "aml.answer", "aml.score"}


def _spans_of(platform: Platform, item_id: str, services: set[str]) -> dict[str, list[TraceSpan]]:
    """The traces of a work item, once spans from `services` are in the files (each service
    exports in batches every two seconds)."""
    deadline = time.monotonic() + 30
    while True:
        found = traces_of(read_spans(platform.stack.data_dir / "traces"), item_id)
        if services <= {s.service for spans in found.values() for s in spans}:
            return found
        assert time.monotonic() < deadline, f"spans of {item_id} missing: {found}"
        time.sleep(1)


async def test_each_item_is_one_trace_across_the_services(
    platform: Platform, baseline: dict[str, Any], db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-8.3: an Add chunk's trace holds the scheduler's release, the adder's work and the HTTP
    client span to the participant; a question's also the searcher, answerer and scorer."""
    job_id = baseline["job_id"]
    chunk = await db.add_chunks.find_one({"job_id": job_id}, sort=[("seq", 1)])
    question = await db.questions.find_one({"job_id": job_id})
    for item, expected, stages in (
        (chunk, {"scheduler", "adder"}, ["aml.release", "aml.add", "participant.add"]),
        (
            question,
            {"scheduler", "searcher", "answerer", "scorer"},
            [
                "aml.release",
                "aml.search",
                "participant.search",
                "aml.answer",
                "llm.chat",
                "aml.score",
            ],
        ),
    ):
        found = _spans_of(platform, item["_id"], expected)
        assert list(found) == [item["trace_id"]], "one trace, the one stored on the item"
        spans = found[item["trace_id"]]
        assert expected <= {s.service for s in spans}
        names = [s.name for s in spans]
        assert all(stage in names for stage in stages), names
        # The participant call is a child span with an HTTP client span below it.
        attempt = next(s for s in spans if s.name.startswith("participant."))
        http = [s for s in spans if s.parent_id == attempt.span_id]
        assert http and http[0].attributes.get("http.response.status_code", 200) == 200
        ours = [s for s in spans if s.name in STAGE_SPANS]
        assert ours and all(s.attributes.get("aml.job_id") == job_id for s in ours)
        assert all(s.attributes.get("aml.item_id") == item["_id"] for s in ours)
        # Only an Add's spans name a contract request_id (the same id).
        request_ids = {s.attributes.get("aml.request_id") for s in ours}
        assert request_ids == ({item["_id"]} if item is chunk else {None})

    # `aml trace` prints the tree of the Add's trace.
    assert main(["trace", chunk["_id"], "--data-dir", str(platform.stack.data_dir)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"trace {chunk['trace_id']}"
    assert any("aml.release  [scheduler]" in line for line in printed)
    assert any("participant.add  [adder]" in line for line in printed)
    # ...and, by the question's item id, the question's.
    assert main(["trace", question["_id"], "--data-dir", str(platform.stack.data_dir)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"trace {question['trace_id']}"
    assert any("aml.score  [scorer]" in line for line in printed)
