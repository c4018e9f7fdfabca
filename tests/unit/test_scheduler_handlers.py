"""The scheduler's release and completion rules, driven through FastStream's in-memory NATS
broker (`TestNatsBroker`) against in-memory stores: each user's Adds go out one at a time in
`seq` order, a user's questions only once all of that user's Adds are done (once, behind a
release marker), and a job completes only when every question is final, once, and never when it
is no longer running."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from fake_stores import MemoryStores, memory_stores
from fakes import Document, TestBrokerBus
from faststream.nats import JStream, NatsBroker, NatsMessage, TestNatsBroker

from aml_contract import subjects
from aml_contract.messages import AddDone, QuestionDone, SearchDone, message_id
from aml_contract.participant import user_chunk_id
from aml_evaluation.aggregate import QuestionOutcome
from aml_evaluation.datasets import parse_locomo
from aml_evaluation.registry import load_dataset
from aml_pipeline.chains import add_order
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_runtime.broker import publish
from aml_scheduler.handlers import ScheduleJobs, platform_failed, platform_failure_reason
from aml_scheduler.planning import plan_chunks, plan_questions
from aml_scheduler.settings import SchedulerSettings

JOB = "job-1"
VERSION = "ver-1"
# What the gateway's submission wrote on the job (the scheduler reads it through its model).
SUBMITTED: dict[str, Any] = {
    "team_id": "team-1", "mode": "smoke", "track": "textual", "run_label": "r1",
    "datasets": ["synthetic"], "created_at": datetime(2026, 1, 1, tzinfo=UTC),
}  # fmt: skip


@dataclass(frozen=True)
class Sent:
    subject: str
    msg_id: str
    body: Document
    # What the stores held when the message went out (checked after the run).
    seen: Document = field(default_factory=dict)


@dataclass
class Rig:
    stores: MemoryStores
    broker: NatsBroker
    scheduler: ScheduleJobs
    sent: list[Sent]

    def on(self, prefix: str) -> list[Sent]:
        return [s for s in self.sent if s.subject.startswith(prefix)]


def _stream(name: str) -> JStream:
    return JStream(name=name, declare=False)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """The scheduler with its event subscribers wired as in `aml_scheduler.main` (minus the
    delivery budget), and a recorder on the work and finished subjects."""
    stores = memory_stores()
    broker = NatsBroker(logger=None)
    settings = SchedulerSettings()
    # The participant client and the secrets serve planning only, which these tests skip.
    unused = cast(Any, None)
    scheduler = ScheduleJobs(
        settings,
        stores.typed(),
        TestBrokerBus(broker),
        unused,
        unused,
        build_evaluation_spec(settings),
        "c",
    )
    sent: list[Sent] = []

    def snapshot(body: Document) -> Document:
        if "request_id" in body:
            chunk = stores.plans.chunks[body["request_id"]]
            mine = [c for c in stores.plans.chunks.values() if c["user_id"] == chunk["user_id"]]
            return {"seq": chunk["seq"], "states": {c["seq"]: c["state"] for c in mine}}
        if "item_id" in body:
            user = stores.plans.questions[body["item_id"]]["user_id"]
            mine = [c for c in stores.plans.chunks.values() if c["user_id"] == user]
            marker = stores.plans.releases.get(f"{JOB}/{user}")
            return {"add_states": {c["state"] for c in mine}, "marker": marker}
        return {}

    @broker.subscriber("aml.work.>", stream=_stream(subjects.WORK_STREAM))
    async def work(body: Document, msg: NatsMessage) -> None:
        sent.append(Sent(msg.raw_message.subject, msg.headers["Nats-Msg-Id"], body, snapshot(body)))

    @broker.subscriber(subjects.JOB_FINISHED, stream=_stream(subjects.FINISHED_STREAM))
    async def finished(body: Document, msg: NatsMessage) -> None:
        sent.append(Sent(msg.raw_message.subject, msg.headers["Nats-Msg-Id"], body))

    @broker.subscriber(subjects.ADD_DONE, stream=_stream(subjects.EVENTS_STREAM))
    async def on_add_done(event: AddDone) -> None:
        await scheduler.on_add_done(event)

    @broker.subscriber(subjects.QUESTION_DONE, stream=_stream(subjects.EVENTS_STREAM))
    async def on_question_done(event: QuestionDone) -> None:
        await scheduler.on_question_done(event)

    @broker.subscriber(subjects.SEARCH_DONE, stream=_stream(subjects.EVENTS_STREAM))
    async def on_search_done(event: SearchDone) -> None:
        await scheduler.on_search_done(event)

    async with TestNatsBroker(broker):
        yield Rig(stores, broker, scheduler, sent)


@pytest.fixture(scope="module")
def plan() -> tuple[list[Document], list[Document]]:
    dataset = load_dataset("synthetic", Path("/nonexistent"))
    chunks, questions = plan_chunks(JOB, dataset), plan_questions(JOB, dataset, top_k=10)
    return [c.stored() for c in chunks], [q.stored() for q in questions]


def planned(stores: MemoryStores, plan: tuple[list[Document], list[Document]], state: str) -> None:
    chunks, questions = plan
    # Stored last-seq-first, so a release that took the first pending chunk it finds, rather
    # than the lowest `seq`, would send a user's Adds out of order.
    for chunk in sorted(chunks, key=lambda c: -int(c["seq"])):
        stores.plans.chunks[chunk["_id"]] = dict(chunk)
    for question in questions:
        stores.plans.questions[question["_id"]] = dict(question)
    stores.jobs.jobs[JOB] = {
        "_id": JOB,
        **SUBMITTED,
        "state": state,
        "planned": True,
        "version_id": VERSION,
        "users": sorted({c["user_id"] for c in chunks}),
        "totals": {"add": len(chunks), "questions": len(questions)},
    }


def first_chunks(chunks: list[Document]) -> set[str]:
    return {c["_id"] for c in chunks if c["seq"] == 1}


async def test_adds_go_out_one_per_user_in_seq_order_then_that_users_questions(
    rig: Rig, plan: tuple[list[Document], list[Document]]
) -> None:
    chunks, questions = plan
    planned(rig.stores, plan, "running")
    await rig.scheduler.release(JOB)
    assert {s.body["request_id"] for s in rig.on(subjects.WORK_ADD)} == first_chunks(chunks)
    assert not rig.on(subjects.WORK_SEARCH)

    # Acting as the adder: confirm the oldest Add still outstanding, announce it on the event
    # subject the scheduler consumes, until nothing is left to confirm.
    confirmed: list[str] = []
    while pending := [
        s.body["request_id"]
        for s in rig.on(subjects.WORK_ADD)
        if s.body["request_id"] not in confirmed
    ]:
        request_id = pending[0]
        rig.stores.plans.chunks[request_id]["state"] = "done"
        confirmed.append(request_id)
        event = AddDone(job_id=JOB, request_id=request_id, outcome="done")
        await publish(
            TestBrokerBus(rig.broker), subjects.ADD_DONE, event, message_id("add-done", request_id)
        )

    adds = rig.on(subjects.WORK_ADD)
    assert sorted(s.body["request_id"] for s in adds) == sorted(c["_id"] for c in chunks)
    for add in adds:
        seq, states = add.seen["seq"], add.seen["states"]
        # Everything before it confirmed, itself and everything after still unsent.
        assert all(state == "done" for s, state in states.items() if s < seq), add
        assert all(state == "pending" for s, state in states.items() if s >= seq), add
        assert add.subject == subjects.work_subject("add", VERSION, JOB)
        assert add.msg_id == message_id(subjects.WORK_ADD, add.body["request_id"])

    searches = rig.on(subjects.WORK_SEARCH)
    assert sorted(s.body["item_id"] for s in searches) == sorted(q["_id"] for q in questions)
    for search in searches:
        assert search.seen == {"add_states": {"done"}, "marker": None}
        assert (
            search.body["search_body"]
            == rig.stores.plans.questions[search.body["item_id"]]["search_body"].decode()
        )
    users = {c["user_id"] for c in chunks}
    assert set(rig.stores.plans.releases) == {f"{JOB}/{user}" for user in users}

    # A redelivered AddDone and the reconciliation's release send nothing again.
    before = len(rig.sent)
    last = AddDone(job_id=JOB, request_id=confirmed[-1], outcome="done")
    await publish(TestBrokerBus(rig.broker), subjects.ADD_DONE, last, "add-done:again")
    await rig.scheduler.release(JOB)
    assert len(rig.sent) == before


async def test_users_progress_independently(
    rig: Rig, plan: tuple[list[Document], list[Document]]
) -> None:
    chunks, questions = plan
    planned(rig.stores, plan, "running")
    users = sorted({c["user_id"] for c in chunks})
    ready, failed, *waiting = users
    for chunk in rig.stores.plans.chunks.values():
        if chunk["user_id"] == ready:
            chunk["state"] = "done"
        elif chunk["user_id"] == failed and chunk["seq"] == 1:
            chunk["state"] = "failed"

    await rig.scheduler.release(JOB)
    searched = {
        rig.stores.plans.questions[s.body["item_id"]]["user_id"]
        for s in rig.sent
        if "item_id" in s.body
    }
    assert searched == {ready}
    assert len(rig.on(subjects.WORK_SEARCH)) == sum(q["user_id"] == ready for q in questions)
    # A user whose Add failed gets neither its next Add nor its questions (its job is failed
    # by the AddDone that reported it); the others are not held back.
    assert {s.body["request_id"] for s in rig.on(subjects.WORK_ADD)} == {
        c["_id"] for c in chunks if c["user_id"] in waiting and c["seq"] == 1
    }


async def test_a_repeated_release_reuses_each_message_id(
    rig: Rig, plan: tuple[list[Document], list[Document]]
) -> None:
    planned(rig.stores, plan, "running")
    await rig.scheduler.release(JOB)
    await rig.scheduler.release(JOB)
    adds = rig.on(subjects.WORK_ADD)
    # Sent twice (this broker does not de-duplicate), under one id each: JetStream keeps one.
    assert len(adds) == 2 * len(first_chunks(plan[0]))
    assert len({s.msg_id for s in adds}) == len(first_chunks(plan[0]))


async def test_a_released_users_questions_are_not_sent_again(
    rig: Rig, plan: tuple[list[Document], list[Document]]
) -> None:
    chunks, _ = plan
    planned(rig.stores, plan, "running")
    for chunk in rig.stores.plans.chunks.values():
        chunk["state"] = "done"
    released = sorted({c["user_id"] for c in chunks})[0]
    rig.stores.plans.releases[f"{JOB}/{released}"] = {"_id": f"{JOB}/{released}"}
    await rig.scheduler.release(JOB)
    users = {
        rig.stores.plans.questions[s.body["item_id"]]["user_id"]
        for s in rig.on(subjects.WORK_SEARCH)
    }
    assert users == {c["user_id"] for c in chunks} - {released}


async def test_the_re_drive_skips_users_it_released_without_a_read(
    rig: Rig, plan: tuple[list[Document], list[Document]], monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks, _ = plan
    planned(rig.stores, plan, "running")
    for chunk in rig.stores.plans.chunks.values():
        chunk["state"] = "done"
    await rig.scheduler.release(JOB)
    sent = len(rig.on(subjects.WORK_SEARCH))
    assert sent > 0

    async def no_read(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a released user's chunks or marker were read again")

    # Every read of one chunk, and of a release marker.
    for read in ("chunk", "chain_chunk", "announced_chunk", "released"):
        monkeypatch.setattr(rig.stores.plans, read, no_read)
    await rig.scheduler.release(JOB)
    for user in {c["user_id"] for c in chunks}:
        await rig.scheduler.release(JOB, user)
    assert len(rig.on(subjects.WORK_SEARCH)) == sent


@pytest.mark.parametrize("state", ["queued", "completed", "failed"])
async def test_nothing_is_released_for_a_job_that_is_not_running(
    rig: Rig, plan: tuple[list[Document], list[Document]], state: str
) -> None:
    planned(rig.stores, plan, state)
    await rig.scheduler.release(JOB)
    for chunk in rig.stores.plans.chunks.values():
        chunk["state"] = "done"
    await rig.scheduler.release(JOB)
    assert rig.sent == []
    assert rig.stores.plans.releases == {}


# -- completion -----------------------------------------------------------------------------

QUESTIONS = 3


def finishing_job(stores: MemoryStores, final: int, state: str = "running") -> None:
    """A planned job of two Adds and `QUESTIONS` questions, `final` of them scored, with its
    counters as the stage workers leave them."""
    stores.jobs.jobs[JOB] = {
        "_id": JOB,
        **SUBMITTED,
        "state": state,
        "planned": state != "queued",
        "version_id": VERSION,
        "totals": {"add": 2, "questions": QUESTIONS},
        "progress": {"add": {"done": 2}, "questions_final": final, "events": 2 + 3 * final},
    }
    if final:
        stores.jobs.jobs[JOB]["progress"] |= {
            s: {"done": final} for s in ("search", "answer", "score")
        }
    for i in range(2):
        stores.plans.chunks[f"a{i}"] = {"_id": f"a{i}", "job_id": JOB, "state": "done"}
    for i in range(QUESTIONS):
        item = f"{JOB}/synthetic/q{i}"
        stores.plans.questions[item] = {
            "_id": item,
            "job_id": JOB,
            "dataset_id": "synthetic",
            "category_name": "facts",
            "question_id": f"q{i}",
        }
        if i < final:
            score(stores, item)


def score(stores: MemoryStores, item: str) -> None:
    for records in (stores.records.searches, stores.records.answers):
        records[item] = {"_id": item, "job_id": JOB, "state": "done"}
    stores.records.scores[item] = {
        "_id": item,
        "job_id": JOB,
        "state": "done",
        "category_name": "facts",
        "judge_label": "CORRECT",
        "judge_labels": ["CORRECT"],
        "f1": 1.0,
        "bleu1": 1.0,
    }


async def question_done(rig: Rig, item: str) -> None:
    """The announcement of the stage worker that made `item` final."""
    event = QuestionDone(job_id=JOB, item_id=item, stage="score", outcome="done")
    await publish(
        TestBrokerBus(rig.broker), subjects.QUESTION_DONE, event, message_id("question-done", item)
    )


async def test_a_job_completes_only_when_every_question_is_final(rig: Rig) -> None:
    finishing_job(rig.stores, final=QUESTIONS - 1)
    await question_done(rig, f"{JOB}/synthetic/q1")
    job = rig.stores.jobs.jobs[JOB]
    assert job["state"] == "running" and "results" not in job
    assert rig.on(subjects.JOB_FINISHED) == []

    # The last score is stored and counted by its writer, which announces it.
    score(rig.stores, f"{JOB}/synthetic/q2")
    progress = rig.stores.jobs.jobs[JOB]["progress"]
    for stage in ("search", "answer", "score"):
        progress[stage]["done"] += 1
    progress["questions_final"] += 1
    await question_done(rig, f"{JOB}/synthetic/q2")
    job = rig.stores.jobs.jobs[JOB]
    assert job["state"] == "completed"
    assert job["results"]["overall"]["judge_accuracy"] == 1.0
    assert job["results"]["datasets"]["synthetic"]["categories"]["facts"]["questions"] == QUESTIONS
    assert [(s.body, s.msg_id) for s in rig.on(subjects.JOB_FINISHED)] == [
        ({"job_id": JOB, "state": "completed"}, message_id("finished", JOB))
    ]


@pytest.mark.parametrize("state", ["failed", "completed", "queued"])
async def test_a_job_no_longer_running_is_left_alone(rig: Rig, state: str) -> None:
    finishing_job(rig.stores, final=QUESTIONS, state=state)
    before = copy.deepcopy(rig.stores.jobs.jobs[JOB])
    await question_done(rig, f"{JOB}/synthetic/q0")
    await rig.scheduler.complete_if_done(JOB)
    assert rig.stores.jobs.jobs[JOB] == before
    assert rig.sent == []


async def test_completion_is_stored_and_announced_once(rig: Rig) -> None:
    finishing_job(rig.stores, final=QUESTIONS)
    # Two replicas (or the event and the reconciliation) at once: both find the job running.
    await asyncio.gather(rig.scheduler.complete_if_done(JOB), rig.scheduler.complete_if_done(JOB))
    stored = dict(rig.stores.jobs.jobs[JOB])
    assert stored["state"] == "completed"
    # ... and a redelivered event afterwards.
    await question_done(rig, f"{JOB}/synthetic/q2")
    assert rig.stores.jobs.jobs[JOB]["finished_at"] == stored["finished_at"]
    assert len(rig.on(subjects.JOB_FINISHED)) == 1


async def test_a_completion_records_the_questions_the_platform_failed(rig: Rig) -> None:
    """The answer model was down for one question: the job completes with its results, and
    records the platform's failure, so the run is shown as not publishable and not charged."""
    finishing_job(rig.stores, final=QUESTIONS - 1)
    down = f"{JOB}/synthetic/q2"
    rig.stores.records.searches[down] = {"_id": down, "job_id": JOB, "state": "done"}
    rig.stores.records.answers[down] = {"_id": down, "job_id": JOB, "state": "failed",
        "failure_kind": "platform_error", "failure": "the answer model did not answer"}  # fmt: skip
    rig.stores.jobs.jobs[JOB]["progress"]["questions_final"] += 1
    await rig.scheduler.complete_if_done(JOB)
    job = rig.stores.jobs.jobs[JOB]
    assert job["state"] == "completed"
    assert job["results"]["overall"]["failures"] == {"platform_error": 1}
    assert job["platform_failures"] == 1
    assert job["platform_failure_reason"] == "1 question failed by the platform (platform_error)"


