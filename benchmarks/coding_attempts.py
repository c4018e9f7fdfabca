"""What one coding attempt (SPEC R-2.5) costs the platform itself, and how many attempts this
machine runs at once: the answerer's Solve and the scorer's Verify (`aml_pipeline.coding_track.
solve` and `verify`, the functions the services call), each attempt of a synthetic-coding task
solved by mini-swe-agent in the bubblewrap sandbox with the LLM stand-in's scripted coding agent
as its model, then verified with the task's hidden tests in a fresh sandbox.

    .venv/bin/python benchmarks/coding_attempts.py [--levels 1,2,4,8] [--attempts 32]
        [--latency 0] [--json out.json] [--no-record]

The stand-in runs as a process of its own (`python -m aml_llm_standin`), so its CPU is never
counted as the platform's, and the time the agent waits for it is taken out of Solve's wall
time. The agent gets its scope's memories as a participant returning the relevant trajectory
first would give them (every attempt resolves; Verify runs the tests either way). The agent and
sandbox limits are the platform's defaults (EvaluationSettings); the scripted agent takes two
steps (a `git apply`, then the submit command), so a real agent's tens of steps cost more
sandboxed commands than this, while the fixed costs (sandbox start, diff, verify) are the same.

**CPU.** getrusage cannot see a sandboxed command's CPU: bwrap's monitor does not wait for the
init of the command's pid namespace, so nothing below it is added to this process's children's
times. The platform's CPU is therefore the machine's (every core's non-idle time, /proc/stat)
less the stand-in's (/proc/<pid>/stat) and less the machine's background, measured for 3 s
before the first attempt and taken off at its rate: on a machine that runs nothing else, this
process and everything it started. "of which this process" is this process's own (the agent's
thread, the event loop, the diff) and its reaped children's (bwrap's monitors, tar, chmod), from
getrusage; the rest ran in the sandboxes.

**One at a time** (`solo`): each of the 16 attempts (8 tasks x relevant/noisy) alone, after one
unrecorded warm-up attempt. Per attempt: the sandbox's start (snapshot unpacked, working copy
made; Solve's and Verify's), Solve's wall time without the model's, its CPU time, the agent's
sandboxed commands, Verify's wall and CPU time and the hidden tests' own run.

**At once** (`concurrency`): for each level N, `--attempts` attempts (Solve then Verify, each
attempt in turn over the tasks and conditions) with N in flight at a time: wall time,
throughput, per-attempt wall (median, p90), CPU per attempt and the machine's CPU use (the
platform's CPU / (wall x cores)), and the stand-in's CPU per attempt apart. The knee is the
largest N whose throughput was still at least 10 % above the level before it: past it, more
attempts at once only make each one slower.

Writes a dated record under benchmarks/results/ (`<UTC minute>-coding-attempts-<commit>.json`,
as benchmarks/results/README.md describes) unless `--no-record`. The commit is read from .git
without running git, so whether the working tree had changes is not checked: the record says
"(working tree not checked)" and its name ends in `-unchecked`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai

from aml_evaluation.chunker import AddChunk, plan_adds
from aml_evaluation.coding.bundle import CONDITIONS, CodingBundle, Condition, load_coding_bundle
from aml_evaluation.coding.chunking import scope_key
from aml_evaluation.coding.synthetic import SHIPPED_BUNDLE_DIR, SYNTHETIC_CODING_ID
from aml_evaluation.context import estimated
from aml_evaluation.registry import load_dataset
from aml_memory_server.store import rows_from_add
from aml_pipeline.coding_agent import AgentConfig, ChatMessage
from aml_pipeline.coding_track import Workspace, solve, verify, verify_limits
from aml_pipeline.evaluation_spec import coding_agent_config
from aml_pipeline.llm import complete_chat
from aml_pipeline.sandbox import (
    CommandResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    require_sandbox,
)
from aml_runtime.settings import EvaluationSettings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SCENARIO = "coding-attempts"
# A level whose throughput is not this much above the previous one's gains nothing.
KNEE_GAIN = 1.10


@dataclass
class AttemptCost:
    """One attempt's figures (seconds unless named otherwise)."""

    task: str
    condition: str
    resolved: bool
    solve_sandbox_start_ms: float
    verify_sandbox_start_ms: float
    solve_wall: float
    model_wait: float
    solve_own_wall: float
    solve_cpu: float
    solve_cpu_here: float
    commands: int
    command_walls: list[float]
    verify_wall: float
    verify_cpu: float
    verify_cpu_here: float
    test_seconds: float
    wall: float


