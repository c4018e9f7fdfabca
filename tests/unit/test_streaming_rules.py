"""Streaming datasets (R-4.5, R-4.7): a question asked at several points of its conversation.
The chunker ends an Add at every point, the plan makes one item per (question, point) and
records which Add each search holds back, and the results split a dataset's overall by point."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from fake_stores import memory_stores
from fakes import TestBrokerBus
from faststream.nats import JStream, NatsBroker, NatsMessage, TestNatsBroker

from aml_contract import subjects
from aml_contract.messages import QuestionFacts, QuestionWork
from aml_contract.participant import Message
from aml_evaluation.aggregate import QuestionOutcome, aggregate, results_fingerprint
from aml_evaluation.chunker import cut_at_points, plan_adds
from aml_evaluation.datasets import Dataset, parse_locomo
from aml_pipeline.question_stage import QuestionStageWorker
from aml_runtime.settings import CommonSettings
from aml_scheduler.planning import plan_chunks, plan_questions
from aml_scheduler.watchdog import diagnose

DATA = Path(__file__).parents[1] / "data" / "streaming" / "streaming_v1.json"
JOB = "job-s"
Document = dict[str, Any]


def _samples() -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = json.loads(DATA.read_text(encoding="utf-8"))
    return samples


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return parse_locomo(_samples(), "streaming", "v1")


def _without_points(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for sample in samples:
        for item in sample["qa"]:
            item.pop("asked_at", None)
    return samples


# -- parsing -----------------------------------------------------------------------------------


def test_points_are_read_and_a_dataset_with_any_is_streaming(dataset: Dataset) -> None:
    assert [q.asked_at for q in dataset.questions] == [(2, 6), (), (8,), (0, 3)]
    assert dataset.streaming
    assert dataset.asked_points() == {"str-1": (2, 6, 8), "str-2": (0, 3)}
    plain = parse_locomo(_without_points(_samples()), "plain", "v1")
    assert not plain.streaming and plain.asked_points() == {}


@pytest.mark.parametrize(
    ("asked_at", "message"),
    [
        ([6, 2], r"must be increasing"),
        ([2, 2], r"must be increasing"),
        ([-1], r"must be increasing turn counts from 0"),
        ([9], r"asked_at 9 is past its conversation's 8 turns"),
        (["2"], r"asked_at must be a list of integers"),
        (3, r"asked_at must be a list of integers"),
    ],
)
def test_bad_points_are_refused_naming_the_question(asked_at: object, message: str) -> None:
    samples = _samples()
    samples[0]["qa"][0]["asked_at"] = asked_at
    with pytest.raises(ValueError, match=message):
        parse_locomo(samples, "streaming", "v1")


# -- chunking ----------------------------------------------------------------------------------


def _messages(count: int) -> list[Message]:
    return [Message(role="user", content=f"m{index}") for index in range(count)]


def test_a_chunk_is_cut_at_every_point_inside_it() -> None:
    chunks = [_messages(5), _messages(3)]
    # Two turns precede the session: points 4 and 9 fall inside its two chunks, 2 and 7 on
    # their boundaries (nothing to cut), 20 after them.
    cut = cut_at_points(chunks, 2, [2, 4, 7, 9, 20])
    assert [len(chunk) for chunk in cut] == [2, 3, 2, 1]
    assert [m.content for chunk in cut for m in chunk] == [
        m.content for chunk in chunks for m in chunk
    ]
    assert cut_at_points(chunks, 2, []) == chunks


def test_an_add_ends_at_every_point_and_only_there(dataset: Dataset) -> None:
    adds = plan_adds(dataset, JOB)
    plan = [(a.conversation_id, a.seq, a.session_id[-9:], len(a.request.messages)) for a in adds]
    # str-1's points 2 and 6 split each of its two 4-turn sessions; 8 is its end. str-2's 0
    # and 3 are its start and end: its one session is one Add.
    assert plan == [
        ("str-1", 1, "session_1", 2),
        ("str-1", 2, "session_1", 2),
        ("str-1", 3, "session_2", 2),
        ("str-1", 4, "session_2", 2),
        ("str-2", 1, "session_1", 3),
    ]
    plain = plan_adds(parse_locomo(_without_points(_samples()), "streaming", "v1"), JOB)
    assert [len(a.request.messages) for a in plain] == [4, 4, 3]
    # The same turns in the same order, only cut differently.
    assert [m for a in adds for m in a.request.messages] == [
        m for a in plain for m in a.request.messages
    ]


# -- planning ----------------------------------------------------------------------------------


def test_one_item_per_question_and_point(dataset: Dataset) -> None:
    items = {q.id: q for q in plan_questions(JOB, dataset, top_k=10)}
    prefix = f"{JOB}/streaming/"
    assert sorted(items) == sorted(
        prefix + name
        for name in ("str-1:q0000@2", "str-1:q0000@6", "str-1:q0001", "str-1:q0002@8",
                     "str-2:q0000@0", "str-2:q0000@3")
    )  # fmt: skip
    fields = {
        name: (q.point, q.point_index, q.after_seq, q.holds_add)
        for name, q in ((i.removeprefix(prefix), q) for i, q in items.items())
    }
    assert fields == {
        "str-1:q0000@2": (2, 1, 1, 2),
        "str-1:q0000@6": (6, 2, 3, 4),
        "str-1:q0001": (None, None, None, None),
        "str-1:q0002@8": (8, 1, 4, None),
        "str-2:q0000@0": (0, 1, 0, 1),
        "str-2:q0000@3": (3, 2, 1, None),
    }
    first, second = items[prefix + "str-1:q0000@2"], items[prefix + "str-1:q0000@6"]
    # The same question, the same Search bytes: only the memory differs between the points.
    assert first.question_id == second.question_id == "str-1:q0000"
    assert first.search_body == second.search_body
    assert first.trace_id != second.trace_id
    # A question without points is stored as in any other dataset.
    assert set(items[prefix + "str-1:q0001"].stored()) == {
        "_id", "job_id", "dataset_id", "question_id", "conversation_id", "user_id", "question",
        "category", "category_name", "gold_answer", "options", "f1_variant", "search_body",
        "trace_id", "evidence_rule", "evidence_markers",
    }  # fmt: skip


def test_each_add_names_the_searches_held_before_it(dataset: Dataset) -> None:
    held = {(c.conversation_id, c.seq): c.searched_before for c in plan_chunks(JOB, dataset)}
    prefix = f"{JOB}/streaming/"
    assert held == {
        ("str-1", 1): None,
        ("str-1", 2): [prefix + "str-1:q0000@2"],
        ("str-1", 3): None,
        ("str-1", 4): [prefix + "str-1:q0000@6"],
        ("str-2", 1): [prefix + "str-2:q0000@0"],
    }


def test_a_dataset_without_points_plans_as_before(dataset: Dataset) -> None:
    plain = parse_locomo(_without_points(_samples()), "streaming", "v1")
    chunks = plan_chunks(JOB, plain)
    assert all("searched_before" not in c.stored() for c in chunks)
    questions = plan_questions(JOB, plain, top_k=10)
    assert [q.id.rsplit("/", 1)[1] for q in questions] == [
        "str-1:q0000", "str-1:q0001", "str-1:q0002", "str-2:q0000"
    ]  # fmt: skip
    assert all(q.point is None and "point" not in q.stored() for q in questions)


# -- aggregation -------------------------------------------------------------------------------


def _outcome(point: int | None, label: str | None, category: str = "single-hop") -> QuestionOutcome:
    if label is None:
        return QuestionOutcome(
            dataset_id="streaming", category_name=category, scored=False,
            failure_kind="participant_outage", point_index=point,
        )  # fmt: skip
    return QuestionOutcome(
        dataset_id="streaming", category_name=category, scored=True, judge_label=label,
        judge_labels=[label], f1=1.0 if label == "CORRECT" else 0.0, point_index=point,
    )  # fmt: skip


def test_results_split_a_streaming_dataset_by_point() -> None:
    outcomes = [
        _outcome(1, "WRONG"),
        _outcome(1, "WRONG"),
        _outcome(1, None),
        _outcome(2, "CORRECT"),
        _outcome(2, "WRONG"),
        _outcome(None, "CORRECT"),  # a question of the dataset without points
        _outcome(1, "CORRECT", category="adversarial"),  # excluded from the overall
    ]
    results = aggregate(JOB, "completed", outcomes, {"streaming": ["adversarial"]})
    dataset = results.datasets["streaming"]
    assert dataset.points is not None and sorted(dataset.points) == ["1", "2"]
    first, second = dataset.points["1"], dataset.points["2"]
    assert (first.questions, first.scored, first.failed, first.judge_correct) == (3, 2, 1, 0)
    assert first.failures == {"participant_outage": 1}
    assert (second.questions, second.judge_correct, second.accuracy) == (2, 1, 0.5)
    # Every item counts in its category and the overall, whatever its point.
    assert dataset.categories["single-hop"].questions == 6
    assert dataset.overall.questions == 6 and dataset.overall.judge_correct == 2
    assert results.overall.questions == 6
    stored = results.model_dump(mode="json")["datasets"]["streaming"]
    assert stored["points"]["2"]["judge_correct"] == 1


def test_other_datasets_have_no_points_and_keep_their_fingerprint() -> None:
    outcomes = [_outcome(None, "CORRECT"), _outcome(None, "WRONG")]
    results = aggregate(JOB, "completed", outcomes, {})
    assert results.datasets["streaming"].points is None
    datasets = results.model_dump(mode="json")["datasets"]
    assert "points" not in datasets["streaming"]
    assert "points" not in json.loads(results.model_dump_json())["datasets"]["streaming"]
    # As stored before streaming existed: the same fingerprint.
    before = {k: v for k, v in datasets["streaming"].items() if k != "points"}
    assert results_fingerprint(datasets) == results_fingerprint({"streaming": before})
    streaming = aggregate(JOB, "completed", [_outcome(1, "CORRECT"), _outcome(1, "WRONG")], {})
    assert results_fingerprint(streaming.model_dump(mode="json")["datasets"]) != (
        results_fingerprint(datasets)
    )


# -- the search stage announces a search that holds an Add back -------------------------------


@pytest.mark.parametrize(
    ("holds_add", "state"), [(True, "done"), (True, "failed"), (False, "done")]
)
async def test_the_search_stage_announces_a_held_search_final(holds_add: bool, state: str) -> None:
    broker = NatsBroker(logger=None)
    announced: list[tuple[str, Document]] = []
    answers: list[Document] = []

    @broker.subscriber(subjects.SEARCH_DONE, stream=JStream(subjects.EVENTS_STREAM, declare=False))
    async def search_done(body: Document, msg: NatsMessage) -> None:
        announced.append((msg.headers["Nats-Msg-Id"], body))

    @broker.subscriber("aml.work.answer.>", stream=JStream(subjects.WORK_STREAM, declare=False))
    async def answer(body: Document) -> None:
        answers.append(body)

    facts = QuestionFacts(
        dataset_id="streaming", question_id="str-1:q0000", user_id="u-1", question="Where?",
        category=4, category_name="single-hop", gold_answer="At a bakery", f1_variant="f1",
    )  # fmt: skip
    item_id = f"{JOB}/streaming/str-1:q0000@2"
    work = QuestionWork(
        job_id=JOB, version_id="ver-1", item_id=item_id, facts=facts, holds_add=holds_add
    )
    unused = cast(Any, None)
    stage = QuestionStageWorker(
        "search", CommonSettings(), unused, broker, TestBrokerBus(broker), unused
    )
    async with TestNatsBroker(broker):
        await stage._hand_on(work, state, announce=False)
    expected = [(f"search-done:{item_id}", {"job_id": JOB, "item_id": item_id, "user_id": "u-1"})]
    assert announced == (expected if holds_add else [])
    # A done search goes on to the answer either way; a failed one ends there.
    assert len(answers) == (state == "done")


# -- the watchdog: a user waiting for its searches is held at search, not at add -----------------


async def test_a_job_whose_next_add_waits_for_a_search_is_stuck_at_search() -> None:
    stores = memory_stores()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    held = f"{JOB}/streaming/str-2:q0000@0"
    stores.jobs.jobs[JOB] = {
        "_id": JOB, "state": "running", "planned": True, "started_at": t0, "created_at": t0,
        "totals": {"add": 2, "questions": 3}, "progress": {"add": {"done": 1}},
    }  # fmt: skip
    chunks = [("u-1", 2, "pending", None), ("u-1", 1, "done", None), ("u-2", 1, "pending", [held])]
    for user, seq, state, searched_before in chunks:
        chunk = {"_id": f"{user}:{seq}", "job_id": JOB, "user_id": user, "seq": seq, "state": state}
        if searched_before:
            chunk["searched_before"] = searched_before
        stores.plans.chunks[f"{user}:{seq}"] = chunk
    stores.audit.calls["c1"] = {
        "_id": "c1", "job_id": JOB, "stage": "search", "operation": "search", "attempt": 1,
        "started_at": t0 + timedelta(seconds=5), "outcome": "retry", "status": 503,
    }  # fmt: skip
    later = t0 + timedelta(seconds=1000)

    stall = await diagnose(stores.typed(), stores.jobs.jobs[JOB], later, 600)
    assert stall is not None
    assert (stall.stage, stall.cause) == ("search", "participant")
    assert "1 of 2 Add requests final, held back by 1 searches not final" in stall.reason
    assert "last call search attempt 1 failed: 503" in stall.reason

    # Its search is final: the Adds themselves are what is stuck.
    stores.records.searches[held] = {"_id": held, "job_id": JOB, "state": "done"}
    stall = await diagnose(stores.typed(), stores.jobs.jobs[JOB], later, 600)
    assert stall is not None and stall.stage == "add"
