"""Scoring primitives (SPEC R-6.2): token F1 as in the LoCoMo paper, and parsing of the LLM
judge's verdict. Pure functions, no I/O."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from typing import Final, Literal

from nltk.stem import PorterStemmer  # type: ignore[import-untyped]

F1_VERSION: Final = "f1-locomo-v1"

JudgeLabel = Literal["CORRECT", "WRONG"]

# Default mode (NLTK_EXTENSIONS), as the reference instantiates it. Only read after
# construction, so sharing one instance is not shared mutable state.
_STEMMER: Final = PorterStemmer()
_PUNCTUATION: Final = frozenset(string.punctuation)
# "and" is removed along with the articles: the LoCoMo reference does so (see normalize_answer).
_ARTICLES: Final = re.compile(r"\b(a|an|the|and)\b")
_BARE_LABEL: Final = re.compile(r"\b(correct|wrong)\b", re.IGNORECASE)
# A negation right before a bare label ("not correct", "isn't wrong") inverts it; such text is
# treated as unparseable rather than guessed at.
_NEGATED_LABEL: Final = re.compile(r"(\bnot|\bnever|\bno|n't)\s+(correct|wrong)\b", re.IGNORECASE)


def normalize_answer(s: str) -> str:
    """Normalisation of snap-research/locomo `task_eval/evaluation.py::normalize_answer`,
    step for step:

    1. remove commas (so "1,000" becomes "1000" rather than two tokens),
    2. lowercase,
    3. remove ASCII punctuation (`string.punctuation`; other Unicode punctuation stays),
    4. replace the words a, an, the AND "and" by a space (SQuAD removes only the articles;
       LoCoMo's variant adds "and"),
    5. collapse whitespace.

    The reference uses the `regex` module for step 4; `re` gives the same word boundaries for
    this pattern on str input.
    """
    s = s.replace(",", "").lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _stemmed_tokens(text: str) -> list[str]:
    # str(): nltk is untyped, this keeps the Any from leaking into the scores' types.
    return [str(_STEMMER.stem(word)) for word in normalize_answer(text).split()]


def token_f1(prediction: str, gold: str | int) -> float:
    """Token F1 of the LoCoMo paper (`f1_score` in task_eval/evaluation.py): both sides
    normalised (see normalize_answer), split on whitespace, Porter-stemmed (nltk), and compared
    as multisets, so a token repeated in both counts as often as it appears in both.

    Edge cases follow the reference: whenever no token is shared the score is 0.0, which
    includes one side empty AND both sides empty (SQuAD would give 1.0 for both empty).

    `gold` may be an int because some LoCoMo gold answers are JSON numbers (years); it is
    compared by its decimal string, as the reference does with `str(answer)`.
    """
    prediction_tokens = _stemmed_tokens(prediction)
    gold_tokens = _stemmed_tokens(str(gold))
    shared = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(prediction_tokens)
    recall = shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _label_of(value: object) -> JudgeLabel | None:
    if not isinstance(value, dict):
        return None
    label = value.get("label")
    if not isinstance(label, str):
        return None
    normalized = label.strip().upper()
    if normalized == "CORRECT":
        return "CORRECT"
    if normalized == "WRONG":
        return "WRONG"
    return None


def _json_objects(text: str) -> list[object]:
    """Every JSON value that starts at a "{" of `text`, in order of position. Scanning each "{"
    (not only the first) finds the verdict behind chatter, inside ```json fences, and after a
    stray brace in the prose."""
    decoder = json.JSONDecoder()
    found: list[object] = []
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        found.append(value)
    return found


def parse_judge_label(text: str) -> JudgeLabel | None:
    """The judge's verdict, or None when it cannot be read (a judge failure, to be reported as
    such, never scored as WRONG).

    1. The first JSON object in `text` whose "label" is CORRECT or WRONG (case-insensitive,
       surrounding whitespace ignored).
    2. Otherwise a bare word CORRECT or WRONG (case-insensitive, whole word, so "incorrect"
       does not count), only if exactly one of the two appears and is never negated
       ("not correct"). Both words present, or none → None.
    """
    for value in _json_objects(text):
        label = _label_of(value)
        if label is not None:
            return label
    if _NEGATED_LABEL.search(text):
        return None
    words = {word.upper() for word in _BARE_LABEL.findall(text)}
    if words == {"CORRECT"}:
        return "CORRECT"
    if words == {"WRONG"}:
        return "WRONG"
    return None
