"""The participant simulator as its users see it: a real HTTP server on a loopback port, spoken
to with httpx, whose scripted behaviour must be exactly what the script says."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from aml_contract.participant import AddRequest, Message, SearchRequest, encode
from aml_participant_simulator import (
    NOT_JSON_BODY,
    TOTAL,
    Script,
    Simulator,
    SimulatorSnapshot,
    running_simulator,
    serving_simulator,
)
from aml_participant_simulator.latency import LatencySampler
from aml_participant_simulator.script import LognormalLatency
from aml_pipeline.participants import CallFailed, validate_add_response, validate_search_response

JSON = {"Content-Type": "application/json"}


def add_body(request_id: str, user: str, text: str, session: str = "s1") -> bytes:
    request = AddRequest(
        request_id=request_id,
        messages=[Message(role="user", content=text, timestamp=1_700_000_000_000)],
        user_id=user,
        session_id=session,
    )
    return encode(request)


def search_body(user: str, query: str, top_k: int = 5) -> bytes:
    return encode(SearchRequest(query=query, user_id=user, top_k=top_k))


def script(value: dict[str, Any]) -> Script:
    # Through JSON, as scripts are written: this also checks that the JSON form loads.
    return Script.model_validate_json(json.dumps(value))


def test_ok_add_then_search_round_trip() -> None:
    simulator = Simulator(Script())
    with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
        assert http.get("/health").status_code == 200
        added = http.post("/add", content=add_body("r1", "u1", "I adopted a cat named Miso"))
        assert added.status_code == 200
        validate_add_response(added.json(), "r1", "u1", "s1")
        # A retry of the same request_id is idempotent: answered again, stored once.
        again = http.post("/add", content=add_body("r1", "u1", "I adopted a cat named Miso"))
        assert again.json() == added.json()
        http.post("/add", content=add_body("r2", "u1", "the weather was rainy"))
        found = http.post("/search", content=search_body("u1", "What is my cat called?"))
        assert found.status_code == 200
        items = validate_search_response(found.json(), 5)
        assert [item.id for item in items] == ["r1#0"]
        assert items[0].content == "I adopted a cat named Miso"
        assert items[0].created_at == "2023-11-14T22:13:20.000Z"
        # Another user's scope holds nothing.
        other = http.post("/search", content=search_body("u2", "What is my cat called?"))
        assert other.json() == {"data": []}
    assert len(simulator.memories) == 2
    assert [r.outcome for r in simulator.requests] == ["ok"] * 6


def test_429_with_retry_after_then_success_per_request_id() -> None:
    simulator = Simulator(
        script(
            {
                "add": {
                    "responses": [{"status": 429, "headers": {"Retry-After": "2"}}, {"status": 200}]
                }
            }
        )
    )
    with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
        first = http.post("/add", content=add_body("r1", "u1", "hello"))
        assert (first.status_code, first.headers["retry-after"], first.content) == (429, "2", b"")
        # The sequence is per request_id: r2 starts its own.
        assert http.post("/add", content=add_body("r2", "u1", "hi")).status_code == 429
        retried = http.post("/add", content=add_body("r1", "u1", "hello"))
        assert retried.status_code == 200
        validate_add_response(retried.json(), "r1", "u1", "s1")
        # Past the end of the sequence, `then` (normal success) applies.
        assert http.post("/add", content=add_body("r1", "u1", "hello")).status_code == 200
    records = simulator.requests
    assert [(r.sequence_key, r.attempt, r.status) for r in records] == [
        ("r1", 0, 429),
        ("r2", 0, 429),
        ("r1", 1, 200),
        ("r1", 2, 200),
    ]
    assert [m.id for m in simulator.memories] == ["r1#0"]


def test_by_key_sequences_and_custom_bodies() -> None:
    simulator = Simulator(
        script(
            {
                "search": {
                    "by_key": {"boom": [{"status": 500, "body": "upstream exploded"}]},
                    "responses": [
                        {"status": 503, "body_base64": base64.b64encode(b"\xff\x00").decode()}
                    ],
                }
            }
        )
    )
    with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
        boom = http.post("/search", content=search_body("u1", "boom"))
        assert (boom.status_code, boom.content) == (500, b"upstream exploded")
        other = http.post("/search", content=search_body("u1", "other"))
        assert (other.status_code, other.content) == (503, b"\xff\x00")
        assert http.post("/search", content=search_body("u1", "boom")).status_code == 200


@pytest.mark.parametrize("abort", [False, True])
def test_drop_closes_the_connection_without_a_response(abort: bool) -> None:
    simulator = Simulator(script({"add": {"responses": [{"mode": "drop", "abort": abort}]}}))
    with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
        with pytest.raises(httpx.TransportError):
            http.post("/add", content=add_body("r1", "u1", "hello"))
        # The server is unharmed: the retry gets the normal answer.
        assert http.post("/add", content=add_body("r1", "u1", "hello")).status_code == 200
    dropped = simulator.requests[0]
    assert (dropped.outcome, dropped.status) == ("drop", None)
    # Without persist the dropped write was not stored; the retry stored it once.
    assert [m.id for m in simulator.memories] == ["r1#0"]


def test_drop_after_persisting() -> None:
    simulator = Simulator(script({"add": {"responses": [{"mode": "drop", "persist": True}]}}))
    with (
        running_simulator(simulator) as url,
        httpx.Client(base_url=url) as http,
        pytest.raises(httpx.TransportError),
    ):
        http.post("/add", content=add_body("r1", "u1", "hello"))
    assert [m.id for m in simulator.memories] == ["r1#0"]


ADD_OK = {"success": True, "request_id": "r1", "user_id": "u1", "session_id": "s1"}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("missing_ids", {"success": True}),
        ("success_false", {**ADD_OK, "success": False}),
        ("wrong_request_id", {**ADD_OK, "request_id": "r1:wrong"}),
    ],
)
def test_malformed_add_bodies(mode: str, expected: dict[str, Any]) -> None:
    with (
        running_simulator(script({"add": {"responses": [{"mode": mode}]}})) as url,
        httpx.Client(base_url=url) as http,
    ):
        response = http.post("/add", content=add_body("r1", "u1", "hello"))
    assert response.status_code == 200
    assert response.content == json.dumps(expected, separators=(",", ":")).encode()
    with pytest.raises(CallFailed):
        validate_add_response(response.json(), "r1", "u1", "s1")


MEMORY = {
    "id": "r1#0",
    "content": "my cat Miso",
    "score": 1.0,
    "created_at": "2023-11-14T22:13:20.000Z",
}


def pad(index: int) -> dict[str, Any]:
    return {"id": f"sim-pad-{index}", "content": f"padding memory {index}", "score": 0.0}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("missing_ids", {"data": [{k: v for k, v in MEMORY.items() if k != "id"}]}),
        ("items_wrapper", {"items": [MEMORY]}),
        ("top_level_array", [MEMORY]),
        ("too_many_items", {"data": [MEMORY, pad(0), pad(1), pad(2)]}),
        ("empty_id", {"data": [{**MEMORY, "id": ""}]}),
        ("empty_content", {"data": [{**MEMORY, "content": ""}]}),
        ("non_numeric_score", {"data": [{**MEMORY, "score": "high"}]}),
    ],
)
def test_malformed_search_bodies(mode: str, expected: Any) -> None:
    top_k = 3
    with (
        running_simulator(script({"search": {"responses": [{"mode": mode}]}})) as url,
        httpx.Client(base_url=url) as http,
    ):
        http.post("/add", content=add_body("r1", "u1", "my cat Miso"))
        response = http.post("/search", content=search_body("u1", "cat", top_k))
        normal = http.post("/search", content=search_body("u1", "cat", top_k))
    assert response.status_code == 200
    assert response.content == json.dumps(expected, separators=(",", ":")).encode()
    with pytest.raises(CallFailed):
        validate_search_response(response.json(), top_k)
    assert normal.json() == {"data": [MEMORY]}


def test_malformed_search_body_without_results_still_has_the_defect() -> None:
    with (
        running_simulator(script({"search": {"responses": [{"mode": "empty_id"}]}})) as url,
        httpx.Client(base_url=url) as http,
    ):
        response = http.post("/search", content=search_body("u1", "anything"))
    assert response.json() == {"data": [{**pad(0), "id": ""}]}


@pytest.mark.parametrize("endpoint", ["add", "search", "health"])
def test_not_json(endpoint: str) -> None:
    with (
        running_simulator(script({endpoint: {"responses": [{"mode": "not_json"}]}})) as url,
        httpx.Client(base_url=url) as http,
    ):
        if endpoint == "health":
            response = http.get("/health")
        else:
            body = add_body("r1", "u1", "x") if endpoint == "add" else search_body("u1", "x")
            response = http.post(f"/{endpoint}", content=body)
    assert response.content == NOT_JSON_BODY
    assert response.headers["content-type"] == "application/json"


def test_async_202_then_polling_until_done() -> None:
    simulator = Simulator(
        script({"add": {"responses": [{"mode": "async_202", "pending_polls": 2}]}})
    )
    with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
        accepted = http.post("/add", content=add_body("r1", "u1", "my cat Miso"))
        assert accepted.status_code == 202
        task_id = accepted.json()["task_id"]
        polls = [http.get(f"/tasks/{task_id}").json() for _ in range(2)]
        assert polls == [{"status": "pending"}, {"status": "pending"}]
        # Not searchable while pending.
        assert http.post("/search", content=search_body("u1", "cat")).json() == {"data": []}
        done = http.get(f"/tasks/{task_id}").json()
        assert done == {"status": "done", "result": ADD_OK}
        assert http.get(f"/tasks/{task_id}").json() == done
        assert len(http.post("/search", content=search_body("u1", "cat")).json()["data"]) == 1
        assert http.get("/tasks/no-such-task").status_code == 404
    assert [r.endpoint for r in simulator.requests].count("tasks") == 5


def test_async_202_task_failure() -> None:
    failing = {"mode": "async_202", "pending_polls": 1, "task_result": "failed"}
    with (
        running_simulator(script({"add": {"responses": [failing]}})) as url,
        httpx.Client(base_url=url) as http,
    ):
        task_id = http.post("/add", content=add_body("r1", "u1", "x")).json()["task_id"]
        assert http.get(f"/tasks/{task_id}").json() == {"status": "pending"}
        assert http.get(f"/tasks/{task_id}").json()["status"] == "failed"
        assert http.post("/search", content=search_body("u1", "x")).json() == {"data": []}


async def test_capacity_reject_429_above_max_concurrency() -> None:
    simulator = Simulator(
        script(
            {
                "add": {
                    "latency": 0.5,
                    "capacity": {
                        "max_concurrency": 2,
                        "on_excess": "reject_429",
                        "retry_after": 1,
                    },
                }
            }
        )
    )
    async with serving_simulator(simulator) as url, httpx.AsyncClient(base_url=url) as http:
        responses = await asyncio.gather(
            *(http.post("/add", content=add_body(f"r{i}", "u1", "x")) for i in range(6))
        )
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200, 200, 429, 429, 429, 429]
    assert all(r.headers["retry-after"] == "1" for r in responses if r.status_code == 429)
    assert simulator.peak_active["add"] == 2
    records = simulator.requests
    assert sorted(r.outcome for r in records) == ["ok", "ok"] + ["reject_429"] * 4
    # A rejection means both slots were taken on arrival: at least three in flight.
    rejected = [r for r in records if r.outcome == "reject_429"]
    assert min(r.concurrency_at_arrival for r in rejected) >= 3
    assert simulator.peak_concurrency["add"] == max(r.concurrency_at_arrival for r in records)


async def test_participant_wide_capacity_reject_503() -> None:
    simulator = Simulator(
        script(
            {
                "capacity": {"max_concurrency": 1, "on_excess": "reject_503"},
                "add": {"latency": 0.5},
            }
        )
    )
    async with serving_simulator(simulator) as url, httpx.AsyncClient(base_url=url) as http:
        slow = asyncio.create_task(http.post("/add", content=add_body("r1", "u1", "x")))
        await asyncio.sleep(0.2)
        rejected = await http.post("/search", content=search_body("u1", "x"))
        # Health is outside the participant-wide limit: it is a probe, not load.
        health = await http.get("/health")
        assert (await slow).status_code == 200
    assert (rejected.status_code, health.status_code) == (503, 200)
    search_record = next(r for r in simulator.requests if r.endpoint == "search")
    assert (search_record.outcome, search_record.total_concurrency_at_arrival) == ("reject_503", 2)
    assert simulator.peak_concurrency[TOTAL] >= 2


async def test_queue_mode_never_serves_more_than_max_concurrency() -> None:
    simulator = Simulator(script({"search": {"latency": 0.1, "capacity": {"max_concurrency": 2}}}))
    started = time.monotonic()
    async with serving_simulator(simulator) as url, httpx.AsyncClient(base_url=url) as http:
        responses = await asyncio.gather(
            *(http.post("/search", content=search_body("u1", f"q{i}")) for i in range(8))
        )
    elapsed = time.monotonic() - started
    assert [r.status_code for r in responses] == [200] * 8
    assert simulator.peak_active["search"] == 2
    assert simulator.peak_concurrency["search"] == 8
    # Eight requests, two at a time, 0.1 s each: at least four rounds.
    assert elapsed >= 0.4
    # All eight were in flight together, so their arrivals saw 1..8 requests in flight.
    assert sorted(r.concurrency_at_arrival for r in simulator.requests) == list(range(1, 9))


def test_recording_keeps_exact_bytes_headers_and_times() -> None:
    # Not the canonical encoding: odd spacing and raw UTF-8, which must survive byte for byte.
    body = (
        '{ "user_id":"u1", "session_id":"s1","request_id" : "r1",'
        '"messages":[{"role":"user","content":"café ☕"}] }'
    ).encode()
    simulator = Simulator(Script())
    wall_before = time.time()
    with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
        assert (
            http.post("/add", content=body, headers={**JSON, "X-Trace": "t-1"}).status_code == 200
        )
        (record,) = simulator.requests
        snapshot = SimulatorSnapshot.model_validate_json(http.get("/_sim/requests").content)
        raw = http.get("/_sim/requests").json()
        assert http.post("/_sim/reset").json() == {"reset": True, "kept_memories": False}
        assert http.get("/_sim/requests").json()["requests"] == []
    assert record.body == body
    assert record.header("x-trace") == "t-1"
    assert record.header("content-type") == "application/json"
    assert (record.method, record.path, record.endpoint) == ("POST", "/add", "add")
    assert record.concurrency_at_arrival == 1
    assert record.total_concurrency_at_arrival == 1
    assert record.arrived_monotonic <= record.finished_monotonic
    assert record.arrived_at.timestamp() >= wall_before
    # Out of process: the same record, its body as base64.
    assert snapshot.requests == [record]
    assert base64.b64decode(raw["requests"][0]["body"]) == body
    assert raw["peak_concurrency"]["add"] == 1
    assert simulator.requests == []
    assert simulator.memories == []


def test_leakage_returns_another_users_memory() -> None:
    with (
        running_simulator(script({"search": {"leak": {"count": 1}}})) as url,
        httpx.Client(base_url=url) as http,
    ):
        http.post("/add", content=add_body("a1", "alice", "alice likes tea"))
        http.post("/add", content=add_body("b1", "bob", "bob likes coffee"))
        found = http.post("/search", content=search_body("alice", "what does alice drink"))
    items = found.json()["data"]
    assert [item["id"] for item in items] == ["b1#0", "a1#0"]
    assert items[0]["score"] > items[1]["score"]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": "Token sim-key"}, 401),
        ({"Authorization": "Bearer sim-key"}, 200),
    ],
)
def test_auth(headers: dict[str, str], status: int) -> None:
    simulator = Simulator(script({"auth": {"method": "bearer", "key": "sim-key"}}))
    with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
        assert (
            http.post("/search", content=search_body("u1", "x"), headers=headers).status_code
            == status
        )
        # Health is unauthenticated.
        assert http.get("/health").status_code == 200
    assert simulator.requests[0].outcome == ("ok" if status == 200 else "unauthorized")


def test_latency_distribution_is_reproducible_with_a_seed() -> None:
    def latencies(seed: int) -> list[float]:
        simulator = Simulator(
            script(
                {
                    "health": {
                        "latency": {"kind": "uniform", "low": 0.01, "high": 0.05, "seed": seed}
                    }
                }
            )
        )
        with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
            for _ in range(4):
                started = time.monotonic()
                http.get("/health")
                # The drawn latency was really applied.
                assert time.monotonic() - started >= 0.01
        records = simulator.requests
        for record in records:
            assert record.finished_monotonic - record.arrived_monotonic >= record.latency_s
        return [record.latency_s for record in records]

    first, again, other = latencies(7), latencies(7), latencies(8)
    assert first == again
    assert first != other
    assert all(0.01 <= value <= 0.05 for value in first)
    lognormal = LognormalLatency(kind="lognormal", mu=-3.0, sigma=1.0, max_seconds=0.2, seed=3)
    draws = [LatencySampler(lognormal) for _ in range(2)]
    assert [draws[0].sample() for _ in range(50)] == [draws[1].sample() for _ in range(50)]


def test_script_rejects_modes_an_endpoint_cannot_honour() -> None:
    with pytest.raises(ValidationError, match="not available"):
        script({"health": {"responses": [{"mode": "too_many_items"}]}})
    with pytest.raises(ValidationError, match="leak applies to search only"):
        script({"add": {"leak": {}}})
    with pytest.raises(ValidationError, match="slow mode needs delay_s"):
        script({"add": {"responses": [{"mode": "slow"}]}})


def test_command_line_serves_a_script_file(tmp_path: Path) -> None:
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps({"add": {"responses": [{"status": 429}]}}))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aml_participant_simulator",
            "--port",
            "0",
            "--script",
            str(script_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        deadline = time.monotonic() + 10
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        assert httpx.post(f"{url}/add", content=add_body("r1", "u1", "x")).status_code == 429
        records = httpx.get(f"{url}/_sim/requests").json()["requests"]
        assert [r["outcome"] for r in records] == ["ok", "status"]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_refuses_non_loopback_hosts() -> None:
    with pytest.raises(ValueError, match="loopback"), running_simulator(Script(), host="0.0.0.0"):
        pass


def test_slow_answers_late_enough_to_time_a_client_out() -> None:
    simulator = Simulator(script({"search": {"responses": [{"mode": "slow", "delay_s": 0.3}]}}))
    with running_simulator(simulator) as url, httpx.Client(base_url=url) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/search", content=search_body("u1", "x"), timeout=0.1)
        started = time.monotonic()
        assert http.post("/search", content=search_body("u1", "y")).status_code == 200
        assert time.monotonic() - started >= 0.3
        # Past its sequence, the first query is answered at once.
        assert http.post("/search", content=search_body("u1", "x"), timeout=0.2).status_code == 200
