"""Work planning of the scheduler on the shipped synthetic dataset: ids, seq, bodies, and the
evaluation spec."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from aml_contract.participant import AddRequest, SearchRequest
from aml_evaluation.chunker import plan_adds
from aml_evaluation.datasets import Dataset, parse_locomo
from aml_evaluation.prompts import question_with_options
from aml_evaluation.registry import load_dataset
from aml_evaluation.scoring import parse_choice
from aml_runtime.documents import ScoreDocument, StageRecord
from aml_runtime.telemetry import item_trace, item_trace_hex
from aml_scheduler.handlers import question_outcome
from aml_scheduler.planning import (
    WrittenOwners,
    dataset_parts,
    plan_chunks,
    plan_part,
    plan_questions,
    plan_written_texts,
    question_item_id,
)
from aml_scorer.handlers import ScoreAnswer

JOB = "job-42"
CHUNK_ID = re.compile(rf"eval:{JOB}:synthetic:(?P<conv>[^:]+):chunk-(?P<n>\d+)")


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return load_dataset("synthetic", Path("/nonexistent"))


@pytest.fixture(scope="module")
def chunks(dataset: Dataset) -> list[dict[str, object]]:
    return [chunk.stored() for chunk in plan_chunks(JOB, dataset)]


@pytest.fixture(scope="module")
def questions(dataset: Dataset) -> list[dict[str, object]]:
    return [question.stored() for question in plan_questions(JOB, dataset, top_k=100)]


# --- chunks ---------------------------------------------------------------------------------


def test_chunk_ids_unique_and_well_formed(
    dataset: Dataset, chunks: list[dict[str, object]]
) -> None:
    assert chunks
    ids = [doc["_id"] for doc in chunks]
    assert len(set(ids)) == len(ids)
    conversations = {c.conversation_id for c in dataset.conversations}
    for doc in chunks:
        match = CHUNK_ID.fullmatch(str(doc["_id"]))
        assert match is not None, doc["_id"]
        assert match["conv"] == doc["conversation_id"]
        assert match["conv"] in conversations
        assert int(match["n"]) == doc["seq"]
        assert doc["job_id"] == JOB
        assert doc["dataset_id"] == "synthetic"
        assert doc["state"] == "pending"
    assert {doc["conversation_id"] for doc in chunks} == conversations


def test_chunk_seq_contiguous_per_user(chunks: list[dict[str, object]]) -> None:
    per_user: dict[str, list[int]] = defaultdict(list)
    for doc in chunks:
        per_user[str(doc["user_id"])].append(int(doc["seq"]))  # type: ignore[call-overload]
    for user_id, seqs in per_user.items():
        assert seqs == list(range(1, len(seqs) + 1)), user_id
        assert user_id.startswith(f"eval:{JOB}:synthetic:")


def test_chunk_body_decodes_to_the_planned_request(
    dataset: Dataset, chunks: list[dict[str, object]]
) -> None:
    planned = plan_adds(dataset, JOB)
    assert len(planned) == len(chunks)
    for doc, add in zip(chunks, planned, strict=True):
        body = doc["body"]
        assert isinstance(body, bytes)
        request = AddRequest.model_validate_json(body)
        assert request == add.request
        assert request.request_id == doc["_id"]
        assert request.user_id == doc["user_id"]
        assert request.session_id == doc["session_id"]
        assert len(request.messages) == doc["messages"]
        payload = json.loads(body)
        assert set(payload) == {"request_id", "messages", "user_id", "session_id"}


def test_chunk_planning_is_deterministic(dataset: Dataset, chunks: list[dict[str, object]]) -> None:
    assert [chunk.stored() for chunk in plan_chunks(JOB, dataset)] == chunks


def test_chunk_ids_differ_between_jobs(dataset: Dataset, chunks: list[dict[str, object]]) -> None:
    other = [chunk.stored() for chunk in plan_chunks("job-43", dataset)]
    assert not {d["_id"] for d in other} & {d["_id"] for d in chunks}
    assert not {d["user_id"] for d in other} & {d["user_id"] for d in chunks}


# --- questions ------------------------------------------------------------------------------


def test_questions_one_document_each(dataset: Dataset, questions: list[dict[str, object]]) -> None:
    assert len(questions) == len(dataset.questions)
    for doc, question in zip(questions, dataset.questions, strict=True):
        assert doc["_id"] == question_item_id(JOB, "synthetic", question.question_id)
        assert doc["question_id"] == question.question_id
        assert doc["gold_answer"] == question.answer
        assert doc["category_name"] == question.category_name
        assert doc["question"] == question.question
    # The adversarial questions go out without a gold: their trap answer is not the truth.
    adversarial = [doc for doc in questions if doc["category"] == 5]
    assert adversarial and all(doc["gold_answer"] is None for doc in adversarial)


def test_search_body_never_carries_the_gold_answer(
    dataset: Dataset, questions: list[dict[str, object]]
) -> None:
    for doc, question in zip(questions, dataset.questions, strict=True):
        body = doc["search_body"]
        assert isinstance(body, bytes)
        payload = json.loads(body)
        assert set(payload) <= {"query", "user_id", "top_k", "options"}
        assert "answer" not in payload and "gold_answer" not in payload
        assert payload["query"] == question.question
        assert payload["top_k"] == 100
        # Exactly the question, its scope and top_k: nothing else can hide in the bytes.
        expected = {"query": question.question, "user_id": doc["user_id"], "top_k": 100}
        assert (
            body
            == json.dumps(
                expected, sort_keys=True, separators=(",", ":"), ensure_ascii=False
            ).encode()
        )
        if question.answer and question.answer.lower() not in question.question.lower():
            assert question.answer.lower() not in payload["query"].lower(), question.question_id


def test_search_user_matches_the_conversations_chunks(
    chunks: list[dict[str, object]], questions: list[dict[str, object]]
) -> None:
    chunk_users = defaultdict(set)
    for doc in chunks:
        chunk_users[doc["conversation_id"]].add(doc["user_id"])
    for users in chunk_users.values():
        assert len(users) == 1
    for doc in questions:
        request = SearchRequest.model_validate_json(doc["search_body"])  # type: ignore[arg-type]
        assert request.user_id == doc["user_id"]
        assert chunk_users[doc["conversation_id"]] == {request.user_id}


def test_question_ids_unique_even_when_texts_repeat() -> None:
    raw = json.loads(
        (files("aml_evaluation") / "data" / "synthetic" / "synthetic_v1.json").read_bytes()
    )
    first = raw[0]["qa"][0]
    raw[0]["qa"].append(dict(first))
    raw[1]["qa"].append(dict(first))  # the same text in another conversation, too
    dataset = parse_locomo(raw, "synthetic", "test")
    documents = [question.stored() for question in plan_questions(JOB, dataset, top_k=10)]
    ids = [doc["_id"] for doc in documents]
    assert len(set(ids)) == len(ids)
    repeated = [doc for doc in documents if doc["question"] == first["question"]]
    assert len(repeated) == 3
    assert len({doc["_id"] for doc in repeated}) == 3


def test_multiple_choice_options_go_out_but_not_the_answer(dataset: Dataset) -> None:
    question = dataset.questions[0].model_copy(
        update={"options": ["Lisbon", "Berlin", "Oslo"], "answer": "Berlin (option b)"}
    )
    mc = dataset.model_copy(update={"questions": [question]})
    (doc,) = [question.stored() for question in plan_questions(JOB, mc, top_k=5)]
    payload = json.loads(doc["search_body"])
    assert payload["options"] == ["Lisbon", "Berlin", "Oslo"]
    assert "Berlin (option b)" not in doc["search_body"].decode()


# --- outcomes and multiple choice -----------------------------------------------------------


def test_question_outcome_from_each_final_record() -> None:
    question = {"question_id": "s:q0001", "dataset_id": "d", "category_name": "temporal"}
    base = {"_id": "j/d/s:q0001", "job_id": "j"}
    scored = question_outcome(
        question,
        ScoreDocument.model_validate(
            {**base, "state": "done", "category_name": "temporal", "judge_label": "CORRECT",
             "judge_labels": ["CORRECT"], "f1": 0.5, "bleu1": 0.25}
        ),
    )  # fmt: skip
    assert scored.scored and scored.failure is None
    assert (scored.judge_label, scored.f1, scored.bleu1) == ("CORRECT", 0.5, 0.25)
    failed = {**base, "state": "failed", "failure_kind": "participant_outage"}
    outage = question_outcome(question, StageRecord.model_validate(failed))
    assert not outage.scored and outage.failure == "participant_outage"
    assert outage.judge_label is None
    # Scored means a done score document, not a done record of another stage.
    searched = StageRecord.model_validate({**base, "state": "done"})
    assert question_outcome(question, searched).failure == "platform_error"
    # No final record at all (cannot happen once complete): the platform's fault.
    assert question_outcome(question, None).failure == "platform_error"
    unreadable = question_outcome(
        question,
        ScoreDocument.model_validate({**base, "state": "done", "judge_labels": [None]}),
    )
    assert unreadable.failure == "judge_failure"
    choice = question_outcome(
        question,
        ScoreDocument.model_validate(
            {**base, "state": "done", "multiple_choice": True, "choice_correct": None}
        ),
    )
    assert choice.failure == "unreadable_choice"


def test_options_reach_the_answer_prompt_as_letters() -> None:
    text = question_with_options("Where did Zoë move?", ["Lisbon", "Berlin", "Oslo"])
    assert text.splitlines() == [
        "Where did Zoë move?",
        "Options:",
        "A. Lisbon",
        "B. Berlin",
        "C. Oslo",
        "Answer with the letter of one option.",
    ]
    assert question_with_options("Q?", None) == "Q?"
    assert parse_choice("B", ["Lisbon", "Berlin", "Oslo"]) == 1


def test_multiple_choice_is_scored_by_the_option_named() -> None:
    unused: Any = None  # choice() uses none of the collaborators
    score = ScoreAnswer(
        settings=unused, stores=unused, llm=unused, prompt=unused, abstention_prompt=unused
    )
    options = ["Lisbon", "Berlin", "Oslo"]
    assert score.choice("B", options, "Berlin")["choice_correct"] is True
    assert score.choice("(c) Oslo", options, "Berlin")["choice_correct"] is False
    unreadable = score.choice("maybe Lisbon or Oslo", options, "Berlin")
    assert unreadable["chosen_option"] is None and unreadable["choice_correct"] is None


def test_every_item_is_planned_with_the_trace_its_releases_land_in(
    chunks: list[dict[str, object]], questions: list[dict[str, object]]
) -> None:
    """The trace id is derived from the item id (aml_runtime.telemetry), so it is known at plan
    time and no release has to write it."""
    for item in [*chunks, *questions]:
        assert item["trace_id"] == item_trace_hex(str(item["_id"]))
    with item_trace("aml.release", str(chunks[0]["_id"])) as span:
        assert format(span.get_span_context().trace_id, "032x") == chunks[0]["trace_id"]
    assert len({item["trace_id"] for item in [*chunks, *questions]}) == len(chunks) + len(questions)


def test_planned_documents_hold_only_what_the_plan_writes(
    chunks: list[dict[str, object]], questions: list[dict[str, object]]
) -> None:
    """Stored under MongoDB's `_id`; a field another writer fills in later (the adder's
    outcome) is absent, not null, and the planned abstention's gold answer is a stored null."""
    assert all("_id" in doc and "id" not in doc for doc in [*chunks, *questions])
    assert not {"finished_at", "at_us", "failure", "failure_kind"} & set(chunks[0])
    assert any("gold_answer" in doc and doc["gold_answer"] is None for doc in questions)


