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
import threading
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


def _kill_namespace(process: subprocess.Popen[bytes]) -> None:
    """Kills the namespace's init (bwrap's child), so that the kernel kills every process in the
    namespace and bwrap reaps its child and exits. Never after bwrap was reaped."""
    with contextlib.suppress(OSError, ValueError):
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        for child in children:
            # Read while bwrap lives: a child it reaps meanwhile leaves a pid the kernel hands
            # out again only after wrapping around.
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Kills the sandbox's pid namespace, then bwrap. The namespace's init is killed first;
    killing bwrap first would leave that init to whoever reaps orphans, a zombie for good where
    the platform's process is PID 1 of its container."""
    _kill_namespace(process)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_KILL_GRACE_SECONDS)
        return
    # bwrap leads its own process group; --die-with-parent then takes the namespace down.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


class Interrupt:
    """Cuts a sandbox's commands short from another thread (`Sandbox.interrupt`): the one
    running is killed now, and one that starts later as soon as it starts. Its `run_bwrap`
    returns it as timed out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._set = False

    @property
    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            self._set = True
            if self._process is not None:
                _kill_namespace(self._process)

    def watch(self, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._process = process
            if self._set:
                _kill_namespace(process)

    def unwatch(self) -> None:
        """Called before the process is reaped: a reaped pid may be someone else's by the time
        another thread would signal it."""
        with self._lock:
            self._process = None


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
    interrupt: Interrupt | None = None,
) -> CommandResult:
    """Runs `argv` (a bwrap command line ending in the READY handshake), as `user` when given
    (the caller is root), with a clean environment and no stdin; cut short when `interrupt` is
    set."""
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
                # Even when interrupted: until READY the namespace's init may not exist yet,
                # and bwrap, killed first, would leave it behind (`_kill_tree`).
                return start + _START_SECONDS
            if interrupt is not None and interrupt.is_set:
                return 0.0
            return reader.started_at + wall_seconds

        if interrupt is not None:
            interrupt.watch(process)
        try:
            finished = _drain(process.stdout.fileno(), reader, deadline)
        finally:
            if interrupt is not None:
                interrupt.unwatch()
        cut = not finished or (interrupt is not None and interrupt.is_set)
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
        if interrupt is not None and interrupt.is_set:
            raise SandboxFault("the sandbox was interrupted before its command started")
        said = bytes(reader.preamble).decode("utf-8", "replace").strip()
        first = said.splitlines()[0] if said else f"exit code {exit_code}, no message"
        if not finished:
            first = f"no start within {_START_SECONDS:g} s ({first})"
        raise SandboxFault(f"the sandbox did not start: {first}")
    return CommandResult(
        exit_code=TIMED_OUT if cut else exit_code,
        output=reader.cap.text(),
        truncated=reader.cap.truncated,
        output_bytes=reader.cap.total,
        timed_out=cut,
        duration_seconds=round(duration, 3),
    )
