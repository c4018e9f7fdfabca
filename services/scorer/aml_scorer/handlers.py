"""Score one answer: the LLM judge's label and token F1 against the gold answer. A judge reply
that cannot be parsed is kept as a judge failure (counted apart), never turned into WRONG."""

from __future__ import annotations

from dataclasses import dataclass

from openai import AsyncOpenAI
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.messages import QuestionWork
from aml_evaluation.prompts import Prompt
from aml_evaluation.scoring import F1_VERSION, parse_judge_label, token_f1
from aml_runtime.broker import Exhausted
from aml_runtime.db import Document
from aml_runtime.llm import complete
from aml_scorer.settings import ScorerSettings


@dataclass
class ScoreAnswer:
    settings: ScorerSettings
    db: AsyncDatabase[Document]
    llm: AsyncOpenAI
    prompt: Prompt

    async def __call__(self, work: QuestionWork, question: Document, delivery: int) -> Document:
        answer = await self.db.answers.find_one({"_id": work.item_id})
        if answer is None or answer["state"] != "done":
            raise Exhausted("platform_error", f"no answer for {work.item_id}")
        gold = question["gold_answer"]
        text = self.prompt.text.format(
            question=question["question"], gold_answer=gold, generated_answer=answer["answer"]
        )
        raw = await complete(
            self.llm, self.settings.judge_model, text, self.settings.judge_max_tokens
        )
        return {
            "dataset_id": question["dataset_id"],
            "category": question["category"],
            "category_name": question["category_name"],
            "judge_label": parse_judge_label(raw),
            "judge_raw": raw[:2000],
            "judge_model": self.settings.judge_model,
            "judge_prompt_sha256": self.prompt.sha256,
            "f1": token_f1(answer["answer"], gold),
            "f1_version": F1_VERSION,
        }
