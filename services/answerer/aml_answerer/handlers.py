"""Answer one question from the candidates the participant returned, in its order (R-6.1)."""

from __future__ import annotations

from dataclasses import dataclass

from openai import AsyncOpenAI
from pymongo.asynchronous.database import AsyncDatabase

from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_evaluation.context import TokenCount, fit_candidates
from aml_evaluation.prompts import Prompt, format_memories, question_with_options
from aml_pipeline.evaluation_spec import token_counter_name
from aml_pipeline.llm import complete
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.db import Document
from aml_runtime.documents import FailureKind


@dataclass
class AnswerQuestion:
    settings: AnswererSettings
    db: AsyncDatabase[Document]
    llm: AsyncOpenAI
    prompt: Prompt
    count_tokens: TokenCount

    async def __call__(self, work: QuestionWork, question: Document, item: StageCall) -> Document:
        search = await self.db.searches.find_one({"_id": work.item_id})
        if search is None or search["state"] != "done":
            raise FinalFailure(FailureKind.PLATFORM_ERROR, f"no search result for {work.item_id}")
        context = await fit_candidates(
            search["candidates"], self.settings.answer_context_tokens, self.count_tokens
        )
        text = self.prompt.text.format(
            memories=format_memories(context.memories),
            question=question_with_options(
                question["question"], question.get("options"), question.get("question_date")
            ),
        )
        answer = await complete(
            self.llm,
            self.settings.answer_model,
            text,
            self.settings.answer_max_tokens,
            item.admission,
        )
        return {
            "answer": answer.strip(),
            "model": self.settings.answer_model,
            "prompt": self.prompt.name,
            "prompt_sha256": self.prompt.sha256,
            "candidates_returned": context.candidates_returned,
            "candidates_used": len(context.memories),
            "context_tokens": context.tokens,
            "token_counter": token_counter_name(self.settings),
        }