async def test_a_clean_completion_records_no_platform_failure(rig: Rig) -> None:
    finishing_job(rig.stores, final=QUESTIONS)
    await rig.scheduler.complete_if_done(JOB)
    job = rig.stores.jobs.jobs[JOB]
    assert job["state"] == "completed" and job["platform_failures"] == 0
    assert "platform_failure_reason" not in job


async def test_a_completion_stores_what_the_results_cost_beside_them(rig: Rig) -> None:
    """The efficiency figures from the job's audit, answers and scores, with what they were
    measured under; the results' fingerprinted part (`datasets`) is as without them."""
    stores = rig.stores
    finishing_job(stores, final=QUESTIONS)
    stores.jobs.jobs[JOB]["top_k"] = 10
    stores.accounts.versions[VERSION] = {
        "_id": VERSION, "capacity": {"max_concurrency": 3, "max_rps": 7.5}
    }  # fmt: skip

    async def call(item: str, n: int, operation: str, latency: float, status: int) -> None:
        await stores.audit.record_attempt(
            {"job_id": JOB, "item_id": item, "delivery": 1, "operation": operation,
             "attempt": n, "latency_ms": latency, "status": status,
             "outcome": "ok" if status == 200 else "retry", "error_class": None}
        )  # fmt: skip

    await call("a0", 1, "add", 40.0, 200)
    await call("a1", 1, "add", 60.0, 200)
    for i in range(QUESTIONS):
        item = f"{JOB}/synthetic/q{i}"
        if i == 0:
            await call(item, 1, "search", 5.0, 429)
        await call(item, 1 + (i == 0), "search", 100.0 * (i + 1), 200)
        stores.records.answers[item] |= {
            "candidates_returned": 4, "candidates_used": 2, "retrieved_tokens": 80,
            "retrieved_bytes": 400, "used_tokens": 30, "tokens_in": 250, "tokens_out": 6,
        }  # fmt: skip
        stores.records.scores[item] |= {"judge_tokens_in": 120, "judge_tokens_out": 3}

    await rig.scheduler.complete_if_done(JOB)
    results = rig.stores.jobs.jobs[JOB]["results"]
    figures = results["efficiency"]
    assert figures["method"] == "efficiency-v1"
    assert figures["measured_under"] == {
        "search_top_k": {"synthetic": 10}, "max_concurrency": 3, "max_rps": 7.5,
        "deployment": "embedded",
    }  # fmt: skip
    overall = figures["overall"]
    assert overall["add"]["items"] == 2 and overall["add"]["first_attempts"]["max_ms"] == 60.0
    search = overall["search"]
    assert (search["items"], search["attempts"], search["rate_limited"]) == (3, 4, 1)
    assert search["first_attempts"]["count"] == 2 and search["retried"]["count"] == 2
    assert overall["context"]["truncated_questions"] == 3
    assert overall["context"]["retrieved_tokens_mean"] == 80.0
    assert overall["llm"] == {
        "questions": 3, "answer_tokens_in_mean": 250.0, "answer_tokens_out_mean": 6.0,
        "judge_tokens_in_mean": 120.0, "judge_tokens_out_mean": 3.0,
    }  # fmt: skip
    facts = figures["datasets"]["synthetic"]["categories"]["facts"]
    assert facts["add"] is None and facts["search"]["items"] == 3
    # What the fingerprint is over is what the aggregation alone gives.
    assert "efficiency" not in results["datasets"]["synthetic"]


