"""Running one bwrap process: its output read without ever blocking past the deadline, kept up to
a cap, and its whole process tree killed when the deadline passes.

The sandboxed side writes `READY` before it executes the command (`bwrap.argv`). Whatever comes
before it is bwrap's own (a setup error, a platform fault); everything after it is the
command's. The command cannot fake or suppress a start failure: it runs only after `READY`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .model import TIMED_OUT, CommandResult, SandboxFault

READY = b"\x1eaml-sandbox-ready\x1e"
_CHUNK = 1 << 16
# bwrap says why it failed in a line or two.
_PREAMBLE_KEPT = 4096
# bwrap sets a sandbox up in about ten milliseconds; a command's time limit starts at READY, so a
# short limit is the command's alone and a sandbox that does not start is the platform's fault.
_START_SECONDS = 10.0
# After the kill, the pid namespace's processes die within milliseconds; the pipe's end-of-file
# says they all did.
_KILL_GRACE_SECONDS = 5.0


@dataclass
class OutputCap:
    """The first and last halves of `limit` bytes of a stream, and how many bytes it had."""

    limit: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            keep = self.limit - self.limit // 2
            self.tail += chunk[-keep:]
            del self.tail[: max(0, len(self.tail) - keep)]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        if not self.truncated:
            return (self.head + self.tail).decode("utf-8", "replace")
        dropped = self.total - len(self.head) - len(self.tail)
        return (
            self.head.decode("utf-8", "replace")
            + f"\n[... {dropped} bytes of output dropped ...]\n"
            + self.tail.decode("utf-8", "replace")
        )


@dataclass
class _Reader:
    """Splits bwrap's preamble from the command's output."""

    cap: OutputCap
    preamble: bytearray = field(default_factory=bytearray)
    started_at: float | None = None

    @property
    def started(self) -> bool:
        return self.started_at is not None

    def add(self, chunk: bytes) -> None:
        if self.started:
            self.cap.add(chunk)
            return
        self.preamble += chunk
        at = self.preamble.find(READY)
        if at >= 0:
            self.started_at = time.monotonic()
            rest = bytes(self.preamble[at + len(READY) :])
            self.preamble = self.preamble[:at]
            if rest:
                self.cap.add(rest)
        elif len(self.preamble) > _PREAMBLE_KEPT + len(READY):
            # Keep the start (bwrap's message) and enough of the end to find READY across reads.
            self.preamble = self.preamble[:_PREAMBLE_KEPT] + self.preamble[-len(READY) :]


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Kills the sandbox's pid namespace, then bwrap. The namespace's init (bwrap's child) is
    killed first, so the kernel kills every process in the namespace and bwrap reaps its child
    and exits; killing bwrap first would leave that init to whoever reaps orphans, a zombie for
    good where the platform's process is PID 1 of its container."""
    with contextlib.suppress(OSError, ValueError):
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        for child in children:
            # Read while bwrap lives: a child it reaps meanwhile leaves a pid the kernel hands
            # out again only after wrapping around.
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_KILL_GRACE_SECONDS)
        return
    # bwrap leads its own process group; --die-with-parent then takes the namespace down.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _drain(fd: int, reader: _Reader, deadline: Callable[[], float]) -> bool:
    """Reads `fd` until end-of-file (True) or `deadline()` (False), asked again after each read
    (it moves when the command starts)."""
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline() - time.monotonic()
            if remaining <= 0:
                return False
            if not selector.select(remaining):
                continue
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                return True
            reader.add(chunk)


def run_bwrap(
    argv: Sequence[str],
    *,
    wall_seconds: float,
    output_bytes: int,
    user: int | None,
) -> CommandResult:
    """Runs `argv` (a bwrap command line ending in the READY handshake), as `user` when given
    (the caller is root), with a clean environment and no stdin."""
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            cwd="/",
            start_new_session=True,
            close_fds=True,
            user=user,
            group=user,
            extra_groups=None if user is None else [],
        )
    except OSError as error:
        raise SandboxFault(f"bwrap could not be started: {error}") from error
    assert process.stdout is not None
    reader = _Reader(OutputCap(output_bytes))
    try:

        def deadline() -> float:
            if reader.started_at is None:
                return start + _START_SECONDS
            return reader.started_at + wall_seconds

        finished = _drain(process.stdout.fileno(), reader, deadline)
        if not finished:
            _kill_tree(process)
            grace = time.monotonic() + _KILL_GRACE_SECONDS
            if not _drain(process.stdout.fileno(), reader, lambda: grace):
                raise SandboxFault("the sandbox's processes outlived its kill")
        exit_code = process.wait(timeout=_KILL_GRACE_SECONDS)
    except subprocess.TimeoutExpired as error:
        raise SandboxFault("bwrap did not exit after its output ended") from error
    finally:
        # Never signal a reaped pid: it may belong to someone else by now.
        if process.returncode is None:
            _kill_tree(process)
            process.wait()
        process.stdout.close()
    duration = time.monotonic() - start
    if not reader.started:
        said = bytes(reader.preamble).decode("utf-8", "replace").strip()
        first = said.splitlines()[0] if said else f"exit code {exit_code}, no message"
        if not finished:
            first = f"no start within {_START_SECONDS:g} s ({first})"
        raise SandboxFault(f"the sandbox did not start: {first}")
    return CommandResult(
        exit_code=exit_code if finished else TIMED_OUT,
        output=reader.cap.text(),
        truncated=reader.cap.truncated,
        output_bytes=reader.cap.total,
        timed_out=not finished,
        duration_seconds=round(duration, 3),
    )
