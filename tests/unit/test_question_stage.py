"""What a question stage needs of the question comes with its work (no database read)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from aml_contract.messages import QuestionFacts, QuestionWork
from aml_pipeline.question_stage import (
    CARRIED_CANDIDATES_BYTES,
    QuestionStageWorker,
    carried_candidates,
)
from aml_runtime.settings import CommonSettings
from aml_runtime.stores import Stores

PLANNED = {
    "_id": "j1/conv-26:q0007",
    "job_id": "j1",
    "dataset_id": "locomo",
    "question_id": "conv-26:q0007",
    "conversation_id": "conv-26",
    "user_id": "u-conv-26",
    "question": "When did Caroline go to the LGBTQ support group?",
    "category": 2,
    "category_name": "temporal",
    "gold_answer": "7 May 2023",
    "options": None,
    "f1_variant": "f1-locomo-category-v1",
    "search_body": b'{"query":"When did Caroline go?","top_k":10,"user_id":"u-conv-26"}',
}


class _NoDatabase:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the stage read the database ({name})")

    def __getitem__(self, name: str) -> Any:
        raise AssertionError(f"the stage read the database ({name})")


async def _nothing(*args: Any) -> dict[str, Any]:
    return {}


def _stage(name: Any) -> QuestionStageWorker:
    stores = Stores.over(cast(Any, _NoDatabase()))
    return QuestionStageWorker(
        name, CommonSettings(), stores, cast(Any, None), cast(Any, None), _nothing
    )


def _released() -> QuestionWork:
    """The work as the scheduler releases it."""
    body = PLANNED["search_body"]
    assert isinstance(body, bytes)
    return QuestionWork(
        job_id="j1",
        version_id="ver-1",
        item_id=str(PLANNED["_id"]),
        facts=QuestionFacts.of(PLANNED),
        search_body=body.decode(),
    )


def test_facts_of_a_planned_question() -> None:
    facts = QuestionFacts.of(PLANNED)
    assert facts.user_id == "u-conv-26"
    assert facts.gold_answer == "7 May 2023"
    assert facts.f1_variant == "f1-locomo-category-v1"


async def test_the_search_stage_sends_the_planned_bytes_without_reading_the_question() -> None:
    question = await _stage("search")._question(_released())
    # The exact bytes planned, unchanged through the message (R-4.10 re-sends them as they are).
    assert question["search_body"] == PLANNED["search_body"]
    assert question["user_id"] == "u-conv-26"


async def test_later_stages_use_the_facts_handed_on() -> None:
    handed_on = _released().model_copy(update={"search_body": None})
    question = await _stage("answer")._question(handed_on)
    assert question["question"] == PLANNED["question"]


async def test_a_search_without_its_body_reads_the_question() -> None:
    """Work released by an earlier release carries no body: the stage reads the question (here
    the database refuses, which shows the read was attempted)."""
    without_body = _released().model_copy(update={"search_body": None})
    with pytest.raises(AssertionError, match="read the database"):
        await _stage("search")._question(without_body)


def test_candidates_travel_with_the_work_up_to_the_bound() -> None:
    small = [{"id": "m1", "content": "Caroline went on 7 May", "score": 0.5}]
    assert carried_candidates(small) is small
    # As compact JSON, [{"id":"m","content":""}] is 25 bytes, plus the text.
    at_bound = [{"id": "m", "content": "x" * (CARRIED_CANDIDATES_BYTES - 25)}]
    assert carried_candidates(at_bound) is at_bound
    over = [{"id": "m", "content": "x" * (CARRIED_CANDIDATES_BYTES - 24)}]
    assert carried_candidates(over) is None
    assert carried_candidates([]) == []


def test_the_stage_skeleton_never_tests_which_stage_it_runs() -> None:
    """What differs between the stages is their `StageShape` (and their `Compute`): neither the
    per-question skeleton nor the stage worker compares a stage's name with a literal."""
    import ast
    from pathlib import Path

    import aml_pipeline.question_stage as question_stage
    import aml_pipeline.stage_worker as stage_worker

    found = []
    for module in (question_stage, stage_worker):
        tree = ast.parse(Path(str(module.__file__)).read_text("utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = [ast.unparse(side) for side in sides]
            literal = any(
                isinstance(side, ast.Constant) and side.value in STAGE_NAMES for side in sides
            )
            if literal and any("stage" in name for name in names):
                found.append(f"{module.__name__}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found
    # Every question stage has its shape, and the chain of hand-ons ends at the score.
    assert set(question_stage.STAGES) == {"search", "answer", "score"}
    assert [question_stage.STAGES[s].following for s in ("search", "answer", "score")] == [
        "answer", "score", None,
    ]  # fmt: skip


STAGE_NAMES = {"add", "search", "answer", "score"}
