"""The coding track end to end on the real sandbox (R-2.5): the answer stage's Solve runs the
real mini-swe-agent, driven by a scripted answer model, in bubblewrap over a synthetic-coding
task's snapshot, and the score stage's Verify applies the submitted patch and the hidden tests in
a fresh sandbox and grades the log. The scripted model applies the task's gold patch (resolved)
or its stand-in's wrong patch (unresolved) with a here-doc, then submits; a hostile agent harms
only its own sandbox and ends unresolved; a failing LLM is the platform's failure, never an
unresolved attempt. Skipped, with the one line the track refuses with, where bwrap cannot run."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from coding_doubles import SUBMIT, ScriptedLLM, apply_with_heredoc, bash, bundle_tasks
from host_processes import running
from pymongo import AsyncMongoClient

# The fakes live beside the unit tests that use them, which import them by name from there.
sys.path.append(str(Path(__file__).resolve().parents[1] / "unit"))
from fake_stores import memory_stores

from aml_answerer.handlers import SolveTask
from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_evaluation.coding.bundle import CodingBundle
from aml_evaluation.coding.synthetic import SYNTHETIC_CODING_DIR, materialise_synthetic_coding
from aml_evaluation.context import estimated
from aml_evaluation.scoring import CODING_SCORER
from aml_pipeline.capacity import Capacity, CapacityLimiter
from aml_pipeline.coding_agent import AgentConfig, PlatformFailure, load_agent_config
from aml_pipeline.coding_track import verify_limits
from aml_pipeline.sandbox import (
    CommandResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    require_sandbox,
)
from aml_pipeline.stage_worker import StageCall
from aml_runtime.stores import Stores
from aml_scorer.handlers import VerifyAttempt

pytestmark = pytest.mark.integration

TASK_IDS = [
    task["task_id"] for task in json.loads((SYNTHETIC_CODING_DIR / "tasks.json").read_text())
]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CodingBundle]:
    try:
        require_sandbox()
    except SandboxUnavailable as unavailable:
        pytest.skip(str(unavailable))
    root = tmp_path_factory.mktemp("synthetic-coding")
    return root, materialise_synthetic_coding(root)


@pytest.fixture(scope="module")
def agent() -> AgentConfig:
    # Upstream's prompts; short limits so that a hostile command costs seconds.
    return load_agent_config(
        token_counter="utf8-bytes-div-3-v1",
        step_limit=8,
        command_timeout_seconds=5.0,
        wall_seconds=120.0,
    )


def question(task_id: str, condition: str = "relevant") -> dict[str, Any]:
    return {
        "dataset_id": "synthetic-coding",
        "question_id": f"{task_id}:{condition}",
        "category_name": condition,
        "category": 1,
        "scorer": CODING_SCORER,
        "coding_task": task_id,
        "task_type": "debug",
    }


def work() -> QuestionWork:
    memories = [{"content": "Past session: the team's conventions are in the README."}]
    return QuestionWork(job_id="j", version_id="v", item_id="j/coding/q", candidates=memories)


def stages(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig, llm: ScriptedLLM
) -> tuple[SolveTask, VerifyAttempt]:
    root, bundle = synthetic
    tasks = bundle_tasks(bundle, root)
    solve = SolveTask(
        AnswererSettings(), memory_stores().typed(), llm.client, agent, tasks, estimated
    )
    return solve, VerifyAttempt(tasks, verify_limits(120.0))


def sandboxes_left() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("aml-sandbox-")}


@pytest.mark.parametrize("task_id", TASK_IDS)
async def test_the_gold_patch_resolves_and_the_wrong_one_does_not(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig, task_id: str
) -> None:
    _, bundle = synthetic
    task = bundle.task(task_id)
    assert task.stand_in is not None
    before = sandboxes_left()
    for patch, resolved in ((task.gold_patch, True), (task.stand_in.wrong_patch, False)):
        solve, verify = stages(synthetic, agent, ScriptedLLM([apply_with_heredoc(patch), SUBMIT]))
        answer = await solve(work(), question(task_id), StageCall(1))
        assert (answer["end_reason"], answer["steps"]) == ("submitted", 2)
        assert answer["answer"], "the sandbox's diff of the working copy"
        score = await verify(question(task_id), answer["answer"])
        assert score["resolved"] is resolved, score["reason"]
        assert score["tests_ran"] and score["patch_applied"]
        assert score["report"]["PASS_TO_PASS"]["failure"] == []
    # Every sandbox, the solve's and the verify's, is gone.
    assert sandboxes_left() <= before


async def test_the_agent_works_in_testbed_as_its_prompt_says(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    llm = ScriptedLLM([bash("pwd && ls /testbed"), SUBMIT])
    solve, _ = stages(synthetic, agent, llm)
    answer = await solve(work(), question("tally-allocate"), StageCall(1))
    observation = answer["trajectory"][3]["content"]
    assert "/testbed" in observation and "tally" in observation
    assert "/testbed" in llm.bodies[0]["messages"][1]["content"]  # upstream's prompt, unchanged


async def test_a_hostile_agent_harms_only_its_own_sandbox(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig, tmp_path: Path
) -> None:
    keep = tmp_path / "platform-file"
    keep.write_text("still here")
    replies = [
        bash(f"rm -rf --no-preserve-root / {keep} 2>&1 | tail -1; echo status=$?"),
        # A fork bomb: stopped at the sandbox's process limit, killed at the command's timeout.
        bash(":(){ :|:& };:"),
        bash("python3 -c 'print(6 * 7)'"),
        SUBMIT,
    ]
    llm = ScriptedLLM(replies)
    solve, verify = stages(synthetic, agent, llm)
    answer = await solve(work(), question("tally-allocate"), StageCall(1))
    assert answer["end_reason"] == "submitted"
    assert keep.read_text() == "still here"
    assert Path("/usr/bin/python3").exists()
    contents = [message["content"] for message in answer["trajectory"]]
    assert "42" in contents[7], contents[7]  # the sandbox still runs commands afterwards
    # Its working copy was emptied: a patch deleting the repository, which resolves nothing.
    score = await verify(question("tally-allocate"), answer["answer"])
    assert score["resolved"] is False


async def test_an_attempt_past_its_wall_limit_is_unresolved(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    quick = load_agent_config(
        token_counter="utf8-bytes-div-3-v1", command_timeout_seconds=30.0, wall_seconds=3.0
    )
    llm = ScriptedLLM([bash("sleep 60"), SUBMIT])
    solve, verify = stages(synthetic, quick, llm)
    answer = await solve(work(), question("tally-allocate"), StageCall(1))
    assert (answer["end_reason"], answer["answer"]) == ("wall_limit", "")
    score = await verify(question("tally-allocate"), answer["answer"])
    assert (score["resolved"], score["tests_ran"]) == (False, False)


class Watched:
    """The real sandbox, recording its kills, the end of each of its commands, and which of
    `argv`'s processes still ran when it was removed."""

    def __init__(self, sandbox: Sandbox, argv: tuple[str, ...]) -> None:
        self.sandbox = sandbox
        self.argv = argv
        self.events: list[object] = []

    def run(self, command: str, timeout: float) -> CommandResult:
        try:
            return self.sandbox.run(command, timeout)
        finally:
            self.events.append("command returned")

    def interrupt(self) -> None:
        self.events.append("interrupted")
        self.sandbox.interrupt()

    def apply(self, patch: str) -> CommandResult:
        return self.sandbox.apply(patch)

    def patch(self) -> str:
        return self.sandbox.patch()

    def close(self) -> None:
        self.events.append(("removed while running", running(*self.argv)))
        self.sandbox.close()


