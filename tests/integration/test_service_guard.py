"""A service never outlives its broker, its database or its launcher spinning (issue 15): with
nats-server and nx-27017 gone it uses little CPU and exits (status 3) within
`AML_DEPENDENCY_LOSS_EXIT_SECONDS` plus the shutdown grace; under the embedded stack it exits
once its launcher is gone. And one data dir serves one stack: a second launcher is refused with
one line naming the dir and the holder's pid, before it touches anything."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aml_devtools.processes import ManagedProcess, find_executable
from aml_devtools.stack import LOCK_FILE, STACK_FILE, DataDirBusyError, EmbeddedStack, StackConfig
from aml_runtime.broker import RECONNECT_WAIT_SECONDS, reconnect_options
from aml_runtime.secrets import SecretBox
from aml_runtime.service import DEPENDENCY_LOST_EXIT_CODE
from aml_runtime.settings import CommonSettings

pytestmark = pytest.mark.integration

LOSS_EXIT = 6.0
# The guard decides every LOSS_EXIT / 4 s; a clean shutdown is given 10 s at most.
EXIT_BOUND = LOSS_EXIT + LOSS_EXIT / 4 + 10.0 + 5.0


def _needs_servers() -> None:
    for binary in ("nats-server", "nx-27017"):
        if find_executable(binary) is None:
            pytest.skip(f"{binary} is not installed")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[EmbeddedStack]:
    _needs_servers()
    with EmbeddedStack(StackConfig(data_dir=tmp_path / "stack", start_llm=False)) as s:
        s.start_infra()
        yield s


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _scheduler(stack: EmbeddedStack, **env: str) -> ManagedProcess:
    base = {
        "AML_SECRET_KEYS": SecretBox.new_key(),
        "AML_METRICS_PORT": "0",
        "AML_DEPENDENCY_LOSS_EXIT_SECONDS": str(LOSS_EXIT),
        "AML_RECONCILE_INTERVAL_SECONDS": "1",
    }
    proc = stack.start_process("scheduler", [sys.executable, "-m", "aml_scheduler"], base | env)
    deadline = time.monotonic() + 30
    while "started successfully" not in proc.log_path.read_text():
        assert proc.is_running(), proc.tail_log()
        assert time.monotonic() < deadline, proc.tail_log()
        time.sleep(0.2)
    return proc


def _wait_exit(proc: ManagedProcess, bound: float) -> tuple[int | None, float]:
    started = time.monotonic()
    while proc.is_running() and time.monotonic() - started < bound:
        time.sleep(0.1)
    return proc.returncode, time.monotonic() - started


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_service_without_its_broker_and_database_idles_and_exits(stack: EmbeddedStack) -> None:
    proc = _scheduler(stack)
    assert proc.pid is not None
    time.sleep(2)  # connected and consuming
    before = _cpu_seconds(proc.pid)
    stack.kill("nats")
    stack.kill("mongo")
    lost = time.monotonic()
    cpu = before
    while proc.is_running() and time.monotonic() - lost < EXIT_BOUND:
        cpu = _cpu_seconds(proc.pid)
        time.sleep(0.2)
    code, _ = _wait_exit(proc, 1)
    elapsed = time.monotonic() - lost
    print(f"\nexit {code} after {elapsed:.1f}s; CPU {cpu - before:.2f}s over that time")
    assert code == DEPENDENCY_LOST_EXIT_CODE, proc.tail_log()
    assert LOSS_EXIT - 1 <= elapsed <= EXIT_BOUND
    # A retry loop would take a core; a few probes and reconnects take almost nothing.
    assert cpu - before < 0.25 * elapsed
    assert "service.dependency_lost" in proc.log_path.read_text()


def test_a_service_exits_when_its_launcher_is_gone(stack: EmbeddedStack) -> None:
    # Pretend the launcher was pid 1: this process is then no longer the service's parent.
    proc = _scheduler(stack, AML_STACK_PID="1", AML_DEPENDENCY_LOSS_EXIT_SECONDS="4")
    code, elapsed = _wait_exit(proc, 20)
    assert code == DEPENDENCY_LOST_EXIT_CODE, proc.tail_log()
    assert elapsed < 15
    assert "launcher pid 1" in proc.log_path.read_text()


def test_the_stack_tells_its_services_who_launched_them(stack: EmbeddedStack) -> None:
    assert stack.env()["AML_STACK_PID"] == str(os.getpid())


def test_the_broker_reconnects_for_longer_than_the_guard_waits() -> None:
    settings = CommonSettings(dependency_loss_exit_seconds=300)
    options = reconnect_options(settings)
    assert options["max_reconnect_attempts"] * RECONNECT_WAIT_SECONDS > 300


def test_a_second_stack_on_a_data_dir_in_use_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    first = EmbeddedStack(StackConfig(data_dir=data, start_llm=False))
    first.lock()
    (data / STACK_FILE).write_text("{}")
    try:
        second = EmbeddedStack(StackConfig(data_dir=data, start_llm=False))
        with pytest.raises(DataDirBusyError, match=f"{data}.*pid {os.getpid()}"):
            second.start_infra()
        # Its stop (as its `with` block or atexit would run it) leaves the running stack's file.
        second.stop()
        assert (data / STACK_FILE).exists()

        for command in ("up", "demo"):
            cli = subprocess.run(
                [sys.executable, "-m", "aml_devtools.cli", command, "--data-dir", str(data)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert cli.returncode == 1
            assert cli.stdout == ""
            lines = cli.stderr.strip().splitlines()
            assert len(lines) == 1, cli.stderr
            assert str(data) in lines[0] and f"pid {os.getpid()}" in lines[0]
            # `aml demo` clears its data dir: never one in use.
            assert (data / STACK_FILE).exists()
    finally:
        first.stop()
    # Released: the next stack takes it.
    third = EmbeddedStack(StackConfig(data_dir=data, start_llm=False))
    third.lock()
    third.stop()


def test_a_crashed_launcher_releases_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "crash"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from aml_devtools.stack import EmbeddedStack, StackConfig\n"
            f"s = EmbeddedStack(StackConfig(data_dir=Path({str(data)!r}), start_llm=False))\n"
            "s.lock(); print('locked', flush=True); time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(DataDirBusyError, match=f"pid {holder.pid}"):
            EmbeddedStack(StackConfig(data_dir=data, start_llm=False)).lock()
        holder.kill()
        holder.wait()
        after = EmbeddedStack(StackConfig(data_dir=data, start_llm=False))
        after.lock()
        assert (data / LOCK_FILE).read_text().strip() == str(os.getpid())
        after.stop()
    finally:
        holder.kill()
        holder.wait()