def _streaming() -> Dataset:
    data = Path(__file__).parents[1] / "data" / "streaming" / "streaming_v1.json"
    return parse_locomo(json.loads(data.read_text()), "streaming", "v1")


@pytest.mark.parametrize("turns_per_part", [1, 40, 10**9])
def test_planning_part_by_part_gives_the_documents_of_the_whole(
    dataset: Dataset, turns_per_part: int
) -> None:
    """A job is planned and stored part by part (whole conversations with their questions): the
    same chunks, questions (streaming points and held searches included) and written texts as
    planning the dataset at once."""
    for whole in (dataset, _streaming(), load_dataset("synthetic_multimodal", Path("/x"))):
        parts = list(dataset_parts(whole, turns_per_part))
        if turns_per_part == 1:
            assert len(parts) >= len(whole.conversations)
        chunks = [c.stored() for part in parts for c in plan_chunks("job-1", part)]
        questions = [q.stored() for part in parts for q in plan_questions("job-1", part, 10)]
        assert chunks == [c.stored() for c in plan_chunks("job-1", whole)]
        by_id = sorted(questions, key=lambda q: str(q["_id"]))
        expected = [q.stored() for q in plan_questions("job-1", whole, 10)]
        assert by_id == sorted(expected, key=lambda q: str(q["_id"]))
        owners = WrittenOwners()
        for part in parts:
            owners.add(c.body for c in plan_chunks("job-1", part) if c.body is not None)
        bodies = [c.body for c in plan_chunks("job-1", whole) if c.body is not None]
        assert sorted(owners.documents("job-1"), key=str) == sorted(
            plan_written_texts("job-1", bodies), key=str
        )


