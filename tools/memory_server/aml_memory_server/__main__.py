"""`python -m aml_memory_server --host 127.0.0.1 --port 8400 --db PATH [--auth-method M]
[--key-env VAR]`. The key comes from the environment variable named by --key-env, never from
argv: argv is visible to every local user (ps, /proc) and ends up in shell history."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import uvicorn
from pydantic import SecretStr

from .app import create_app
from .settings import AUTH_METHODS, MemoryServerSettings

DEFAULT_KEY_ENV = "AML_MEMORY_KEY"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aml_memory_server",
        description="AML reference memory server (SQLite FTS5, BM25).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--db", type=Path, required=True, help="SQLite database file")
    parser.add_argument("--auth-method", choices=AUTH_METHODS, default="token")
    parser.add_argument(
        "--key-env",
        default=DEFAULT_KEY_ENV,
        help=f"environment variable holding the memory system key (default {DEFAULT_KEY_ENV})",
    )
    parser.add_argument("--log-level", default="info")
    return parser


def settings_from_args(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> MemoryServerSettings:
    """Raises ValueError naming the variable (never its value) when a needed key is missing."""
    key: SecretStr | None = None
    if args.auth_method != "none":
        value = environ.get(args.key_env, "")
        if not value:
            raise ValueError(
                f"auth method {args.auth_method!r} needs the key in environment variable "
                f"{args.key_env}, which is unset or empty"
            )
        key = SecretStr(value)
    return MemoryServerSettings(db_path=args.db, auth_method=args.auth_method, key=key)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args, os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
