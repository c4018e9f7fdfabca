"""Every worker's /health, /ready and /metrics (aml_runtime.metrics, wired by service.serve) and
the gateway's readiness checks, against a real nats-server and nx-27017: ready when both
answer, 503 with the reason when MongoDB does not, and the named metrics after recorded work."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from openai import AsyncOpenAI
from prometheus_client import REGISTRY
from pydantic import SecretStr
from pymongo import AsyncMongoClient

from aml_contract import subjects
from aml_devtools.processes import free_port
from aml_gateway.main import create_app
from aml_gateway.settings import GatewaySettings
from aml_pipeline.audit import CallRecorder
from aml_pipeline.llm import complete
from aml_pipeline.outages import Outages
from aml_pipeline.participants import Attempt
from aml_pipeline.progress import count_final
from aml_runtime.broker import declare_streams, make_broker
from aml_runtime.clock import now_us
from aml_runtime.db import Document
from aml_runtime.metrics import OpsServer, observe_backlog, process_checks
from aml_runtime.secrets import SecretBox
from aml_runtime.service import open_runtime, serve
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def worker(nats_url: str, mongo_url: str) -> AsyncIterator[tuple[str, CommonSettings]]:
    """A worker process's runtime started through `serve`, exactly as every service does."""
    port = free_port()
    settings = CommonSettings(
        nats_url=nats_url,
        mongo_url=mongo_url,
        mongo_db=f"metrics_{uuid.uuid4().hex[:8]}",
        metrics_port=port,
        metrics_host="127.0.0.1",
    )
    app = serve(open_runtime("metrics-test", settings))
    await app.start()
    try:
        yield f"http://127.0.0.1:{port}", settings
    finally:
        await app.stop()


async def test_worker_is_healthy_and_ready_when_nats_and_mongodb_answer(
    worker: tuple[str, CommonSettings],
) -> None:
    base, _ = worker
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        health = await http.get(f"{base}/health")
        ready = await http.get(f"{base}/ready")
        missing = await http.get(f"{base}/nothing")
    assert health.status_code == 200
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"status": "ok"}
    assert missing.status_code == 404


async def test_ready_is_503_with_the_reason_when_mongodb_is_unreachable(nats_url: str) -> None:
    broker = make_broker(CommonSettings(nats_url=nats_url))
    await broker.connect()
    # A port nothing listens on: every MongoDB operation fails or hangs until the bound.
    closed = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"
    client: AsyncMongoClient[Document] = AsyncMongoClient(closed, serverSelectionTimeoutMS=300)
    ops = OpsServer(process_checks(broker, client["aml"], 1.0, None), timeout=1.0)
    port = await ops.start("127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            response = await http.get(f"http://127.0.0.1:{port}/ready")
    finally:
        await ops.stop()
        await client.close()
        await broker.stop()
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not_ready"
    # Only MongoDB is named: NATS answered.
    assert set(body["reasons"]) == {"mongodb"}, body


async def test_ready_names_an_unreachable_llm(nats_url: str, mongo_url: str) -> None:
    broker = make_broker(CommonSettings(nats_url=nats_url))
    await broker.connect()
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url)
    llm = f"http://127.0.0.1:{free_port()}/v1"
    ops = OpsServer(process_checks(broker, client["aml"], 1.0, llm), timeout=1.0)
    try:
        status, _, body = await ops.respond("/ready")
    finally:
        await client.close()
        await broker.stop()
    assert status == 503
    assert b'"llm"' in body and b'"mongodb"' not in body and b'"nats"' not in body


async def test_metrics_expose_items_calls_llm_backlog_and_jobs(
    worker: tuple[str, CommonSettings],
) -> None:
    base, settings = worker
    client: AsyncMongoClient[Document] = AsyncMongoClient(settings.mongo_url)
    db = client[settings.mongo_db]
    job_id = f"j{uuid.uuid4().hex[:10]}"
    await db.jobs.insert_one({"_id": job_id, "state": "running"})
    items_before = _value("aml_items_total", stage="search", outcome="failed")

    # The writer of the stage document counts its outcome (a redelivery finds the document and
    # counts nothing: tests/integration/test_progress.py).
    await count_final(Stores.over(db), job_id, "search", "failed", now_us())

    record = CallRecorder(Stores.over(db), job_id, "search", "q-1", delivery=1, version_id="ver-m1")
    await record(
        Attempt(operation="search", attempt=1, started_at=datetime.now(UTC), latency_ms=42.0,
                status=503, error_class=None, outcome="retry")
    )  # fmt: skip

    # An LLM endpoint nothing listens on: the call fails and is counted as an error.
    llm = AsyncOpenAI(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="x", max_retries=0)
    with pytest.raises(Exception, match="Connection"):
        await complete(llm, "metrics-model", "hi", 4)
    await llm.close()

    broker = make_broker(settings)
    await broker.connect()
    await declare_streams(broker)
    await broker.publish(b"{}", subjects.work_subject("score", "ver-m1", job_id), stream="AML_WORK")
    # A participant's lane paused by an outage (R-4.13).
    await Outages(Stores.over(db)).declare("ver-m1", "participant", time.time(), "HTTP 503", 600)
    await observe_backlog(broker, Stores.over(db))
    await broker.stop()

    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        response = await http.get(f"{base}/metrics")
    await client.close()
    assert response.status_code == 200
    text = response.text
    for name in (
        "aml_items_total",
        "aml_participant_call_seconds_bucket",
        "aml_llm_call_seconds_bucket",
        "aml_llm_errors_total",
        "aml_pending_work",
        "aml_jobs",
        "aml_paused_lanes",
    ):
        assert f"\n{name}{{" in text, f"{name} missing from /metrics"
    assert _value("aml_items_total", stage="search", outcome="failed") == items_before + 1
    calls = _value(
        "aml_participant_call_seconds_count", version_id="ver-m1", operation="search", status="503"
    )
    assert calls == 1
    assert _value("aml_llm_errors_total", model="metrics-model", error="APIConnectionError") == 1
    assert _value("aml_pending_work", stage="score") >= 1
    assert _value("aml_jobs", state="running") == 1
    assert _value("aml_jobs", state="completed") == 0
    assert _value("aml_paused_lanes", kind="participant") == 1
    assert _value("aml_paused_lanes", kind="llm") == 0


async def test_gateway_ready_checks_nats_and_mongodb(nats_url: str, mongo_url: str) -> None:
    settings = GatewaySettings(
        nats_url=nats_url,
        mongo_url=mongo_url,
        mongo_db=f"ready_{uuid.uuid4().hex[:8]}",
        secret_keys=SecretStr(SecretBox.new_key()),
    )
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    closed: AsyncMongoClient[Document] = AsyncMongoClient(
        f"mongodb://127.0.0.1:{free_port()}/?directConnection=true", serverSelectionTimeoutMS=300
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://gw") as http,
    ):
        ready = await http.get("/ready")
        # The database goes away under the running gateway: /ready says so, /health does not.
        services = app.state.services
        working = services.db
        services.db = closed["aml"]
        try:
            down = await http.get("/ready")
            still_alive = await http.get("/health")
        finally:
            services.db = working
            await closed.close()
    assert ready.status_code == 200, ready.text
    assert down.status_code == 503
    assert down.json()["status"] == "not_ready"
    assert set(down.json()["reasons"]) == {"mongodb"}
    assert still_alive.status_code == 200
