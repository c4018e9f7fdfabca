"""Scoring primitives (SPEC R-6.2): token F1 as in the LoCoMo paper, as in LoCoMo's own
evaluation code (per category) and as in the mem0 evaluation harness, the abstention rule for
questions the conversation does not answer, BLEU-1, multiple-choice answer parsing, and parsing
of the LLM judge's verdict. Pure functions (BLEU-1 reads nltk's pinned punkt_tab model once);
every scorer carries a version constant that a run records.

A gold answer of None means the conversation does not contain the answer (LoCoMo's adversarial
questions, whose `adversarial_answer` is a trap, not the truth): such a question is answered
correctly by abstaining, so no scorer compares the prediction with the trap."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Final, Literal, NamedTuple

import regex  # type: ignore[import-untyped]
from nltk.stem import PorterStemmer  # type: ignore[import-untyped]
from nltk.tokenize import word_tokenize  # type: ignore[import-untyped]
from nltk.translate.bleu_score import (  # type: ignore[import-untyped]
    SmoothingFunction,
    sentence_bleu,
)

from aml_evaluation.atmbench.scoring import ATM_SCORER
from aml_evaluation.punkt import require_punkt_tab

F1_VERSION: Final = "f1-locomo-v1"
F1_SET_VERSION: Final = "f1-set-v1"
F1_CATEGORY_VERSION: Final = "f1-locomo-category-v1"
F1_MEMGALLERY_VERSION: Final = "f1-memgallery-v1"
ABSTENTION_VERSION: Final = "abstention-phrase-v1"
BLEU_VERSION: Final = "bleu1-nltk-word_tokenize-v2"
MC_VERSION: Final = "mc-parse-v1"
# A dataset's manifest scorer that scores open questions by token F1 alone, no judge asked
# (Mem-Gallery's own evaluation reports F1; R-6.2 "multimodal Mem-Gallery -> F1").
TOKEN_F1_SCORER: Final = "token_f1"
# A coding dataset's scorer: an attempt is resolved when its patch makes every
# FAIL_TO_PASS test pass and keeps every PASS_TO_PASS test passing (aml_evaluation.coding.grading).
CODING_SCORER: Final = "swe_resolved"

# LoCoMo's category numbers, as in its data files (and the dataset manifests).
LOCOMO_MULTI_HOP: Final = 1
LOCOMO_TEMPORAL: Final = 2
LOCOMO_OPEN_DOMAIN: Final = 3
LOCOMO_SINGLE_HOP: Final = 4
LOCOMO_ADVERSARIAL: Final = 5

JudgeLabel = Literal["CORRECT", "WRONG"]

# Default mode (NLTK_EXTENSIONS), as the reference instantiates it. Only read after
# construction, so sharing one instance is not shared mutable state.
_STEMMER: Final = PorterStemmer()
_PUNCTUATION: Final = frozenset(string.punctuation)
# "and" is removed along with the articles: the LoCoMo reference does so (see normalize_answer).
# `regex`, not `re`, because the reference uses it and their word boundaries differ (see
# normalize_answer); nltk itself requires `regex`, so it is installed wherever nltk is.
_ARTICLES: Final = regex.compile(r"\b(a|an|the|and)\b")
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

    Step 4 uses the `regex` module with the reference's pattern and default flags: its word
    boundaries differ from `re`'s next to Unicode combining marks, zero-width joiners and
    superscript digits (`re` removes the "a" of a decomposed "á", `regex` keeps it).
    """
    s = s.replace(",", "").lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = str(_ARTICLES.sub(" ", s))
    return " ".join(s.split())


def _stemmed_tokens(text: str, normalize: Callable[[str], str] = normalize_answer) -> list[str]:
    # str(): nltk is untyped, this keeps the Any from leaking into the scores' types.
    return [str(_STEMMER.stem(word)) for word in normalize(text).split()]


