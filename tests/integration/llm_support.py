"""The LLM stand-in (`aml_llm_standin`) as a real server process on loopback, for the integration
tests that need an OpenAI-compatible model: shared by the stand-in's own tests and the tests
that run the answer stage."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aml_devtools.processes import ManagedProcess, free_port, http_ready
from aml_devtools.stack import HOST, EmbeddedStack


def standin_server(factory: pytest.TempPathFactory, latency: float, capacity: int) -> Iterator[str]:
    """Run the stand-in while the generator is open; yields its base URL (without /v1)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable, "-m", "aml_llm_standin",
        "--port", str(port), "--latency", str(latency), "--concurrency", str(capacity),
    ]  # fmt: skip
    process = ManagedProcess(
        "llm-standin",
        argv,
        log_dir=Path(factory.mktemp("standin")),
        ready=http_ready(f"{url}/health"),
        stop_grace=5,
    )
    process.start()
    try:
        process.wait_ready(30)
        yield url
    finally:
        process.stop()


def standin_in_stack(stack: EmbeddedStack, latency: float, capacity: int, name: str) -> str:
    """Run the stand-in as one of `stack`'s processes (so a test can kill and restart it on its
    port); returns its base URL (without /v1)."""
    port = free_port(HOST)
    url = f"http://{HOST}:{port}"
    argv = [sys.executable, "-m", "aml_llm_standin", "--host", HOST, "--port", str(port),
            "--latency", str(latency), "--concurrency", str(capacity)]  # fmt: skip
    stack.start_process(name, argv, ready=http_ready(f"{url}/health"))
    return url
