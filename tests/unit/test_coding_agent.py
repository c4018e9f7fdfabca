"""The coding track's Solve step (aml_pipeline.coding_agent): mini-swe-agent's real DefaultAgent
driven by a scripted model and a runner that runs each command with subprocess in a temporary
work tree (no sandbox here), and the memory section's cut (rule coding-context-v1)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aml_pipeline.coding_agent import (
    MEMORY_SECTION,
    MINI_SWE_AGENT_VERSION,
    SUBMIT_SENTINEL,
    AgentConfig,
    Attempt,
    ChatMessage,
    ContextExhausted,
    EndReason,
    LoopBridge,
    PlatformFailure,
    RunnerStopped,
    StoppableRunner,
    attempt,
    bounded_trajectory,
    load_agent_config,
    memory_context,
)

ROOT = Path(__file__).resolve().parents[2]


# --- the memory section -----------------------------------------------------------------------


async def by_length(text: str) -> int:
    """One token per character, so the cuts are easy to check by hand."""
    return len(text)


async def test_memories_are_the_ranked_prefix_that_fits() -> None:
    candidates = [
        {"content": "b" * 10, "created_at": "2024-01-02"},  # "- [2024-01-02] bbbbbbbbbb": 25
        {"content": "a" * 10},  # "- aaaaaaaaaa": 12
        {"content": "c"},  # "- c": 3, would fit after a cut but is never pulled ahead of rank
    ]
    context = await memory_context(candidates, 37, by_length)
    assert context.text == "- [2024-01-02] bbbbbbbbbb\n- aaaaaaaaaa"
    assert (context.tokens, context.kept, context.candidates_returned) == (37, 2, 3)
    assert not context.first_cut
    context = await memory_context(candidates, 36, by_length)
    assert (context.text, context.tokens, context.kept) == ("- [2024-01-02] bbbbbbbbbb", 25, 1)


async def test_a_first_memory_over_the_budget_is_cut_to_it() -> None:
    context = await memory_context([{"content": "x" * 500}, {"content": "y"}], 60, by_length)
    marker = "\n  [cut at the memory budget]"  # format_memories indents continuation lines
    assert context.text == "- " + "x" * (60 - 2 - len(marker)) + marker
    assert (context.tokens, context.kept, context.first_cut) == (60, 1, True)
    # A budget too small for even the mark: no memories at all.
    context = await memory_context([{"content": "x" * 500}], 5, by_length)
    assert (context.text, context.tokens, context.kept) == ("", 0, 0)


async def test_no_memories_give_an_empty_section() -> None:
    context = await memory_context([], 100, by_length)
    assert (context.text, context.kept, context.candidates_returned) == ("", 0, 0)


# --- the config -----------------------------------------------------------------------------


def config_with(**changes: Any) -> AgentConfig:
    fields: dict[str, Any] = {
        "system_template": "You are a bot.",
        "instance_template": "{{task}}\n" + MEMORY_SECTION + "\nGo.",
        "observation_template": "<returncode>{{output.returncode}}</returncode>\n"
        "<output>\n{{ output.output -}}\n</output>",
        "format_error_template": "Format error: {{error}}",
        "step_limit": 10,
        "command_timeout_seconds": 10.0,
        "wall_seconds": 30.0,
        "memory_tokens": 100,
        "token_counter": "utf8-bytes-div-3-v1",
        "reply_max_tokens": 256,
    }
    return AgentConfig(**(fields | changes))


def test_the_fingerprint_is_stable_and_covers_every_field() -> None:
    config = config_with()
    assert config.fingerprint() == config_with().fingerprint()
    assert re.fullmatch(r"[0-9a-f]{64}", config.fingerprint())
    for change in (
        {"step_limit": 11},
        {"wall_seconds": 31.0},
        {"command_timeout_seconds": 11.0},
        {"memory_tokens": 101},
        {"temperature": 0.5},
        {"system_template": "You are a robot."},
        {"agent_version": "2.4.7"},
    ):
        assert config_with(**change).fingerprint() != config.fingerprint(), change


def test_the_templates_are_upstreams_with_the_memory_section() -> None:
    import minisweagent
    import yaml
    from jinja2 import StrictUndefined, Template

    upstream_path = Path(minisweagent.package_dir) / "config/benchmarks/swebench_backticks.yaml"
    upstream = yaml.safe_load(upstream_path.read_text("utf-8"))
    config = load_agent_config(token_counter="test")
    assert config.system_template == upstream["agent"]["system_template"]
    assert config.observation_template == upstream["model"]["observation_template"]
    assert (config.step_limit, config.command_timeout_seconds) == (250, 60.0)
    assert config.command_env["PAGER"] == "cat"

    def render(template: str, **variables: str) -> str:
        return Template(template, undefined=StrictUndefined).render(**variables)

    # Without memories the task prompt is exactly upstream's.
    stock = render(upstream["agent"]["instance_template"], task="Fix it.")
    assert render(config.instance_template, task="Fix it.", memories="") == stock
    with_memories = render(config.instance_template, task="Fix it.", memories="- {{ not jinja }}")
    assert "</pr_description>\n\n<memories>\n" in with_memories
    assert "- {{ not jinja }}\n</memories>\n\n<instructions>" in with_memories


def test_the_pin_matches_the_code() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"][
        "dependencies"
    ]
    pins = [pin for pin in dependencies if pin.startswith("mini-swe-agent")]
    assert pins == [f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}"]


# --- an attempt -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    exit_code: int
    output: str
    timed_out: bool
    truncated: bool


class SubprocessRunner:
    """The sandbox's stand-in: bash in a temporary work tree, its process group killed at the
    timeout, output cut at `cap` characters."""

    def __init__(self, workdir: Path, cap: int = 50_000) -> None:
        self.workdir = workdir
        self.cap = cap
        self.timeouts: list[float] = []

    def run(self, command: str, timeout: float) -> Ran:
        self.timeouts.append(timeout)
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            timed_out = True
        code = -1 if timed_out else process.returncode
        return Ran(code, output[: self.cap], timed_out, len(output) > self.cap)


class BrokenRunner:
    def run(self, command: str, timeout: float) -> Ran:
        raise OSError("bwrap: setting up the namespace failed")


def bash(command: str) -> str:
    return f"THOUGHT: next.\n\n```mswea_bash_command\n{command}\n```"


SUBMIT = bash(f"echo {SUBMIT_SENTINEL} && echo done")


class ScriptedModel:
    """`complete` that replies from a list (the last reply repeats), reporting as tokens the
    characters of the conversation and of the reply, and keeps what it was sent."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.sent: list[list[ChatMessage]] = []
        self.threads: set[int] = set()

    async def __call__(self, messages: list[ChatMessage]) -> tuple[str, int, int]:
        self.threads.add(threading.get_ident())
        self.sent.append(messages)
        reply = self.replies[min(len(self.sent), len(self.replies)) - 1]
        return reply, sum(len(m["content"]) for m in messages), len(reply)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "greet.py").write_text('print("hello")\n')
    return tmp_path


