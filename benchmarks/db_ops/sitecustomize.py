"""Counts every MongoDB command a process sends, for `pipeline_load.py --db-ops`.

Python imports `sitecustomize` at start from the path, so a process started with this directory
on PYTHONPATH and `AML_DB_OPS_DIR` set registers a pymongo command listener before any client
exists, and rewrites `<AML_DB_OPS_DIR>/<module>-<pid>.json` every second with its counts by
"<collection>.<command>" (a bulk write of n statements counts once, as one round trip; a
capacity slot's find-and-modify also counts as taken or refused). Without the variable it does
nothing. Never loaded by the services themselves.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from pymongo import monitoring

_DIR = os.environ.get("AML_DB_OPS_DIR")
# Connection upkeep, not the pipeline's work.
_UPKEEP = frozenset({"hello", "ismaster", "isMaster", "ping", "endSessions", "buildInfo"})


class _Listener(monitoring.CommandListener):
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        # request id -> the capacity pool of a find-and-modify awaiting its reply.
        self._taking: dict[int, str] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        name = event.command_name
        if name in _UPKEEP:
            return
        collection = event.command.get("collection" if name == "getMore" else name)
        self.counts[f"{collection}.{name}"] += 1
        if name == "findAndModify" and collection == "capacity_slots":
            pool = str(event.command.get("query", {}).get("pool", ""))
            kind = "rate" if pool.endswith("/r") else "concurrency"
            self._taking[event.request_id] = kind + (" next" if event.command.get("sort") else "")

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        kind = self._taking.pop(event.request_id, None)
        if kind is not None:
            taken = event.reply.get("value") is not None
            self.counts[f"({kind} slot {'taken' if taken else 'refused'})"] += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._taking.pop(event.request_id, None)


def _process_name() -> str:
    main = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    # `python -m aml_searcher` runs .../aml_searcher/__main__.py
    return main.parent.name if main.name == "__main__.py" else main.stem


def _write_every_second(listener: _Listener, folder: Path) -> None:
    while True:
        time.sleep(1.0)
        path = folder / f"{_process_name()}-{os.getpid()}.json"
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps(dict(listener.counts)), encoding="utf-8")
        partial.replace(path)


if _DIR:
    _listener = _Listener()
    monitoring.register(_listener)
    threading.Thread(target=_write_every_second, args=(_listener, Path(_DIR)), daemon=True).start()
