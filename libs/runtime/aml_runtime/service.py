"""What every service process shares: logging, one broker, one database handle, streams declared
before anything is consumed, a clean shutdown, and an exit when its dependencies are gone.

**Dependency guard.** A service whose NATS connection or MongoDB stays unreachable for
`AML_DEPENDENCY_LOSS_EXIT_SECONDS`, or (under the embedded stack, `AML_STACK_PID`) whose launcher
is no longer its parent, exits with `DEPENDENCY_LOST_EXIT_CODE` (its supervisor restarts it; a
deployment's pod restart does the same). The probes run on the event loop, the decision on a
thread of its own: an event loop that no longer gets to run (see below) stops refreshing the
probes and is therefore counted as lost too, and the thread still acts.

Why: FastStream's pull-consumer loop suppresses `ConnectionClosedError` and fetches again at
once; once nats-py gives up reconnecting (by default after 60 attempts, about two minutes) the
connection is closed for good and every fetch fails without suspending, so that loop never
yields: the process spins at full CPU and no other task, nor the asyncio SIGTERM handler (the
parent-death signal), ever runs again. `aml_runtime.broker.make_broker` therefore keeps
reconnecting (every 2 s) for longer than the guard's bound, so the connection is never closed
while the service lives, and the guard ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog
import uvloop
from faststream import FastStream
from faststream.nats import NatsBroker
from opentelemetry.sdk.trace import TracerProvider
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_runtime.broker import (
    Bus,
    JetStreamBus,
    StreamReplicasUnavailable,
    declare_streams,
    make_broker,
)
from aml_runtime.db import Document, connect
from aml_runtime.documents import ensure_indexes
from aml_runtime.logging import configure_logging
from aml_runtime.metrics import OpsServer, mongo_ready, nats_ready, process_checks, readiness
from aml_runtime.settings import CommonSettings, LLMSettings
from aml_runtime.stores import Stores
from aml_runtime.telemetry import configure_tracing

Hook = Callable[[], Awaitable[None]]
log = structlog.get_logger()

# The exit status of a service that gave up on its broker, its database or its launcher.
DEPENDENCY_LOST_EXIT_CODE = 3
# The exit status of a service whose configuration the deployment cannot honour (streams with
# more replicas than the NATS cluster has nodes): a restart would fail the same way.
MISCONFIGURED_EXIT_CODE = 2
# Background tasks get this long to end once cancelled at shutdown.
_CANCEL_WAIT_SECONDS = 3.0
# After asking the application to stop, the guard waits this long for a clean shutdown.
_SHUTDOWN_GRACE_SECONDS = 10.0
# How often a worker's application looks for a stop request (see `run_service`).
_EXIT_POLL_SECONDS = 0.5


@dataclass
class Runtime:
    broker: NatsBroker
    # The handlers' JetStream writes (`aml_runtime.broker.Bus`), over the broker's connection.
    bus: Bus
    client: AsyncMongoClient[Document]
    # The driver, for what no store does (indexes, the readiness ping); everything else goes
    # through `stores`, over the same database.
    db: AsyncDatabase[Document]
    stores: Stores
    tracing: TracerProvider
    settings: CommonSettings


def open_runtime(name: str, settings: CommonSettings) -> Runtime:
    configure_logging(name, settings.log_level)
    tracing = configure_tracing(name, settings.trace_dir)
    client, db = connect(settings)
    broker = make_broker(settings, tracing)
    return Runtime(
        broker=broker,
        bus=JetStreamBus(broker),
        client=client,
        db=db,
        stores=Stores.over(db),
        tracing=tracing,
        settings=settings,
    )


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


def guard_interval(limit: float) -> float:
    """How often the guard probes and decides: a few times within the bound, at most every 5 s."""
    return max(0.2, min(5.0, limit / 4))


@dataclass
class DependencyGuard:
    """See the module's docstring. `probe` runs on the event loop; `watch` on its own thread."""

    runtime: Runtime
    limit: float
    stack_pid: int | None
    request_exit: Callable[[], None]
    last_ok: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    _stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        started = time.monotonic()
        self.last_ok = {"nats": started, "mongodb": started}
        thread = threading.Thread(target=self.watch, name="aml-dependency-guard", daemon=True)
        thread.start()

    def stop(self) -> None:
        self._stopped.set()

    async def probe(self) -> None:
        """Refresh each dependency's last good answer (on the event loop)."""
        timeout = min(self.runtime.settings.ready_timeout_seconds, guard_interval(self.limit))
        while not self._stopped.is_set():
            checks = {
                "nats": lambda: nats_ready(self.runtime.broker, timeout),
                "mongodb": lambda: mongo_ready(self.runtime.db),
            }
            problems = await readiness(checks, timeout)
            answered = time.monotonic()
            for name in checks:
                if name in problems:
                    self.reasons[name] = problems[name]
                else:
                    self.last_ok[name] = answered
                    self.reasons.pop(name, None)
            await asyncio.sleep(guard_interval(self.limit))

    def verdict(self, moment: float) -> str | None:
        """Why the service should exit now, or None."""
        if self.stack_pid is not None and os.getppid() != self.stack_pid:
            return f"its embedded stack (launcher pid {self.stack_pid}) is gone"
        for name, ok in self.last_ok.items():
            if moment - ok >= self.limit:
                why = self.reasons.get(name, "the service's event loop stopped running")
                return f"{name} unreachable for {moment - ok:.0f}s ({why})"
        return None

    def watch(self) -> None:
        while not self._stopped.wait(guard_interval(self.limit)):
            reason = self.verdict(time.monotonic())
            if reason is not None:
                self.exit(reason)
                return

    def exit(self, reason: str) -> None:
        log.error("service.dependency_lost", reason=reason, exit_code=DEPENDENCY_LOST_EXIT_CODE)
        with contextlib.suppress(Exception):
            self.request_exit()
        # The service's own shutdown hooks if the event loop still runs (they end the process
        # when done); the process ends either way.
        time.sleep(_SHUTDOWN_GRACE_SECONDS)
        _exit_now()


