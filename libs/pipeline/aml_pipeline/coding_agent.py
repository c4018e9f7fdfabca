"""The coding track's Solve step: a fixed coding agent attempts a task in a sandboxed copy of the
repository, with the participant's candidates in its task prompt.

The agent is mini-swe-agent (MIT; the bash-only agent that is SWE-bench's baseline), pinned at
MINI_SWE_AGENT_VERSION, driven through its pluggable interfaces rather than re-implemented: its
`DefaultAgent` loop, its text-based action format and observation rendering
(`minisweagent.models.utils.actions_text`, as its `LitellmTextbasedModel` uses them) and the
prompts of its SWE-bench text-based config (`config/benchmarks/swebench_backticks.yaml`: one
```mswea_bash_command``` block a reply, submission by the sentinel COMPLETE_TASK_AND_SUBMIT_
FINAL_OUTPUT as the first line of a command's output). Ours are the two ends it plugs into:

- `BridgedModel`: its Model protocol over the platform's `complete(messages)`, which goes
  through the deployment's one LLM budget (every agent step is one call). The agent is
  synchronous, so it runs in a thread of its own and each query is handed to the service's event
  loop (`LoopBridge`, `asyncio.run_coroutine_threadsafe`).
- `SandboxEnvironment`: its Environment protocol over a `CommandRunner` (the bubblewrap sandbox
  implements it), each command under the per-command timeout, cut to the time left. The
  attempt's end stops its runner (`StoppableRunner`) while the agent's thread may still be in a
  command: no command starts after it, the one running is killed, and the sandbox is removed
  only once that command has returned.

Of mini-swe-agent's dependencies only the agent core's are needed (jinja2, pydantic, rich,
python-dotenv, platformdirs, and pyyaml to read its config); its LLM layer (litellm) and its
CLI, UI and benchmark runners (typer, textual, prompt-toolkit, datasets, tenacity) are never
imported here. It is imported lazily (`_upstream`) so that the rest of this module (the config,
`memory_context`) works where it is not installed, and with its import-time side effects tamed.

What the evaluation spec fixes (`AgentConfig`, hashed by `fingerprint()`): the agent's name,
version and class, the prompt templates (upstream's, with our memory section), the step limit,
the per-command timeout, the wall limit of an attempt, the memory token budget, the output cap
of a reply and temperature 0.

A caller: `load_agent_config` once (into the spec); per task `memory_context(candidates,
config.memory_tokens, counter)`, then `attempt(...)`, then the patch from the sandbox (`git diff`
of its work tree against the snapshot; upstream's workflow leaves a `patch.txt` and scratch
scripts untracked there). Upstream's task prompt names the work tree `/testbed`, so the sandbox
mounts the repository there (`aml_pipeline.sandbox.bwrap.REPO`), and the prompt stays upstream's.
`PlatformFailure` is the platform's error, never an unresolved task. `aml_pipeline.coding_track`
is that caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import hashlib
import importlib
import importlib.metadata
import json
import math
import os
import shlex
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypedDict, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from aml_evaluation.context import TokenCount, fit_candidates
from aml_evaluation.prompts import Memory, format_memories

MINI_SWE_AGENT_VERSION: Final = "2.4.6"
AGENT_CLASS: Final = "minisweagent.agents.default.DefaultAgent"
# The text-based SWE-bench config: replies carry their command in a fenced block, which any
# chat model can produce (the default swebench.yaml needs the provider's tool calls).
UPSTREAM_CONFIG: Final = "config/benchmarks/swebench_backticks.yaml"
# LitellmTextbasedModelConfig.action_regex at the pinned version (the config does not set it).
ACTION_REGEX: Final = r"```mswea_bash_command\s*\n(.*?)\n```"
SUBMIT_SENTINEL: Final = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
CODING_CONTEXT_RULE: Final = "coding-context-v1"
MEMORY_SECTION_VERSION: Final = "coding-memory-v1"

# Our one change to upstream's instance template, put right after the task's
# `</pr_description>` and before its `<instructions>`: the memories are task context, read
# before the workflow. With no memories the block renders to nothing, so the prompt is exactly
# upstream's (the no-memory baseline runs the stock agent). The memory text is a template
# variable, never part of the template, so a participant's text is not evaluated by jinja.
_MEMORY_ANCHOR: Final = "</pr_description>\n"
MEMORY_SECTION: Final = (
    "{% if memories %}\n"
    "<memories>\n"
    "Notes retrieved for this task from a memory of earlier work, most relevant first. They may "
    "be incomplete or out of date: check them against the repository before relying on them.\n"
    "{{memories}}\n"
    "</memories>\n"
    "{% endif %}"
)
# Appended to the participant's first candidate when it alone is over the budget and is cut.
CUT_MARK: Final = "\n[cut at the memory budget]"


class ChatMessage(TypedDict):
    """One message of the conversation as `complete` receives it (OpenAI's chat shape)."""

    role: str
    content: str


# The platform's model call: the conversation -> (reply text, prompt tokens, reply tokens). It
# goes through the LLM admission and uses AgentConfig.temperature and .reply_max_tokens.
Complete = Callable[[list[ChatMessage]], Coroutine[Any, Any, tuple[str, int, int]]]


class ContextExhausted(Exception):
    """What `complete` raises when the conversation no longer fits the model's context window
    (the provider's 400 for an over-long prompt): the attempt's own end (`context_limit`), as
    mini-swe-agent ends on litellm's ContextWindowExceededError, not the platform's failure."""


class CommandResult(Protocol):
    @property
    def exit_code(self) -> int: ...
    @property
    def output(self) -> str:
        """stdout and stderr merged, as the command wrote them, at most the runner's cap."""
        ...

    @property
    def timed_out(self) -> bool: ...
    @property
    def truncated(self) -> bool: ...


class CommandRunner(Protocol):
    def run(self, command: str, timeout: float) -> CommandResult:
        """Runs `bash -c command` in the sandbox's work tree (a fresh shell each time, as
        mini-swe-agent's environments do), killing it and everything it started after
        `timeout` seconds. Raises only when the sandbox itself fails: the platform's failure,
        which the agent never sees as a command's output."""
        ...


@runtime_checkable
class Interruptible(Protocol):
    def interrupt(self) -> None:
        """From any thread: kills the command running now and refuses later ones
        (`aml_pipeline.sandbox.Sandbox.interrupt`)."""
        ...


class RunnerStopped(Exception):
    """A command asked of a `StoppableRunner` after its attempt ended."""


class StoppableRunner:
    """The CommandRunner of one attempt, which the attempt's end (its wall limit, a cancelled
    item) stops from the loop's thread while the agent's thread may be inside a command: from
    then on it refuses commands, and it kills the one running when its runner can
    (`Interruptible`, as the sandbox is). `close` removes the sandbox only once no command runs
    in it, so no command ever runs in a directory being removed."""

    def __init__(self, runner: CommandRunner) -> None:
        self._runner = runner
        self._state = threading.Condition()
        self._stopped = False
        self._running = False
        # The removal left to the thread of the command still running when `close` gave up.
        self._close: Callable[[], None] | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def run(self, command: str, timeout: float) -> CommandResult:
        with self._state:
            if self._stopped:
                raise RunnerStopped
            self._running = True
        try:
            return self._runner.run(command, timeout)
        finally:
            with self._state:
                self._running = False
                self._state.notify_all()
                close, self._close = self._close, None
            if close is not None:
                close()

    def stop(self) -> None:
        """Refuse further commands and kill the one running (if the runner can be)."""
        with self._state:
            # Killed once: a second stop (the closing after the attempt's own) finds it dying.
            kill = self._running and not self._stopped
            self._stopped = True
        if kill and isinstance(self._runner, Interruptible):
            self._runner.interrupt()

    def close(self, close: Callable[[], None], wait: float) -> bool:
        """Stop, then `close` (the sandbox's removal) once no command runs: here, after up to
        `wait` seconds for a command being killed to return (True), or else by the thread that
        runs it, when it returns (False). Blocking: for a worker thread."""
        self.stop()
        with self._state:
            if not self._state.wait_for(lambda: not self._running, wait):
                self._close = close
                return False
        close()
        return True


class AgentConfig(BaseModel):
    """Everything that decides how the agent attempts a task; part of the evaluation spec."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: Literal["mini-swe-agent"] = "mini-swe-agent"
    agent_version: str = MINI_SWE_AGENT_VERSION
    agent_class: str = AGENT_CLASS
    prompts: str = Field(
        default=f"{UPSTREAM_CONFIG}+{MEMORY_SECTION_VERSION}",
        description="Where the templates come from: upstream's config and our memory section.",
    )
    system_template: str
    instance_template: str
    observation_template: str
    format_error_template: str
    action_regex: str = ACTION_REGEX
    submit_sentinel: str = SUBMIT_SENTINEL
    command_env: dict[str, str] = Field(
        default_factory=dict, description="Set for every command (upstream's environment.env)."
    )
    step_limit: int = Field(ge=1, description="Model calls an attempt may make.")
    max_consecutive_format_errors: int = Field(default=3, ge=1)
    command_timeout_seconds: float = Field(gt=0)
    wall_seconds: float = Field(gt=0, description="Wall-clock limit of one attempt.")
    memory_tokens: int = Field(ge=1, description="Budget of the memory section (rule below).")
    memory_rule: str = CODING_CONTEXT_RULE
    token_counter: str = Field(description="How memory tokens are counted.")
    reply_max_tokens: int = Field(ge=1, description="Output cap of one model reply.")
    temperature: float = 0.0

    def canonical_json(self) -> bytes:
        return json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    def fingerprint(self) -> str:
        return hashlib.sha256(self.canonical_json()).hexdigest()


def _upstream() -> Any:
    """mini-swe-agent's agent core, imported on first use. Importing `minisweagent` prints a
    banner, creates its global config folder and loads a `.env` from it into os.environ; the
    two variables it reads first point that at an empty private folder and silence it, so a
    service neither writes to its home nor picks up anyone's settings."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    if "MSWEA_GLOBAL_CONFIG_DIR" not in os.environ:
        os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = str(_private_config_dir())
    return importlib.import_module("minisweagent")


def _private_config_dir() -> Path:
    """One folder per user, reused by every process (a folder per process would be left behind
    by each one), trusted only if this user owns it and no one else can write to it."""
    folder = Path(tempfile.gettempdir()) / f"aml-mswea-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    status = folder.lstat()
    if stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and not status.st_mode & 0o022:
        return folder
    # Someone else's folder (or a link) in its place: a private one of this process instead.
    return Path(tempfile.mkdtemp(prefix="aml-mswea-"))


def _upstream_module(name: str) -> Any:
    _upstream()
    return importlib.import_module(f"minisweagent.{name}")


def installed_agent_version() -> str | None:
    try:
        return importlib.metadata.version("mini-swe-agent")
    except importlib.metadata.PackageNotFoundError:
        return None


def load_agent_config(
    *,
    step_limit: int = 250,
    command_timeout_seconds: float = 60.0,
    wall_seconds: float = 1800.0,
    memory_tokens: int = 2000,
    token_counter: str,
    reply_max_tokens: int = 4096,
) -> AgentConfig:
    """The config with the templates read from the installed, pinned mini-swe-agent. The step
    limit and the command timeout default to that config's own (250 steps, 60 s)."""
    version = installed_agent_version()
    if version != MINI_SWE_AGENT_VERSION:
        raise RuntimeError(f"mini-swe-agent {MINI_SWE_AGENT_VERSION} is needed, found {version}")
    yaml = importlib.import_module("yaml")
    path = Path(_upstream().package_dir) / UPSTREAM_CONFIG
    upstream = yaml.safe_load(path.read_text("utf-8"))
    agent, model = upstream["agent"], upstream["model"]
    instance = agent["instance_template"]
    if instance.count(_MEMORY_ANCHOR) != 1:
        raise RuntimeError(f"{UPSTREAM_CONFIG}: no single {_MEMORY_ANCHOR!r} to put memories at")
    return AgentConfig(
        system_template=agent["system_template"],
        instance_template=instance.replace(_MEMORY_ANCHOR, _MEMORY_ANCHOR + MEMORY_SECTION),
        observation_template=model["observation_template"],
        format_error_template=model["format_error_template"],
        command_env={str(k): str(v) for k, v in upstream["environment"]["env"].items()},
        step_limit=step_limit,
        command_timeout_seconds=command_timeout_seconds,
        wall_seconds=wall_seconds,
        memory_tokens=memory_tokens,
        token_counter=token_counter,
        reply_max_tokens=reply_max_tokens,
    )


# --- the memory section ---------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryContext:
    """The memory section's text and, for the audit, how it was cut."""

    text: str
    tokens: int
    kept: int
    candidates_returned: int
    first_cut: bool


async def memory_context(
    candidates: Sequence[dict[str, Any]], budget_tokens: int, count_tokens: TokenCount
) -> MemoryContext:
    """The candidates the agent sees, rule `coding-context-v1`: the answer context's rule
    (`aml_evaluation.context`, context-v1: each candidate rendered as its `- [created_at]
    content` line, the longest prefix in the participant's order whose line tokens fit; whole
    candidates, none skipped to squeeze in a shorter one), with one difference: a first
    candidate over the budget on its own is cut to fit (longest content prefix, by the same
    counter, ending in CUT_MARK) instead of kept whole. The section is in every step's prompt,
    so its budget must bound it, while the system's top result is never dropped. Only a budget
    too small for any of it gives no memories. Images are shown as placeholders: the agent's
    model gets text."""
    fitted = await fit_candidates(candidates, budget_tokens, count_tokens, takes_images=False)
    if fitted.tokens <= budget_tokens:
        return MemoryContext(
            text=format_memories(fitted.memories) if fitted.memories else "",
            tokens=fitted.tokens,
            kept=len(fitted.memories),
            candidates_returned=len(candidates),
            first_cut=False,
        )
    first = fitted.memories[0]

    async def tokens_of(length: int) -> int:
        cut = Memory(first.text[:length] + CUT_MARK, first.created_at)
        return await count_tokens(format_memories([cut]))

    # Longest prefix that fits: fits(low) holds, fits(high) does not.
    low, high = -1, len(first.text)
    while high - low > 1:
        middle = (low + high) // 2
        if await tokens_of(middle) <= budget_tokens:
            low = middle
        else:
            high = middle
    if low < 0:
        return MemoryContext("", 0, 0, len(candidates), first_cut=True)
    return MemoryContext(
        text=format_memories([Memory(first.text[:low] + CUT_MARK, first.created_at)]),
        tokens=await tokens_of(low),
        kept=1,
        candidates_returned=len(candidates),
        first_cut=True,
    )


# --- the model: the thread-to-loop bridge and mini-swe-agent's Model protocol -----------------


class _CompleteFailed(Exception):
    """`complete` raised (not ContextExhausted): the LLM's or the platform's failure."""


class _SandboxFailed(Exception):
    """The CommandRunner raised: the sandbox's failure."""


class LoopBridge:
    """Calls `complete` on the service's event loop from the agent's thread, and stops it.

    `call` blocks its (worker) thread until the coroutine finishes on the loop. `stop` (from
    the loop's thread) cancels the call in flight, so a hanging model cannot hold an attempt
    past its wall limit, and refuses later ones. Both raise `Stopped` in the worker.

    Each call runs as a task in a copy of the context the bridge was made in (the attempt's
    caller's), not of the agent's thread, which has none of it: the call's span is the work
    item's, and the item's LLM admission sees the call as its own (the turn the caller lends
    it, `aml_pipeline.capacity.Admission.lend_turn`)."""

    class Stopped(Exception):
        pass

    def __init__(self, loop: asyncio.AbstractEventLoop, complete: Complete) -> None:
        """Made on the loop's thread (by `attempt`)."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._context = contextvars.copy_context()
        self._complete = complete
        self._lock = threading.Lock()
        self._stopped = False
        self._in_flight: concurrent.futures.Future[tuple[str, int, int]] | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def call(self, messages: list[ChatMessage]) -> tuple[str, int, int]:
        # On the loop's own thread this would wait for itself forever.
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("LoopBridge.call must run outside the event loop's thread")
        with self._lock:
            if self._stopped:
                raise LoopBridge.Stopped
            # The task is created by a callback that runs in a copy of the context it was
            # scheduled from: this one, entered here (a fresh copy: one thread at a time).
            future = self._context.copy().run(
                asyncio.run_coroutine_threadsafe, self._complete(messages), self._loop
            )
            self._in_flight = future
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._stopped:
                raise LoopBridge.Stopped from None
            raise
        finally:
            with self._lock:
                self._in_flight = None

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._in_flight is not None:
                self._in_flight.cancel()


def _time_exceeded() -> Exception:
    """mini-swe-agent's own end for a spent wall clock (exit status TimeExceeded)."""
    exit_message = {
        "role": "exit",
        "content": "TimeExceeded",
        "extra": {"exit_status": "TimeExceeded", "submission": ""},
    }
    error: Exception = _upstream_module("exceptions").TimeExceeded(exit_message)
    return error


class BridgedModel:
    """mini-swe-agent's Model protocol, text-based like its LitellmTextbasedModel: the reply's
    one command block is the action, anything else is its FormatError (with the reply kept in
    the error message's `extra.model_response` for the trajectory). Counts the calls and the
    tokens `complete` reports, the malformed replies' too."""

    def __init__(self, config: AgentConfig, call: Callable[[list[ChatMessage]], Any]) -> None:
        self.config = config
        self._call = call
        self.calls = 0
        self.tokens_in = 0
        self.tokens_out = 0
        self.format_errors = 0

    def query(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        # mini-swe-agent's bookkeeping (`extra`) stays out of what the model is sent.
        sent: list[ChatMessage] = [
            {"role": str(message["role"]), "content": str(message["content"])}
            for message in messages
        ]
        self.calls += 1
        try:
            text, tokens_in, tokens_out = self._call(sent)
        except LoopBridge.Stopped:
            raise _time_exceeded() from None
        except ContextExhausted:
            raise
        except Exception as exc:
            raise _CompleteFailed(f"{type(exc).__name__}: {exc}") from exc
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        usage = {"tokens_in": tokens_in, "tokens_out": tokens_out, "timestamp": time.time()}
        actions_text = _upstream_module("models.utils.actions_text")
        try:
            actions = actions_text.parse_regex_actions(
                text,
                action_regex=self.config.action_regex,
                format_error_template=self.config.format_error_template,
            )
        except _upstream_module("exceptions").FormatError as error:
            self.format_errors += 1
            error.messages[0]["extra"].update(usage)
            raise
        return {"role": "assistant", "content": text, "extra": {"actions": actions, **usage}}

    def format_message(self, **kwargs: Any) -> dict[str, Any]:
        return dict(kwargs)

    def format_observation_messages(
        self,
        message: dict[str, Any],
        outputs: list[dict[str, Any]],
        template_vars: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = _upstream_module(
            "models.utils.actions_text"
        ).format_observation_messages(
            outputs,
            observation_template=self.config.observation_template,
            template_vars=template_vars,
        )
        return messages

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"model_type": f"{__name__}.{type(self).__name__}"}}}


