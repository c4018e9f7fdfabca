"""Operational metrics and the health endpoints of every worker process.

Each worker (scheduler, adder, searcher, answerer, scorer, publisher) serves, on
`AML_METRICS_PORT` (0: off), `GET /health` (the process is alive), `GET /ready` (its broker,
database and, for the LLM stages, the LLM endpoint answer within bounded time; 503 with the
reasons otherwise) and `GET /metrics` (Prometheus text format). The gateway answers `/ready` on
its own port with the same checks (`readiness`).

The metrics are process-global (prometheus_client's default registry) and are updated where the
platform already records the facts: `progress.OutcomeCounter` (items per stage and outcome), the
audit trail's `CallRecorder` (participant calls), `llm.complete` (LLM calls), and the
scheduler's periodic `observe_backlog` (pending work per stage, jobs by state).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import get_args

import httpx
import structlog
from faststream.nats import NatsBroker
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract import subjects
from aml_contract.api.vocabulary import JobState
from aml_runtime.db import Document
from aml_runtime.stores import Stores

log = structlog.get_logger()

ITEMS = Counter(
    "aml_items",
    "Items whose final outcome a stage recorded (counted once per item, by the first writer).",
    ["stage", "outcome"],
)
# Buckets span a fast Search (tens of ms) to a slow Add (minutes).
_CALL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
PARTICIPANT_CALLS = Histogram(
    "aml_participant_call_seconds",
    "Participant HTTP attempts: the participant's own time, by version, operation and status "
    "(the HTTP status code, or the error class when there was no answer).",
    ["version_id", "operation", "status"],
    buckets=_CALL_BUCKETS,
)
LLM_CALLS = Histogram(
    "aml_llm_call_seconds",
    "LLM chat completions by model and outcome (ok or error).",
    ["model", "outcome"],
    buckets=_CALL_BUCKETS,
)
LLM_ERRORS = Counter(
    "aml_llm_errors", "Failed LLM chat completions by model and error class.", ["model", "error"]
)
PENDING_WORK = Gauge(
    "aml_pending_work",
    "Messages waiting (or in flight) in AML_WORK per stage: what an autoscaler scales on.",
    ["stage"],
)
JOBS = Gauge("aml_jobs", "Jobs by state.", ["state"])
PAUSED_LANES = Gauge(
    "aml_paused_lanes",
    "Capacity keys whose work is paused by an outage (R-4.13): participant versions, and the LLM.",
    ["kind"],
)

# Every job state, so a state with no job reads 0 instead of vanishing.
JOB_STATES: tuple[str, ...] = get_args(JobState)


def participant_call(version_id: str, operation: str, status: int | None, error: str | None,
                     latency_ms: float) -> None:  # fmt: skip
    label = str(status) if status is not None else (error or "error")
    PARTICIPANT_CALLS.labels(version_id, operation, label).observe(latency_ms / 1000.0)


# -- readiness ----------------------------------------------------------------------------------

Check = Callable[[], Awaitable[str | None]]


async def nats_ready(broker: NatsBroker, timeout: float) -> str | None:
    """None when the broker's own connection is up and JetStream answers account info."""
    try:
        client = broker.connection
    except Exception:  # not connected yet: FastStream raises until connect() has run
        return "nats: not connected"
    if not client.is_connected:
        return "nats: not connected"
    try:
        await client.jetstream(timeout=timeout).account_info()
    except Exception as exc:  # JetStream disabled, not ready or not answering
        return f"nats: JetStream unavailable: {type(exc).__name__}"
    return None


async def mongo_ready(db: AsyncDatabase[Document]) -> str | None:
    try:
        await db.command("ping")
    except Exception as exc:  # unreachable, no primary, refused
        return f"mongodb: {type(exc).__name__}"
    return None


async def llm_ready(base_url: str, timeout: float) -> str | None:
    """The LLM endpoint answers HTTP at all (any status below 500: a 401 or 404 still proves the
    server is there; the key and model are the calls' business, not readiness')."""
    url = base_url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        return f"llm: {type(exc).__name__}"
    if response.status_code >= 500:
        return f"llm: HTTP {response.status_code}"
    return None


async def readiness(checks: Mapping[str, Check], timeout: float) -> dict[str, str]:
    """The reasons, per check, why the process is not ready (empty: ready). Checks run together
    and each is cut at `timeout`, so a probe never waits on a hung dependency."""

    async def bounded(check: Check) -> str | None:
        try:
            return await asyncio.wait_for(check(), timeout)
        except TimeoutError:
            return f"no answer within {timeout:g}s"

    names = list(checks)
    results = await asyncio.gather(*(bounded(checks[name]) for name in names))
    return {name: reason for name, reason in zip(names, results, strict=True) if reason}


# -- backlog ------------------------------------------------------------------------------------


async def observe_backlog(broker: NatsBroker, stores: Stores) -> None:
    """Refresh the pending-work and jobs-by-state gauges (run periodically by the scheduler:
    one process exports them, so a sum over replicas never counts a backlog twice)."""
    js = broker.connection.jetstream()
    for stage, prefix in subjects.WORK_PREFIX.items():
        info = await js.stream_info(subjects.WORK_STREAM, subjects_filter=f"{prefix}.*.*")
        PENDING_WORK.labels(stage).set(sum((info.state.subjects or {}).values()))
    counts = dict.fromkeys(JOB_STATES, 0)
    counts.update(await stores.jobs.count_by_state())
    for state, count in counts.items():
        JOBS.labels(state).set(count)
    paused = {"participant": 0, "llm": 0}
    async for kind in stores.outages.paused_kinds():
        paused[kind] = paused.get(kind, 0) + 1
    for kind, count in paused.items():
        PAUSED_LANES.labels(kind).set(count)


# -- the HTTP endpoint ----------------------------------------------------------------------------


@dataclass
class OpsServer:
    """`/health`, `/ready` and `/metrics` over plain asyncio: a few GETs from probes and a
    scraper need no web framework, and running on the service's own loop lets `/ready` use the
    service's own broker connection and database client."""

    checks: Mapping[str, Check]
    timeout: float = 2.0
    _server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def respond(self, path: str) -> tuple[int, str, bytes]:
        if path == "/health":
            return 200, "application/json", b'{"status": "ok"}'
        if path == "/ready":
            problems = await readiness(self.checks, self.timeout)
            body = {"status": "not_ready", "reasons": problems} if problems else {"status": "ok"}
            return (503 if problems else 200), "application/json", json.dumps(body).encode()
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest()
        return 404, "application/json", b'{"status": "not_found"}'

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
            method, target = request.split(b" ", 2)[:2]
            path = target.decode("latin-1").split("?", 1)[0]
            if method != b"GET":
                status, kind, body = 405, "application/json", b'{"status": "method_not_allowed"}'
            else:
                status, kind, body = await self.respond(path)
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(
                status, "Service Unavailable"
            )
            head = (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            pass  # a malformed or abandoned request gets no answer
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def process_checks(
    broker: NatsBroker, db: AsyncDatabase[Document], timeout: float, llm_base_url: str | None
) -> dict[str, Check]:
    checks: dict[str, Check] = {
        "nats": lambda: nats_ready(broker, timeout),
        "mongodb": lambda: mongo_ready(db),
    }
    if llm_base_url is not None:
        checks["llm"] = lambda: llm_ready(llm_base_url, timeout)
    return checks
