"""The coding track's sandbox (SPEC R-2.5) against the real bubblewrap: what a command can see,
the hostile commands and archives it must survive, and the patch round trip from an agent's
working copy to a fresh verify sandbox. Skips, with `require_sandbox()`'s one line, where bwrap
cannot run."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_processes import running

from aml_pipeline.sandbox import (
    CommandResult,
    Sandbox,
    SandboxFault,
    SandboxLimits,
    SandboxUnavailable,
    require_sandbox,
)

pytestmark = pytest.mark.integration

CALC = "def add(a, b):\n    return a + b\n"
TESTS = (
    "import unittest\n\nfrom calc.core import add\n\n\n"
    "class AddTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
BINARY = b"\x00\x01\x02 not text \xff"
LATIN1 = "café\n".encode("latin-1")


@pytest.fixture(scope="module", autouse=True)
def _bwrap_available() -> None:
    try:
        require_sandbox()
    except SandboxUnavailable as unavailable:
        pytest.skip(str(unavailable))


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _add_link(tar: tarfile.TarFile, name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small pure-Python project: a package, its tests, a binary file, a Latin-1 file and a
    symlink inside the tree."""
    archive = tmp_path_factory.mktemp("snapshot") / "calc.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add(tar, "./calc/__init__.py", b"")
        _add(tar, "./calc/core.py", CALC.encode())
        _add(tar, "./tests/__init__.py", b"")
        _add(tar, "./tests/test_core.py", TESTS.encode())
        _add(tar, "./data/blob.bin", BINARY)
        _add(tar, "./data/notes.txt", LATIN1)
        _add(tar, "./run.sh", b"#!/bin/sh\necho run\n", mode=0o755)
        _add_link(tar, "./data/core-link.py", "../calc/core.py")
    return archive


@pytest.fixture
def sandbox(snapshot: Path) -> Iterator[Sandbox]:
    with Sandbox.from_archive(snapshot) as made:
        yield made


