"""The scorer's two lanes on a real nats-server and nx-27017, with the workers its composition
root makes (`llm_stage_worker`, `sandbox_stage_worker`) over one score stage and the real
`ScoreAnswer` and `VerifyAttempt`: the answer stage queues a coding attempt's score work on the
verify lane and any other question's on the LLM's, a test run holds no slot of the LLM budget
(with a budget of one, judge calls pass while verifies run), and no more attempts are verified
at once than `coding_verify_concurrency`; the ones waiting stay in the broker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from coding_doubles import LocalWorkspace, ScriptedLLM, bundle_tasks
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract import subjects
from aml_contract.messages import QuestionFacts, QuestionWork
from aml_evaluation.coding.synthetic import materialise_synthetic_coding
from aml_evaluation.prompts import load_prompt
from aml_evaluation.scoring import CODING_SCORER, F1_VERSION
from aml_pipeline.coding_track import OpenTask, SandboxCheck, verify_limits
from aml_pipeline.llm import LLM_CAPACITY_KEY
from aml_pipeline.question_stage import QuestionStageWorker
from aml_pipeline.sandbox import CommandResult, SandboxLimits
from aml_pipeline.stage_worker import (
    StageCall,
    StageWorker,
    llm_stage_worker,
    sandbox_stage_worker,
)
from aml_runtime.broker import JetStreamBus, declare_streams, make_broker
from aml_runtime.db import Document
from aml_runtime.documents import ensure_indexes
from aml_runtime.service import Runtime
from aml_runtime.stores import Stores
from aml_scorer.handlers import ScoreAnswer, VerifyAttempt
from aml_scorer.settings import ScorerSettings

pytestmark = pytest.mark.integration

TASK = "tally-allocate"
JOB = "jverify"
VERSION = "ver-v"


@dataclass
class Gate:
    """Holds every verify's test command until opened; counts the test runs at once."""

    opened: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    now: int = 0
    peak: int = 0
    started: int = 0


class GatedWorkspace(LocalWorkspace):
    """The verify step's workspace whose test command waits at the gate."""

    gate: Gate

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        with self.gate.lock:
            self.gate.now += 1
            self.gate.started += 1
            self.gate.peak = max(self.gate.peak, self.gate.now)
        try:
            assert self.gate.opened.wait(60), "the gate was never opened"
            return super().run(command, timeout)
        finally:
            with self.gate.lock:
                self.gate.now -= 1


@dataclass
class Rig:
    settings: ScorerSettings
    broker: NatsBroker
    db: AsyncDatabase[Document]
    runtime: Runtime
    tasks: OpenTask
    gold: str


@pytest.fixture
async def rig(
    nats_url: str, mongo_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Rig]:
    settings = ScorerSettings(
        nats_url=nats_url, ack_wait_seconds=5.0, llm_concurrency=1, coding_verify_concurrency=2
    )
    broker = make_broker(settings)
    await broker.connect()
    await declare_streams(broker)
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    db = client["aml_verify_lane"]
    await ensure_indexes(db)
    await db.jobs.insert_one({"_id": JOB, "state": "running", "top_k": 5,
                              "created_at": datetime.now(UTC)})  # fmt: skip
    # The parts of the runtime the worker factories use (the broker and the stores).
    runtime = Runtime(
        broker=broker, bus=JetStreamBus(broker), client=client, db=db,
        stores=Stores.over(db), tracing=cast(Any, None), settings=settings,
    )  # fmt: skip
    root = tmp_path_factory.mktemp("synthetic-coding")
    bundle = materialise_synthetic_coding(root)
    yield Rig(
        settings, broker, db, runtime, bundle_tasks(bundle, root), bundle.task(TASK).gold_patch
    )
    js = broker.connection.jetstream()
    await js.purge_stream(subjects.WORK_STREAM)
    for consumer in await js.consumers_info(subjects.WORK_STREAM):
        await js.delete_consumer(subjects.WORK_STREAM, consumer.name)
    await client.drop_database("aml_verify_lane")
    await broker.stop()
    await client.close()


def coding_facts(index: int) -> QuestionFacts:
    return QuestionFacts(
        dataset_id="synthetic-coding", question_id=f"{TASK}:relevant-{index}", user_id="u-1",
        question="Fix it.", category=1, category_name="relevant", gold_answer=None,
        f1_variant=F1_VERSION, scorer=CODING_SCORER, coding_task=TASK, task_type="debug",
    )  # fmt: skip


