"""Composition root of the gateway: `python -m aml_gateway` (uvicorn)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from pymongo import ASCENDING

from aml_gateway import publication
from aml_gateway.deps import Services
from aml_gateway.errors import install_error_handlers
from aml_gateway.routes import access, admin, datasets, jobs, leaderboard, pages, reviews, versions
from aml_gateway.settings import GatewaySettings
from aml_runtime.broker import declare_streams, make_broker
from aml_runtime.db import connect, ensure_indexes
from aml_runtime.jobs import now
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
        client, db = connect(settings)
        broker = make_broker(settings, tracing)
        await broker.connect()
        await declare_streams(broker)
        await ensure_indexes(db)
        await db.jobs.create_index([("run_label_key", ASCENDING)], unique=True)
        # One submission at a time per team: see routes/jobs.py.
        await db.jobs.create_index([("submission_key", ASCENDING)], unique=True)
        await publication.ensure_indexes(db)
        # An approval interrupted between its two writes gets its entry now.
        await publication.repair_entries(db, clock)
        box = SecretBox(settings.secret_keys)
        app.state.services = Services(settings, db, broker, box, clock)
        yield
        await broker.stop()
        await client.close()

    app = FastAPI(title="AML gateway", version="0.1.0", lifespan=lifespan)
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
