"""The coding track's Solve and Verify as the answer and score stages run them (R-2.5;
aml_pipeline.coding_track, aml_answerer.handlers.SolveTask, aml_scorer.handlers.VerifyAttempt):
the real mini-swe-agent driven by a scripted answer model behind the openai client, on a
synthetic-coding task, in a workspace that stands in for the sandbox (no isolation here: the
real sandbox is tests/integration/test_coding_attempts_sandboxed.py's). Also the multi-message
completion, the LLM admission across an attempt's steps, and the patch's files."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from coding_doubles import (
    SUBMIT,
    Files,
    LocalWorkspace,
    ScriptedLLM,
    apply_with_heredoc,
    bash,
    bundle_tasks,
)
from fake_stores import MemoryStageRecordStore, MemoryStores, memory_stores

from aml_answerer.handlers import AnswerQuestion, SolveTask
from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_devtools import rescore
from aml_evaluation.coding.bundle import CodingBundle
from aml_evaluation.coding.dataset import coding_dataset
from aml_evaluation.coding.grading import GRADING_VERSION
from aml_evaluation.coding.source import CodingTaskUnavailable
from aml_evaluation.coding.synthetic import materialise_synthetic_coding
from aml_evaluation.context import estimated
from aml_evaluation.prompts import load_prompt
from aml_evaluation.scoring import CODING_SCORER
from aml_pipeline import evaluation_spec
from aml_pipeline.capacity import REQUEST_LEAVING, Admission, Capacity, CapacityLimiter
from aml_pipeline.coding_agent import AgentConfig, PlatformFailure, load_agent_config
from aml_pipeline.coding_track import (
    MAX_PATCH_BYTES,
    VERIFY_RULE,
    HiddenTestsRejected,
    SandboxCheck,
    verify,
    verify_limits,
    without_files,
)
from aml_pipeline.llm import ContextLengthExceeded, LLMUnavailable, complete_chat
from aml_pipeline.outages import LanePause, OutageExpired, Outages
from aml_pipeline.question_stage import CARRIED_ANSWER_BYTES, STAGES
from aml_pipeline.sandbox import SandboxLimits, SandboxUnavailable
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.documents import AnswerDocument, FailureKind, ScoreDocument
from aml_runtime.settings import EvaluationSettings
from aml_scorer.handlers import ScoreAnswer, VerifyAttempt
from aml_scorer.settings import ScorerSettings

TASK = "tally-allocate"
LIMITS = SandboxLimits(wall_seconds=60.0)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CodingBundle]:
    root = tmp_path_factory.mktemp("synthetic-coding")
    return root, materialise_synthetic_coding(root)


@pytest.fixture(scope="module")
def agent() -> AgentConfig:
    return load_agent_config(token_counter="utf8-bytes-div-3-v1", step_limit=6, wall_seconds=60)


def question(task_id: str = TASK, condition: str = "relevant") -> dict[str, Any]:
    return {
        "dataset_id": "synthetic-coding",
        "question_id": f"{task_id}:{condition}",
        "user_id": f"eval:j1:synthetic-coding:{task_id}:{condition}",
        "question": "the problem statement",
        "category": 1,
        "category_name": condition,
        "gold_answer": task_id,
        "f1_variant": "f1-locomo-v1",
        "scorer": CODING_SCORER,
        "coding_task": task_id,
        "task_type": "development",
    }


CANDIDATES = [
    {"content": "In tally, the leftover minor units go to the LAST parts.", "created_at": "2024"},
    {"content": "Unrelated: the ledger sorts entries by date."},
]


def work(candidates: list[dict[str, Any]] | None = CANDIDATES) -> QuestionWork:
    return QuestionWork(
        job_id="j1", version_id="ver-1", item_id="j1/synthetic-coding/q", candidates=candidates
    )


def workspaces() -> tuple[list[LocalWorkspace], Any]:
    opened: list[LocalWorkspace] = []

    def open_workspace(archive: Path, limits: SandboxLimits) -> LocalWorkspace:
        opened.append(LocalWorkspace(archive, limits))
        return opened[-1]

    return opened, open_workspace


def no_probe() -> None:
    return None


def solver(
    synthetic: tuple[Path, CodingBundle],
    agent: AgentConfig,
    llm: ScriptedLLM,
    outages: Outages | None = None,
) -> tuple[SolveTask, list[LocalWorkspace]]:
    root, bundle = synthetic
    opened, open_workspace = workspaces()
    solve = SolveTask(
        AnswererSettings(),
        memory_stores().typed(),
        llm.client,
        agent,
        bundle_tasks(bundle, root),
        estimated,
        outages,
        open_workspace,
        SandboxCheck(no_probe),
    )
    return solve, opened


def verifier(synthetic: tuple[Path, CodingBundle]) -> tuple[VerifyAttempt, list[LocalWorkspace]]:
    root, bundle = synthetic
    opened, open_workspace = workspaces()
    return (
        VerifyAttempt(bundle_tasks(bundle, root), LIMITS, open_workspace, SandboxCheck(no_probe)),
        opened,
    )


# --- solve ----------------------------------------------------------------------------------


async def test_a_heredoc_edit_then_the_submission_is_the_answer(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    _, bundle = synthetic
    gold = bundle.task(TASK).gold_patch
    llm = ScriptedLLM([apply_with_heredoc(gold), SUBMIT])
    solve, opened = solver(synthetic, agent, llm)
    fields = await solve(work(), question(), StageCall(1))

    assert fields["end_reason"] == "submitted"
    assert (fields["steps"], fields["format_errors"]) == (2, 0)
    # The answer is the working copy's diff: the gold patch's change, nothing else.
    assert fields["answer"].startswith("diff --git a/tally/money.py b/tally/money.py")
    assert "+def allocate(money, parts):" in fields["answer"]
    assert fields["patch_files"] == ["tally/money.py"]
    assert fields["patch_bytes"] == len(fields["answer"].encode())
    # Every step was one call of the answer model, at temperature 0, with the reply cap.
    assert len(llm.bodies) == 2
    assert {body["model"] for body in llm.bodies} == {"gpt-4o-mini"}
    assert {(body["temperature"], body["max_tokens"]) for body in llm.bodies} == {(0.0, 4096)}
    assert fields["tokens_in"] == sum(
        sum(len(m["content"]) for m in body["messages"]) for body in llm.bodies
    )
    assert fields["tokens_out"] == sum(len(reply) for reply in llm.replies)
    assert fields["agent"] == "mini-swe-agent 2.4.6"
    assert fields["agent_config_sha256"] == agent.fingerprint()
    # The candidates in the participant's order, within the budget, in the task prompt.
    task_prompt = llm.bodies[0]["messages"][1]["content"]
    assert task_prompt.index("LAST parts") < task_prompt.index("ledger sorts")
    assert (fields["candidates_returned"], fields["candidates_used"]) == (2, 2)
    assert fields["memory_first_cut"] is False
    roles = [message["role"] for message in fields["trajectory"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "exit"]
    assert fields["trajectory_elided"] == 0
    assert opened[0].closed
    # The answer document reads back as the stages' model.
    stored = AnswerDocument.model_validate({"_id": "q", "job_id": "j1", "state": "done", **fields})
    assert (stored.end_reason, stored.steps) == ("submitted", 2)


async def test_an_attempt_at_its_step_limit_has_nothing_to_verify(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    _, bundle = synthetic
    # It fixes the code but never submits: an agent that hits its limits is unresolved.
    replies = [apply_with_heredoc(bundle.task(TASK).gold_patch), bash("ls")]
    solve, _ = solver(synthetic, agent, ScriptedLLM(replies))
    fields = await solve(work(), question(), StageCall(1))
    assert fields["end_reason"] == "step_limit"
    assert fields["steps"] == agent.step_limit
    assert fields["answer"] == ""
    assert fields["patch_files"] == []


async def test_a_full_context_ends_the_attempt_unresolved(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    request = httpx.Request("POST", "http://llm/v1/chat/completions")
    refusal = openai.BadRequestError(
        "This model's maximum context length is 128000 tokens.",
        response=httpx.Response(400, request=request),
        body={"code": "context_length_exceeded", "type": "invalid_request_error"},
    )
    solve, _ = solver(synthetic, agent, ScriptedLLM([], failure=refusal))
    fields = await solve(work(), question(), StageCall(1))
    assert (fields["end_reason"], fields["answer"]) == ("context_limit", "")


async def test_a_failing_llm_is_a_platform_failure_never_unresolved(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    request = httpx.Request("POST", "http://llm/v1/chat/completions")
    down = openai.APIConnectionError(request=request)
    solve, _ = solver(synthetic, agent, ScriptedLLM([], failure=down))
    # Without outages: the item's delivery fails and is retried (then platform_error).
    with pytest.raises(PlatformFailure) as failed:
        await solve(work(), question(), StageCall(1))
    assert failed.value.where == "model"
    assert not isinstance(failed.value, FinalFailure)

    # With outages: the LLM is declared down (every replica's LLM lanes pause) and the attempt
    # is given up for a redelivery once it answers, not waited out against its wall clock.
    stores = memory_stores()
    outages = Outages(stores.typed())
    solve, _ = solver(synthetic, agent, ScriptedLLM([], failure=down), outages)
    with pytest.raises(PlatformFailure) as failed:
        await solve(work(), question(), StageCall(1))
    assert isinstance(failed.value.__cause__, LLMUnavailable)
    assert outages.is_paused("llm")
    # A paused LLM is not called at all.
    llm = ScriptedLLM([SUBMIT])
    solve, _ = solver(synthetic, agent, llm, outages)
    with pytest.raises(PlatformFailure):
        await solve(work(), question(), StageCall(1))
    assert llm.bodies == []


class ExpiredOutages:
    """An LLM outage past its window: the call fails the item as the platform's, at once."""

    def is_paused(self, key: str) -> bool:
        return False

    async def declare(self, key: str, kind: str, since: float, reason: str, window: float) -> Any:
        pause = LanePause.model_validate(
            {"_id": key, "kind": "llm", "paused": False, "since": since - 4000, "reason": reason,
             "window": window, "probe_at": since, "interval": 15.0}
        )  # fmt: skip
        raise OutageExpired(pause, since)

    async def succeeded(self, key: str) -> None:
        return None