def open_facts(index: int) -> QuestionFacts:
    return QuestionFacts(
        dataset_id="synthetic", question_id=f"s1:q{index}", user_id="u-1",
        question="What does Ann drink?", category=1, category_name="single-hop",
        gold_answer="tea", f1_variant=F1_VERSION,
    )  # fmt: skip


async def answered(rig: Rig, facts: QuestionFacts, answer: str) -> None:
    """One question through the answer stage, which hands it on to the score stage's lanes."""

    async def answer_it(*_: Any) -> Document:
        return {"answer": answer}

    stage = QuestionStageWorker(
        "answer", rig.settings, Stores.over(rig.db), rig.broker, JetStreamBus(rig.broker),
        answer_it,
    )  # fmt: skip
    work = QuestionWork(
        job_id=JOB, version_id=VERSION, item_id=f"{JOB}/{facts.question_id}", facts=facts
    )
    item = SimpleNamespace(delivered=1, admission=None, call=lambda job: StageCall(1, None, job))
    await stage._process(work, cast(Any, item))
    await stage.close()


def no_probe() -> None:
    return None


async def _until(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_verifies_hold_no_llm_slot_and_keep_to_their_own_bound(rig: Rig) -> None:
    settings, db = rig.settings, rig.db
    gate = Gate()

    def open_workspace(archive: Path, limits: SandboxLimits) -> LocalWorkspace:
        workspace = GatedWorkspace(archive, limits)
        workspace.gate = gate
        return workspace

    judge = ScriptedLLM(['{"label": "CORRECT"}'])
    compute = ScoreAnswer(
        settings,
        Stores.over(db),
        judge.client,
        load_prompt(settings.judge_prompt),
        load_prompt(settings.judge_abstention_prompt),
        verify=VerifyAttempt(
            rig.tasks, verify_limits(120.0), open_workspace, SandboxCheck(no_probe)
        ),
    )
    stage = QuestionStageWorker(
        "score", settings, Stores.over(db), rig.broker, JetStreamBus(rig.broker), compute
    )
    # As the scorer's composition root makes them (services/scorer/aml_scorer/main.py).
    workers: list[StageWorker[QuestionWork]] = [
        llm_stage_worker(rig.runtime, settings, "score", "t-scorer", stage),
        sandbox_stage_worker(
            rig.runtime, settings, "verify", "t-scorer-verify", stage,
            settings.coding_verify_concurrency,
        ),
    ]  # fmt: skip

    attempts, questions = 5, 3
    for index in range(attempts):
        await answered(rig, coding_facts(index), rig.gold)
    for index in range(questions):
        await answered(rig, open_facts(index), "Ann drinks tea.")
    js = rig.broker.connection.jetstream()
    for stage_name, count in (("verify", attempts), ("score", questions)):
        info = await js.stream_info(
            subjects.WORK_STREAM, subjects_filter=f"{subjects.WORK_PREFIX[stage_name]}.*.*"
        )
        assert sum((info.state.subjects or {}).values()) == count, stage_name

    async def scores(**query: Any) -> int:
        return await db.scores.count_documents({"job_id": JOB, "state": "done", **query})

    for worker in workers:
        await worker.start(rig.broker)
    try:
        # Two verifies run (the bound), the other three wait in the broker; meanwhile every
        # judge call passes under an LLM budget of one.
        async def judged() -> bool:
            return await scores(judge_label="CORRECT") == questions

        async def verifying() -> bool:
            return gate.now == 2

        await _until(verifying)
        await _until(judged)
        assert gate.now == 2 and gate.started == 2
        assert await scores(resolved={"$exists": True}) == 0
        verify_consumer = await js.consumer_info(subjects.WORK_STREAM, "t-scorer-verify")
        assert verify_consumer.num_pending == attempts - 2
        assert verify_consumer.num_ack_pending == 2

        async def llm_slot_free() -> bool:
            # Given back once the judge lane ran out of work: no verify holds it.
            held = {"pool": f"{LLM_CAPACITY_KEY}/c", "free_at": {"$gt": time.time()}}
            return await db.capacity_slots.count_documents(held) == 0

        await _until(llm_slot_free, timeout=10)
        # The verify lane's slots are counted by its process alone.
        assert await db.capacity_slots.count_documents({"pool": {"$regex": "^sandbox"}}) == 0
        assert gate.now == 2
        gate.opened.set()

        async def verified() -> bool:
            return await scores(resolved=True) == attempts

        await _until(verified)
    finally:
        gate.opened.set()
        for worker in workers:
            await worker.stop()
        await stage.close()
    assert gate.peak == settings.coding_verify_concurrency
    assert len(judge.bodies) == questions  # the verifies asked the LLM nothing