def own_cpu() -> float:
    """This process's CPU time and its reaped children's (with theirs), user and system."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def process_cpu(pid: int) -> float:
    """A running process's CPU time, user and system, from /proc (the stand-in's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> float:
    """Every core's non-idle time since boot (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _, _, irq, softirq, steal = (int(field) for field in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Reading:
    wall: float
    machine: float
    standin: float
    here: float


class Meter:
    """The platform's CPU between two readings (see the module docstring)."""

    def __init__(self, standin: int) -> None:
        self.standin = standin
        self.background = 0.0  # CPU seconds per second of wall time

    def read(self) -> Reading:
        return Reading(time.perf_counter(), machine_cpu(), process_cpu(self.standin), own_cpu())

    def measure_background(self, seconds: float = 3.0) -> None:
        before = self.read()
        time.sleep(seconds)
        after = self.read()
        self.background = max(0.0, self.platform(before, after)) / (after.wall - before.wall)

    def platform(self, before: Reading, after: Reading) -> float:
        wall = after.wall - before.wall
        other = after.standin - before.standin + self.background * wall
        return after.machine - before.machine - other


def memories(
    bundle: CodingBundle, adds: Sequence[AddChunk], task_id: str, condition: Condition
) -> list[dict[str, Any]]:
    """The scope's memories from a job's Adds, one per message as the reference memory server
    stores them, the relevant trajectory's first: what a participant that finds it would
    return."""
    scope = scope_key(task_id, condition)
    relevant = set(bundle.conditions.root[task_id].relevant)
    rows = [
        row for add in adds if add.conversation_id == scope for row in rows_from_add(add.request)
    ]
    rows.sort(key=lambda row: row.session_id.rsplit(":", 1)[1] not in relevant)
    return [{"id": row.id, "content": row.content, "created_at": row.created_at} for row in rows]


class Attempts:
    """Solve and Verify as the answerer and the scorer run them, timed."""

    def __init__(
        self, bundle: CodingBundle, llm: openai.AsyncOpenAI, agent: AgentConfig, meter: Meter
    ) -> None:
        self.bundle = bundle
        self.llm = llm
        self.agent = agent
        self.meter = meter
        self.verify_limits = verify_limits(EvaluationSettings().coding_test_timeout_seconds)
        # The shipped bundle's Adds as a job writes them (its datasets root is never read).
        self.adds = plan_adds(load_dataset(SYNTHETIC_CODING_ID, SHIPPED_BUNDLE_DIR), "bench")

    async def run(self, task_id: str, condition: Condition) -> AttemptCost:
        task = self.bundle.task(task_id)
        snapshot = SHIPPED_BUNDLE_DIR / task.snapshot
        candidates = memories(self.bundle, self.adds, task_id, condition)
        starts: list[float] = []
        waits: list[float] = []
        # Per sandbox opened (Solve's, then Verify's): the wall time of each command run in it.
        commands: list[list[float]] = []

        def open_workspace(archive: Path, limits: SandboxLimits) -> Workspace:
            began = time.perf_counter()
            sandbox = Sandbox.from_archive(archive, limits)
            starts.append(time.perf_counter() - began)
            commands.append([])
            return Counted(sandbox, commands[-1])

        async def complete(messages: list[ChatMessage]) -> tuple[str, int, int]:
            began = time.perf_counter()
            try:
                reply = await complete_chat(
                    self.llm,
                    "aml-llm-standin",
                    messages,
                    self.agent.reply_max_tokens,
                    temperature=self.agent.temperature,
                )
            finally:
                waits.append(time.perf_counter() - began)
            return reply.text, reply.tokens_in, reply.tokens_out

        # Only meaningful with one attempt at a time: the machine's CPU is everyone's.
        began = self.meter.read()
        solution = await solve(
            task, snapshot, candidates, self.agent, complete, estimated, open_workspace
        )
        solved = self.meter.read()
        verdict = await asyncio.to_thread(
            verify, task, snapshot, solution.patch, self.verify_limits, open_workspace
        )
        ended = self.meter.read()
        solve_wall = solved.wall - began.wall
        return AttemptCost(
            task=task_id,
            condition=condition,
            resolved=verdict.resolved,
            solve_sandbox_start_ms=1000 * starts[0],
            verify_sandbox_start_ms=1000 * starts[1] if len(starts) > 1 else 0.0,
            solve_wall=solve_wall,
            model_wait=sum(waits),
            solve_own_wall=solve_wall - sum(waits),
            solve_cpu=self.meter.platform(began, solved),
            solve_cpu_here=solved.here - began.here,
            commands=len(commands[0]),
            command_walls=commands[0],
            verify_wall=ended.wall - solved.wall,
            verify_cpu=self.meter.platform(solved, ended),
            verify_cpu_here=ended.here - solved.here,
            test_seconds=verdict.test_seconds or 0.0,
            wall=ended.wall - began.wall,
        )