async def test_an_llm_down_past_its_window_fails_the_item_as_the_platforms(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    request = httpx.Request("POST", "http://llm/v1/chat/completions")
    down = openai.APIConnectionError(request=request)
    outages = cast(Outages, ExpiredOutages())
    solve, _ = solver(synthetic, agent, ScriptedLLM([], failure=down), outages)
    with pytest.raises(FinalFailure) as failed:
        await solve(work(), question(), StageCall(1))
    assert failed.value.kind == FailureKind.PLATFORM_ERROR
    assert "longer than AML_LLM_OUTAGE_SECONDS" in failed.value.reason


async def test_no_bubblewrap_fails_the_item_at_once_with_one_line(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    def missing() -> None:
        raise SandboxUnavailable("the coding track needs bubblewrap (bwrap) on PATH")

    solve, opened = solver(synthetic, agent, ScriptedLLM([SUBMIT]))
    solve.sandbox_check = SandboxCheck(missing)
    with pytest.raises(FinalFailure) as failed:
        await solve(work(), question(), StageCall(1))
    assert failed.value.kind == FailureKind.PLATFORM_ERROR
    assert failed.value.reason == "the coding track needs bubblewrap (bwrap) on PATH"
    assert opened == []


async def test_the_answer_stage_solves_a_coding_question_and_answers_the_others(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    llm = ScriptedLLM([SUBMIT])
    solve, _ = solver(synthetic, agent, llm)
    answer = AnswerQuestion(
        AnswererSettings(), memory_stores().typed(), llm.client, load_prompt("answer_v1"),
        estimated, solve=solve,
    )  # fmt: skip
    fields = await answer(work(), question(), StageCall(1))
    assert fields["end_reason"] == "submitted" and fields["answer"] == ""
    without = AnswerQuestion(
        AnswererSettings(), memory_stores().typed(), llm.client, load_prompt("answer_v1"),
        estimated,
    )  # fmt: skip
    with pytest.raises(FinalFailure, match="does not run the coding track"):
        await without(work(), question(), StageCall(1))


class CountingLimiter:
    """The LLM budget's rate slots as an admission takes them (no database)."""

    def __init__(self) -> None:
        self.taken = 0
        self.stamped: list[tuple[str, float]] = []

    async def wait_rate_slot(self, capacity: Capacity, holder: str) -> str:
        self.taken += 1
        return f"rate-{self.taken}"

    async def settle(self, capacity: Capacity, holder: str, stamps: list[Any], *rest: Any) -> None:
        self.stamped.extend(stamps)


async def test_every_step_takes_a_rate_slot_under_the_items_turn(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    """The question stage holds the item's turn around the whole attempt; the agent's calls,
    made as tasks of their own from its thread, leave under it (they would wait for it
    forever otherwise), each with a rate slot of the LLM budget."""
    limiter = CountingLimiter()
    admission = Admission(
        cast(CapacityLimiter, limiter),
        Capacity(key="llm", max_concurrency=1, max_rps=50.0),
        holder="h",
        concurrency_slot="llm/c/0",
        rate_slot=None,
        admitted_at=time.time(),
    )
    _, bundle = synthetic
    llm = ScriptedLLM([bash("ls"), apply_with_heredoc(bundle.task(TASK).gold_patch), SUBMIT])
    solve, _ = solver(synthetic, agent, llm)
    left: list[int] = []
    REQUEST_LEAVING.set(lambda: left.append(1))

    async def under_the_turn() -> dict[str, Any]:
        # As the question stage runs a compute: awaited by the task holding the turn.
        async with admission.turn():
            return await solve(work(), question(), StageCall(1, admission))

    try:
        fields = await asyncio.wait_for(under_the_turn(), 60)
    finally:
        REQUEST_LEAVING.set(None)
    assert fields["steps"] == 3
    assert limiter.taken == 3
    # The slot's next item is fetched when the attempt ends, not at its first call.
    assert left == []


async def test_the_agent_config_is_loaded_by_the_first_attempt(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answerer loads mini-swe-agent's config with its first coding item, once, whichever
    of the items arriving together asks first; a process without it fails the item at once."""
    loads: list[EvaluationSettings] = []

    def load(settings: EvaluationSettings) -> AgentConfig:
        loads.append(settings)
        time.sleep(0.05)  # long enough for the other threads to arrive meanwhile
        return agent

    monkeypatch.setattr(evaluation_spec, "coding_agent_config", load)
    loader = evaluation_spec.coding_agent_loader(EvaluationSettings())
    solve, _ = solver(synthetic, agent, ScriptedLLM([SUBMIT]))
    lazy = dataclasses.replace(solve, agent=loader)
    assert loads == []
    answers = await asyncio.gather(*(lazy(work(), question(), StageCall(1)) for _ in range(3)))
    assert len(loads) == 1
    assert {answer["agent_config_sha256"] for answer in answers} == {agent.fingerprint()}

    def missing() -> AgentConfig:
        raise RuntimeError(f"mini-swe-agent {agent.agent_version} is needed, found None")

    with pytest.raises(FinalFailure) as failed:
        await dataclasses.replace(solve, agent=missing)(work(), question(), StageCall(1))
    assert failed.value.kind is FailureKind.PLATFORM_ERROR
    assert "is needed, found None" in failed.value.reason


async def test_a_lent_turn_is_the_lenders_only_while_it_holds_it() -> None:
    admission = Admission(
        cast(CapacityLimiter, CountingLimiter()),
        Capacity(key="llm", max_concurrency=1),
        holder="h",
        concurrency_slot="llm/c/0",
        rate_slot=None,
        admitted_at=time.time(),
    )
    order: list[str] = []

    async def call(name: str) -> None:
        async with admission.turn():
            order.append(name)

    with pytest.raises(RuntimeError), admission.lend_turn():
        pass
    async with admission.turn():
        with admission.lend_turn():
            lent = asyncio.create_task(call("lent"))
        other = asyncio.create_task(call("other"))
        await asyncio.wait_for(lent, 5)
        await asyncio.sleep(0.01)
        assert order == ["lent"]  # the other task waits for the turn
        late = asyncio.create_task(call("late"))  # not lent: waits too
        await asyncio.sleep(0.01)
        assert order == ["lent"]
    await asyncio.wait_for(asyncio.gather(other, late), 5)
    assert order == ["lent", "other", "late"]


# --- the completion -------------------------------------------------------------------------


async def test_the_multi_message_completion_sends_the_conversation() -> None:
    llm = ScriptedLLM(["fine"])
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    reply = await complete_chat(llm.client, "m", messages, 77, temperature=0.0, seed=3)
    assert reply == ("fine", len("be brief") + len("hi"), len("fine"))
    assert llm.bodies == [
        {"model": "m", "messages": messages, "temperature": 0.0, "max_tokens": 77, "seed": 3}
    ]


async def test_an_over_long_conversation_is_told_apart_from_other_refusals() -> None:
    request = httpx.Request("POST", "http://llm/v1/chat/completions")
    llama = openai.BadRequestError(
        "the request exceeds the available context size, try increasing it",
        response=httpx.Response(400, request=request),
        body={"code": 400, "type": "exceed_context_size_error"},
    )
    with pytest.raises(ContextLengthExceeded):
        await complete_chat(ScriptedLLM([], failure=llama).client, "m", [], 5)
    other = openai.BadRequestError(
        "invalid temperature", response=httpx.Response(400, request=request), body=None
    )
    with pytest.raises(openai.BadRequestError):
        await complete_chat(ScriptedLLM([], failure=other).client, "m", [], 5)


# --- the patch's files ----------------------------------------------------------------------


PATCH = (
    "diff --git a/src/a.py b/src/a.py\n--- a/src/a.py\n+++ b/src/a.py\n@@ -1 +1 @@\n-x\n+y\n"
    "diff --git a/tests/test_a.py b/tests/test_a.py\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/tests/test_a.py\n@@ -0,0 +1 @@\n+t\n"
    "diff --git a/tests/data.bin b/tests/data.bin\nindex 1..2 100644\nGIT binary patch\n"
    "literal 1\nIcmZ?d00001\n\n"
)


def test_the_hidden_tests_files_are_left_out_of_a_patch() -> None:
    kept, ignored = without_files(PATCH, ["tests/test_a.py", "tests/data.bin"])
    assert kept == PATCH.split("diff --git a/tests/test_a.py")[0]
    assert ignored == ["tests/data.bin", "tests/test_a.py"]
    assert without_files(PATCH, ["elsewhere.py"]) == (PATCH, [])


def test_a_large_answer_is_read_by_the_score_stage_not_carried() -> None:
    carry = STAGES["answer"].carry
    assert carry({"answer": "short"}) == {"answer": "short"}
    assert carry({"answer": ""}) == {"answer": ""}
    assert carry({"answer": "x" * (CARRIED_ANSWER_BYTES + 1)}) == {"answer": None}
    assert MAX_PATCH_BYTES > CARRIED_ANSWER_BYTES


# --- verify ---------------------------------------------------------------------------------


async def test_verify_resolves_the_gold_patch_and_not_the_wrong_one(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    root, bundle = synthetic
    task = bundle.task(TASK)
    assert task.stand_in is not None
    opened, open_workspace = workspaces()
    gold = verify(task, root / task.snapshot, task.gold_patch, LIMITS, open_workspace)
    assert (gold.resolved, gold.resolution, gold.tests_ran) == (True, "RESOLVED_FULL", True)
    assert gold.report is not None
    assert gold.report["FAIL_TO_PASS"]["success"] == task.fail_to_pass
    assert gold.report["PASS_TO_PASS"]["failure"] == []
    assert (gold.grading_version, gold.verify_rule) == (GRADING_VERSION, VERIFY_RULE)
    assert gold.test_log is not None and "OK" in gold.test_log
    wrong = verify(task, root / task.snapshot, task.stand_in.wrong_patch, LIMITS, open_workspace)
    assert not wrong.resolved and wrong.tests_ran
    assert "FAIL_TO_PASS" in wrong.reason
    assert all(workspace.closed for workspace in opened)


def test_verify_grades_an_empty_patch_unresolved_without_running(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    root, bundle = synthetic
    task = bundle.task(TASK)
    opened, open_workspace = workspaces()
    empty = verify(task, root / task.snapshot, "  \n", LIMITS, open_workspace)
    assert (empty.resolved, empty.tests_ran, opened) == (False, False, [])
    # A patch whose only changes are to the hidden tests' files changes nothing that counts.
    only_tests = verify(task, root / task.snapshot, task.test_patch, LIMITS, open_workspace)
    assert not only_tests.resolved and not only_tests.tests_ran
    assert only_tests.ignored_files == ["tests/test_allocate.py"]


def test_verify_leaves_the_agents_edits_of_hidden_test_files_out(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    """SWE-bench resets the test patch's files before applying it: an agent that also wrote
    the hidden test file (a scratch test of its own) is graded on its fix alone."""
    root, bundle = synthetic
    task = bundle.task(TASK)
    scratch = (
        "diff --git a/tests/test_allocate.py b/tests/test_allocate.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/test_allocate.py\n@@ -0,0 +1 @@\n+raise SystemExit(1)\n"
    )
    _, open_workspace = workspaces()
    result = verify(task, root / task.snapshot, task.gold_patch + scratch, LIMITS, open_workspace)
    assert result.resolved
    assert result.ignored_files == ["tests/test_allocate.py"]


def test_a_patch_that_does_not_apply_is_unresolved_with_gits_reason(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    root, bundle = synthetic
    task = bundle.task(TASK)
    stale = task.gold_patch.replace(" \n \n+def allocate", " \n # not there\n+def allocate")
    assert stale != task.gold_patch
    _, open_workspace = workspaces()
    result = verify(task, root / task.snapshot, stale, LIMITS, open_workspace)
    assert (result.resolved, result.patch_applied, result.tests_ran) == (False, False, False)
    assert result.reason.startswith("the patch does not apply:")


# Hidden test changes to a file the snapshot does not have: they cannot apply.
ELSEWHERE = (
    "diff --git a/nothere.py b/nothere.py\n--- a/nothere.py\n+++ b/nothere.py\n"
    "@@ -1 +1 @@\n-a\n+b\n"
)


def test_hidden_tests_that_do_not_apply_are_the_platforms_fault(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    root, bundle = synthetic
    task = bundle.task(TASK)
    broken = task.model_copy(update={"test_patch": ELSEWHERE})
    _, open_workspace = workspaces()
    with pytest.raises(HiddenTestsRejected, match="hidden test changes of task tally-allocate"):
        verify(broken, root / task.snapshot, task.gold_patch, LIMITS, open_workspace)


def test_tests_past_their_time_are_unresolved(synthetic: tuple[Path, CodingBundle]) -> None:
    root, bundle = synthetic
    task = bundle.task(TASK).model_copy(update={"test_command": "sleep 5"})
    _, open_workspace = workspaces()
    result = verify(task, root / task.snapshot, task.gold_patch, verify_limits(0.5), open_workspace)
    assert (result.resolved, result.test_timed_out) == (False, True)
    assert result.reason == "the tests ran past their 0.5 s"


class AnswerRecords(MemoryStageRecordStore):
    async def answer_of(self, item_id: str) -> AnswerDocument | None:
        stored = self.answers.get(item_id)
        return None if stored is None else AnswerDocument.model_validate(stored)


async def test_the_score_stage_verifies_a_coding_attempt(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    _, bundle = synthetic
    gold = bundle.task(TASK).gold_patch
    verifier_, _ = verifier(synthetic)
    score = ScoreAnswer(
        ScorerSettings(), memory_stores().typed(), ScriptedLLM([]).client,
        load_prompt("judge_v1"), load_prompt("judge_abstention_v1"), verify=verifier_,
    )  # fmt: skip
    fields = await score(work().model_copy(update={"answer": gold}), question(), StageCall(1))
    assert fields["resolved"] is True and fields["resolution"] == "RESOLVED_FULL"
    assert (fields["coding_task"], fields["task_type"]) == (TASK, "development")
    assert (fields["category_name"], fields["dataset_id"]) == ("relevant", "synthetic-coding")
    assert fields["grading_version"] == GRADING_VERSION
    assert "judge_label" not in fields and "f1" not in fields
    stored = ScoreDocument.model_validate({"_id": "q", "job_id": "j1", "state": "done", **fields})
    assert stored.resolved is True

    # A large patch was not carried: the score stage reads the answer document.
    records = AnswerRecords()
    records.answers["j1/synthetic-coding/q"] = {
        "_id": "j1/synthetic-coding/q", "job_id": "j1", "state": "done", "answer": "",
    }  # fmt: skip
    score.stores = MemoryStores(records=records).typed()
    fields = await score(work(), question(), StageCall(1))
    assert fields["resolved"] is False and fields["tests_ran"] is False

    without = ScoreAnswer(
        ScorerSettings(), memory_stores().typed(), ScriptedLLM([]).client,
        load_prompt("judge_v1"), load_prompt("judge_abstention_v1"),
    )  # fmt: skip
    with pytest.raises(FinalFailure, match="does not run the coding track"):
        await without(work().model_copy(update={"answer": gold}), question(), StageCall(1))


async def test_broken_hidden_tests_fail_the_attempt_as_the_platforms(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    root, bundle = synthetic
    task = bundle.task(TASK)
    broken = task.model_copy(update={"test_patch": ELSEWHERE})
    verifier_, _ = verifier(synthetic)

    def open_task(dataset_id: str, task_id: str) -> Files:
        return Files(broken, root / task.snapshot)

    verifier_.open_task = open_task
    with pytest.raises(FinalFailure) as failed:
        await verifier_(question(), task.gold_patch)
    assert failed.value.kind == FailureKind.PLATFORM_ERROR


# --- regrading stored patches (`aml rescore` of a coding dataset) ---------------------------


@dataclass(frozen=True)
class Manifest:
    dataset_id: str = "synthetic-coding"
    version: str = "1"
    scorer: str = CODING_SCORER
    f1_variant: str = "f1-locomo-v1"
    categories: dict[int, str] = field(default_factory=lambda: {1: "relevant", 2: "noisy"})
    excluded_from_overall: list[int] = field(default_factory=list)


async def test_stored_patches_are_regraded_without_the_llm(
    synthetic: tuple[Path, CodingBundle],
) -> None:
    root, bundle = synthetic
    dataset = coding_dataset(bundle, Manifest())
    task = bundle.task(TASK)
    assert task.stand_in is not None
    other = bundle.tasks[0].task_id if bundle.tasks[0].task_id != TASK else bundle.tasks[1].task_id
    patches = {
        f"{TASK}:relevant": task.gold_patch,
        f"{TASK}:noisy": task.stand_in.wrong_patch,
        f"{other}:relevant": "",
    }
    _, open_workspace = workspaces()
    verifier_ = rescore.sandbox_verifier(
        "synthetic-coding", bundle_tasks(bundle, root), LIMITS, open_workspace
    )
    with pytest.raises(rescore.RescoreInputError, match="coding dataset"):
        await rescore.score_questions(dataset, patches, None, None)
    rows = await rescore.score_questions(dataset, patches, None, None, verify_attempt=verifier_)
    by_id = {row.question_id: row for row in rows}
    assert by_id[f"{TASK}:relevant"].resolved is True
    assert by_id[f"{TASK}:noisy"].resolved is False
    assert by_id[f"{other}:relevant"].resolved is False  # an empty patch
    assert by_id[f"{other}:noisy"].failure == rescore.NO_PREDICTION
    results = rescore.results_of(dataset, rows, manifest=cast(Any, Manifest()))
    overall = results.datasets["synthetic-coding"].overall
    assert (overall.attempts, overall.resolved, overall.headline) == (3, 1, "resolved_rate")
    assert overall.failures == {rescore.NO_PREDICTION: len(dataset.questions) - 3}
    assert results.datasets["synthetic-coding"].task_types is not None

    # A task the platform cannot open is a platform failure, never unresolved.
    def unavailable(dataset_id: str, task_id: str) -> Files:
        raise CodingTaskUnavailable(f"dataset {dataset_id!r} task {task_id!r}: missing")

    broken = rescore.sandbox_verifier("synthetic-coding", unavailable, LIMITS, open_workspace)
    rows = await rescore.score_questions(dataset, patches, None, None, verify_attempt=broken)
    assert {row.failure for row in rows if row.question_id in patches} == {"platform_error"}


async def test_a_task_whose_files_are_unavailable_is_retried_never_unresolved(
    synthetic: tuple[Path, CodingBundle], agent: AgentConfig
) -> None:
    def unavailable(dataset_id: str, task_id: str) -> Files:
        raise CodingTaskUnavailable(f"dataset {dataset_id!r} task {task_id!r}: snapshot missing")

    llm = ScriptedLLM([SUBMIT])
    solve, opened = solver(synthetic, agent, llm)
    solve.open_task = unavailable
    # A plain exception: the delivery is retried, then the item fails as platform_error.
    with pytest.raises(CodingTaskUnavailable):
        await solve(work(), question(), StageCall(1))
    assert (llm.bodies, opened) == ([], [])
    verifier_, opened = verifier(synthetic)
    verifier_.open_task = unavailable
    with pytest.raises(CodingTaskUnavailable):
        await verifier_(question(), "diff --git a/x b/x\n")
    assert opened == []