async def test_an_edit_then_the_submission(workdir: Path) -> None:
    edit = bash("cat <<'EOF' > greet.py\nprint(\"hello, world\")\nEOF\npython3 greet.py")
    model = ScriptedModel([edit, SUBMIT])
    result = await attempt(
        "Make greet.py greet the world.",
        "- [2024-05-01] greet.py prints the greeting",
        config_with(),
        model,
        SubprocessRunner(workdir),
    )
    assert (workdir / "greet.py").read_text() == 'print("hello, world")\n'
    assert result.end_reason is EndReason.SUBMITTED
    assert result.submission == "done\n"
    assert (result.steps, result.format_errors) == (2, 0)
    assert result.tokens_out == len(edit) + len(SUBMIT)
    assert result.tokens_in == sum(sum(len(m["content"]) for m in sent) for sent in model.sent)
    assert result.worker_stopped and result.trajectory_elided == 0
    assert result.config_fingerprint == config_with().fingerprint()
    assert result.agent == f"mini-swe-agent {MINI_SWE_AGENT_VERSION}"
    roles = [message.role for message in result.trajectory]
    assert roles == ["system", "user", "assistant", "user", "assistant", "exit"]
    task = result.trajectory[1].content
    assert "greet the world" in task and "<memories>" in task and "greet.py prints" in task
    observation = result.trajectory[3]
    assert observation.content == "<returncode>0</returncode>\n<output>\nhello, world\n</output>"
    assert observation.extra["returncode"] == 0
    assert result.trajectory[2].extra["tokens_out"] == len(edit)
    assert result.trajectory[-1].extra["exit_status"] == "Submitted"
    # The model is sent plain chat messages, from the loop's own thread, not the agent's.
    assert model.sent[1][-1] == {"role": "user", "content": observation.content}
    assert model.threads == {threading.get_ident()}
    Attempt.model_validate_json(result.model_dump_json())  # an audit document round-trips