@pytest.mark.parametrize("mode", ["full", "smoke"])
async def test_a_full_run_keeps_its_questions_headline_values(rig: Rig, mode: str) -> None:
    """What the board's ties compare (aml_gateway.ties): each question counted in Overall with
    its value in Overall's headline, their mean Overall's figure. A smoke run is never
    published, so it keeps none."""
    finishing_job(rig.stores, final=QUESTIONS - 1)
    rig.stores.jobs.jobs[JOB]["mode"] = mode
    wrong = f"{JOB}/synthetic/q1"
    rig.stores.records.scores[wrong] |= {"judge_label": "WRONG", "judge_labels": ["WRONG"]}
    failed = f"{JOB}/synthetic/q2"
    rig.stores.records.searches[failed] = {"_id": failed, "job_id": JOB, "state": "failed",
        "failure_kind": "contract_error", "failure": "not JSON"}  # fmt: skip
    rig.stores.jobs.jobs[JOB]["progress"]["questions_final"] += 1
    await rig.scheduler.complete_if_done(JOB)
    job = rig.stores.jobs.jobs[JOB]
    assert job["state"] == "completed"
    kept = await rig.stores.leaderboard.headline_outcomes_of(JOB)
    if mode == "smoke":
        assert kept is None
        return
    assert kept is not None
    # The failed question is outside the headline, as in the results.
    assert (kept.headline, kept.values) == ("accuracy", {"synthetic/q0": 1.0, "synthetic/q1": 0.0})
    assert job["results"]["overall"]["accuracy"] == sum(kept.values.values()) / len(kept.values)


