"""What the answer and score documents record for the efficiency figures: the retrieved
candidates' size by the frozen word counter against what fitted the context budget, and the
platform's own model use as the provider reported it (the model is a scripted fake)."""

from __future__ import annotations

from typing import Any, cast

from fakes import FakeChatModel

from aml_answerer.handlers import AnswerQuestion
from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_evaluation.context import estimated
from aml_evaluation.prompts import load_prompt
from aml_evaluation.wordcount import count_words
from aml_pipeline.stage_worker import StageCall
from aml_scorer.handlers import ScoreAnswer
from aml_scorer.settings import ScorerSettings


class CountingModel(FakeChatModel):
    """A fake model that reports `usage` as a provider does: words in, words out."""

    async def post(self, path: str, *, cast_to: type, body: dict[str, Any]) -> dict[str, Any]:
        reply = await super().post(path, cast_to=cast_to, body=body)
        text = reply["choices"][0]["message"]["content"]
        prompt = str(body["messages"][0]["content"])
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        return reply | {"usage": usage}


def _answerer(model: FakeChatModel, budget: int) -> AnswerQuestion:
    unused: Any = None
    return AnswerQuestion(
        settings=AnswererSettings(answer_context_tokens=budget),
        stores=unused,
        llm=cast(Any, model),
        prompt=load_prompt("answer_v1"),
        count_tokens=estimated,
    )


def _work(candidates: list[dict[str, Any]]) -> QuestionWork:
    return QuestionWork(job_id="j", version_id="v", item_id="j/d/q1", candidates=candidates)


async def test_oversized_candidates_are_seen_retrieved_in_full_and_used_in_part() -> None:
    memory = "Ana moved to Lisbon in May and works at the harbour bakery on weekdays. " * 8
    candidates = [{"id": f"m{n}", "content": memory} for n in range(20)]
    model = CountingModel(" Lisbon ")
    answer = await _answerer(model, budget=300)(
        _work(candidates), {"question": "Where does Ana live?"}, StageCall(delivered=1)
    )
    words = count_words(memory)
    assert answer["candidates_returned"] == 20 and answer["candidates_used"] == 1
    assert answer["retrieved_tokens"] == 20 * words
    assert answer["retrieved_bytes"] == 20 * len(memory.encode("utf-8"))
    assert answer["used_tokens"] == words
    (prompt,) = model.prompts
    assert (answer["tokens_in"], answer["tokens_out"]) == (len(prompt.split()), 1)
    assert answer["answer"] == "Lisbon"


async def test_a_provider_without_usage_records_none_used() -> None:
    answer = await _answerer(FakeChatModel("Paris"), budget=2000)(
        _work([{"id": "m", "content": "Ana lives in Paris"}]), {"question": "Where?"},
        StageCall(delivered=1),
    )  # fmt: skip
    assert (answer["retrieved_tokens"], answer["used_tokens"]) == (4, 4)
    assert (answer["tokens_in"], answer["tokens_out"]) == (0, 0)


async def test_a_score_records_the_judges_tokens_over_its_calls() -> None:
    replies = iter(["no verdict here", '{"label": "CORRECT"}'])
    model = CountingModel(lambda prompt: next(replies))
    unused: Any = None
    scorer = ScoreAnswer(
        settings=ScorerSettings(judge_runs=1, judge_retries=1),
        stores=unused,
        llm=cast(Any, model),
        prompt=load_prompt("judge_v1"),
        abstention_prompt=load_prompt("judge_abstention_v1"),
    )
    question = {
        "dataset_id": "d", "category": 1, "category_name": "facts", "question": "Where?",
        "gold_answer": "Paris", "f1_variant": "f1-locomo-v1",
    }  # fmt: skip
    work = QuestionWork(job_id="j", version_id="v", item_id="j/d/q1", answer="Paris")
    scored = await scorer(work, question, StageCall(delivered=1))
    assert scored["judge_label"] == "CORRECT" and scored["judge_calls"] == 2
    prompt_words = sum(len(str(prompt).split()) for prompt in model.prompts)
    assert scored["judge_tokens_in"] == prompt_words
    assert scored["judge_tokens_out"] == 3 + 2