def watched_solver(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig, command: tuple[str, ...]
) -> tuple[SolveTask, list[Watched]]:
    root, bundle = synthetic
    opened: list[Watched] = []

    def open_workspace(archive: Path, limits: SandboxLimits) -> Watched:
        opened.append(Watched(Sandbox.from_archive(archive, limits), command))
        return opened[-1]

    llm = ScriptedLLM([bash(" ".join(command)), SUBMIT])
    solve = SolveTask(
        AnswererSettings(), memory_stores().typed(), llm.client, agent,
        bundle_tasks(bundle, root), estimated, open_workspace=open_workspace,
    )  # fmt: skip
    return solve, opened


async def test_a_command_cut_by_the_wall_limit_is_killed_before_its_sandbox_goes(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    """The wall limit strikes while the agent's command runs (its own limit is far off): the
    command's processes are gone, and its sandbox removed, once it has returned."""
    quick = load_agent_config(
        token_counter="utf8-bytes-div-3-v1", command_timeout_seconds=60.0, wall_seconds=3.0
    )
    command = ("sleep", "87.25")
    solve, opened = watched_solver(synthetic, quick, command)
    started = time.monotonic()
    answer = await solve(work(), question("tally-allocate"), StageCall(1))
    assert time.monotonic() - started < 3.0 + 5
    assert (answer["end_reason"], answer["answer"]) == ("wall_limit", "")
    (sandbox,) = opened
    assert sandbox.events[-2:] == ["command returned", ("removed while running", [])]
    assert not sandbox.sandbox.root.exists()
    assert running(*command) == []


async def test_an_attempt_cancelled_mid_command_kills_it_before_its_sandbox_goes(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    """The item is cancelled (its worker stops) while the agent's command runs: the command is
    killed, and its sandbox removed only after it returned; no process of it survives."""
    patient = load_agent_config(
        token_counter="utf8-bytes-div-3-v1", command_timeout_seconds=60.0, wall_seconds=120.0
    )
    command = ("sleep", "88.25")
    solve, opened = watched_solver(synthetic, patient, command)
    before = sandboxes_left()
    attempt = asyncio.create_task(solve(work(), question("tally-allocate"), StageCall(1)))
    deadline = time.monotonic() + 30
    while not running(*command):
        assert time.monotonic() < deadline and not attempt.done(), "the command never ran"
        await asyncio.sleep(0.05)
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    assert running(*command) == []
    (sandbox,) = opened
    assert sandbox.events == ["interrupted", "command returned", ("removed while running", [])]
    assert sandboxes_left() <= before


async def test_a_failing_llm_is_the_platforms_failure(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    before = sandboxes_left()
    request = httpx.Request("POST", "http://llm/v1/chat/completions")
    llm = ScriptedLLM([], failure=openai.InternalServerError(
        "upstream failed", response=httpx.Response(500, request=request), body=None
    ))  # fmt: skip
    solve, _ = stages(synthetic, agent, llm)
    with pytest.raises(PlatformFailure) as failed:
        await solve(work(), question("tally-allocate"), StageCall(1))
    assert failed.value.where == "model"
    assert sandboxes_left() <= before


class TimedLLM(ScriptedLLM):
    """Records when each call reached the model."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(replies)
        self.times: list[float] = []

    async def post(self, path: str, *, cast_to: type, body: dict[str, Any]) -> dict[str, Any]:
        self.times.append(time.time())
        return await super().post(path, cast_to=cast_to, body=body)


async def test_the_llm_budget_holds_across_steps_and_replicas(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig, mongo_url: str
) -> None:
    """Two attempts, each in its own replica (limiter and database client), under one LLM
    budget of one question at a time and 4 calls a second: every step is one call under its
    item's admission, so the second attempt's calls start only after the first attempt's end,
    and no second holds more than 4 calls."""
    clients: list[AsyncMongoClient[dict[str, Any]]] = [AsyncMongoClient(mongo_url) for _ in "ab"]
    limiters = [CapacityLimiter(Stores.over(client["aml_coding_budget"])) for client in clients]
    capacity = Capacity(key="llm-coding", max_concurrency=1, max_rps=4.0)
    models = [TimedLLM([bash("true")] * 5 + [SUBMIT]) for _ in "ab"]

    async def attempt_in(replica: int) -> dict[str, Any]:
        solve, _ = stages(synthetic, agent, models[replica])
        admission = await limiters[replica].admit(capacity)
        try:
            # As the question stage runs a compute: under the admission's turn.
            async with admission.turn():
                return await solve(work(), question("tally-allocate"), StageCall(1, admission))
        finally:
            await admission.release()

    try:
        answers = await asyncio.wait_for(asyncio.gather(attempt_in(0), attempt_in(1)), 120)
    finally:
        for client in clients:
            await client.close()
    assert [answer["steps"] for answer in answers] == [6, 6]
    first, second = sorted(models, key=lambda model: model.times[0])
    assert max(first.times) < min(second.times), "the attempts overlapped at the LLM"
    times = sorted(first.times + second.times)
    for start in times:
        # Departures are stamped a moment before a call reaches the model: 50 ms of slack.
        assert sum(1 for t in times if start <= t < start + 0.95) <= 4, times