async def test_upstreams_own_templates_drive_an_attempt(workdir: Path) -> None:
    config = load_agent_config(token_counter="test", wall_seconds=30.0)
    replies = [
        "Let me look around first.",
        bash("sed -i 's/hello/hello, world/' greet.py && echo \"PAGER=$PAGER\""),
        bash("seq 1 5000"),
        bash(f"echo {SUBMIT_SENTINEL} && cat greet.py"),
    ]
    model = ScriptedModel(replies)
    result = await attempt("Greet the world.", "- a note", config, model, SubprocessRunner(workdir))
    assert result.end_reason is EndReason.SUBMITTED
    assert result.submission == 'print("hello, world")\n'
    assert (result.steps, result.format_errors) == (4, 1)
    contents = [message.content for message in result.trajectory]
    assert "Please format your action in triple backticks" in contents[2]
    # Commands run with upstream's environment variables (PAGER=cat, ...).
    assert "PAGER=cat" in contents[4]
    # Upstream's observation template elides the middle of a long output.
    assert "<elided_chars>" in contents[6] and "<output_head>" in contents[6]
    assert model.sent[0][0]["content"] == config.system_template.rstrip("\n")


async def test_no_memories_leave_the_section_out(workdir: Path) -> None:
    model = ScriptedModel([SUBMIT])
    result = await attempt("Task.", "", config_with(), model, SubprocessRunner(workdir))
    assert result.end_reason is EndReason.SUBMITTED
    assert "<memories>" not in model.sent[0][1]["content"]


async def test_the_step_limit_ends_it(workdir: Path) -> None:
    result = await attempt(
        "Task.",
        "",
        config_with(step_limit=3),
        ScriptedModel([bash("ls")]),
        SubprocessRunner(workdir),
    )
    assert (result.end_reason, result.steps) == (EndReason.STEP_LIMIT, 3)
    assert result.trajectory[-1].extra["exit_status"] == "LimitsExceeded"


async def test_a_malformed_reply_is_answered_and_the_attempt_goes_on(workdir: Path) -> None:
    model = ScriptedModel(["I would run ls.", SUBMIT])
    result = await attempt("Task.", "", config_with(), model, SubprocessRunner(workdir))
    assert (result.end_reason, result.steps, result.format_errors) == (EndReason.SUBMITTED, 2, 1)
    feedback = result.trajectory[2]
    assert feedback.role == "user" and feedback.content.startswith("Format error: Expected exactly")
    assert feedback.extra["model_response"] == "I would run ls."
    assert feedback.extra["tokens_out"] == len("I would run ls.")
    # As upstream: the malformed reply itself is not put back into the conversation.
    assert [m["role"] for m in model.sent[1]] == ["system", "user", "user"]


async def test_repeated_malformed_replies_end_it(workdir: Path) -> None:
    model = ScriptedModel(["no command here"])
    result = await attempt("Task.", "", config_with(), model, SubprocessRunner(workdir))
    assert (result.end_reason, result.steps, result.format_errors) == (
        EndReason.FORMAT_ERROR,
        3,
        3,
    )