def _multiset_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
    """F1 of two token lists compared as multisets; 0.0 when no token is shared."""
    shared = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(prediction_tokens)
    recall = shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, gold: str | int) -> float:
    """Token F1 of the LoCoMo paper (`f1_score` in task_eval/evaluation.py): both sides
    normalised (see normalize_answer), split on whitespace, Porter-stemmed (nltk), and compared
    as multisets, so a token repeated in both counts as often as it appears in both.

    Edge cases follow the reference: whenever no token is shared the score is 0.0, which
    includes one side empty AND both sides empty (SQuAD would give 1.0 for both empty).

    `gold` may be an int because some LoCoMo gold answers are JSON numbers (years); it is
    compared by its decimal string, as the reference does with `str(answer)`.
    """
    return _multiset_f1(_stemmed_tokens(prediction), _stemmed_tokens(str(gold)))


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


# LoCoMo's test for an abstention (task_eval/evaluation.py, category 5): its answer prompt
# offers "Not mentioned in the conversation" for such questions, and "no information available"
# is the other wording its code accepts.
ABSTENTION_PHRASES: Final = ("no information available", "not mentioned")


def abstention_score(prediction: str) -> float:
    """`abstention-phrase-v1`: 1.0 when the lowercased prediction contains one of
    ABSTENTION_PHRASES anywhere ("Not mentioned in the memories." counts; "I don't know" does
    not), else 0.0. LoCoMo's rule for its adversarial category; here the score of every
    question whose gold is that the conversation does not contain the answer."""
    lowered = prediction.lower()
    return 1.0 if any(phrase in lowered for phrase in ABSTENTION_PHRASES) else 0.0


def multi_answer_f1(prediction: str, gold: str | int) -> float:
    """LoCoMo's `f1` for multi-hop answers: prediction and gold are each split on "," into
    parts (surrounding whitespace stripped); every gold part takes the best token_f1 of any
    prediction part, and the score is the mean over the gold parts. A gold without a comma is
    one part, so the score is the best-matching prediction part's F1, not the whole
    prediction's."""
    predictions = [part.strip() for part in prediction.split(",")]
    golds = [part.strip() for part in str(gold).split(",")]
    best = [max(token_f1(candidate, part) for candidate in predictions) for part in golds]
    return sum(best) / len(best)


# A variant scores one question: (prediction, gold, LoCoMo category) -> F1, with gold None
# when the conversation does not contain the answer.
F1Scorer = Callable[[str, str | int | None, int], float]


def f1_locomo(prediction: str, gold: str | int | None, category: int) -> float:
    """`f1-locomo-v1`: token_f1 against the whole gold, whatever the category; an abstention
    question (gold None) by abstention_score."""
    return abstention_score(prediction) if gold is None else token_f1(prediction, gold)


def f1_set(prediction: str, gold: str | int | None, category: int) -> float:
    """`f1-set-v1`: token_f1_set against the whole gold; an abstention question by
    abstention_score (the mem0 harness itself leaves LoCoMo's category 5 out)."""
    return abstention_score(prediction) if gold is None else token_f1_set(prediction, gold)


def f1_locomo_category(prediction: str, gold: str | int | None, category: int) -> float:
    """`f1-locomo-category-v1`: the per-category procedure of LoCoMo's own evaluation code
    (snap-research/LoCoMo `task_eval/evaluation.py`, `eval_question_answering`), on LoCoMo's
    category numbers:

    - 1 multi-hop: multi_answer_f1 (split on commas, mean over gold parts of the best part);
    - 2 temporal, 4 single-hop: token_f1 against the whole gold;
    - 3 open-domain: token_f1 against the gold up to its first ";" (stripped), as the
      reference does with `answer.split(';')[0].strip()`;
    - 5 adversarial: abstention_score, for EVERY category-5 question, also the two of
      locomo10 whose transcript supports an answer: the reference decides by category.

    Raises ValueError for any other category, or a gold of None outside category 5."""
    if category == LOCOMO_ADVERSARIAL:
        return abstention_score(prediction)
    if gold is None:
        raise ValueError(f"category {category}: only category 5 is scored without a gold answer")
    if category == LOCOMO_MULTI_HOP:
        return multi_answer_f1(prediction, gold)
    if category == LOCOMO_OPEN_DOMAIN:
        return token_f1(prediction, str(gold).split(";")[0].strip())
    if category in (LOCOMO_TEMPORAL, LOCOMO_SINGLE_HOP):
        return token_f1(prediction, gold)
    raise ValueError(f"{F1_CATEGORY_VERSION} scores LoCoMo categories 1-5, not {category}")