def test_platform_failures_in_words() -> None:
    outcomes = [
        QuestionOutcome(dataset_id="d", category_name="c", scored=False, failure_kind=kind)
        for kind in ("platform_error", "participant_outage", "platform_error", None)
    ] + [QuestionOutcome(dataset_id="d", category_name="c", scored=True, judge_label="WRONG")]
    # A question failed with no kind recorded is not assumed to be the platform's here: the
    # scheduler's `question_outcome` already names a missing record `platform_error`.
    assert platform_failed(outcomes) == 2
    assert platform_failure_reason(0) is None
    assert platform_failure_reason(3) == "3 questions failed by the platform (platform_error)"
    assert platform_failure_reason(1, adds=2) == (
        "2 Add requests and 1 question failed by the platform (platform_error)"
    )


# -- streaming datasets: a user's next Add waits for the searches asked before it --------------

STREAMING = Path(__file__).parents[1] / "data" / "streaming" / "streaming_v1.json"


@pytest.fixture(scope="module")
def streaming_plan() -> tuple[list[Document], list[Document]]:
    dataset = parse_locomo(json.loads(STREAMING.read_text(encoding="utf-8")), "streaming", "v1")
    chunks, questions = plan_chunks(JOB, dataset), plan_questions(JOB, dataset, top_k=10)
    return [c.stored() for c in chunks], [q.stored() for q in questions]


