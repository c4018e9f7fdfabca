"""The host's processes as a test sees them (a sandbox's commands are visible there)."""

from __future__ import annotations

import os
from pathlib import Path


def running(*argv: str) -> list[int]:
    """The pids of the host's processes running exactly `argv`."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == wanted:
                found.append(int(pid))
        except OSError:
            continue
    return found
