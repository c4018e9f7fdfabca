"""Score one answer (R-6.2): an open question by the LLM judge (N runs, majority label), token
F1 in the dataset's declared variant and BLEU-1; a multiple-choice question by the option the
answer names. A judge verdict that cannot be read is a judge failure, counted apart, never
turned into WRONG."""

from __future__ import annotations

from dataclasses import dataclass

from openai import AsyncOpenAI
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.messages import QuestionWork
from aml_evaluation.judging import judge
from aml_evaluation.prompts import Prompt
from aml_evaluation.scoring import (
    BLEU_VERSION,
    F1_VARIANTS,
    F1_VERSION,
    MC_VERSION,
    bleu1,
    parse_choice,
)
from aml_runtime.broker import Exhausted
from aml_runtime.db import Document
from aml_runtime.llm import complete
from aml_runtime.stage_worker import StageCall
from aml_scorer.settings import ScorerSettings


@dataclass
class ScoreAnswer:
    settings: ScorerSettings
    db: AsyncDatabase[Document]
    llm: AsyncOpenAI
    prompt: Prompt

    async def __call__(self, work: QuestionWork, question: Document, item: StageCall) -> Document:
        answer = await self.db.answers.find_one({"_id": work.item_id})
        if answer is None or answer["state"] != "done":
            raise Exhausted("platform_error", f"no answer for {work.item_id}")
        found = {
            "dataset_id": question["dataset_id"],
            "category": question["category"],
            "category_name": question["category_name"],
        }
        options = question.get("options")
        if options:
            return found | self.choice(answer["answer"], options, question["gold_answer"])
        return found | await self.open_question(question, answer["answer"], item)

    def choice(self, answer: str, options: list[str], gold: str) -> Document:
        chosen = parse_choice(answer, options)
        return {
            "multiple_choice": True,
            "chosen_option": chosen,
            "choice_correct": None if chosen is None else options[chosen] == gold,
            "mc_version": MC_VERSION,
        }

    async def open_question(self, question: Document, answer: str, item: StageCall) -> Document:
        gold = question["gold_answer"]
        text = self.prompt.text.format(
            question=question["question"], gold_answer=gold, generated_answer=answer
        )
        settings = self.settings

        async def ask() -> str:
            return await complete(
                self.llm, settings.judge_model, text, settings.judge_max_tokens, item.admission
            )

        verdict = await judge(ask, settings.judge_runs, settings.judge_retries)
        variant = question.get("f1_variant", F1_VERSION)
        return {
            "judge_label": verdict.label,
            "judge_labels": verdict.labels,
            "judge_replies": verdict.replies,
            "judge_calls": verdict.calls,
            "judge_model": settings.judge_model,
            "judge_prompt_sha256": self.prompt.sha256,
            "f1": F1_VARIANTS[variant](answer, gold),
            "f1_version": variant,
            "bleu1": bleu1(answer, gold),
            "bleu1_version": BLEU_VERSION,
        }