async def _drive(rig: Rig, events: list[tuple[str, str]], fail: set[str]) -> None:
    """Act as the adder and the searcher until nothing is outstanding: confirm each Add sent,
    store each search sent (`failed` for those in `fail`), announcing what they announce, and
    record the order in `events`."""
    handled: set[str] = set()
    while True:
        outstanding = [s for s in rig.on("aml.work.") if s.msg_id not in handled]
        if not outstanding:
            return
        sent = outstanding[0]
        handled.add(sent.msg_id)
        if "request_id" in sent.body:
            request_id = sent.body["request_id"]
            events.append(("add", request_id))
            rig.stores.plans.chunks[request_id]["state"] = "done"
            event = AddDone(job_id=JOB, request_id=request_id, outcome="done")
            await publish(
                TestBrokerBus(rig.broker), subjects.ADD_DONE, event, f"add-done:{request_id}"
            )
            continue
        item_id = sent.body["item_id"]
        events.append(("search", item_id))
        state = "failed" if item_id in fail else "done"
        rig.stores.records.searches[item_id] = {"_id": item_id, "job_id": JOB, "state": state}
        if sent.body["holds_add"]:
            user = rig.stores.plans.questions[item_id]["user_id"]
            done = SearchDone(job_id=JOB, item_id=item_id, user_id=user)
            await publish(
                TestBrokerBus(rig.broker), subjects.SEARCH_DONE, done, f"search-done:{item_id}"
            )


