"""Answer one question from the candidates the participant returned, in its order."""

from __future__ import annotations

from dataclasses import dataclass

from openai import AsyncOpenAI
from pymongo.asynchronous.database import AsyncDatabase

from aml_answerer.settings import AnswererSettings
from aml_contract.messages import QuestionWork
from aml_evaluation.prompts import Prompt, format_memories
from aml_runtime.broker import Exhausted
from aml_runtime.db import Document
from aml_runtime.llm import complete


def fit_candidates(candidates: list[Document], budget_chars: int) -> list[tuple[str, str | None]]:
    """The longest prefix of the ranked candidates whose rendered text (content and date) fits
    the budget; the first candidate is always kept. Order is kept and nothing is skipped to
    squeeze a later one in: rank is the participant's decision."""
    kept: list[tuple[str, str | None]] = []
    used = 0
    for candidate in candidates:
        content = candidate["content"]
        text = (
            content
            if isinstance(content, str)
            else " ".join(part.get("text", "") for part in content if part.get("type") == "text")
        )
        created = None if candidate.get("created_at") is None else str(candidate["created_at"])
        size = len(text) + len(created or "")
        if used + size > budget_chars and kept:
            break
        kept.append((text, created))
        used += size
    return kept


@dataclass
class AnswerQuestion:
    settings: AnswererSettings
    db: AsyncDatabase[Document]
    llm: AsyncOpenAI
    prompt: Prompt

    async def __call__(self, work: QuestionWork, question: Document, delivery: int) -> Document:
        search = await self.db.searches.find_one({"_id": work.item_id})
        if search is None or search["state"] != "done":
            raise Exhausted("platform_error", f"no search result for {work.item_id}")
        memories = fit_candidates(search["candidates"], self.settings.answer_context_chars)
        text = self.prompt.text.format(
            memories=format_memories(memories), question=question["question"]
        )
        answer = await complete(
            self.llm, self.settings.answer_model, text, self.settings.answer_max_tokens
        )
        return {
            "answer": answer.strip(),
            "model": self.settings.answer_model,
            "prompt": self.prompt.name,
            "prompt_sha256": self.prompt.sha256,
            "candidates_used": len(memories),
            "context_chars": sum(len(text) + len(date or "") for text, date in memories),
        }