# --- the environment: mini-swe-agent's Environment protocol over the sandbox -----------------


class SandboxEnvironment:
    """mini-swe-agent's Environment protocol over a CommandRunner. A command's observation is
    what upstream's local and docker environments give (output, return code, and for a
    timeout return code -1 with subprocess's timeout message); a command whose output starts
    with the sentinel line and that exits 0 submits. Each command gets the per-command timeout,
    cut to the attempt's time left; with none left, or once the attempt has ended (its runner
    stopped), the attempt ends (TimeExceeded)."""

    def __init__(
        self, config: AgentConfig, runner: StoppableRunner, deadline: float, bridge: LoopBridge
    ) -> None:
        self.config = config
        self._runner = runner
        self._deadline = deadline
        self._bridge = bridge
        self._env_prefix = (
            "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in config.command_env.items())
            if config.command_env
            else ""
        )

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        command = str(action.get("command", ""))
        left = self._deadline - time.monotonic()
        if self._bridge.stopped or left <= 0:
            raise _time_exceeded()
        limit = min(float(timeout or self.config.command_timeout_seconds), left)
        script = f"{self._env_prefix}\n{command}" if self._env_prefix else command
        try:
            result = self._runner.run(script, limit)
        except Exception as exc:
            if self._runner.stopped:
                raise _time_exceeded() from None
            raise _SandboxFailed(f"{type(exc).__name__}: {exc}") from exc
        if self._runner.stopped:
            # Killed by the attempt's end: what it printed is no observation of the agent's.
            raise _time_exceeded()
        extra: dict[str, Any] = {"truncated": result.truncated, "timed_out": result.timed_out}
        if result.timed_out:
            # subprocess.TimeoutExpired's message, as upstream's environments report it.
            message = f"Command '{command}' timed out after {limit:g} seconds"
            output = {
                "output": result.output,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {message}",
                "extra": {**extra, "exception_type": "TimeoutExpired", "exception": message},
            }
        else:
            output = {
                "output": result.output,
                "returncode": result.exit_code,
                "exception_info": "",
                "extra": extra,
            }
        lines = result.output.lstrip().splitlines(keepends=True)
        submitted = bool(lines) and lines[0].strip() == self.config.submit_sentinel
        if submitted and output["returncode"] == 0:
            submission = "".join(lines[1:])
            exit_message = {
                "role": "exit",
                "content": submission,
                "extra": {"exit_status": "Submitted", "submission": submission},
            }
            raise _upstream_module("exceptions").Submitted(exit_message)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        # Unlike upstream's LocalEnvironment, not the service's os.environ (its secrets).
        return {}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment_type": f"{__name__}.{type(self).__name__}"}}}


