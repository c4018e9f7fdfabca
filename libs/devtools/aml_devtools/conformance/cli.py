"""`aml check` on the command line: its arguments, the target they describe, and the exit code
(0 every rule holds, warnings allowed; 1 a rule is violated; 2 the arguments are unusable).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from pydantic import SecretStr

from aml_devtools.conformance.probe import CheckTarget, run_check
from aml_devtools.conformance.report import render, render_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--add", required=True, help="the Add URL")
    parser.add_argument("--search", required=True, help="the Search URL")
    parser.add_argument("--health", required=True, help="the Health URL")
    parser.add_argument("--status-url", help="the Add-status URL template, with {task_id}")
    parser.add_argument(
        "--auth-method", choices=("none", "token", "bearer", "x-api-key"), default="none"
    )
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--key", help="the Memory System Key (visible to local users: see --key-env)")
    key.add_argument("--key-env", help="environment variable holding the Memory System Key")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def target_from_args(args: argparse.Namespace) -> CheckTarget:
    key = args.key if args.key is not None else (os.environ.get(args.key_env or "") or None)
    if args.auth_method != "none" and not key:
        raise ValueError(f"auth method {args.auth_method!r} needs --key or --key-env")
    return CheckTarget(
        add_url=args.add,
        search_url=args.search,
        health_url=args.health,
        status_url_template=args.status_url,
        auth_method=args.auth_method,
        key=SecretStr(key) if key else None,
        timeout_seconds=args.timeout,
    )


def main_from_args(args: argparse.Namespace) -> int:
    """Exit 0 when every rule holds (warnings allowed), 1 on any violation, 2 on bad input."""
    try:
        target = target_from_args(args)
    except ValueError as exc:
        print(f"aml check: {exc}")
        return 2
    report = asyncio.run(run_check(target))
    if args.json:
        print(render_json(report))
    else:
        print(render(report))
    return 1 if report.failed else 0