def _position(events: list[tuple[str, str]], kind: str, suffix: str) -> int:
    (index,) = [i for i, (k, name) in enumerate(events) if k == kind and name.endswith(suffix)]
    return index


@pytest.mark.parametrize("fail", [set(), {f"{JOB}/streaming/str-1:q0000@2"}])
async def test_a_question_is_searched_at_each_point_before_any_later_add(
    rig: Rig, streaming_plan: tuple[list[Document], list[Document]], fail: set[str]
) -> None:
    chunks, questions = streaming_plan
    planned(rig.stores, streaming_plan, "running")
    await rig.scheduler.release(JOB)
    # str-2's question at point 0 goes out before its first Add, which is held back.
    first = {s.body.get("request_id") or s.body["item_id"] for s in rig.sent}
    assert first == {
        "eval:job-1:streaming:str-1:chunk-1", f"{JOB}/streaming/str-2:q0000@0"
    }  # fmt: skip
    events: list[tuple[str, str]] = []
    await _drive(rig, events, fail)

    assert sorted(name for _, name in events) == sorted(
        [c["_id"] for c in chunks] + [q["_id"] for q in questions]
    )
    assert len(events) == len(set(events))  # nothing sent twice
    add = {seq: _position(events, "add", f"str-1:chunk-{seq}") for seq in (1, 2, 3, 4)}
    at_2 = _position(events, "search", "str-1:q0000@2")
    at_6 = _position(events, "search", "str-1:q0000@6")
    # The question at 2 turns: after Add 1 (turns 1-2), before Add 2; at 6: after Add 3.
    assert add[1] < at_2 < add[2] < add[3] < at_6 < add[4]
    # The questions asked at the end, or without points, only after the last Add.
    for suffix in ("str-1:q0001", "str-1:q0002@8"):
        assert _position(events, "search", suffix) > add[4]
    assert (
        _position(events, "search", "str-2:q0000@0")
        < _position(events, "add", "str-2:chunk-1")
        < _position(events, "search", "str-2:q0000@3")
    )
    # Only the searches that hold an Add back are announced.
    held = {s.body["item_id"] for s in rig.on(subjects.WORK_SEARCH) if s.body["holds_add"]}
    assert held == {q["_id"] for q in questions if "holds_add" in q}
    users = {c["user_id"] for c in chunks}
    assert set(rig.stores.plans.releases) == {f"{JOB}/{u}" for u in users} | {
        f"{JOB}/eval:job-1:streaming:str-1@1",
        f"{JOB}/eval:job-1:streaming:str-1@3",
        f"{JOB}/eval:job-1:streaming:str-2@0",
    }

    # Redelivered announcements and the reconciliation's release send nothing again.
    before = len(rig.sent)
    for item_id in held:
        done = SearchDone(
            job_id=JOB, item_id=item_id, user_id=rig.stores.plans.questions[item_id]["user_id"]
        )
        await publish(TestBrokerBus(rig.broker), subjects.SEARCH_DONE, done, f"again:{item_id}")
    await rig.scheduler.release(JOB)
    assert len(rig.sent) == before