# --- an attempt -------------------------------------------------------------------------------


class EndReason(StrEnum):
    SUBMITTED = "submitted"
    STEP_LIMIT = "step_limit"
    WALL_LIMIT = "wall_limit"
    # mini-swe-agent's RepeatedFormatError: max_consecutive_format_errors malformed replies in
    # a row (a single one is answered with the format error message and the attempt goes on).
    FORMAT_ERROR = "format_error"
    CONTEXT_LIMIT = "context_limit"


_EXIT_STATUSES: Final = {
    "Submitted": EndReason.SUBMITTED,
    # The cost limit is off (cost_limit 0), so the step limit is the only one left.
    "LimitsExceeded": EndReason.STEP_LIMIT,
    "TimeExceeded": EndReason.WALL_LIMIT,
    "RepeatedFormatError": EndReason.FORMAT_ERROR,
}
TRAJECTORY_MESSAGE_CHARS: Final = 20_000
TRAJECTORY_TOTAL_CHARS: Final = 1_000_000
# What of a message's mini-swe-agent `extra` the trajectory keeps (raw_output repeats content).
_TRAJECTORY_EXTRA: Final = (
    "exit_status", "submission", "tokens_in", "tokens_out", "returncode", "timed_out",
    "truncated", "exception_info", "interrupt_type", "model_response", "timestamp",
)  # fmt: skip


