"""The search stage hands its candidates to the answer stage with the work (real nats-server and
nx-27017): the answerer answers from exactly what the search stored without reading it back,
a list too large to travel stays behind and is read, and a redelivery that finds the search
stored sends the answer stage nothing new."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import httpx
import openai
import pytest
from faststream.nats import NatsBroker
from llm_support import standin_server
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from aml_answerer.handlers import AnswerQuestion
from aml_answerer.settings import AnswererSettings
from aml_contract import subjects
from aml_contract.messages import QuestionFacts, QuestionWork
from aml_evaluation.context import estimated
from aml_evaluation.prompts import load_prompt
from aml_pipeline.question_stage import CARRIED_CANDIDATES_BYTES, QuestionStageWorker
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import JetStreamBus
from aml_runtime.db import Document
from aml_runtime.documents import ensure_indexes
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

FACTS = QuestionFacts(
    dataset_id="synthetic",
    question_id="s1:q1",
    user_id="u-1",
    question="What does Ann drink?",
    category=1,
    category_name="single-hop",
    gold_answer="tea",
    f1_variant="plain",
)


@pytest.fixture(scope="module")
async def db(mongo_url: str) -> AsyncIterator[AsyncDatabase[Document]]:
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    database = client["aml_handoff_it"]
    await ensure_indexes(database)
    yield database
    await client.close()


def searcher(
    db: AsyncDatabase[Document], broker: NatsBroker, candidates: list[Document]
) -> QuestionStageWorker:
    async def search(*_: Any) -> Document:
        return {"candidates": candidates, "n_candidates": len(candidates), "leaks": 0}

    return QuestionStageWorker(
        "search", CommonSettings(), Stores.over(db), broker, JetStreamBus(broker), search
    )


async def search_once(
    db: AsyncDatabase[Document],
    broker: NatsBroker,
    job_id: str,
    candidates: list[Document],
    delivered: int = 1,
) -> None:
    """One delivery of one question's search work, the participant answering `candidates`."""
    await db.jobs.update_one(
        {"_id": job_id},
        {"$setOnInsert": {"state": "running", "top_k": 5, "created_at": datetime.now(UTC)}},
        upsert=True,
    )
    work = QuestionWork(
        job_id=job_id, version_id="ver-h", item_id=f"{job_id}/s1:q1", facts=FACTS, search_body="{}"
    )
    item = SimpleNamespace(
        delivered=delivered, admission=None, call=lambda job: StageCall(delivered, None, job)
    )
    stage = searcher(db, broker, candidates)
    await stage._process(work, cast(Any, item))
    await stage.close()


async def answer_work(broker: NatsBroker, job_id: str) -> Any:
    """The job's answer-stage work queue, as a pull subscription (one per job: the work stream
    allows one consumer per subject)."""
    js = broker.connection.jetstream()
    subject = subjects.work_subject("answer", "ver-h", job_id)
    return await js.pull_subscribe(subject, durable=f"t-{job_id}", stream=subjects.WORK_STREAM)


async def searched(
    db: AsyncDatabase[Document], broker: NatsBroker, job_id: str, candidates: list[Document]
) -> QuestionWork:
    """Run the search stage on one question and return the work it handed to the answer stage."""
    await search_once(db, broker, job_id, candidates)
    sub = await answer_work(broker, job_id)
    [msg] = await sub.fetch(1, timeout=2.0)
    await msg.ack()
    # Unsubscribed now: a pull subscription left open holds the broker's drain at the
    # module's end for its whole timeout (30 s).
    await sub.unsubscribe()
    return QuestionWork.model_validate_json(msg.data)


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from standin_server(tmp_path_factory, latency=0.01, capacity=4)


@pytest.fixture
async def answerer(db: AsyncDatabase[Document], standin: str) -> AsyncIterator[AnswerQuestion]:
    llm = openai.AsyncOpenAI(base_url=f"{standin}/v1", api_key="unused", max_retries=0)
    yield AnswerQuestion(
        AnswererSettings(), Stores.over(db), llm, load_prompt("answer_v1"), estimated
    )
    await llm.close()


def last_prompt(standin: str) -> str:
    """The prompt of the last chat request the stand-in received."""
    received = httpx.get(f"{standin}/requests", timeout=10).json()["requests"]
    (message,) = received[-1]
    content: str = message["content"]
    return content


async def test_the_answerer_answers_from_the_candidates_handed_on(
    db: AsyncDatabase[Document], broker: NatsBroker, answerer: AnswerQuestion, standin: str
) -> None:
    candidates = [{"id": "m1", "content": "Ann drinks tea every morning", "score": 0.9}]
    handed_on = await searched(db, broker, "job-h1", candidates)
    assert handed_on.candidates == candidates
    assert handed_on.search_body is None
    stored = await db.searches.find_one({"_id": handed_on.item_id})
    assert stored is not None and stored["candidates"] == handed_on.candidates
    # The stored document is changed behind the answerer's back: it must not be read.
    await db.searches.update_one(
        {"_id": handed_on.item_id}, {"$set": {"candidates": [{"id": "x", "content": "coffee"}]}}
    )
    result = await answerer(handed_on, FACTS.model_dump(), StageCall(delivered=1))
    prompt = last_prompt(standin)
    assert "Ann drinks tea every morning" in prompt and "coffee" not in prompt
    assert result["candidates_used"] == 1


async def test_candidates_too_large_to_travel_are_read_by_the_answerer(
    db: AsyncDatabase[Document], broker: NatsBroker, answerer: AnswerQuestion, standin: str
) -> None:
    large = [{"id": f"m{i}", "content": "x" * 1000 + f" memory {i}"} for i in range(100)]
    assert len(str(large)) > CARRIED_CANDIDATES_BYTES
    handed_on = await searched(db, broker, "job-h2", large)
    assert handed_on.candidates is None
    result = await answerer(handed_on, FACTS.model_dump(), StageCall(delivered=1))
    assert result["candidates_returned"] == 100
    assert "memory 0" in last_prompt(standin)


async def test_a_redelivery_after_the_search_was_stored_sends_nothing_new(
    db: AsyncDatabase[Document], broker: NatsBroker
) -> None:
    first = [{"id": "m1", "content": "Ann drinks tea"}]
    await searched(db, broker, "job-h3", first)
    # A later delivery finds the stored search and only re-announces the hand-off: the broker
    # drops it within its duplicate window, so nothing new reaches the answer stage.
    await search_once(db, broker, "job-h3", [{"id": "m2", "content": "never stored"}], 2)
    sub = await answer_work(broker, "job-h3")
    with pytest.raises(TimeoutError):
        await sub.fetch(1, timeout=1.0)
    await sub.unsubscribe()
    stored = await db.searches.find_one({"_id": "job-h3/s1:q1"})
    assert stored is not None and stored["candidates"] == first
