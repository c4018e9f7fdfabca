"""A worker process's entry point (`aml_runtime.service.run_service`) on a real nats-server: once
its app has started, what start-up made is out of the garbage collector's view (`gc.freeze`), so
collections walk only what the work makes; the worker then stops cleanly when asked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

WORKER = textwrap.dedent(
    """
    import asyncio, gc, sys
    from faststream import FastStream
    from faststream.nats import NatsBroker
    from aml_runtime.service import run_service

    seen = []

    def create_app():
        app = FastStream(NatsBroker(sys.argv[1], logger=None))

        @app.on_startup
        async def starting():
            seen.append(gc.get_freeze_count())

        @app.after_startup
        async def started():
            async def a_moment_later():
                await asyncio.sleep(0.2)
                seen.append(gc.get_freeze_count())
                app.exit()

            asyncio.get_running_loop().create_task(a_moment_later())

        return app

    run_service(create_app)
    print(*seen)
    """
)


def test_a_worker_freezes_what_startup_made(nats_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WORKER, nats_url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    starting, running = (int(value) for value in done.stdout.split())
    assert starting == 0
    # Everything alive once started: tens of thousands of objects (modules, the broker, ...).
    assert running > 10_000