async def test_a_hanging_model_meets_the_wall_limit(workdir: Path) -> None:
    cancelled = asyncio.Event()

    async def hangs(messages: list[ChatMessage]) -> tuple[str, int, int]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    started = time.monotonic()
    result = await attempt(
        "Task.", "", config_with(wall_seconds=0.5), hangs, SubprocessRunner(workdir)
    )
    assert time.monotonic() - started < 3
    assert (result.end_reason, result.steps) == (EndReason.WALL_LIMIT, 1)
    assert result.worker_stopped and cancelled.is_set()
    assert result.trajectory[-1].extra["exit_status"] == "TimeExceeded"


async def test_a_hanging_command_meets_the_wall_limit(workdir: Path) -> None:
    runner = SubprocessRunner(workdir)
    started = time.monotonic()
    result = await attempt(
        "Task.", "", config_with(wall_seconds=1.0), ScriptedModel([bash("sleep 30")]), runner
    )
    assert time.monotonic() - started < 4
    assert result.end_reason is EndReason.WALL_LIMIT and result.worker_stopped
    # The command's timeout was cut from the per-command 10 s to the time left.
    assert len(runner.timeouts) == 1 and runner.timeouts[0] <= 1.0


class StuckRunner:
    """A runner that does not keep its timeout."""

    def run(self, command: str, timeout: float) -> Ran:
        time.sleep(2)
        return Ran(0, "", False, False)


async def test_the_wall_limit_holds_when_the_runner_does_not(workdir: Path) -> None:
    started = time.monotonic()
    model = ScriptedModel([bash("ls")])
    result = await attempt(
        "Task.", "", config_with(wall_seconds=0.3), model, StuckRunner(), stop_grace_seconds=0.2
    )
    assert time.monotonic() - started < 1.5
    assert result.end_reason is EndReason.WALL_LIMIT
    # Its thread was still in the runner: the caller tears the sandbox down before diffing.
    assert not result.worker_stopped


class HeldRunner:
    """Holds each command until `release` is set; `killable` gives it an `interrupt` that
    releases it, as the sandbox's kill ends a command."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.interrupts = 0

    def run(self, command: str, timeout: float) -> Ran:
        self.started.set()
        self.release.wait(30)
        return Ran(0, "", False, False)


class KillableRunner(HeldRunner):
    def interrupt(self) -> None:
        self.interrupts += 1
        self.release.set()


def test_a_stopped_runner_is_closed_only_once_its_command_returns() -> None:
    """The attempt's end stops its runner while the agent's thread is inside a command that
    cannot be killed: the removal waits that long, then is left to the command's own thread."""
    held = HeldRunner()
    runner = StoppableRunner(held)
    thread = threading.Thread(target=runner.run, args=("sleep", 10.0))
    thread.start()
    assert held.started.wait(5)
    removed: list[str] = []

    def remove() -> None:
        removed.append(threading.current_thread().name)

    assert not runner.close(remove, wait=0.1)
    assert removed == []
    with pytest.raises(RunnerStopped):
        runner.run("echo too late", 10.0)
    held.release.set()
    thread.join(5)
    # Removed by the thread the command ran in, once it returned.
    assert removed == [thread.name]


def test_closing_a_runner_kills_its_command_and_then_removes_it() -> None:
    killable = KillableRunner()
    runner = StoppableRunner(killable)
    thread = threading.Thread(target=runner.run, args=("sleep", 10.0))
    thread.start()
    assert killable.started.wait(5)
    removed: list[str] = []
    assert runner.close(lambda: removed.append("removed"), wait=5.0)
    thread.join(5)
    assert (killable.interrupts, removed) == (1, ["removed"])
    # With no command running, closing removes it at once and kills nothing.
    idle = KillableRunner()
    assert StoppableRunner(idle).close(lambda: removed.append("idle"), wait=0.0)
    assert (idle.interrupts, removed[-1]) == (0, "idle")


async def test_the_wall_limit_kills_the_command_in_flight() -> None:
    """At the wall limit the command in flight is killed, not waited for: the attempt ends on
    time, its thread stopped, even where the command would have run far past its own limit."""
    killable = KillableRunner()
    started = time.monotonic()
    result = await attempt(
        "Task.", "", config_with(wall_seconds=0.5), ScriptedModel([bash("sleep 30")]), killable
    )
    assert time.monotonic() - started < 3
    assert result.end_reason is EndReason.WALL_LIMIT and result.worker_stopped
    assert killable.interrupts == 1
    # What the killed command printed was not shown to the agent as an observation.
    assert result.trajectory[-1].extra["exit_status"] == "TimeExceeded"
    assert [m.role for m in result.trajectory].count("user") == 1


