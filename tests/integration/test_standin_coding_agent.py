"""The coding agent against the LLM stand-in's scripted agent model, everything real: the stand-in
as a server process on loopback over HTTP, mini-swe-agent (`aml_pipeline.coding_agent.attempt`)
in the bubblewrap sandbox over a shipped synthetic-coding snapshot, and the patch it leaves
graded with the task's hidden tests in a fresh sandbox. The relevant trajectory among the
memories resolves the task; noisy memories alone, or the relevant trajectory past the memory
budget, do not. Skipped, with the one line the track refuses with, where bwrap cannot run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
import openai
import pytest
from llm_support import standin_server

from aml_evaluation.coding.bundle import CodingBundle, CodingTask, Trajectory, load_coding_bundle
from aml_evaluation.coding.grading import grade
from aml_evaluation.coding.synthetic import SHIPPED_BUNDLE_DIR
from aml_evaluation.context import estimated
from aml_pipeline.coding_agent import (
    AgentConfig,
    Attempt,
    ChatMessage,
    EndReason,
    load_agent_config,
    memory_context,
)
from aml_pipeline.coding_agent import attempt as run_attempt
from aml_pipeline.llm import complete_chat
from aml_pipeline.sandbox import Sandbox, SandboxUnavailable, require_sandbox

pytestmark = pytest.mark.integration

TASK_ID = "tally-rate-rounding"
LATENCY = 0.05
CAPACITY = 2
TEST_SECONDS = 120.0


@pytest.fixture(scope="module")
def bundle() -> CodingBundle:
    try:
        require_sandbox()
    except SandboxUnavailable as unavailable:
        pytest.skip(str(unavailable))
    return load_coding_bundle(SHIPPED_BUNDLE_DIR)


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory, bundle: CodingBundle) -> Iterator[str]:
    yield from standin_server(tmp_path_factory, LATENCY, CAPACITY)


@pytest.fixture
async def llm(standin: str) -> AsyncIterator[openai.AsyncOpenAI]:
    httpx.post(f"{standin}/stats/reset", timeout=10).raise_for_status()
    client = openai.AsyncOpenAI(base_url=f"{standin}/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


def agent_config(memory_tokens: int = 2000) -> AgentConfig:
    return load_agent_config(
        token_counter="utf8-bytes-div-3-v1",
        step_limit=6,
        command_timeout_seconds=30.0,
        wall_seconds=120.0,
        memory_tokens=memory_tokens,
    )


def candidates(trajectories: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """What a memory system could return: each step of each trajectory, its turns' text."""
    return [
        {
            "content": "\n".join(f"{turn.role}: {turn.content}" for turn in step.turns),
            "created_at": trajectory.created_at.date().isoformat(),
        }
        for trajectory in trajectories
        for step in trajectory.steps
    ]


async def solve_and_grade(
    task: CodingTask,
    memories: str,
    config: AgentConfig,
    llm: openai.AsyncOpenAI,
) -> tuple[Attempt, str, bool]:
    """The agent's attempt in a sandbox, the patch of its working copy, and whether that patch
    with the hidden tests resolves the task."""
    snapshot = SHIPPED_BUNDLE_DIR / task.snapshot

    async def complete(messages: list[ChatMessage]) -> tuple[str, int, int]:
        reply = await complete_chat(llm, "standin", messages, config.reply_max_tokens)
        return reply.text, reply.tokens_in, reply.tokens_out

    with await asyncio.to_thread(Sandbox.from_archive, snapshot) as sandbox:
        done = await run_attempt(task.problem_statement, memories, config, complete, sandbox)
        patch = await asyncio.to_thread(sandbox.patch)

    def verify() -> bool:
        with Sandbox.from_archive(snapshot) as fresh:
            assert fresh.apply(task.test_patch).ok
            applied = fresh.apply(patch)
            assert applied.ok, applied.output
            ran = fresh.run(task.test_command, TEST_SECONDS)
        assert not ran.timed_out
        graded = grade(
            ran.output,
            task.log_format,
            task.fail_to_pass,
            task.pass_to_pass,
            exit_code=ran.exit_code,
        )
        return graded.resolved

    return done, patch, await asyncio.to_thread(verify)


def stats(standin: str) -> dict[str, Any]:
    response = httpx.get(f"{standin}/stats", timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


async def test_the_relevant_trajectory_among_the_memories_resolves_the_task(
    bundle: CodingBundle, llm: openai.AsyncOpenAI, standin: str
) -> None:
    task = bundle.task(TASK_ID)
    assert task.stand_in is not None
    config = agent_config()
    memory = await memory_context(
        candidates(bundle.scope(TASK_ID, "relevant")), config.memory_tokens, estimated
    )
    assert task.stand_in.convention in memory.text
    done, patch, resolved = await solve_and_grade(task, memory.text, config, llm)
    assert (done.end_reason, done.steps) == (EndReason.SUBMITTED, 2)
    assert done.tokens_in > 0 and done.tokens_out > 0
    assert resolved, patch
    assert stats(standin)["by_kind"] == {"coding": 2}


async def test_noisy_memories_alone_do_not_resolve_it(
    bundle: CodingBundle, llm: openai.AsyncOpenAI, standin: str
) -> None:
    task = bundle.task(TASK_ID)
    assert task.stand_in is not None
    relevant = set(bundle.conditions.root[TASK_ID].relevant)
    noisy = [t for t in bundle.scope(TASK_ID, "noisy") if t.trajectory_id not in relevant]
    assert noisy
    config = agent_config()
    memory = await memory_context(candidates(noisy), config.memory_tokens, estimated)
    assert memory.kept and task.stand_in.convention not in memory.text
    done, patch, resolved = await solve_and_grade(task, memory.text, config, llm)
    assert (done.end_reason, done.steps) == (EndReason.SUBMITTED, 2)
    # The agent changed the code (the plausible wrong fix), and the hidden tests catch it.
    assert patch.strip() and not resolved
    assert stats(standin)["by_kind"] == {"coding": 2}


async def test_the_relevant_trajectory_past_the_memory_budget_does_not_count(
    bundle: CodingBundle, llm: openai.AsyncOpenAI
) -> None:
    """The noisy condition as the participant ranked it badly: the relevant trajectory last,
    beyond the budget, so it never reaches the prompt."""
    task = bundle.task(TASK_ID)
    assert task.stand_in is not None
    relevant = set(bundle.conditions.root[TASK_ID].relevant)
    scope = bundle.scope(TASK_ID, "noisy")
    ranked = [t for t in scope if t.trajectory_id not in relevant] + [
        t for t in scope if t.trajectory_id in relevant
    ]
    config = agent_config(memory_tokens=1000)
    memory = await memory_context(candidates(ranked), config.memory_tokens, estimated)
    assert memory.kept < len(candidates(ranked))
    assert task.stand_in.convention not in memory.text
    done, _, resolved = await solve_and_grade(task, memory.text, config, llm)
    assert done.end_reason is EndReason.SUBMITTED and not resolved


async def test_the_stand_in_says_it_is_scripted(standin: str) -> None:
    assert stats(standin)["model"] == "scripted stand-in (not a language model)"
    models = httpx.get(f"{standin}/v1/models", timeout=10).json()
    assert models["data"][0]["description"] == "scripted stand-in (not a language model)"