async def test_a_lost_search_announcement_is_made_up_by_the_re_drive(
    rig: Rig, streaming_plan: tuple[list[Document], list[Document]]
) -> None:
    planned(rig.stores, streaming_plan, "running")
    await rig.scheduler.release(JOB)
    held = f"{JOB}/streaming/str-2:q0000@0"
    assert [s.body["item_id"] for s in rig.on(subjects.WORK_SEARCH)] == [held]
    # Searched, but its announcement never arrives; a release finds the search final.
    rig.stores.records.searches[held] = {"_id": held, "job_id": JOB, "state": "done"}
    await rig.scheduler.release(JOB)
    assert "eval:job-1:streaming:str-2:chunk-1" in {
        s.body["request_id"] for s in rig.on(subjects.WORK_ADD)
    }
    # Released once: its marker was written with the first release.
    assert [s.body["item_id"] for s in rig.on(subjects.WORK_SEARCH)] == [held]


async def test_an_add_stays_held_while_a_search_before_it_is_open(
    rig: Rig, streaming_plan: tuple[list[Document], list[Document]]
) -> None:
    planned(rig.stores, streaming_plan, "running")
    await rig.scheduler.release(JOB)
    for _ in range(3):
        await rig.scheduler.release(JOB)
    assert "eval:job-1:streaming:str-2:chunk-1" not in {
        s.body["request_id"] for s in rig.on(subjects.WORK_ADD)
    }