def _exit_now(code: int = DEPENDENCY_LOST_EXIT_CODE) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


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
    exiting: list[bool] = []
    loops: list[asyncio.AbstractEventLoop] = []

    def request_exit() -> None:
        exiting.append(True)
        if loops:
            loops[0].call_soon_threadsafe(app.exit)

    guard = DependencyGuard(
        runtime, settings.dependency_loss_exit_seconds, settings.stack_pid, request_exit
    )

    @app.on_startup
    async def prepare() -> None:
        # Listening first: /health answers (and /ready says why not) while start-up still waits
        # on the broker or the database.
        loops.append(asyncio.get_running_loop())
        if settings.metrics_port:
            await ops.start(settings.metrics_host, settings.metrics_port)
        await runtime.broker.connect()
        try:
            await declare_streams(runtime.broker, settings.stream_replicas)
        except StreamReplicasUnavailable as exc:
            # One line for the operator instead of a traceback per supervisor restart.
            log.error("service.streams_unavailable", reason=str(exc))
            print(f"cannot start: {exc}", file=sys.stderr)
            _exit_now(MISCONFIGURED_EXIT_CODE)
        await ensure_indexes(runtime.db)

    @app.after_startup
    async def started() -> None:
        if on_start is not None:
            await on_start()
        background.extend(asyncio.create_task(_repeat(task)) for task in every)
        guard.start()
        background.append(asyncio.create_task(guard.probe()))

    @app.on_shutdown
    async def close() -> None:
        # The guard keeps watching while the service shuts down: a shutdown that hangs on a
        # lost broker or database still ends within its bound (its thread dies with the process).
        for running in background:
            running.cancel()
        if background:
            # Bounded: a task inside a MongoDB call may sit out its server selection (30 s)
            # before it sees the cancellation.
            await asyncio.wait(background, timeout=_CANCEL_WAIT_SECONDS)
        if on_stop is not None:
            await on_stop()
        await ops.stop()
        await runtime.client.close()
        runtime.tracing.shutdown()  # flushes the spans still batched
        if exiting:
            # The guard ended the service. FastStream would now drain the NATS connection,
            # which cannot succeed without the server (it raises or waits): the process ends
            # here instead, with the guard's status (unacknowledged messages are redelivered).
            _exit_now()

    @app.after_shutdown
    async def unguard() -> None:
        # Shut down cleanly: nothing left to guard (a process hosting the app, e.g. a test,
        # lives on).
        guard.stop()

    return app


def run_service(create_app: Callable[[], FastStream]) -> None:
    """A worker process's entry point: its application on uvloop until it stops. A question
    costs a few dozen socket round trips (broker, database, participant, LLM), and libuv's loop
    spends less on each than asyncio's own (docs/performance.md)."""

    async def main() -> None:
        app = create_app()
        app.after_startup(_freeze_what_startup_made)
        # FastStream's run loop looks for an exit request every `sleep_time` (0.1 s by default):
        # ten wake-ups a second of an otherwise idle process. A stop then begins within half
        # a second, well within the shutdown grace.
        await app.run(sleep_time=_EXIT_POLL_SECONDS)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def _freeze_what_startup_made() -> None:
    """Move every object alive once the worker has started (modules, clients, settings: they
    live as long as the process) out of the garbage collector's view, so its collections walk
    only what the work made since (collections were about 2.5% of a busy worker's CPU, most of
    it full ones walking the start-up objects). Only in a worker's own process: a process that
    hosts an app for a while (a test) keeps collecting everything."""
    gc.freeze()
