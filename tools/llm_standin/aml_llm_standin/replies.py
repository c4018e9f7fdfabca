"""What the stand-in answers: a pure function of the prompt, so every run of a benchmark gets the
same replies. It recognises the platform's two prompts (aml_evaluation/prompts) by their fixed
wording, without importing them: the stand-in is a model, it must not know the platform's code.

- judge prompt (one that shows a "Generated answer:" or asks for a `{"label": ...}` reply; every
  judge prompt variant does): `{"label": "CORRECT"}` or WRONG, chosen by a hash of the prompt,
  so the results table has both labels and the judge parser reads each; a judge prompt that
  asks for an "accuracy" field (ATM-Bench's own) gets `{"explanation": ..., "accuracy":
  "true"}` or "false", chosen the same way;
- multiple-choice answer prompt ("Options:" then "A. ..." lines): one of the offered letters;
- any other prompt: the first words of the first memory listed, else the prompt's "not
  mentioned" phrase. Answers are cut to `max_tokens` words (a word is at least one token).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

NOT_MENTIONED: Final = "Not mentioned in the memories."
ANSWER_WORDS: Final = 8

_OPTION_LINE: Final = re.compile(r"^([A-Z])\. ", re.MULTILINE)
_MEMORY_LINE: Final = re.compile(r"^Memories:\n- (?:\[[^\]]*\] )?(?P<text>.+)$", re.MULTILINE)


def _digest(prompt: str) -> bytes:
    return hashlib.sha256(prompt.encode("utf-8")).digest()


def _asks_for_accuracy(prompt: str) -> bool:
    return '"accuracy" field' in prompt and "Ground truth:" in prompt


def is_judge_prompt(prompt: str) -> bool:
    return "Generated answer:" in prompt or '{"label"' in prompt or _asks_for_accuracy(prompt)


def judge_reply(prompt: str) -> str:
    correct = _digest(prompt)[0] % 2 == 0
    if _asks_for_accuracy(prompt):
        accuracy = "true" if correct else "false"
        return '{"explanation": "scripted verdict", "accuracy": "' + accuracy + '"}'
    return '{"label": "' + ("CORRECT" if correct else "WRONG") + '"}'


def option_letters(prompt: str) -> list[str]:
    """The letters of the options listed after the last "Options:" line, in order."""
    _, found, tail = prompt.rpartition("\nOptions:\n")
    return _OPTION_LINE.findall(tail) if found else []


def answer_reply(prompt: str, max_tokens: int) -> str:
    letters = option_letters(prompt)
    if letters:
        return letters[_digest(prompt)[0] % len(letters)]
    memory = _MEMORY_LINE.search(prompt)
    words = memory.group("text").split() if memory else NOT_MENTIONED.split()
    return " ".join(words[: max(1, min(ANSWER_WORDS, max_tokens))])


def reply_for(prompt: str, max_tokens: int | None) -> str:
    if is_judge_prompt(prompt):
        return judge_reply(prompt)
    return answer_reply(prompt, max_tokens or ANSWER_WORDS)
