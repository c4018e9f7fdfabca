"""The rules of `aml_pipeline.progress`: which counters a terminal outcome bumps, how the
counters are recounted and read, and when a repair is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aml_contract.messages import Outcome
from aml_pipeline.progress import (
    COUNTERS,
    ERRORS,
    QUESTIONS_FINAL,
    ItemStage,
    all_questions_final,
    counter_field,
    counters_of,
    counting_filters,
    ends_question,
    error_count,
    increments,
    outcome_of,
    questions_final,
    repair_due,
    stage_counts,
    tally,
)
from aml_runtime.clock import micros

ITEM = "job-1/synthetic/s1:q0"


def test_only_terminal_states_are_outcomes() -> None:
    assert outcome_of("done") == "done"
    assert outcome_of("failed") == "failed"
    for state in ("pending", None, "", 1, "DONE"):
        assert outcome_of(state) is None


@pytest.mark.parametrize(
    ("stage", "outcome", "ends"),
    [
        ("add", "done", False),
        ("add", "failed", False),
        ("search", "done", False),
        ("search", "failed", True),
        ("answer", "done", False),
        ("answer", "failed", True),
        ("score", "done", True),
        # A score record is the end of the question whatever it says.
        ("score", "failed", True),
    ],
)
def test_a_question_ends_when_scored_or_failed_before(
    stage: ItemStage, outcome: Outcome, ends: bool
) -> None:
    assert ends_question(stage, outcome) is ends


def test_increments_of_an_outcome() -> None:
    assert increments("search", "done") == {"progress.search.done": 1}
    assert increments("answer", "failed") == {"progress.answer.failed": 1, QUESTIONS_FINAL: 1}
    assert increments("score", "done") == {"progress.score.done": 1, QUESTIONS_FINAL: 1}
    assert increments("add", "failed") == {"progress.add.failed": 1}


def test_tally_counts_stage_documents_and_each_question_once() -> None:
    documents: list[tuple[ItemStage, dict[str, object]]] = [
        ("add", {"state": "done"}),
        ("add", {"state": "done"}),
        ("add", {"state": "pending"}),
        ("search", {"state": "done"}),
        ("search", {"state": "done"}),
        ("search", {"state": "failed"}),
        ("answer", {"state": "done"}),
        ("score", {"state": "done"}),
        # Not terminal, or not a state at all: ignored rather than guessed.
        ("score", {"state": "running"}),
        ("answer", {}),
    ]
    counts = tally(documents, errors=2)
    assert set(counts) == set(COUNTERS)
    assert counts[counter_field("add", "done")] == 2
    assert counts[counter_field("search", "done")] == 2
    assert counts[counter_field("search", "failed")] == 1
    assert counts[counter_field("answer", "done")] == 1
    assert counts[counter_field("score", "done")] == 1
    assert counts[counter_field("score", "failed")] == 0
    # The failed search and the score: two questions over; the other search went on.
    assert counts[QUESTIONS_FINAL] == 2
    assert counts[ERRORS] == 2


def test_every_question_final_only_against_the_planned_total() -> None:
    assert not all_questions_final({"progress": {"questions_final": 3}})  # not planned yet
    assert not all_questions_final({"totals": {"questions": 4}, "progress": {"questions_final": 3}})
    assert all_questions_final({"totals": {"questions": 4}, "progress": {"questions_final": 4}})
    assert not all_questions_final({"totals": {"questions": "4"}})
    # The pre-image of the increment that counts the last question, plus that question.
    before = {"totals": {"questions": 4}, "progress": {"questions_final": 3}}
    assert all_questions_final(before, adding=1)
    assert not all_questions_final(before, adding=0)


def test_absent_counters_read_as_zero() -> None:
    planned = {"_id": "j", "totals": {"add": 3, "questions": 4}}
    assert set(counters_of(planned).values()) == {0}
    assert stage_counts(planned, "search") == (0, 0)
    assert questions_final(planned) == 0 and error_count(planned) == 0
    partial = {"progress": {"search": {"done": 3}, "questions_final": 1, "errors": True}}
    assert stage_counts(partial, "search") == (3, 0)
    assert stage_counts(partial, "answer") == (0, 0)
    assert questions_final(partial) == 1
    assert error_count(partial) == 0  # not a number: not a count


def test_counters_of_matches_tally_keys() -> None:
    job = {"progress": {"add": {"done": 2, "failed": 1}, "questions_final": 5, "errors": 1}}
    counts = counters_of(job)
    assert counts[counter_field("add", "done")] == 2
    assert counts[counter_field("add", "failed")] == 1
    assert counts[QUESTIONS_FINAL] == 5 and counts[ERRORS] == 1
    assert set(counts) == set(tally([], 0))


def test_micros_is_exact() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert micros(moment) == 1767323045678901
    assert micros(moment + timedelta(microseconds=1)) == micros(moment) + 1


def test_repair_is_due_only_after_the_counters_were_still() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    still = timedelta(minutes=1)
    # Just planned (started_at as nx-27017 keeps a $set datetime: a naive ISO string).
    job = {"started_at": start.replace(tzinfo=None).isoformat()}
    assert not repair_due(job, start + timedelta(seconds=59), still)
    assert repair_due(job, start + still, still)
    # An increment 30 s ago: not yet.
    moved = {**job, "progress": {"last_us": micros(start + timedelta(minutes=5))}}
    assert not repair_due(moved, start + timedelta(minutes=5, seconds=30), still)
    assert repair_due(moved, start + timedelta(minutes=6), still)
    # Repaired 10 s ago: an idle job is not re-read every interval.
    at = start + timedelta(seconds=50)
    repaired = {**job, "progress": {"last_us": micros(start), "repaired_us": micros(at)}}
    assert not repair_due(repaired, start + still, still)
    assert repair_due(repaired, at + still, still)
    # Nothing to go by (never the case for a planned job): due.
    assert repair_due({}, start, still)


def test_counting_filters_name_the_job_and_use_no_or() -> None:
    # nx-27017 applies a top-level `$or` of a write filter without the other conditions.
    filters = counting_filters("job-1", 42)
    assert filters == (
        {"_id": "job-1", "progress.counted_to": {"$exists": False}},
        {"_id": "job-1", "progress.counted_to": {"$lt": 42}},
    )
