"""What every service process shares: logging, one broker, one database handle, streams declared
before anything is consumed, and a clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from faststream import FastStream
from faststream.nats import NatsBroker
from opentelemetry.sdk.trace import TracerProvider
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.broker import declare_streams, make_broker
from aml_runtime.db import Document, connect, ensure_indexes
from aml_runtime.logging import configure_logging
from aml_runtime.metrics import OpsServer, process_checks
from aml_runtime.settings import CommonSettings, LLMSettings
from aml_runtime.telemetry import configure_tracing

Hook = Callable[[], Awaitable[None]]
log = structlog.get_logger()


@dataclass
class Runtime:
    broker: NatsBroker
    client: AsyncMongoClient[Document]
    db: AsyncDatabase[Document]
    tracing: TracerProvider
    settings: CommonSettings


def open_runtime(name: str, settings: CommonSettings) -> Runtime:
    configure_logging(name, settings.log_level)
    tracing = configure_tracing(name, settings.trace_dir)
    client, db = connect(settings)
    broker = make_broker(settings, tracing)
    return Runtime(broker=broker, client=client, db=db, tracing=tracing, settings=settings)


@dataclass(frozen=True)
class Periodic:
    """Work a service repeats in the background every `interval` seconds while it runs (after
    waiting one interval first when `wait_first`). A failed pass is logged; the next one runs."""

    name: str
    interval: float
    run: Hook
    wait_first: bool = False


async def _repeat(task: Periodic) -> None:
    if task.wait_first:
        await asyncio.sleep(task.interval)
    while True:
        try:
            await task.run()
        except Exception:
            log.exception("periodic.failed", task=task.name)
        await asyncio.sleep(task.interval)


def serve(
    runtime: Runtime,
    on_start: Hook | None = None,
    on_stop: Hook | None = None,
    every: Sequence[Periodic] = (),
) -> FastStream:
    app = FastStream(runtime.broker)
    background: list[asyncio.Task[None]] = []
    settings = runtime.settings
    # The LLM stages cannot work without the LLM: their readiness includes it.
    llm_url = settings.llm_base_url if isinstance(settings, LLMSettings) else None
    checks = process_checks(runtime.broker, runtime.db, settings.ready_timeout_seconds, llm_url)
    ops = OpsServer(checks, timeout=settings.ready_timeout_seconds)

    @app.on_startup
    async def prepare() -> None:
        # Listening first: /health answers (and /ready says why not) while start-up still waits
        # on the broker or the database.
        if settings.metrics_port:
            await ops.start(settings.metrics_host, settings.metrics_port)
        await runtime.broker.connect()
        await declare_streams(runtime.broker)
        await ensure_indexes(runtime.db)

    @app.after_startup
    async def started() -> None:
        if on_start is not None:
            await on_start()
        background.extend(asyncio.create_task(_repeat(task)) for task in every)

    @app.on_shutdown
    async def close() -> None:
        for running in background:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        if on_stop is not None:
            await on_stop()
        await ops.stop()
        await runtime.client.close()
        runtime.tracing.shutdown()  # flushes the spans still batched

    return app