@pytest.mark.parametrize("turns_per_part", [1, 10**9])
def test_a_part_planned_at_once_is_what_each_planner_gives_alone(
    dataset: Dataset, turns_per_part: int
) -> None:
    """`plan_part` (the scheduler's unit of planning, its Adds chunked once, written texts taken
    from the requests) gives the chunks and questions of `plan_chunks` and `plan_questions`,
    and the written texts of the stored bodies, for text, streaming and multimodal datasets."""
    for whole in (dataset, _streaming(), load_dataset("synthetic_multimodal", Path("/x"))):
        planned, owners, from_bodies = [], WrittenOwners(), WrittenOwners()
        for part in dataset_parts(whole, turns_per_part):
            planned.append(plan_part("job-1", part, 10, owners))
            from_bodies.add(c.body for c in plan_chunks("job-1", part) if c.body is not None)
            assert [c.stored() for c in planned[-1].chunks] == [
                c.stored() for c in plan_chunks("job-1", part)
            ]
            assert [q.stored() for q in planned[-1].questions] == [
                q.stored() for q in plan_questions("job-1", part, 10)
            ]
        assert sum(len(p.chunks) for p in planned) == len(plan_chunks("job-1", whole)) > 0
        assert owners.documents("job-1") == from_bodies.documents("job-1")
        assert owners.pairs == from_bodies.pairs > 0