async def test_users_write_in_a_window_longest_first_and_questions_flow_early(
    rig: Rig, datasets_root: Path
) -> None:
    """LoCoMo-10 (ten conversations) for a version declaring 2 at once: three users write at a
    time, longest conversation first; a user's questions go out as soon as its own Adds are
    written, and the next user starts then, so the first questions flow long before the last
    Add while every Add still follows its predecessor."""
    dataset = load_dataset("locomo", datasets_root)
    chunks = [c.stored() for c in plan_chunks(JOB, dataset)]
    questions = [q.stored() for q in plan_questions(JOB, dataset, top_k=10)]
    planned(rig.stores, (chunks, questions), "running")
    rig.stores.accounts.versions[VERSION] = {
        "_id": VERSION, "capacity": {"max_concurrency": 2, "max_rps": 10.0}
    }  # fmt: skip
    order = add_order(c["user_id"] for c in chunks)
    rig.stores.jobs.jobs[JOB]["users"] = order
    await rig.scheduler.release(JOB)
    assert [s.body["request_id"] for s in rig.on(subjects.WORK_ADD)] == [
        user_chunk_id(user, 1) for user in order[:3]
    ]

    # Acting as the adder, always confirming the Add released earliest.
    confirmed: set[str] = set()
    writing_at_most = 0
    first_question_at = None
    while pending := [
        s.body["request_id"]
        for s in rig.on(subjects.WORK_ADD)
        if s.body["request_id"] not in confirmed
    ]:
        writing_at_most = max(writing_at_most, len(pending))
        request_id = pending[0]
        rig.stores.plans.chunks[request_id]["state"] = "done"
        confirmed.add(request_id)
        if first_question_at is None and rig.on(subjects.WORK_SEARCH):
            first_question_at = len(confirmed)
        await rig.scheduler.on_add_done(AddDone(job_id=JOB, request_id=request_id, outcome="done"))

    assert writing_at_most == 3
    assert confirmed == {c["_id"] for c in chunks}
    for add in rig.on(subjects.WORK_ADD):
        assert all(
            state == "done" for s, state in add.seen["states"].items() if s < add.seen["seq"]
        )
    assert sorted(s.body["item_id"] for s in rig.on(subjects.WORK_SEARCH)) == sorted(
        q["_id"] for q in questions
    )
    # Users finish in the job's order, and the first questions leave with half of the Adds
    # written at most (the window's three longest conversations: 137 of 399; all ten users at
    # once, the first would wait for some 300).
    finished = [
        rig.stores.plans.questions[s.body["item_id"]]["user_id"]
        for s in rig.on(subjects.WORK_SEARCH)
    ]
    assert list(dict.fromkeys(finished))[:3] == sorted(order[:3], key=order.index)
    assert first_question_at is not None and first_question_at <= len(chunks) / 2