async def test_a_slow_command_times_out_and_the_agent_is_told(workdir: Path) -> None:
    runner = SubprocessRunner(workdir)
    model = ScriptedModel([bash("sleep 30"), SUBMIT])
    config = config_with(command_timeout_seconds=0.3)
    result = await attempt("Task.", "", config, model, runner)
    assert result.end_reason is EndReason.SUBMITTED and runner.timeouts[0] == 0.3
    observation = result.trajectory[3]
    assert observation.extra["returncode"] == -1 and observation.extra["timed_out"] is True
    assert "Command 'sleep 30' timed out after 0.3 seconds" in str(
        observation.extra["exception_info"]
    )


async def test_a_failing_model_is_the_platforms_failure(workdir: Path) -> None:
    async def down(messages: list[ChatMessage]) -> tuple[str, int, int]:
        raise ConnectionError("LLM endpoint unreachable")

    with pytest.raises(PlatformFailure) as raised:
        await attempt("Task.", "", config_with(), down, SubprocessRunner(workdir))
    failure = raised.value
    assert failure.where == "model" and "LLM endpoint unreachable" in failure.reason
    assert isinstance(failure.__cause__, ConnectionError)
    assert failure.steps == 1 and [m.role for m in failure.trajectory][:2] == ["system", "user"]


async def test_a_failing_sandbox_is_the_platforms_failure() -> None:
    with pytest.raises(PlatformFailure) as raised:
        await attempt("Task.", "", config_with(), ScriptedModel([bash("ls")]), BrokenRunner())
    assert raised.value.where == "sandbox" and isinstance(raised.value.__cause__, OSError)


async def test_a_full_context_ends_the_attempt(workdir: Path) -> None:
    async def full(messages: list[ChatMessage]) -> tuple[str, int, int]:
        raise ContextExhausted("prompt of 140000 tokens over the model's 131072")

    result = await attempt("Task.", "", config_with(), full, SubprocessRunner(workdir))
    assert (result.end_reason, result.steps) == (EndReason.CONTEXT_LIMIT, 1)


# --- the bridge and the trajectory's bound --------------------------------------------------


async def test_the_bridge_runs_calls_on_the_loop_and_stop_cancels_them() -> None:
    loop = asyncio.get_running_loop()
    started = threading.Event()

    async def slow(messages: list[ChatMessage]) -> tuple[str, int, int]:
        started.set()
        await asyncio.sleep(30)
        return "late", 1, 1

    bridge = LoopBridge(loop, slow)
    with pytest.raises(RuntimeError, match="outside the event loop"):
        bridge.call([])
    outcome: list[BaseException] = []

    def worker() -> None:
        try:
            bridge.call([{"role": "user", "content": "hi"}])
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    while not started.is_set():
        await asyncio.sleep(0.01)
    bridge.stop()
    await asyncio.to_thread(thread.join, 5)
    assert len(outcome) == 1 and isinstance(outcome[0], LoopBridge.Stopped)
    with pytest.raises(LoopBridge.Stopped):
        await asyncio.to_thread(bridge.call, [])


def test_the_trajectory_is_bounded() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "t"},
    ] + [
        {"role": "user", "content": "x" * 100, "extra": {"raw_output": "x" * 100, "returncode": 0}}
        for _ in range(10)
    ]
    kept, elided = bounded_trajectory(messages, message_chars=50, total_chars=10_000)
    assert elided == 0 and len(kept) == 12
    assert kept[2].content.startswith("x" * 50 + "\n[50 characters cut]")
    assert kept[2].extra == {"returncode": 0}
    kept, elided = bounded_trajectory(messages, message_chars=1_000, total_chars=2 + 3 * 101)
    assert elided == 7 and [m.content[:1] for m in kept] == ["s", "t", "x", "x", "x"]