# Mem-Gallery's placeholders for what its normalisation protects; lower-case input never holds
# them (they are upper case), so they cannot collide with the text.
_MEMGALLERY_DOT: Final = "DOTPLACEHOLDER"
_MEMGALLERY_UNDERSCORE: Final = "UNDERSCOREPLACEHOLDER"
_DECIMAL_POINT: Final = regex.compile(r"(?<=\d)\.(?=\d)")


def normalize_answer_memgallery(s: str) -> str:
    """Normalisation of Mem-Gallery's evaluation code (YuanchenBei/Mem-Gallery
    `benchmark/memengine/evaluate/evaluation.py::normalize_answer_universal`), step for step:

    1. lowercase (commas are NOT removed first, unlike LoCoMo: "1,000" becomes "1 000"),
    2. protect a decimal point between two digits ("3.14" stays one token),
    3. protect every underscore (image ids such as "IMG_001" stay one token),
    4. replace the words a, an, the and "and" by a space (`regex` word boundaries, as there),
    5. replace every other ASCII punctuation character by a space (LoCoMo deletes it, so
       "D1:IMG_001" is the two tokens "d1" and "img_001" here, one token "d1img001" there),
    6. restore the protected characters and collapse whitespace.
    """
    s = s.lower()
    s = str(_DECIMAL_POINT.sub(_MEMGALLERY_DOT, s))
    s = s.replace("_", _MEMGALLERY_UNDERSCORE)
    s = str(_ARTICLES.sub(" ", s))
    s = "".join(" " if ch in _PUNCTUATION else ch for ch in s)
    s = s.replace(_MEMGALLERY_DOT, ".").replace(_MEMGALLERY_UNDERSCORE, "_")
    return " ".join(s.split())


def token_f1_memgallery(prediction: str, gold: str | int) -> float:
    """Token F1 of Mem-Gallery (`f1_score` in the file named at normalize_answer_memgallery):
    both sides normalised by normalize_answer_memgallery, split on whitespace, Porter-stemmed
    (nltk) and compared as multisets, as token_f1 does; no shared token gives 0.0, which
    includes either or both sides empty."""
    return _multiset_f1(
        _stemmed_tokens(prediction, normalize_answer_memgallery),
        _stemmed_tokens(str(gold), normalize_answer_memgallery),
    )


def f1_memgallery(prediction: str, gold: str | int | None, category: int) -> float:
    """`f1-memgallery-v1`: token_f1_memgallery against the whole gold, in every category, as
    Mem-Gallery scores every question. An abstention question (gold None: Mem-Gallery's answer
    refusal, whose source gold is the reply "Not mentioned.") by abstention_score, as every
    variant does; Mem-Gallery itself compares the reply's words."""
    return abstention_score(prediction) if gold is None else token_f1_memgallery(prediction, gold)


# Version name -> scorer, so a dataset manifest can declare which token F1 it reports.
F1_VARIANTS: Final[Mapping[str, F1Scorer]] = MappingProxyType(
    {
        F1_VERSION: f1_locomo,
        F1_SET_VERSION: f1_set,
        F1_CATEGORY_VERSION: f1_locomo_category,
        F1_MEMGALLERY_VERSION: f1_memgallery,
    }
)

_BLEU_SMOOTHING: Final = SmoothingFunction().method1


def bleu_tokens(text: str) -> list[str]:
    """`nltk.word_tokenize` of the lowercased text, as the mem0 harness calls it: punkt splits
    sentences first, then the Treebank rules split each one, so every sentence's final period
    is a token of its own ("went. then" is [went, ., then]). Raises
    aml_evaluation.punkt.PunktDataError when the pinned punkt_tab model is not installed."""
    require_punkt_tab()
    # str(): nltk is untyped, this keeps the Any from leaking into the scores' types.
    return [str(token) for token in word_tokenize(text.lower())]


