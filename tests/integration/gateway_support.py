"""The real gateway app for API tests: served in-process over ASGI on a real nx-27017 and
nats-server, with a loopback HTTP server standing in for a participant's Health URL."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import uvicorn
from pydantic import SecretStr
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_gateway.main import create_app
from aml_gateway.settings import GatewaySettings
from aml_pipeline.audit import CallRecorder
from aml_pipeline.participants import Attempt
from aml_runtime.clock import now
from aml_runtime.db import Document
from aml_runtime.secrets import SecretBox
from aml_runtime.stores import Stores

ADMIN_TOKEN = "x" * 32
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# Per-address limits no test run of one address reaches.
UNLIMITED: dict[str, Any] = {"access_request_burst": 100_000, "auth_failure_burst": 100_000}


class _Participant(BaseHTTPRequestHandler):
    """`/health` answers 200, anything else 503: a healthy and an unhealthy Health URL."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keeps the test output readable


@contextmanager
def health_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Participant)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Gateway:
    client: httpx.AsyncClient
    settings: GatewaySettings
    # Every response body the tests received, scanned for the canary at the end.
    bodies: list[str] = field(default_factory=list)

    async def db_documents(self) -> list[Document]:
        mongo: AsyncMongoClient[Document] = AsyncMongoClient(self.settings.mongo_url)
        try:
            db = mongo[self.settings.mongo_db]
            found: list[Document] = []
            for name in await db.list_collection_names():
                found.extend([document async for document in db[name].find()])
            return found
        finally:
            await mongo.close()


# Where a test's clock starts (`clock` in conftest.py): inside every season the tests configure.
T0 = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)


def gateway_settings(
    mongo_url: str, nats_url: str, db_prefix: str = "aml_api", **changes: Any
) -> GatewaySettings:
    """The settings of a test gateway: its own database, an admin token, a fresh secret key and
    loopback participants allowed; `changes` replace any of them."""
    return GatewaySettings(
        **{
            "mongo_url": mongo_url,
            "nats_url": nats_url,
            "mongo_db": f"{db_prefix}_{uuid.uuid4().hex[:8]}",
            "admin_token": SecretStr(ADMIN_TOKEN),
            "secret_keys": SecretStr(SecretBox.new_key()),
            "allow_loopback_targets": True,
            "environment": "development",
            # Every request of these tests comes from one address: the per-address limits
            # are tested on their own (test_gateway_limits.py), with the values set there.
            **UNLIMITED,
            **changes,
        }
    )


@asynccontextmanager
async def open_gateway(
    mongo_url: str,
    nats_url: str,
    clock: Callable[[], datetime] = now,
    **settings: Any,
) -> AsyncIterator[Gateway]:
    config = gateway_settings(mongo_url, nats_url, **settings)
    app = create_app(config, clock)
    bodies: list[str] = []

    async def record(response: httpx.Response) -> None:
        await response.aread()
        bodies.append(response.text)

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://gw",
            event_hooks={"response": [record]},
        ) as client,
    ):
        yield Gateway(client=client, settings=config, bodies=bodies)


def request_body(participant: str, **changes: Any) -> dict[str, Any]:
    """A valid academic new-key request; `changes` replace top-level fields."""
    body: dict[str, Any] = {
        "kind": "new_key",
        "contact": {"name": "Ada", "email": "ada@example.org", "organisation": "Example Lab"},
        "system_name": "recall-graph",
        "version_label": "1.0",
        "tracks": ["textual"],
        "board": "academic",
        "add_url": f"{participant}/add",
        "search_url": f"{participant}/search",
        "health_url": f"{participant}/health",
        "add_status_url_template": f"{participant}/tasks/{{task_id}}",
        "auth_method": "bearer",
        "memory_system_key": "msk-test-key",
        "capacity": {"max_concurrency": 2, "max_rps": 5},
        "run_limits": {"max_run_hours": 48},
        "repository_url": "https://github.com/example/recall-graph",
        "source_disclosure": {
            "original_authors": ["A. Author"],
            "papers": ["https://arxiv.org/abs/0000.00000"],
            "changes": "Added time decay.",
        },
        "declared_models": {"embedding_model": "text-embedding-v4", "llms": ["gpt-4o-mini"]},
    }
    return body | changes


async def submit_access_request(
    gw: Gateway, body: dict[str, Any], key: str | None = None
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = await gw.client.post("/v1/access-requests", json=body, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


@dataclass
class Clock:
    """The gateway's clock, moved by the test across quota and retention boundaries."""

    at: datetime

    def __call__(self) -> datetime:
        return self.at

    def advance(self, span: timedelta) -> None:
        self.at += span


def serve_in_thread(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    """The app served by uvicorn on a free loopback port, in a thread with its own loop (not
    the main thread, so uvicorn installs no signal handlers)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the gateway did not start (its lifespan failed?)")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


@contextmanager
def served_gateway(
    mongo_url: str, nats_url: str, db_prefix: str, admin_token: str, clock: Clock
) -> Iterator[tuple[str, GatewaySettings]]:
    """A development gateway on its own database (`<db_prefix>_<random>`), served in a thread
    on the test's clock: its base URL and settings, stopped when the block ends."""
    settings = GatewaySettings(
        mongo_url=mongo_url,
        nats_url=nats_url,
        mongo_db=f"{db_prefix}_{uuid.uuid4().hex[:8]}",
        admin_token=SecretStr(admin_token),
        secret_keys=SecretStr(SecretBox.new_key()),
        allow_loopback_targets=True,
        environment="development",
    )
    server, thread, base_url = serve_in_thread(create_app(settings, clock))
    try:
        yield base_url, settings
    finally:
        server.should_exit = True
        thread.join(timeout=30)


async def record_calls(
    db: AsyncDatabase[Document], job_id: str, calls: Iterable[tuple[str, str, list[int]]]
) -> None:
    """Participant attempts (stage, item id, HTTP statuses in order) written by the same
    recorder the adder and searcher use, each call's last answer validated."""
    for stage, item_id, statuses in calls:
        record = CallRecorder(Stores.over(db), job_id, stage, item_id, delivery=1)
        for number, status in enumerate(statuses, start=1):
            await record(
                Attempt(
                    operation=stage,
                    attempt=number,
                    started_at=datetime.now(UTC),
                    latency_ms=12.5,
                    status=status,
                    error_class=None,
                    outcome="ok" if status == 200 else "retry",
                )
            )
        await record.validated("valid")
