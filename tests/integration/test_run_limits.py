"""Declared run limits (R-3.1): the request budget of a run is counted in the nx-27017 MongoDB
wire server across clients, as replicas would count it, against the real participant simulator
over loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr
from pymongo import AsyncMongoClient

from aml_contract.participant import SearchRequest, encode
from aml_participant_simulator import Outcome, Script, Simulator, running_simulator
from aml_participant_simulator.script import EndpointScript, ScriptedAuth
from aml_pipeline.capacity import Capacity, CapacityLimiter
from aml_pipeline.participants import Attempt, CallFailed, Endpoint, ParticipantClient
from aml_runtime.settings import ParticipantCallSettings
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

KEY = "sim-key"


async def _ignore(_: Attempt) -> None:
    return None


@pytest.fixture
async def clients(mongo_url: str) -> AsyncIterator[list[ParticipantClient]]:
    """Two participant clients with their own database connections: two replicas."""
    settings = ParticipantCallSettings(
        allow_loopback_targets=True,
        participant_backoff_base_seconds=0.001,
        participant_backoff_max_seconds=0.004,
    )
    mongos: list[AsyncMongoClient[dict[str, Any]]] = [AsyncMongoClient(mongo_url) for _ in "ab"]
    made = [
        ParticipantClient.from_settings(settings, CapacityLimiter(Stores.over(m["aml_run_limits"])))
        for m in mongos
    ]
    yield made
    for client in made:
        await client.aclose()
    for mongo in mongos:
        await mongo.close()


def endpoint(url: str, run_key: str, max_requests: int | None) -> Endpoint:
    return Endpoint(
        add_url=f"{url}/add",
        search_url=f"{url}/search",
        health_url=f"{url}/health",
        auth_method="bearer",
        secret=SecretStr(KEY),
        capacity=Capacity(key=f"cap-{run_key}", max_concurrency=4, max_rps=10.0),
        run_key=run_key,
        max_requests=max_requests,
    )


def search(query: str) -> bytes:
    return encode(SearchRequest(query=query, user_id="user-1", top_k=3))


async def test_a_run_stops_at_its_declared_request_limit(clients: list[ParticipantClient]) -> None:
    # The first query is answered 503 once: its retry is a request and counts.
    script = Script(
        auth=ScriptedAuth(method="bearer", key=KEY),
        search=EndpointScript(by_key={"q1": [Outcome(status=503)]}),
    )
    simulator = Simulator(script)
    with running_simulator(simulator) as url:
        first, second = clients
        limited = endpoint(url, "job-limited", max_requests=3)
        assert await first.search(limited, search("q1"), 3, _ignore) == []  # 2 requests
        assert await second.search(limited, search("q2"), 3, _ignore) == []  # the 3rd
        with pytest.raises(CallFailed) as refused:
            await first.search(limited, search("q3"), 3, _ignore)
        assert refused.value.kind == "run_limit_reached"
        assert "3 requests" in refused.value.reason
        assert len(simulator.requests) == 3  # the refused one never left

        # Another run, and a run without a declared limit, are not affected.
        assert await first.search(endpoint(url, "job-other", 1), search("q4"), 3, _ignore) == []
        for _ in range(4):
            await second.search(endpoint(url, "job-free", None), search("q5"), 3, _ignore)
        assert len(simulator.requests) == 3 + 1 + 4


async def test_audited_latency_is_the_participants_time_only(
    clients: list[ParticipantClient],
) -> None:
    """R-7.3: a participant answering in 0.2 s is audited at about 0.2 s even when the platform
    had to wait a second for its declared rate; that wait is recorded apart as queued_ms."""
    script = Script(auth=ScriptedAuth(method="bearer", key=KEY), search=EndpointScript(latency=0.2))
    simulator = Simulator(script)
    attempts: list[Attempt] = []

    async def keep(attempt: Attempt) -> None:
        attempts.append(attempt)

    with running_simulator(simulator) as url:
        one_per_second = endpoint(url, "job-latency", None).model_copy(
            update={"capacity": Capacity(key="cap-latency", max_concurrency=4, max_rps=1.0)}
        )
        client = clients[0]
        await client.search(one_per_second, search("first"), 3, keep)
        await client.search(one_per_second, search("second"), 3, keep)
    first, second = attempts
    for attempt in attempts:
        assert 200 <= attempt.latency_ms < 700, attempt
    # The second waited for the rate slot the first used: a second (plus the margin) after the
    # first left, less the first's own 0.2 s.
    assert second.queued_ms >= 700, second
    assert first.queued_ms < second.queued_ms