def _files(root: Path) -> dict[str, tuple[str, bytes, bool]]:
    """Every file under `root` (but .git): kind, content or link target, executable bit."""
    found: dict[str, tuple[str, bytes, bool]] = {}
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d != ".git"]
        for name in names:
            path = Path(directory, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = ("link", os.readlink(path).encode(), False)
            else:
                found[key] = ("file", path.read_bytes(), bool(path.stat().st_mode & 0o100))
    return found


def _sandbox_processes(uid: int | None, marker: str) -> list[str]:
    """Host processes that belong to a sandbox: its uid's (when the test runs as root) or any
    whose command line holds `marker`."""
    listing = subprocess.run(
        ["ps", "-eo", "uid=,args="], capture_output=True, text=True, check=True
    ).stdout
    left = []
    for line in listing.splitlines():
        owner, _, args = line.strip().partition(" ")
        if (uid is not None and owner == str(uid)) or (marker in args and "ps -eo" not in args):
            left.append(line)
    return left


def _wait_gone(uid: int | None, marker: str, within: float = 1.0) -> list[str]:
    deadline = time.monotonic() + within
    while (left := _sandbox_processes(uid, marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_command_sees_only_its_repository(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AML_SECRET_KEYS", "platform-secret")
    repository = Path(__file__).resolve().parents[2]
    hidden = [repository, repository / ".venv", "/work", "/root", sandbox.root, sandbox.pristine]
    probe = (
        f"for p in {' '.join(map(str, hidden))} /var /opt /home /usr/local/bin; do "
        '  test -e "$p" && echo "VISIBLE $p"; done; '
        "env | sort; echo uid=$(id -u); ls -A /tmp; "
        "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c AML_ ; "
        "echo written > /testbed/new.txt && echo more >> /testbed/calc/core.py && echo wrote"
    )
    result = sandbox.run(probe)
    assert "VISIBLE" not in result.output
    env = {line.split("=", 1)[0] for line in result.output.splitlines() if "=" in line}
    assert "AML_SECRET_KEYS" not in result.output
    assert env <= {
        "PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PAGER",
        "GIT_PAGER", "PWD", "OLDPWD", "SHLVL", "_", "uid",
    }  # fmt: skip
    assert "uid=1000" in result.output
    assert result.output.rstrip().endswith("wrote")
    assert (sandbox.working_copy / "new.txt").read_text() == "written\n"
    assert not (sandbox.pristine / "new.txt").exists()
    assert (sandbox.pristine / "calc/core.py").read_text() == CALC
    assert os.stat(sandbox.working_copy / "new.txt").st_uid != 0


def test_rm_rf_everything_damages_only_the_working_copy(sandbox: Sandbox, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.write_text("alive")
    first = sandbox.run("rm -rf / --no-preserve-root; echo status=$?")
    second = sandbox.run("rm -rf ~ /testbed/.. ; echo status=$?")
    assert "status=" in first.output and "status=" in second.output
    assert canary.read_text() == "alive"
    assert (sandbox.pristine / "calc/core.py").read_text() == CALC
    assert Path(sys.executable).exists() and Path("/usr/bin/python3").exists()
    assert (sandbox.root / "etc" / "passwd").exists()
    after = sandbox.run("python3 -c 'print(6 * 7)'; ls -A /testbed | wc -l")
    assert after.ok and after.output.split() == ["42", "0"]


def test_a_fork_bomb_is_bounded_and_the_machine_stays_responsive(snapshot: Path) -> None:
    limits = SandboxLimits(processes=64, output_bytes=4096)
    with Sandbox.from_archive(snapshot, limits) as sandbox:
        # The bomb's main shell ends at once, and with it the whole pid namespace.
        plain = sandbox.run(":(){ :|:& };:", timeout=5)
        assert not plain.timed_out and plain.duration_seconds < 5
        # Kept alive, it fills its process budget; a Python started first counts the processes.
        count = (
            "import os, time; time.sleep(1.5); "
            "print('processes', sum(p.isdigit() for p in os.listdir('/proc')), flush=True)"
        )
        outcome: list[CommandResult] = []
        bomb = threading.Thread(
            target=lambda: outcome.append(
                sandbox.run(f'python3 -c "{count}" & :(){{ :|:& }};:; sleep 100', timeout=3)
            )
        )
        started = time.monotonic()
        bomb.start()
        time.sleep(1)
        host_latencies = []
        for _ in range(5):
            before = time.monotonic()
            subprocess.run(["true"], check=True)
            host_latencies.append(time.monotonic() - before)
        bomb.join(timeout=15)
        elapsed = time.monotonic() - started
        assert not bomb.is_alive()
        result = outcome[0]
        assert result.timed_out and elapsed < 3 + 3
        assert max(host_latencies) < 1.0
        counted = [int(line.split()[1]) for line in result.output.splitlines()
                   if line.startswith("processes ")]  # fmt: skip
        assert counted and counted[0] <= limits.processes
        assert _wait_gone(sandbox.uid, "sleep 100") == []
        after = sandbox.run("echo alive")
        assert after.ok and after.output == "alive\n"


def test_endless_output_is_capped(snapshot: Path) -> None:
    with Sandbox.from_archive(snapshot, SandboxLimits(output_bytes=64 * 1024)) as sandbox:
        endless = sandbox.run("yes", timeout=2)
        assert endless.timed_out and endless.truncated
        assert endless.output_bytes > 64 * 1024 and endless.duration_seconds < 4
        assert len(endless.output.encode()) < 64 * 1024 + 100
        flood = sandbox.run("seq 1 1000000; echo the-end")
        assert flood.ok and flood.truncated and flood.output_bytes == 6_888_896 + len("the-end\n")
        assert flood.output.startswith("1\n2\n3\n") and flood.output.endswith("1000000\nthe-end\n")
        assert "bytes of output dropped" in flood.output


def test_sleep_past_the_limit_is_killed_with_its_process_tree(sandbox: Sandbox) -> None:
    result = sandbox.run("(sleep 1000 &); sleep 1000", timeout=2)
    assert result.timed_out and result.exit_code == -1 and not result.ok
    assert 1.9 < result.duration_seconds < 3
    assert _wait_gone(sandbox.uid, "sleep 1000") == []
    # The limit starts when the command does: even a tiny one is the command's, not a fault.
    instant = sandbox.run("sleep 1000", timeout=0.001)
    assert instant.timed_out and instant.duration_seconds < 1


def test_an_interrupt_kills_the_running_command_and_refuses_the_next(sandbox: Sandbox) -> None:
    """`interrupt`, from another thread, ends the command running now with its whole process
    tree (reported as timed out, long before its own limit), and no command runs after it."""
    outcome: list[CommandResult] = []
    command = threading.Thread(
        target=lambda: outcome.append(sandbox.run("(sleep 1001 &); sleep 1001", timeout=60))
    )
    command.start()
    deadline = time.monotonic() + 10
    # Both sleeps, not bwrap's own command line, which names them before they start.
    while len(running("sleep", "1001")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(running("sleep", "1001")) == 2, "the command never started"
    started = time.monotonic()
    sandbox.interrupt()
    command.join(timeout=15)
    assert not command.is_alive() and time.monotonic() - started < 5
    (result,) = outcome
    assert result.timed_out and result.exit_code == -1
    assert _wait_gone(sandbox.uid, "sleep 1001") == []
    with pytest.raises(SandboxFault, match="interrupted"):
        sandbox.run("echo too late")
    # Interrupting it again, with nothing running, changes nothing.
    sandbox.interrupt()


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.005, 0.01, 0.02, 0.05])
def test_an_interrupt_at_any_moment_of_the_start_ends_the_command(
    snapshot: Path, delay: float
) -> None:
    """An interrupt while bwrap is still setting up (before the namespace's init exists to be
    killed) ends the command at once all the same: refused, failed to start, or cut."""
    with Sandbox.from_archive(snapshot) as sandbox:
        outcome: list[CommandResult | SandboxFault] = []

        def run() -> None:
            try:
                outcome.append(sandbox.run("sleep 1002", timeout=60))
            except SandboxFault as fault:
                outcome.append(fault)

        command = threading.Thread(target=run)
        command.start()
        time.sleep(delay)
        started = time.monotonic()
        sandbox.interrupt()
        command.join(timeout=15)
        assert not command.is_alive() and time.monotonic() - started < 5
        (result,) = outcome
        assert isinstance(result, SandboxFault) or result.timed_out
        assert running("sleep", "1002") == []


def test_a_memory_hog_fails(sandbox: Sandbox) -> None:
    result = sandbox.run("python3 -c 'b = bytearray(4 << 30); print(len(b))'")
    assert result.exit_code not in (0, -1)
    assert "MemoryError" in result.output


def test_no_network_not_even_the_platforms_ports(sandbox: Sandbox) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        port = server.getsockname()[1]
        attempts = {
            "loopback": f"socket.create_connection(('127.0.0.1', {port}), timeout=2)",
            "dns": "socket.getaddrinfo('example.com', 443)",
            "outbound": "socket.create_connection(('1.1.1.1', 53), timeout=2)",
        }
        for name, call in attempts.items():
            result = sandbox.run(f"python3 -c \"import socket; {call}; print('REACHED')\"")
            assert result.exit_code != 0 and "REACHED" not in result.output, name
        with pytest.raises(BlockingIOError):
            server.accept()


def test_a_patch_round_trips_to_a_fresh_sandbox(snapshot: Path) -> None:
    edit = (
        "sed -i 's/a + b/b + a  # commutes/' calc/core.py && "
        "mkdir -p calc/extra && printf 'X = 1\\n' > calc/extra/mod.py && "
        "rm calc/__init__.py data/core-link.py && printf '\\000\\003binary' > data/blob.bin && "
        "printf 'caf\\351 au lait\\n' > data/notes.txt && chmod -x run.sh && "
        "ln -s calc/extra/mod.py mod-link.py && "
        "mkdir -p .git/objects && echo agent-made > .git/HEAD"
    )
    with Sandbox.from_archive(snapshot) as agent:
        assert agent.run(edit).ok
        patch = agent.patch()
        expected = _files(agent.working_copy)
    assert "a/calc/core.py b/calc/core.py" in patch and "GIT binary patch" in patch
    assert ".git/" not in patch
    with Sandbox.from_archive(snapshot) as verify:
        applied = verify.apply(patch)
        assert applied.ok, applied.output
        assert _files(verify.working_copy) == expected
        assert verify.patch() == patch
        tests = verify.run("python3 -m unittest -v")
        assert tests.ok and "test_add" in tests.output
    with Sandbox.from_archive(snapshot) as unchanged:
        assert unchanged.patch() == ""
        assert unchanged.apply("").ok
        rejected = unchanged.apply(patch.replace("return a + b", "return a - b"))
        assert not rejected.ok and "patch" in rejected.output


def _hostile(path: Path, build: str) -> Path:
    with tarfile.open(path, "w") as tar:
        _add(tar, "fine.py", b"x = 1\n")
        if build == "parent":
            _add(tar, "../evil", b"owned")
        elif build == "absolute":
            _add(tar, "/tmp/evil", b"owned")
        elif build == "symlink-out":
            _add_link(tar, "etc", "/etc")
        elif build == "symlink-up":
            _add_link(tar, "up", "../../..")
        elif build == "through-link":
            _add_link(tar, "inner", "sub")
            _add(tar, "inner/x", b"through")
        elif build == "hardlink":
            _add_link(tar, "passwd", "/etc/passwd", tarfile.LNKTYPE)
        elif build == "device":
            info = tarfile.TarInfo("null")
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(info)
        elif build == "git":
            _add(tar, "pkg/.git/config", b"[core]\n")
    return path


@pytest.mark.parametrize(
    "build",
    [
        "parent",
        "absolute",
        "symlink-out",
        "symlink-up",
        "through-link",
        "hardlink",
        "device",
        "git",
    ],
)
def test_a_hostile_archive_is_refused(tmp_path: Path, build: str) -> None:
    parent = tmp_path / "sandboxes"
    parent.mkdir()
    with pytest.raises(SandboxFault, match="refused"):
        Sandbox.from_archive(_hostile(tmp_path / f"{build}.tar", build), parent=parent)
    assert list(parent.iterdir()) == []
    assert not Path("/tmp/evil").exists() and not (tmp_path / "evil").exists()


def test_an_unreadable_archive_is_a_platform_fault(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(SandboxFault, match="unreadable"):
        Sandbox.from_archive(garbage)


def test_cleanup_removes_what_the_command_locked(snapshot: Path) -> None:
    with Sandbox.from_archive(snapshot) as sandbox:
        locked = sandbox.run(
            "mkdir -p deep/er && touch deep/er/f && chmod 000 deep/er/f deep/er deep calc /testbed"
        )
        assert locked.ok, locked.output
        assert sandbox.run("ls /testbed").exit_code != 0
        assert sandbox.patch().count("deleted file mode") == 0
        root = sandbox.root
    assert not root.exists()


def test_a_failed_start_is_a_fault_and_a_fake_one_is_not(sandbox: Sandbox) -> None:
    fake = sandbox.run("echo 'bwrap: Can not mount' >&2; exit 1")
    assert fake.exit_code == 1 and "bwrap" in fake.output
    sandbox.working_copy.rename(sandbox.root / "moved")
    with pytest.raises(SandboxFault, match="did not start"):
        sandbox.run("true")


def test_without_bwrap_the_reason_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailable) as unavailable:
        require_sandbox()
    assert str(unavailable.value) == (
        "the coding track needs bubblewrap (bwrap) on PATH: apt-get install bubblewrap"
    )
