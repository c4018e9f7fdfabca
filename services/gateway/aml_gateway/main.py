"""Composition root of the gateway: `python -m aml_gateway` (uvicorn)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import nats
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from pymongo import AsyncMongoClient

from aml_gateway import publication
from aml_gateway.errors import install_error_handlers
from aml_gateway.limits import BodyLimit
from aml_gateway.routes import access, admin, datasets, jobs, leaderboard, pages, reviews, versions
from aml_gateway.services import Services
from aml_gateway.settings import GatewaySettings
from aml_runtime.broker import (
    StreamReplicasUnavailable,
    declare_streams_on,
    make_broker,
)
from aml_runtime.clock import now
from aml_runtime.db import Document, connect
from aml_runtime.documents import GATEWAY_INDEXES, INDEXES, ensure_indexes
from aml_runtime.logging import configure_logging
from aml_runtime.metrics import process_checks, readiness
from aml_runtime.secrets import SecretBox
from aml_runtime.telemetry import configure_tracing

_READY_BODY = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "not_ready"]},
        "reasons": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["status"],
}
_READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "NATS (JetStream) and MongoDB answer",
        "content": {"application/json": {"schema": _READY_BODY, "example": {"status": "ok"}}},
    },
    503: {
        "description": "A dependency does not answer in time; the reason per dependency",
        "content": {
            "application/json": {
                "schema": _READY_BODY,
                "example": {"status": "not_ready", "reasons": {"mongodb": "no answer within 2s"}},
            }
        },
    },
}


class UnsafeConfiguration(RuntimeError):
    """The gateway must not start with these settings."""


class DependencyUnavailable(RuntimeError):
    """NATS or MongoDB does not answer at start; the message names the URL tried."""


def redacted(url: str) -> str:
    """A server URL as it may be logged: credentials in it (`//user:password@`) replaced.
    (Not `urlsplit`: a MongoDB URL may list several hosts.)"""
    return re.sub(r"//[^/@]*@", "//***@", url)


async def unreachable(settings: GatewaySettings) -> str | None:
    """Whether NATS and MongoDB answer within `AML_START_TIMEOUT_SECONDS`: None, or one line
    naming the first that does not and the URL tried. (The broker's own connect keeps
    retrying for minutes, which is right for a running service and wrong for a start.)"""
    timeout = settings.start_timeout_seconds
    errors: list[Exception] = []

    async def remember(error: Exception) -> None:
        # Instead of the client's own logging: a traceback per attempt.
        errors.append(error)

    try:
        connection = await asyncio.wait_for(
            nats.connect(
                servers=settings.nats_servers,
                allow_reconnect=False,
                connect_timeout=timeout,
                max_reconnect_attempts=0,
                error_cb=remember,
            ),
            timeout + 1,
        )
    except Exception as exc:  # any failure to connect is reported the same way
        cause = errors[-1] if errors else exc
        reason = str(cause) or type(cause).__name__
        return f"cannot reach NATS at {redacted(settings.nats_url)}: {reason}"
    try:
        # The streams as every service declares them: a cluster too small for
        # AML_STREAM_REPLICAS is named here, in one line, rather than in a startup traceback.
        await declare_streams_on(connection, settings.stream_replicas)
    except StreamReplicasUnavailable as exc:
        return f"cannot start: {exc}"
    finally:
        await connection.close()
    mongo: AsyncMongoClient[Document] = AsyncMongoClient(
        settings.mongo_url, serverSelectionTimeoutMS=int(timeout * 1000)
    )
    try:
        await mongo.admin.command("ping")
    except Exception as exc:
        reason = (str(exc) or type(exc).__name__).splitlines()[0][:200]
        return f"cannot reach MongoDB at {redacted(settings.mongo_url)}: {reason}"
    finally:
        await mongo.close()
    return None


def create_app(
    settings: GatewaySettings | None = None, clock: Callable[[], datetime] = now
) -> FastAPI:
    settings = settings or GatewaySettings()
    problem = settings.startup_problem()
    if problem is not None:
        # Refused before anything listens: a weak admin token would open review and keys.
        raise UnsafeConfiguration(problem)
    configure_logging("gateway", settings.log_level)
    tracing = configure_tracing("gateway", settings.trace_dir)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Also declares the streams (`unreachable`), so a publish never races them.
        problem = await unreachable(settings)
        if problem is not None:
            # One line naming what was tried, not a traceback through the connect retries.
            raise DependencyUnavailable(problem) from None
        client, db = connect(settings)
        broker = make_broker(settings, tracing)
        await broker.connect()
        await ensure_indexes(db, INDEXES + GATEWAY_INDEXES)
        services = Services(settings, db, broker, SecretBox(settings.secret_keys), clock)
        # An approval interrupted between its two writes gets its entry now.
        await publication.repair_entries(services.stores, clock)
        app.state.services = services
        yield
        await broker.stop()
        await client.close()

    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN at floating versions.
    # The OpenAPI document itself is served (`/openapi.json`), for any viewer to open.
    app = FastAPI(
        title="AML gateway", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    install_error_handlers(app)
    # Request spans without headers or bodies: an Authorization value never reaches a span.
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=tracing, exclude_spans=["receive", "send"]
    )
    app.include_router(access.router)
    app.include_router(admin.router)
    app.include_router(versions.router)
    app.include_router(jobs.router)
    app.include_router(datasets.router)
    app.include_router(reviews.router)
    app.include_router(leaderboard.router)
    # The web pages (not in the OpenAPI document) and their stylesheet, scripts and the
    # vendored Chart.js: served by the gateway itself, no CDN.
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(packages=[("aml_gateway", "static")]), name="static")
    # Outermost: an oversized body is refused before any other layer (or FastAPI) reads it.
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)

    @app.get("/health", tags=["ops"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", tags=["ops"], response_model=None, responses=_READY_RESPONSES)
    async def ready() -> JSONResponse:
        """200 when NATS (with JetStream) and MongoDB answer within the bounded timeout, else
        503 with the reason per dependency."""
        services: Services | None = getattr(app.state, "services", None)
        if services is None:
            problems = {"startup": "not started"}
        else:
            timeout = settings.ready_timeout_seconds
            checks = process_checks(services.broker, services.db, timeout, None)
            problems = await readiness(checks, timeout)
        if problems:
            return JSONResponse({"status": "not_ready", "reasons": problems}, status_code=503)
        return JSONResponse({"status": "ok"})

    return app