class TrajectoryMessage(BaseModel):
    model_config = ConfigDict(frozen=True)
    role: str
    content: str
    extra: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class Attempt(BaseModel):
    """One attempt's audit document, the patch aside (the sandbox diffs its work tree against
    the snapshot)."""

    model_config = ConfigDict(frozen=True)
    end_reason: EndReason
    steps: int = Field(description="Model calls made (mini-swe-agent's n_calls).")
    tokens_in: int
    tokens_out: int
    format_errors: int
    seconds: float
    submission: str
    trajectory: list[TrajectoryMessage]
    trajectory_elided: int = Field(description="Messages left out of the middle for size.")
    worker_stopped: bool = Field(
        description="False only after a wall limit whose command or call had not returned "
        "when the attempt ended: its sandbox is removed only once that command returns "
        "(StoppableRunner.close)."
    )
    agent: str
    config_fingerprint: str


class PlatformFailure(Exception):
    """The attempt could not be judged: `complete` failed (the LLM down past its outage window,
    a refused call), the sandbox failed, or the agent itself did. Never an unresolved task."""

    def __init__(
        self,
        where: Literal["model", "sandbox", "agent"],
        reason: str,
        steps: int,
        tokens_in: int,
        tokens_out: int,
        trajectory: list[TrajectoryMessage],
    ) -> None:
        super().__init__(f"coding agent attempt failed in the {where}: {reason}")
        self.where = where
        self.reason = reason
        self.steps = steps
        self.tokens_in = tokens_in
        self.tokens_out = tokens_out
        self.trajectory = trajectory


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[{len(text) - limit} characters cut]"


