"""The LLM stand-in of the load benchmark, as a real server process on loopback, called with the
openai client the platform uses and with httpx: latency honoured, 429 beyond the declared
capacity (at once, not queued), replies the platform's parsers read, and /stats counting what
was sent."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest
from llm_support import standin_server
from pymongo import AsyncMongoClient

from aml_answerer.handlers import AnswerQuestion
from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_contract.participant import SearchRequest, encode
from aml_evaluation.context import estimated
from aml_evaluation.prompts import format_memories, load_prompt, question_with_options
from aml_evaluation.scoring import parse_choice, parse_judge_label
from aml_llm_standin import max_in_window
from aml_pipeline.stage_worker import StageCall
from aml_runtime.db import Document
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

LATENCY = 0.5
CAPACITY = 2


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stand-in's base URL (without /v1)."""
    yield from standin_server(tmp_path_factory, LATENCY, CAPACITY)


@pytest.fixture
async def llm(standin: str) -> AsyncIterator[openai.AsyncOpenAI]:
    httpx.post(f"{standin}/stats/reset", timeout=10).raise_for_status()
    # No retries: a 429 must reach the test as it was answered.
    client = openai.AsyncOpenAI(base_url=f"{standin}/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


def _stats(standin: str) -> dict[str, object]:
    response = httpx.get(f"{standin}/stats", timeout=10)
    response.raise_for_status()
    body: dict[str, object] = response.json()
    return body


async def _ask(llm: openai.AsyncOpenAI, prompt: str, max_tokens: int = 32) -> str:
    response = await llm.chat.completions.create(
        model="any-model",
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        seed=0,
    )
    return response.choices[0].message.content or ""


def _answer_prompt(question: str, options: list[str] | None = None) -> str:
    memories = format_memories([("Caroline: I joined a pottery class on Sunday.", "8 May 2023")])
    return load_prompt("answer_v1").text.format(
        memories=memories, question=question_with_options(question, options)
    )


def _judge_prompt(gold: str, generated: str) -> str:
    return load_prompt("judge_v1").text.format(
        question="What did Caroline join?", gold_answer=gold, generated_answer=generated
    )


async def test_latency_is_honoured_and_replies_are_deterministic(
    llm: openai.AsyncOpenAI,
) -> None:
    prompt = _answer_prompt("What did Caroline join?")
    started = time.monotonic()
    first = await _ask(llm, prompt)
    elapsed = time.monotonic() - started
    assert LATENCY <= elapsed < LATENCY + 1.0
    assert first == "Caroline: I joined a pottery class on Sunday."
    assert await _ask(llm, prompt) == first
    assert await _ask(llm, prompt, max_tokens=2) == "Caroline: I"


async def test_replies_are_read_by_the_platform_parsers(llm: openai.AsyncOpenAI) -> None:
    labels = {
        parse_judge_label(await _ask(llm, _judge_prompt(gold, "pottery")))
        for gold in ("pottery", "a pottery class", "clay", "ceramics", "a class", "Sunday")
    }
    # Every reply is readable, and a hash of the prompt gives both labels over a few prompts.
    assert labels == {"CORRECT", "WRONG"}
    options = ["pottery", "painting", "running"]
    reply = await _ask(llm, _answer_prompt("What did Caroline join?", options))
    assert parse_choice(reply, options) is not None
    empty = load_prompt("answer_v1").text.format(memories=format_memories([]), question="Why?")
    assert await _ask(llm, empty) == "Not mentioned in the memories."
    # A judge prompt variant without a gold answer is still a judge prompt.
    variant = 'Grade it. Reply only {"label": "CORRECT"} or {"label": "WRONG"}.'
    assert parse_judge_label(await _ask(llm, variant)) is not None


async def test_requests_beyond_capacity_are_answered_429_at_once(
    llm: openai.AsyncOpenAI, standin: str
) -> None:
    prompt = _answer_prompt("What did Caroline join?")

    async def timed() -> tuple[str, float]:
        started = time.monotonic()
        try:
            await _ask(llm, prompt)
        except openai.RateLimitError:
            return "429", time.monotonic() - started
        return "200", time.monotonic() - started

    first = [asyncio.create_task(timed()) for _ in range(CAPACITY)]
    # The first ones hold every slot before the extra ones are sent.
    await asyncio.sleep(LATENCY / 3)
    extra = [asyncio.create_task(timed()) for _ in range(2)]
    served, rejected = await asyncio.gather(*first), await asyncio.gather(*extra)
    assert [status for status, _ in served] == ["200"] * CAPACITY
    assert [status for status, _ in rejected] == ["429"] * 2
    assert all(seconds < LATENCY for _, seconds in rejected), "a 429 must not be queued"

    stats = _stats(standin)
    assert stats["calls"] == CAPACITY + 2
    assert stats["served"] == CAPACITY and stats["rejected_429"] == 2
    assert stats["max_active"] == CAPACITY
    assert stats["max_concurrency"] == CAPACITY + 1  # a rejected request leaves at once


async def test_stats_count_calls_kinds_and_the_busiest_second(
    llm: openai.AsyncOpenAI, standin: str
) -> None:
    for _ in range(2):
        await asyncio.gather(
            _ask(llm, _answer_prompt("What did Caroline join?")),
            _ask(llm, _judge_prompt("pottery", "pottery")),
        )
    bad = httpx.post(f"{standin}/v1/chat/completions", json={"messages": []}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    stats = _stats(standin)
    assert stats["calls"] == stats["served"] == 4
    assert stats["by_kind"] == {"answer": 2, "judge": 2}
    assert stats["rejected_429"] == 0 and stats["invalid"] == 1
    assert stats["max_concurrency"] == stats["max_active"] == 2
    # Two pairs LATENCY apart, all four within one second.
    assert stats["max_in_1s"] == 4
    httpx.post(f"{standin}/stats/reset", timeout=10).raise_for_status()
    assert _stats(standin)["calls"] == 0


CLOCK_TICK = 0.002


async def test_intervals_show_when_each_served_request_held_its_slot(
    llm: openai.AsyncOpenAI, standin: str
) -> None:
    """On the machine's monotonic clock, so a benchmark can lay them over its own times."""
    prompt = _answer_prompt("What did Caroline join?")
    before = time.monotonic()
    await asyncio.gather(*(_ask(llm, prompt) for _ in range(CAPACITY + 1)), return_exceptions=True)
    after = time.monotonic()
    body = httpx.get(f"{standin}/stats/intervals", timeout=10).json()
    assert body["clock"] == "time.monotonic"
    # The request over the capacity was answered 429 and held no slot.
    assert len(body["intervals"]) == CAPACITY == _stats(standin)["served"]
    # The server's event loop (uvloop) times its sleeps on a millisecond clock, so a slot is
    # held for the latency give or take that millisecond.
    for start, end in body["intervals"]:
        assert before <= start and start + LATENCY - CLOCK_TICK <= end <= after
    httpx.post(f"{standin}/stats/reset", timeout=10).raise_for_status()
    assert httpx.get(f"{standin}/stats/intervals", timeout=10).json()["intervals"] == []


def test_max_in_window_counts_half_open_windows() -> None:
    assert max_in_window([]) == 0
    assert max_in_window([0.0, 0.1, 0.2]) == 3
    # Exactly eight per second (binary fractions, so no rounding): eight, not nine, in any
    # [t, t + 1).
    assert max_in_window([i / 8 for i in range(24)]) == 8
    assert max_in_window([5.0, 0.0, 0.5, 5.2, 5.9, 6.05]) == 3
    assert max_in_window([0.0, 1.0, 2.0], window=2.5) == 3


async def test_the_answerer_sends_image_parts_to_an_openai_compatible_server(
    standin: str, llm: openai.AsyncOpenAI, mongo_url: str
) -> None:
    """A multimodal candidate and question reach the server as OpenAI content parts, in the
    participant's order; a text question arrives as one string, as before (R-4.8, R-6.1)."""
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    image = "data:image/png;base64," + base64.b64encode(png).decode()
    picture = {"type": "image_url", "image_url": {"url": image}}
    query = [{"type": "text", "text": "Whose dog is this?"}, picture]
    candidate = {"id": "m1", "content": [{"type": "text", "text": "Rex is Ann's dog"}, picture]}
    mongo: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, tz_aware=True)
    db = mongo[f"standin-{uuid.uuid4().hex[:8]}"]
    try:
        tea = {"id": "m2", "content": "likes tea"}
        await db.searches.insert_many([
            {"_id": "j/d/q1", "state": "done", "candidates": [candidate]},
            {"_id": "j/d/q2", "state": "done", "candidates": [tea]},
        ])  # fmt: skip
        body = encode(SearchRequest.model_validate({"query": query, "user_id": "u", "top_k": 5}))
        await db.questions.insert_one({"_id": "j/d/q1", "search_body": body})
        answer = AnswerQuestion(
            AnswererSettings(), Stores.over(db), llm, load_prompt("answer_v1"), estimated
        )
        shows = {"question": "Whose dog is this?", "question_images": 1}
        work = QuestionWork(job_id="j", version_id="v", item_id="j/d/q1")
        result = await answer(work, shows, StageCall(delivered=1))
        work = QuestionWork(job_id="j", version_id="v", item_id="j/d/q2")
        await answer(work, {"question": "What does she drink?"}, StageCall(delivered=1))
    finally:
        await mongo.drop_database(db.name)
        await mongo.close()
    assert result["images_sent"] == 2
    received = httpx.get(f"{standin}/requests", timeout=10).json()["requests"]
    (pictured,), (text,) = received[-2:]
    parts = pictured["content"]
    assert [part["type"] for part in parts] == ["text", "image_url", "text", "image_url", "text"]
    assert parts[0]["text"].endswith("- Rex is Ann's dog")
    assert parts[2]["text"].endswith("Question: Whose dog is this?")
    assert parts[1]["image_url"] == parts[3]["image_url"] == {"url": image, "detail": "low"}
    assert isinstance(text["content"], str) and "- likes tea" in text["content"]