def bleu1(prediction: str, gold: str | int) -> float:
    """`bleu1-nltk-word_tokenize-v2`: BLEU-1 as the mem0 evaluation harness computes it
    (mem0ai/mem0 `evaluation/metrics/utils.py::calculate_bleu_scores`, key "bleu1"): nltk
    `sentence_bleu` with the gold as the single reference, weights (1, 0, 0, 0) and
    `SmoothingFunction().method1`, on bleu_tokens of both sides. With these weights the value
    is brevity_penalty * clipped unigram precision, where the brevity penalty is
    exp(1 - len(gold) / len(prediction)) when the prediction is the shorter, else 1.

    An empty token list on either side gives 0.0 (checked before nltk is called, so nltk
    never warns); `gold` may be an int, compared as `str(gold)`. A question without a gold
    answer (abstention) has no BLEU-1: callers leave it out rather than compare the answer
    with a made-up reference phrase.
    """
    prediction_tokens = bleu_tokens(prediction)
    gold_tokens = bleu_tokens(str(gold))
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


# How one answer is scored; see scoring_method.
ScoringMethod = Literal["choice", "f1_alone", "judge", "resolved", "atm"]


def scoring_method(options: Sequence[str] | None, dataset_scorer: str | None) -> ScoringMethod:
    """How the scorer service and `aml rescore` both score an answer: a question with options
    by the option it names (`score_choice`), whatever the dataset's scorer; an open question
    of a dataset whose manifest scorer is `token_f1` by token F1 alone (no judge asked, no
    BLEU-1), as Mem-Gallery's own evaluation scores it; a coding task's attempt by whether its
    patch resolves the task (`resolved`: the hidden tests, no LLM); any other open question by
    the LLM judge, token F1 and BLEU-1 (`open_answer_scores`). An ATM-Bench question (scorer
    `atm_qs`) by its answer type, as ATM-Bench scores it (`atm`: aml_evaluation.atmbench)."""
    if dataset_scorer == CODING_SCORER:
        return "resolved"
    if dataset_scorer == ATM_SCORER:
        return "atm"
    if options:
        return "choice"
    return "f1_alone" if dataset_scorer == TOKEN_F1_SCORER else "judge"


class OpenAnswerScores(NamedTuple):
    f1: float
    bleu1: float | None


def open_answer_scores(
    prediction: str, gold: str | int | None, category: int, f1_variant: str
) -> OpenAnswerScores:
    """Token F1 (the named variant) and BLEU-1 of an answer to an open question. A question
    without a gold answer gets the variant's abstention score and no BLEU-1: BLEU measures
    word overlap with a reference answer, and there is none; a fixed phrase as the reference
    would only reward copying one wording of "not mentioned", which the F1 rule and the judge
    already check. Raises KeyError for an unknown variant."""
    f1 = F1_VARIANTS[f1_variant](prediction, gold, category)
    return OpenAnswerScores(f1=f1, bleu1=None if gold is None else bleu1(prediction, gold))


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


class ChoiceScore(NamedTuple):
    # The option the answer picks (0-based, see parse_choice); None when it cannot be read.
    chosen: int | None
    # Whether that option is the gold answer; None when the answer cannot be read.
    correct: bool | None


def score_choice(answer_text: str, options: list[str], gold_answer: str | None) -> ChoiceScore:
    """A multiple-choice answer scored against the gold answer, which is one of the options
    verbatim (the dataset loader checks it): the scorer and `aml rescore` both score with this.
    Raises ValueError if `gold_answer` is none of the options."""
    if gold_answer not in options:
        raise ValueError(f"the gold answer {gold_answer!r} is none of the options {options!r}")
    chosen = parse_choice(answer_text, options)
    return ChoiceScore(chosen, None if chosen is None else options[chosen] == gold_answer)


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