def bounded_trajectory(
    messages: Sequence[dict[str, Any]],
    message_chars: int = TRAJECTORY_MESSAGE_CHARS,
    total_chars: int = TRAJECTORY_TOTAL_CHARS,
) -> tuple[list[TrajectoryMessage], int]:
    """mini-swe-agent's messages as the audit keeps them, and how many were left out: each
    message's text cut to `message_chars`; over `total_chars` in all, the first two (system
    prompt, task) and the latest that fit are kept."""
    kept: list[TrajectoryMessage] = []
    for message in messages:
        extra = message.get("extra") or {}
        kept.append(
            TrajectoryMessage(
                role=str(message.get("role", "")),
                content=_cut(str(message.get("content", "")), message_chars),
                extra={
                    key: _cut(value, message_chars) if isinstance(value, str) else value
                    for key in _TRAJECTORY_EXTRA
                    if isinstance(value := extra.get(key), str | int | float | bool)
                    or (key in extra and value is None)
                },
            )
        )
    sizes = [len(m.content) + sum(len(str(v)) for v in m.extra.values()) for m in kept]
    if sum(sizes) <= total_chars:
        return kept, 0
    head = kept[:2]
    used = sum(sizes[:2])
    tail: list[TrajectoryMessage] = []
    for entry, size in zip(reversed(kept[2:]), reversed(sizes[2:]), strict=True):
        if used + size > total_chars:
            break
        tail.append(entry)
        used += size
    return head + tail[::-1], len(kept) - len(head) - len(tail)


