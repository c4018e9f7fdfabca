"""Which of the participant's candidates the answer model sees (SPEC R-6.1).

Rule (`context-v1`): candidates are taken in the participant's order; each is rendered as its
line of the answer prompt (`- [created_at] content`, see prompts.format_memories) and its tokens
counted; the longest prefix whose summed line tokens fit the budget is kept. The first
candidate is always kept, even alone over the budget, so an answer never lacks the system's top
result; nothing later is skipped to squeeze in a shorter one, since rank is the participant's
decision.

Tokens are counted with the answer model's own tokenizer where one is available offline (the
llama.cpp server's `/tokenize` for local models). Otherwise `estimate_tokens` is used: one token
per three UTF-8 bytes, rounded up. English prose averages about four bytes a token with the
tokenizers of current hosted models, so the estimate errs on the side of fewer candidates. It is
an estimate, not a bound: `benchmarks/context_estimate.py` measured it against SmolLM2's small
49k-entry vocabulary on every LoCoMo turn at 1.086x the true total, but under the true count on
about a third of the lines (digits and dates take one token per character there). The budget's
purpose is that every participant's candidates are cut by the same deterministic rule; the
answer model's own context window is far larger than the budget, so an undercount cannot
overflow it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel

from aml_evaluation.prompts import format_memories

CONTEXT_RULE = "context-v1"
ESTIMATE_COUNTER = "utf8-bytes-div-3-v1"

TokenCount = Callable[[str], Awaitable[int]]


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 3)


async def estimated(text: str) -> int:
    return estimate_tokens(text)


class FittedContext(BaseModel):
    memories: list[tuple[str, str | None]]
    tokens: int
    candidates_returned: int


def memory_of(candidate: dict[str, Any]) -> tuple[str, str | None]:
    """(text, created_at) of a stored candidate; the text parts of multimodal content."""
    content = candidate["content"]
    text = (
        content
        if isinstance(content, str)
        else " ".join(part.get("text", "") for part in content if part.get("type") == "text")
    )
    created = candidate.get("created_at")
    return text, None if created is None else str(created)


async def fit_candidates(
    candidates: Sequence[dict[str, Any]], max_tokens: int, count: TokenCount
) -> FittedContext:
    kept: list[tuple[str, str | None]] = []
    used = 0
    for candidate in candidates:
        memory = memory_of(candidate)
        tokens = await count(format_memories([memory]))
        if kept and used + tokens > max_tokens:
            break
        kept.append(memory)
        used += tokens
    return FittedContext(memories=kept, tokens=used, candidates_returned=len(candidates))
