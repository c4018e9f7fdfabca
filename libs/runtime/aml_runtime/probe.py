"""Container health probe for the AML services (compose healthchecks, Kubernetes exec probes).

    python -m aml_runtime.probe http://localhost:8000/health   GET answers 2xx
    python -m aml_runtime.probe --nats                         AML_NATS_URL answers, JetStream on

Exit status 0 when healthy, 1 with the reason on stderr when not. Workers are probed on their
`/ready` (AML_METRICS_PORT, aml_runtime.metrics); `--nats` remains for a worker whose metrics
port is off: the broker it cannot work without.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import httpx
import nats

from aml_runtime.settings import CommonSettings, nats_servers


async def check_http(url: str, timeout: float) -> str | None:
    """None when GET `url` answers 2xx, else the reason."""
    try:
        # trust_env=False: a proxy from the environment must not answer for the local server.
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        return f"{url}: {type(exc).__name__} {exc}".strip()
    if not response.is_success:
        return f"{url}: HTTP {response.status_code}"
    return None


async def check_nats(url: str, timeout: float) -> str | None:
    """None when a server of `url` (one, or a cluster's separated by commas) accepts a
    connection and JetStream answers account info."""
    try:
        client = await asyncio.wait_for(
            nats.connect(
                nats_servers(url), allow_reconnect=False, connect_timeout=max(1, round(timeout))
            ),
            timeout,
        )
    except Exception as exc:  # any failure to connect means unhealthy
        return f"nats: cannot connect: {type(exc).__name__} {exc}".strip()
    try:
        await client.jetstream(timeout=timeout).account_info()
    except Exception as exc:  # JetStream disabled, not ready or not answering
        return f"nats: JetStream unavailable: {type(exc).__name__} {exc}".strip()
    finally:
        await client.close()
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aml_runtime.probe", description=__doc__)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("url", nargs="?", help="GET this URL; healthy on HTTP 2xx")
    target.add_argument("--nats", action="store_true", help="check AML_NATS_URL and JetStream")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    args = parser.parse_args(argv)
    if args.nats:
        problem = asyncio.run(check_nats(CommonSettings().nats_url, args.timeout))
    else:
        problem = asyncio.run(check_http(args.url, args.timeout))
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