class Counted:
    """A sandbox that times the commands run in it."""

    def __init__(self, sandbox: Sandbox, commands: list[float]) -> None:
        self._sandbox = sandbox
        self._commands = commands

    def run(self, command: str, timeout: float) -> CommandResult:
        began = time.perf_counter()
        try:
            return self._sandbox.run(command, timeout)
        finally:
            self._commands.append(time.perf_counter() - began)

    def apply(self, patch: str) -> CommandResult:
        return self._sandbox.apply(patch)

    def patch(self) -> str:
        return self._sandbox.patch()

    def close(self) -> None:
        self._sandbox.close()


def scopes(bundle: CodingBundle, count: int) -> list[tuple[str, Condition]]:
    """`count` attempts over the tasks and conditions in turn."""
    every = [(task.task_id, condition) for task in bundle.tasks for condition in CONDITIONS]
    return [every[i % len(every)] for i in range(count)]


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def summary(values: Sequence[float], digits: int = 1) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "p90": round(percentile(values, 0.9), digits),
        "max": round(max(values), digits),
    }


async def solo(attempts: Attempts, bundle: CodingBundle) -> dict[str, Any]:
    await attempts.run(bundle.tasks[0].task_id, "relevant")  # warm-up: imports, caches
    costs = [await attempts.run(task, condition) for task, condition in scopes(bundle, 16)]
    ms = 1000.0
    return {
        "attempts": len(costs),
        "resolved": sum(cost.resolved for cost in costs),
        "solve_sandbox_start_ms": summary([c.solve_sandbox_start_ms for c in costs]),
        "verify_sandbox_start_ms": summary([c.verify_sandbox_start_ms for c in costs]),
        "solve_own_wall_ms": summary([ms * c.solve_own_wall for c in costs]),
        "model_wait_ms": summary([ms * c.model_wait for c in costs]),
        "solve_cpu_ms": summary([ms * c.solve_cpu for c in costs]),
        "solve_cpu_here_ms": summary([ms * c.solve_cpu_here for c in costs]),
        "agent_commands": summary([float(c.commands) for c in costs], 0),
        "agent_command_wall_ms": summary([ms * w for c in costs for w in c.command_walls]),
        "verify_wall_ms": summary([ms * c.verify_wall for c in costs]),
        "test_run_ms": summary([ms * c.test_seconds for c in costs]),
        "verify_cpu_ms": summary([ms * c.verify_cpu for c in costs]),
        "verify_cpu_here_ms": summary([ms * c.verify_cpu_here for c in costs]),
        "cpu_per_attempt_ms": summary([ms * (c.solve_cpu + c.verify_cpu) for c in costs]),
        "attempt_wall_ms": summary([ms * c.wall for c in costs]),
        "per_attempt": [asdict(cost) for cost in costs],
    }


