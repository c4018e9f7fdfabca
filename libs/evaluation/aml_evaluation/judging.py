"""The LLM judge "J" (SPEC R-6.2): N runs per question, each retried while its reply cannot be
read, and the majority label. The model call is injected, so the rules are testable without a
model."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from pydantic import BaseModel

from aml_evaluation.prompts import Prompt
from aml_evaluation.scoring import JudgeLabel, parse_judge_label

JUDGE_PARSER_VERSION: Final = "judge-parse-v1"
# Kept per reply in the audit record: enough to see why a reply could not be read.
RAW_KEPT_CHARS: Final = 2000


class JudgeVerdict(BaseModel):
    label: JudgeLabel | None
    labels: list[JudgeLabel | None]
    replies: list[str]
    calls: int


def majority(labels: Sequence[JudgeLabel | None]) -> JudgeLabel | None:
    """The label most runs gave, among the runs that could be read. None when no run could be
    read or CORRECT and WRONG tie: a judge failure, counted apart, never WRONG."""
    correct = sum(1 for label in labels if label == "CORRECT")
    wrong = sum(1 for label in labels if label == "WRONG")
    if correct > wrong:
        return "CORRECT"
    if wrong > correct:
        return "WRONG"
    return None


async def judge(
    call: Callable[[], Awaitable[str]], runs: int = 1, retries: int = 0
) -> JudgeVerdict:
    """`runs` independent verdicts; a run whose reply cannot be read is asked again up to
    `retries` times, and stays None after that."""
    labels: list[JudgeLabel | None] = []
    replies: list[str] = []
    calls = 0
    for _ in range(runs):
        label: JudgeLabel | None = None
        for _ in range(1 + retries):
            reply = await call()
            calls += 1
            replies.append(reply[:RAW_KEPT_CHARS])
            label = parse_judge_label(reply)
            if label is not None:
                break
        labels.append(label)
    return JudgeVerdict(label=majority(labels), labels=labels, replies=replies, calls=calls)


def judge_prompt_for(
    question: str, gold: str | None, answer: str, prompt: Prompt, abstention_prompt: Prompt
) -> tuple[Prompt, str]:
    """The prompt that judges one open question, and its text. A question whose gold is None
    (the conversation does not contain the answer) gets `abstention_prompt`, which is told so
    and has no gold answer to fill in: it is never shown a trap answer as the truth."""
    if gold is None:
        return abstention_prompt, abstention_prompt.text.format(
            question=question, generated_answer=answer
        )
    return prompt, prompt.text.format(question=question, gold_answer=gold, generated_answer=answer)
