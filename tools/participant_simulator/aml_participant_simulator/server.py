"""Running an ASGI app on a loopback socket with uvicorn: in the caller's event loop, in a
background thread, or as the process's main server (the CLI).

The socket is bound here rather than by uvicorn so that port 0 works: the OS picks a free port
and the caller learns it from the socket before the first request, without a race."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

import uvicorn

STARTUP_TIMEOUT_S = 10.0
# In-flight requests get this long to finish at shutdown; a scripted slow or queued request
# must not hold a test's teardown hostage.
GRACEFUL_SHUTDOWN_S = 2


def bind_loopback(host: str, port: int) -> socket.socket:
    """Only loopback: the control endpoints (/_sim/*) are unauthenticated, and the simulator
    answers whatever its script says, which must never reach another machine."""
    address = "127.0.0.1" if host == "localhost" else host
    try:
        ip = ipaddress.ip_address(address)
    except ValueError as exc:
        raise ValueError(f"host must be a loopback IP address or localhost, got {host!r}") from exc
    if not ip.is_loopback:
        raise ValueError(f"host must be a loopback address, got {host!r}")
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    # Named as TCP, so that asyncio sets TCP_NODELAY on every accepted connection (it does so
    # only for sockets whose protocol says TCP): without it an answer's body waits for the
    # client's delayed ACK of its headers, 40 ms on Linux, on top of the scripted latency.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


class _EmbeddedServer(uvicorn.Server):
    """A server inside someone else's process: it leaves signal handling to its host (uvicorn
    would otherwise take over SIGINT/SIGTERM while it runs in the main thread)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def make_server(
    app: Callable[..., Any], sock: socket.socket, *, embedded: bool, log_level: str = "warning"
) -> uvicorn.Server:
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        # The apps served here are raw ASGI: no lifespan, and no proxy-header rewriting of the
        # client address the recording reports.
        lifespan="off",
        proxy_headers=False,
        http="h11",
        log_level=log_level,
        access_log=False,
        # Embedded, the host process's logging configuration is left alone.
        log_config=None if embedded else uvicorn.config.LOGGING_CONFIG,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    return _EmbeddedServer(config) if embedded else uvicorn.Server(config)


@contextlib.asynccontextmanager
async def serve_in_loop(
    app: Callable[..., Any], host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve in the running event loop until the block ends; yields the base URL."""
    sock = bind_loopback(host, port)
    server = make_server(app, sock, embedded=True)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not server.started:
            if task.done():
                task.result()  # re-raises the startup failure
                raise RuntimeError("simulator server stopped during startup")
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulator server not started after {STARTUP_TIMEOUT_S}s")
            await asyncio.sleep(0.01)
        yield base_url(sock)
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.contextmanager
def serve_in_thread(
    app: Callable[..., Any], host: str = "127.0.0.1", port: int = 0
) -> Iterator[str]:
    """Serve from a background thread with its own event loop until the block ends; for
    synchronous callers. Yields the base URL."""
    sock = bind_loopback(host, port)
    server = make_server(app, sock, embedded=True)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as exc:  # handed to the starting thread, which reports it
            failure.append(exc)

    thread = threading.Thread(target=run, name="aml-participant-simulator", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("simulator server stopped during startup") from (
                    failure[0] if failure else None
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulator server not started after {STARTUP_TIMEOUT_S}s")
            time.sleep(0.01)
        yield base_url(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=GRACEFUL_SHUTDOWN_S + 5.0)
        sock.close()