async def level(attempts: Attempts, bundle: CodingBundle, n: int, count: int) -> Any:
    gate = asyncio.Semaphore(n)

    async def one(task: str, condition: Condition) -> AttemptCost:
        async with gate:
            return await attempts.run(task, condition)

    before = attempts.meter.read()
    costs = await asyncio.gather(*(one(task, cond) for task, cond in scopes(bundle, count)))
    after = attempts.meter.read()
    wall = after.wall - before.wall
    used, model = attempts.meter.platform(before, after), after.standin - before.standin
    return {
        "at_once": n,
        "attempts": count,
        "resolved": sum(cost.resolved for cost in costs),
        "wall_s": round(wall, 2),
        "attempts_per_s": round(count / wall, 3),
        "attempt_wall_ms": summary([1000 * cost.wall for cost in costs], 0),
        "cpu_per_attempt_ms": round(1000 * used / count, 1),
        "cpu_use": round(used / (wall * (os.cpu_count() or 1)), 3),
        "standin_cpu_per_attempt_ms": round(1000 * model / count, 1),
    }


def knee(levels: Sequence[dict[str, Any]]) -> int:
    """The largest level whose throughput was still KNEE_GAIN above the one before it."""
    best = levels[0]["at_once"]
    for before, after in itertools.pairwise(levels):
        if after["attempts_per_s"] >= KNEE_GAIN * before["attempts_per_s"]:
            best = after["at_once"]
        else:
            break
    return int(best)


def start_standin(latency: float, capacity: int) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "aml_llm_standin", "--port", "0", "--latency", str(latency),
         "--concurrency", str(capacity)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"the stand-in did not start: {line!r}")
    return process, line.removeprefix("listening on ")


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version()}


def checkout_commit(root: Path = ROOT) -> str:
    """The checked-out commit's short hash, read from .git without running git ("" outside a
    checkout): a git command may take the index's lock while other work goes on in the tree."""
    git = root / ".git"
    if git.is_file():  # a worktree: "gitdir: <path>"
        git = (root / git.read_text().split(":", 1)[1].strip()).resolve()
    common = git / "commondir"
    shared = (git / common.read_text().strip()).resolve() if common.is_file() else git
    try:
        head = (git / "HEAD").read_text().strip()
    except OSError:
        return ""
    if not head.startswith("ref: "):
        return head[:7]
    ref = head.removeprefix("ref: ")
    for folder in (git, shared):
        if (folder / ref).is_file():
            return (folder / ref).read_text().strip()[:7]
    packed = shared / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            if line.endswith(f" {ref}"):
                return line.split()[0][:7]
    return ""


def render(figures: dict[str, Any]) -> str:
    s = figures["solo"]

    def row(name: str, key: str, unit: str = "ms") -> str:
        cell = s[key]
        return f"  {name:<40}{cell['median']:>9}{cell['p90']:>9}{cell['max']:>9}  {unit}"

    lines = [
        f"one attempt at a time ({s['attempts']} attempts, {s['resolved']} resolved; "
        "the platform's own cost, the model's wait left out):",
        f"  {'':<40}{'median':>9}{'p90':>9}{'max':>9}",
        row("sandbox start, Solve", "solve_sandbox_start_ms"),
        row("sandbox start, Verify", "verify_sandbox_start_ms"),
        row("Solve wall without the model's", "solve_own_wall_ms"),
        row("  the model's wait (stand-in)", "model_wait_ms"),
        row("Solve CPU", "solve_cpu_ms"),
        row("  of which this process", "solve_cpu_here_ms"),
        row("  agent commands in the sandbox", "agent_commands", "commands"),
        row("  each command's wall (bwrap included)", "agent_command_wall_ms"),
        row("Verify wall", "verify_wall_ms"),
        row("  the hidden tests' run", "test_run_ms"),
        row("Verify CPU", "verify_cpu_ms"),
        row("  of which this process", "verify_cpu_here_ms"),
        row("CPU per attempt (Solve + Verify)", "cpu_per_attempt_ms"),
        row("attempt wall (Solve + Verify)", "attempt_wall_ms"),
        "",
        f"attempts at once on this machine ({figures['machine']['cores']} cores; stand-in "
        f"latency {figures['settings']['latency_s']} s):",
        f"  {'at once':>8}{'wall s':>9}{'att/s':>8}{'wall p50':>10}{'wall p90':>10}"
        f"{'CPU/att':>9}{'CPU use':>9}{'stand-in':>10}",
    ]
    for c in figures["concurrency"]:
        lines.append(
            f"  {c['at_once']:>8}{c['wall_s']:>9}{c['attempts_per_s']:>8}"
            f"{c['attempt_wall_ms']['median']:>8}ms{c['attempt_wall_ms']['p90']:>8}ms"
            f"{c['cpu_per_attempt_ms']:>7}ms{100 * c['cpu_use']:>8.0f}%"
            f"{c['standin_cpu_per_attempt_ms']:>8}ms"
        )
    lines.append(
        f"  knee: {figures['knee']} at once (the last level with at least "
        f"{round(100 * (KNEE_GAIN - 1))} % more throughput than the one before)"
    )
    return "\n".join(lines)


