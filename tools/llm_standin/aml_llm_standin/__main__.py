"""`python -m aml_llm_standin --port P [--latency 0.5] [--concurrency 8] [--host 127.0.0.1]
[--coding-tasks tasks.jsonl ...]`. Prints `listening on <base URL>` once bound (useful with
--port 0); the OpenAI base URL is that plus `/v1`."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from aml_evaluation.coding.bundle import CodingBundleError

from .app import create_app
from .coding import SHIPPED_TASKS, load_coding_tasks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aml_llm_standin",
        description="An OpenAI-compatible stand-in LLM: fixed latency, declared capacity.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--port", type=int, default=8600, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per completion")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="requests served at once; more get 429"
    )
    parser.add_argument(
        "--coding-tasks",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="a coding bundle's tasks.jsonl whose tasks (with stand-in hints) the scripted "
        "coding agent knows besides the shipped synthetic-coding ones; repeatable",
    )
    parser.add_argument("--log-level", default="warning")
    return parser


def bind_loopback(host: str, port: int) -> socket.socket:
    """Bound here, not by uvicorn, so that port 0 works and the caller learns the port. Only
    loopback: the stand-in has no authentication and exists for local benchmarks and tests."""
    address = "127.0.0.1" if host == "localhost" else host
    ip = ipaddress.ip_address(address)
    if not ip.is_loopback:
        raise ValueError(f"host must be a loopback address, got {host!r}")
    sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.latency < 0 or args.concurrency < 1:
        parser.error("--latency must be >= 0 and --concurrency >= 1")
    try:
        coding_tasks = load_coding_tasks([SHIPPED_TASKS, *args.coding_tasks])
    except (CodingBundleError, OSError) as exc:
        parser.error(f"--coding-tasks: {exc}")
    try:
        sock = bind_loopback(args.host, args.port)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        create_app(args.latency, args.concurrency, coding_tasks),
        host=host,
        port=port,
        lifespan="off",
        log_level=args.log_level,
        access_log=False,
        # Requests in flight get this long at shutdown: a stopping benchmark must not wait.
        timeout_graceful_shutdown=2,
    )
    url = f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"
    print(f"listening on {url}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
