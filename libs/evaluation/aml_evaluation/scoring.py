"""Scoring primitives (SPEC R-6.2): token F1 as in the LoCoMo paper and as in the mem0
evaluation harness, BLEU-1, multiple-choice answer parsing, and parsing of the LLM judge's
verdict. Pure functions, no I/O; every scorer carries a version constant that a run records."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, Literal

from nltk.stem import PorterStemmer  # type: ignore[import-untyped]
from nltk.tokenize import NLTKWordTokenizer  # type: ignore[import-untyped]
from nltk.translate.bleu_score import (  # type: ignore[import-untyped]
    SmoothingFunction,
    sentence_bleu,
)

F1_VERSION: Final = "f1-locomo-v1"
F1_SET_VERSION: Final = "f1-set-v1"
BLEU_VERSION: Final = "bleu1-nltk-v1"
MC_VERSION: Final = "mc-parse-v1"

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


# The characters mem0's `simple_tokenize` turns into spaces; everything else stays in the token.
_SET_F1_SEPARATORS: Final = str.maketrans(dict.fromkeys(".,!?", " "))


def _set_tokens(text: str) -> set[str]:
    return set(text.lower().translate(_SET_F1_SEPARATORS).split())


def token_f1_set(prediction: str, gold: str | int) -> float:
    """Set-based token F1 of the mem0 evaluation harness (mem0ai/mem0
    `evaluation/metrics/utils.py`, `simple_tokenize` + the "f1" of `calculate_metrics`; that
    file is borrowed from A-Mem, WujiangXu/AgenticMemory `utils.py`, and memodb-io/memobase
    `docs/experiments/locomo-benchmark` is a fork of the same harness). Step for step:

    1. lowercase,
    2. replace each of the four characters ``. , ! ?`` by a space — no other normalisation:
       other punctuation stays part of its token ("paris;" is not "paris"), articles and "and"
       stay, nothing is stemmed, and "1,000" becomes the two tokens "1" and "000",
    3. split on whitespace and take the SET of tokens, so duplicates collapse
       ("cat cat" vs "cat" is 1.0),
    4. precision = |shared| / |prediction set|, recall = |shared| / |gold set|, F1 their
       harmonic mean.

    Edge cases as in the harness: an empty token set on either side (empty or whitespace-only
    text, or only ``.,!?``) gives 0.0, also when both are empty; no shared token gives 0.0.

    `gold` may be an int (LoCoMo years); the harness compares `str(answer)`, so does this.
    """
    prediction_tokens = _set_tokens(prediction)
    gold_tokens = _set_tokens(str(gold))
    shared = len(prediction_tokens & gold_tokens)
    if shared == 0:
        return 0.0
    precision = shared / len(prediction_tokens)
    recall = shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


F1Scorer = Callable[[str, str | int], float]

# Version name -> scorer, so a dataset manifest can declare which token F1 it reports.
F1_VARIANTS: Final[Mapping[str, F1Scorer]] = MappingProxyType(
    {F1_VERSION: token_f1, F1_SET_VERSION: token_f1_set}
)

# The Treebank-style tokenizer that nltk.word_tokenize applies to each sentence; it needs no
# downloaded data (only word_tokenize's punkt sentence split does). Stateless after
# construction, like the stemmer.
_WORD_TOKENIZER: Final = NLTKWordTokenizer()
_BLEU_SMOOTHING: Final = SmoothingFunction().method1


def _bleu_tokens(text: str) -> list[str]:
    return [str(token) for token in _WORD_TOKENIZER.tokenize(text.lower())]


def bleu1(prediction: str, gold: str | int) -> float:
    """BLEU-1 as the mem0 evaluation harness computes it (mem0ai/mem0
    `evaluation/metrics/utils.py::calculate_bleu_scores`, key "bleu1"): nltk `sentence_bleu`
    with the gold as the single reference, weights (1, 0, 0, 0) and
    `SmoothingFunction().method1`. With these weights the value is
    brevity_penalty * clipped unigram precision, where the brevity penalty is
    exp(1 - len(gold) / len(prediction)) when the prediction is the shorter, else 1.

    Tokens: both sides lowercased and split by nltk's `NLTKWordTokenizer` (Treebank rules:
    punctuation becomes its own token, "Paris." is ["paris", "."], "1,000" stays one token).
    The harness uses `nltk.word_tokenize`, which first splits sentences with the punkt model;
    that model is downloaded data, so it is not used here. The only difference: a period
    ending a sentence that is not the last one stays on its word ("went." instead of "went",
    "."). For one-sentence answers the tokens are the same.

    An empty token list on either side gives 0.0 (checked before nltk is called, so nltk
    never warns); `gold` may be an int, compared as `str(gold)`.
    """
    prediction_tokens = _bleu_tokens(prediction)
    gold_tokens = _bleu_tokens(str(gold))
    if not prediction_tokens or not gold_tokens:
        return 0.0
    return float(
        sentence_bleu(
            [gold_tokens],
            prediction_tokens,
            weights=(1, 0, 0, 0),
            smoothing_function=_BLEU_SMOOTHING,
        )
    )


# "Answer: B", "The correct answer is (B)", "Option - B": a prefix needs a colon, dash or "is",
# so an option text that merely starts with "Answer" is not cut.
_CHOICE_PREFIX: Final = re.compile(
    r"^(?:the\s+)?(?:correct\s+|final\s+)?(?:answer|option|choice)\s*(?:is\b\s*:?|[:\-])\s*",
    re.IGNORECASE,
)
# A letter label at the start: "(B)", "[B]", "B)", "B.", "B:" (any text may follow), or a
# letter standing alone. A letter followed by a space and more text ("A dog") is not a label.
_CHOICE_LABEL: Final = re.compile(
    r"^(?:[(\[]\s*(?P<bracketed>[A-Za-z])\s*[)\]]"
    r"|(?P<delimited>[A-Za-z])[.):\]]"
    r"|(?P<bare>[A-Za-z])$)"
    r"\s*(?P<rest>.*)$",
    re.DOTALL,
)


def _option_by_text(text: str, options: list[str]) -> int | None:
    """The one option whose normalised text equals the normalised `text`; None if none or
    several do, or if `text` normalises to nothing."""
    normalized = normalize_answer(text)
    if not normalized:
        return None
    matches = [i for i, option in enumerate(options) if normalize_answer(option) == normalized]
    return matches[0] if len(matches) == 1 else None


def _option_by_label(text: str, option_count: int) -> tuple[int | None, str]:
    """The option a leading letter label names (A = 0, case-insensitive) and the text after
    the label; (None, "") when there is no label or its letter is past the last option."""
    match = _CHOICE_LABEL.match(text)
    if match is None:
        return None, ""
    letter = match.group("bracketed") or match.group("delimited") or match.group("bare")
    index = ord(letter.upper()) - ord("A")
    if index >= option_count:
        return None, ""
    return index, match.group("rest")


def parse_choice(answer_text: str, options: list[str]) -> int | None:
    """Which option (0-based) a model's answer picks, or None when it cannot be read — a
    failure to be reported as such, never scored as a wrong option.

    The text is stripped of surrounding whitespace and of markdown "*" and "`", then an optional
    prefix ("Answer:", "The answer is", "Correct option -") is dropped. The answer is read as:

    - a leading letter label for the first 26 options, A = 0: "B", "(B)", "[b]", "B)", "B.",
      "B:", possibly followed by text ("B. Paris", "(B) because ..."); a letter past the last
      option is no label;
    - the text of exactly one option, compared after normalize_answer (case, ASCII
      punctuation, articles ignored): "paris." picks "Paris". Options that normalise the same
      are ambiguous; an option that normalises to nothing ("A", "?") cannot be picked by text.

    Every reading that applies (the label, the whole text, the text after the label) must
    name the same option; if they disagree ("B" when option A's text is "B", "B) London" when
    London is option A), or none applies ("I think B", "Paris or London"), the result is None.
    """
    text = answer_text.strip().strip("*`").strip()
    body = _CHOICE_PREFIX.sub("", text, count=1)
    label, rest = _option_by_label(body, len(options))
    readings = {
        label,
        _option_by_text(text, options),
        _option_by_text(body, options),
        _option_by_text(rest, options) if label is not None else None,
    }
    readings.discard(None)
    return readings.pop() if len(readings) == 1 else None


def choice_correct(answer_text: str, options: list[str], correct_index: int) -> bool | None:
    """Whether the answer picks the correct option (see parse_choice); None when the answer
    cannot be read as an option. Raises ValueError if `correct_index` names no option."""
    if not 0 <= correct_index < len(options):
        raise ValueError(f"correct_index {correct_index} out of range for {len(options)} options")
    choice = parse_choice(answer_text, options)
    if choice is None:
        return None
    return choice == correct_index


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