def record(document: dict[str, Any], folder: Path = RESULTS) -> Path:
    measured = datetime.fromisoformat(document["measured_at"]).astimezone(UTC)
    short = document["commit"].split()[0] if document["commit"] else "unknown"
    stem = f"{measured:%Y-%m-%dT%H%MZ}-{SCENARIO}-{short}-unchecked"
    folder.mkdir(parents=True, exist_ok=True)
    number = 1
    while True:
        path = folder / (f"{stem}.json" if number == 1 else f"{stem}-{number}.json")
        try:
            with path.open("x", encoding="utf-8") as file:
                file.write(json.dumps(document, indent=2) + "\n")
        except FileExistsError:
            number += 1
            continue
        return path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,2,4,8", help="attempts at once, comma-separated")
    parser.add_argument("--attempts", type=int, default=32, help="attempts per level")
    parser.add_argument("--latency", type=float, default=0.0, help="stand-in seconds per call")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--no-record", dest="record", action="store_false")
    return parser.parse_args(argv)


async def measure(args: argparse.Namespace, meter: Meter, url: str) -> Any:
    bundle = load_coding_bundle(SHIPPED_BUNDLE_DIR)
    agent = coding_agent_config(EvaluationSettings(token_counter="estimate"))
    levels = [int(n) for n in args.levels.split(",")]
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as llm:
        attempts = Attempts(bundle, llm, agent, meter)
        figures = await solo(attempts, bundle)
        at_once = [await level(attempts, bundle, n, args.attempts) for n in levels]
    return figures, at_once


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(
        ["benchmarks/coding_attempts.py", *(sys.argv[1:] if argv is None else argv)]
    )
    # Read at the start: the working tree may change while the benchmark runs.
    commit = checkout_commit()
    try:
        require_sandbox()
    except SandboxUnavailable as unavailable:
        print(f"coding_attempts: {unavailable}", file=sys.stderr)
        return 2
    # Above any level: the stand-in never answers 429.
    capacity = 2 * max(int(n) for n in args.levels.split(","))
    standin, url = start_standin(args.latency, capacity)
    try:
        meter = Meter(standin.pid)
        meter.measure_background()
        solo_figures, at_once = asyncio.run(measure(args, meter, url))
    finally:
        standin.terminate()
        standin.wait(10)
    figures = {
        "measured_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": f"{commit} (working tree not checked)" if commit else "",
        "command": command,
        "settings": {
            "latency_s": args.latency,
            "standin_capacity": capacity,
            "attempts_per_level": args.attempts,
            "agent": "mini-swe-agent, scripted stand-in model (2 steps)",
            "limits": "EvaluationSettings defaults",
        },
        "machine": machine() | {"background_cpu_per_s": round(meter.background, 3)},
        "solo": solo_figures,
        "concurrency": at_once,
        "knee": knee(at_once),
    }
    print(render(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    if args.record:
        print(f"figures recorded in {record(figures).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
