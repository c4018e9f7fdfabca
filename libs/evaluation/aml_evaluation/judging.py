"""The LLM judge "J" (SPEC R-6.2): N runs per question, each retried while its reply cannot be
read, and the majority label. The model call is injected, so the rules are testable without a
model."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Final

from pydantic import BaseModel

from aml_evaluation.atmbench.scoring import parse_judge_reply
from aml_evaluation.prompts import Prompt, load_prompt
from aml_evaluation.scoring import JudgeLabel, parse_judge_label

JUDGE_PARSER_VERSION: Final = "judge-parse-v1"

# Per-question judge rules (`Question.judge_rule`, carried to the scorer in the question's
# facts) -> the prompt file that grades them. A question without a rule gets the release's
# judge prompt, or its abstention prompt when it has no gold answer (LoCoMo). The LongMemEval
# rules follow LongMemEval's own answer check, per question type (xiaowu0162/LongMemEval,
# src/evaluation/evaluate_qa.py, get_anscheck_prompt): temporal-reasoning tolerates off-by-one
# counts of days/weeks/months; knowledge-update accepts older information next to the updated
# answer; single-session-preference grades against a rubric (the gold answer IS the rubric);
# abstention ("_abs" questions) is correct iff the response says the question cannot be
# answered, the source's explanation shown to the judge. Its other types (single-session-user,
# single-session-assistant, multi-session) use the release's judge prompt. Every prompt keeps
# the JSON verdict that parse_judge_label reads; the evaluation spec records each one.
LONGMEMEVAL_ABSTENTION_RULE: Final = "longmemeval-abstention"
JUDGE_RULE_PROMPTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "longmemeval-temporal": "judge_longmemeval_temporal_v1",
        "longmemeval-knowledge-update": "judge_longmemeval_knowledge_update_v1",
        "longmemeval-preference": "judge_longmemeval_preference_v1",
        LONGMEMEVAL_ABSTENTION_RULE: "judge_longmemeval_abstention_v1",
    }
)
# Rules that judge a question without a gold answer (their prompt shows `{explanation}`).
ABSTENTION_RULES: Final = frozenset({LONGMEMEVAL_ABSTENTION_RULE})
# Kept per reply in the audit record: enough to see why a reply could not be read.
RAW_KEPT_CHARS: Final = 2000


# A judge call's reply: its text, or its text with the tokens the provider counted in and out
# (aml_pipeline.llm.ChatReply is such a tuple).
JudgeReply = str | tuple[str, int, int]


class JudgeVerdict(BaseModel):
    label: JudgeLabel | None
    labels: list[JudgeLabel | None]
    replies: list[str]
    calls: int
    # Summed over the calls (0 when the call reports no tokens): the platform's own model use.
    tokens_in: int = 0
    tokens_out: int = 0


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
    call: Callable[[], Awaitable[JudgeReply]],
    runs: int = 1,
    retries: int = 0,
    parse: Callable[[str], JudgeLabel | None] = parse_judge_label,
) -> JudgeVerdict:
    """`runs` independent verdicts; a run whose reply cannot be read is asked again up to
    `retries` times, and stays None after that. `parse` reads a reply's label (a benchmark's
    own judge prompt may ask for its own verdict format)."""
    labels: list[JudgeLabel | None] = []
    replies: list[str] = []
    calls = tokens_in = tokens_out = 0
    for _ in range(runs):
        label: JudgeLabel | None = None
        for _ in range(1 + retries):
            reply = await call()
            if not isinstance(reply, str):
                reply, used_in, used_out = reply
                tokens_in, tokens_out = tokens_in + used_in, tokens_out + used_out
            calls += 1
            replies.append(reply[:RAW_KEPT_CHARS])
            label = parse(reply)
            if label is not None:
                break
        labels.append(label)
    return JudgeVerdict(
        label=majority(labels),
        labels=labels,
        replies=replies,
        calls=calls,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
    )


def load_judge_rule_prompts() -> dict[str, Prompt]:
    """The prompt of every judge rule (JUDGE_RULE_PROMPTS), by rule."""
    return {rule: load_prompt(name) for rule, name in JUDGE_RULE_PROMPTS.items()}


def judge_prompt_for(
    question: str,
    gold: str | None,
    answer: str,
    prompt: Prompt,
    abstention_prompt: Prompt,
    *,
    rule: str | None = None,
    rule_prompts: Mapping[str, Prompt] | None = None,
    explanation: str | None = None,
) -> tuple[Prompt, str]:
    """The prompt that judges one open question, and its text. A question whose gold is None
    (the conversation does not contain the answer) gets `abstention_prompt`, which is told so
    and has no gold answer to fill in: it is never shown a trap answer as the truth.

    A question with a judge `rule` gets that rule's prompt from `rule_prompts` (by default the
    shipped JUDGE_RULE_PROMPTS) instead. An abstention rule needs a gold of None and shows the
    judge `explanation`; any other rule needs a gold. Raises ValueError for an unknown rule or
    a rule that does not fit the gold."""
    if rule is not None:
        prompts = load_judge_rule_prompts() if rule_prompts is None else rule_prompts
        chosen = prompts.get(rule)
        if chosen is None:
            raise ValueError(f"unknown judge rule {rule!r}")
        if rule in ABSTENTION_RULES:
            if gold is not None:
                raise ValueError(f"judge rule {rule!r} is for questions without a gold answer")
            return chosen, chosen.text.format(
                question=question,
                explanation=explanation or "(none given)",
                generated_answer=answer,
            )
        if gold is None:
            raise ValueError(f"judge rule {rule!r} needs a gold answer")
        return chosen, chosen.text.format(
            question=question, gold_answer=gold, generated_answer=answer
        )
    if gold is None:
        return abstention_prompt, abstention_prompt.text.format(
            question=question, generated_answer=answer
        )
    return prompt, prompt.text.format(question=question, gold_answer=gold, generated_answer=answer)


def atm_judge_label(reply: str) -> JudgeLabel | None:
    """ATM-Bench's judge reply (its JSON `accuracy`, aml_evaluation.atmbench.scoring) as a
    label; None when it cannot be read (a judge failure, never WRONG)."""
    verdict = parse_judge_reply(reply)
    if verdict is None:
        return None
    return "CORRECT" if verdict else "WRONG"
