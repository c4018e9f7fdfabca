"""The LLM stages give their slot's turn to the next call as soon as their own model call has
answered: the answerer before counting and storing its answer, the scorer before its F1, BLEU-1
and evidence read. A slot's next call then waits for no database round trip of the item before
it (issue 30: a saturated capacity's next request leaves as a slot frees). The model is a
scripted fake; the turn is the real `Admission`'s."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, cast

from fakes import FakeChatModel
from turns import turn_only_admission

from aml_answerer.handlers import AnswerQuestion
from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_evaluation.context import estimated
from aml_evaluation.evidence import normalize_text
from aml_evaluation.prompts import load_prompt
from aml_pipeline.capacity import Admission
from aml_pipeline.stage_worker import StageCall
from aml_scorer.handlers import ScoreAnswer
from aml_scorer.settings import ScorerSettings


async def _compute_under_turn(
    admission: Admission, compute: Awaitable[Any], events: list[str]
) -> Any:
    """As the question stage computes an item: under the slot's turn, the next call waiting."""

    async def next_call() -> None:
        async with admission.turn():
            events.append("next call's turn")

    async with admission.turn():
        waiting = asyncio.create_task(next_call())
        result = await compute
        events.append("compute returned")
    await asyncio.wait_for(waiting, 5)
    return result


class SlowRecords:
    """The stored searches, read slowly: long enough for a next call that may go to go."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def candidates_of(self, item_id: str) -> list[dict[str, Any]]:
        await asyncio.sleep(0.05)
        self.events.append("evidence read")
        return [{"id": "m1", "content": "Ana moved to Lisbon in May."}]


async def test_the_scorer_passes_the_turn_once_its_judge_has_answered() -> None:
    events: list[str] = []
    stores: Any = type("Stores", (), {"records": SlowRecords(events)})()
    scorer = ScoreAnswer(
        settings=ScorerSettings(judge_runs=1, judge_retries=1),
        stores=stores,
        llm=cast(Any, FakeChatModel('{"label": "CORRECT"}')),
        prompt=load_prompt("judge_v1"),
        abstention_prompt=load_prompt("judge_abstention_v1"),
    )
    question = {
        "dataset_id": "d", "category": 1, "category_name": "facts", "question": "Where?",
        "gold_answer": "Lisbon", "f1_variant": "f1-locomo-v1",
        "evidence_markers": {"D1:3": [normalize_text("Ana moved to Lisbon in May.")]},
    }  # fmt: skip
    work = QuestionWork(job_id="j", version_id="v", item_id="j/d/q1", answer="Lisbon")
    admission = turn_only_admission("llm")
    scored = await _compute_under_turn(
        admission, scorer(work, question, StageCall(1, admission)), events
    )
    assert scored["judge_label"] == "CORRECT"
    assert scored["evidence_ranks"] == {"D1:3": 1}
    assert events == ["next call's turn", "evidence read", "compute returned"]


async def test_the_answerer_passes_the_turn_once_its_model_has_answered() -> None:
    events: list[str] = []

    class Model(FakeChatModel):
        async def post(self, path: str, *, cast_to: type, body: dict[str, Any]) -> Any:
            reply = await super().post(path, cast_to=cast_to, body=body)
            events.append("model answered")
            return reply

    unused: Any = None
    answerer = AnswerQuestion(
        settings=AnswererSettings(),
        stores=unused,
        llm=cast(Any, Model("Lisbon")),
        prompt=load_prompt("answer_v1"),
        count_tokens=estimated,
    )
    work = QuestionWork(
        job_id="j", version_id="v", item_id="j/d/q1",
        candidates=[{"id": "m1", "content": "Ana moved to Lisbon in May."}],
    )  # fmt: skip
    admission = turn_only_admission("llm")

    async def answered() -> Any:
        answer = await answerer(work, {"question": "Where?"}, StageCall(1, admission))
        await asyncio.sleep(0.01)  # what follows the compute (storing it) runs after the pass
        events.append("answer stored")
        return answer

    answer = await _compute_under_turn(admission, answered(), events)
    assert answer["answer"] == "Lisbon"
    assert events == ["model answered", "next call's turn", "answer stored", "compute returned"]