@dataclass(frozen=True)
class _Outcome:
    exit_info: dict[str, Any] | None
    error: BaseException | None


async def attempt(
    task_prompt: str,
    memories: str,
    config: AgentConfig,
    complete: Complete,
    runner: CommandRunner,
    *,
    stop_grace_seconds: float = 5.0,
) -> Attempt:
    """One attempt of the task by mini-swe-agent's DefaultAgent, `memories` (memory_context's
    text) in its task prompt. Returns how it ended; raises PlatformFailure when it could not
    be judged. The wall limit holds whatever hangs: at the deadline the model call in flight is
    cancelled, the command in flight killed (when `runner` can be interrupted) and the attempt
    returns (after at most `stop_grace_seconds` for the agent's thread to wind down; see
    Attempt.worker_stopped). Pass a `StoppableRunner` to close the runner after the attempt
    only once no command runs in it."""
    version = installed_agent_version()
    if version != config.agent_version:
        raise RuntimeError(f"mini-swe-agent {config.agent_version} is configured, found {version}")
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    deadline = started + config.wall_seconds
    bridge = LoopBridge(loop, complete)
    model = BridgedModel(config, bridge.call)
    commands = runner if isinstance(runner, StoppableRunner) else StoppableRunner(runner)
    environment = SandboxEnvironment(config, commands, deadline, bridge)
    agent = _upstream_module("agents.default").DefaultAgent(
        model,
        environment,
        system_template=config.system_template,
        instance_template=config.instance_template,
        step_limit=config.step_limit,
        cost_limit=0.0,
        wall_time_limit_seconds=math.ceil(config.wall_seconds),
        max_consecutive_format_errors=config.max_consecutive_format_errors,
    )
    done: asyncio.Future[_Outcome] = loop.create_future()

    def settle(outcome: _Outcome) -> None:
        if not done.done():
            done.set_result(outcome)

    def work() -> None:
        try:
            outcome = _Outcome(agent.run(task_prompt, memories=memories), None)
        except BaseException as exc:  # handed to the loop's thread, which judges it
            outcome = _Outcome(None, exc)
        # A closed loop (RuntimeError) has nobody waiting for this attempt any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=work, name="coding-agent", daemon=True).start()
    try:
        finished, _ = await asyncio.wait({done}, timeout=max(0.0, deadline - time.monotonic()))
        if not finished:
            bridge.stop()
            commands.stop()
            await asyncio.wait({done}, timeout=stop_grace_seconds)
    except asyncio.CancelledError:
        bridge.stop()
        commands.stop()
        raise
    outcome = done.result() if done.done() else None
    trajectory, elided = bounded_trajectory(list(agent.messages))
    usage = {"steps": model.calls, "tokens_in": model.tokens_in, "tokens_out": model.tokens_out}
    if outcome is None or isinstance(outcome.error, LoopBridge.Stopped):
        end = EndReason.WALL_LIMIT
    elif isinstance(outcome.error, ContextExhausted):
        end = EndReason.CONTEXT_LIMIT
    elif outcome.error is not None:
        where: Literal["model", "sandbox", "agent"] = (
            "model"
            if isinstance(outcome.error, _CompleteFailed)
            else "sandbox"
            if isinstance(outcome.error, _SandboxFailed)
            else "agent"
        )
        reason = (
            str(outcome.error)
            if where != "agent"
            else f"{type(outcome.error).__name__}: {outcome.error}"
        )
        raise PlatformFailure(where, reason, trajectory=trajectory, **usage) from (
            outcome.error.__cause__ or outcome.error
        )
    else:
        exit_info = outcome.exit_info or {}
        status = str(exit_info.get("exit_status", ""))
        if status not in _EXIT_STATUSES:
            raise PlatformFailure(
                "agent", f"unknown exit status {status!r}", trajectory=trajectory, **usage
            )
        end = _EXIT_STATUSES[status]
    submission = str((outcome.exit_info or {}).get("submission", "")) if outcome else ""
    return Attempt(
        end_reason=end,
        format_errors=model.format_errors,
        seconds=round(time.monotonic() - started, 3),
        submission=_cut(submission, TRAJECTORY_MESSAGE_CHARS),
        trajectory=trajectory,
        trajectory_elided=elided,
        worker_stopped=outcome is not None,
        agent=f"{config.agent} {config.agent_version}",
        config_fingerprint=config.fingerprint(),
        **usage,
    )