def test_a_text_written_in_two_conversations_names_both_users() -> None:
    owners = WrittenOwners()
    for user in ("u1", "u2"):
        request = AddRequest(
            request_id=f"{user}:chunk-1", user_id=user, session_id="s",
            messages=[{"role": "user", "content": "the same words"}],
        )  # fmt: skip
        owners.add([request.model_dump_json().encode()])
    (document,) = owners.documents("job-1")
    assert document["users"] == ["u1", "u2"]


def test_written_texts_are_taken_in_batches_and_counted_by_pair(dataset: Dataset) -> None:
    """A planner stores what it holds once it holds many (text, user) pairs: taken in batches,
    the same documents, and nothing is held from then on."""
    bodies = [c.body for c in plan_chunks("job-1", dataset) if c.body is not None]
    owners = WrittenOwners()
    owners.add(bodies)
    expected = owners.documents("job-1")
    assert owners.pairs == sum(len(doc["users"]) for doc in expected) > len(expected) // 2
    owners.add(bodies)  # the same texts again: no new pair
    assert owners.pairs == sum(len(doc["users"]) for doc in expected)
    batches = owners.take("job-1", 7)
    assert owners.pairs == 0
    taken = list(batches)
    assert [len(batch) for batch in taken[:-1]] == [7] * (len(taken) - 1)
    assert [doc for batch in taken for doc in batch] == expected
    assert not owners.owners and not owners.documents("job-1")
