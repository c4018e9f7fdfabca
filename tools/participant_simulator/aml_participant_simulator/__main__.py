"""`python -m aml_participant_simulator --port P --script script.json [--host 127.0.0.1]
[--auth-method M --key-env VAR] [--log-level L]`. Prints `listening on <base URL>` once bound
(useful with --port 0). --auth-method/--key-env replace the script's auth; the key comes from
the environment, never from argv, which every local user can read (ps, /proc)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import SecretStr, ValidationError

from aml_memory_server.settings import AUTH_METHODS

from .script import Script, ScriptedAuth
from .server import base_url, bind_loopback, make_server
from .simulator import Simulator


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aml_participant_simulator",
        description="AML participant simulator: a scripted participant for tests and benchmarks.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--port", type=int, default=8500, help="0 picks a free port")
    parser.add_argument("--script", type=Path, help="Script JSON (default: all endpoints ok)")
    parser.add_argument("--auth-method", choices=AUTH_METHODS, help="overrides the script's")
    parser.add_argument("--key-env", help="environment variable holding the expected key")
    parser.add_argument("--log-level", default="warning")
    return parser


def script_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Script:
    """Raises ValueError (naming files and variables, never a key) on a bad script or auth."""
    try:
        script = Script.load(args.script) if args.script else Script()
    except (OSError, ValidationError) as exc:
        raise ValueError(f"cannot load script {args.script}: {exc}") from exc
    if args.auth_method is None:
        return script
    key: SecretStr | None = None
    if args.auth_method != "none":
        value = environ.get(args.key_env or "", "")
        if not value:
            raise ValueError(
                f"auth method {args.auth_method!r} needs --key-env naming a set, non-empty "
                "environment variable"
            )
        key = SecretStr(value)
    return script.model_copy(update={"auth": ScriptedAuth(method=args.auth_method, key=key)})


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        script = script_from_args(args, os.environ)
        sock = bind_loopback(args.host, args.port)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    server = make_server(Simulator(script), sock, embedded=False, log_level=args.log_level)
    print(f"listening on {base_url(sock)}", flush=True)
    stop = threading.Event()
    threading.Thread(target=freeze_survivors, args=(stop,), name="gc-freeze", daemon=True).start()
    server.run(sockets=[sock])
    return 0


# How often what has survived so far is moved out of the collector's reach.
FREEZE_EVERY_SECONDS = 1.0


def freeze_survivors(stop: threading.Event) -> None:
    """The simulator keeps every request it served (and every memory it was given) until it is
    reset: tens of thousands of objects over a benchmark, which a full collection traverses
    each time, stopping the server for 70 ms and more (measured: 9,600 requests). An arrival
    stamped after such a pause looks like a request sent late, and a burst of them like a rate
    the client never sent. Freezing the survivors every second keeps each collection to the
    last second's objects. What is frozen is still freed by reference counting when a reset
    drops it; only cyclic garbage frozen before it was collected is kept, and request handling
    makes little of it."""
    while not stop.is_set():
        gc.freeze()
        stop.wait(FREEZE_EVERY_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
