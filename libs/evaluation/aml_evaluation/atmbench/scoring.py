"""ATM-Bench's answer score, "ATM" or "QS" (question-type score), as the benchmark computes it
(JingbiaoMei/ATM-Bench, docs/metrics.md and memqa/utils/evaluator/README.md):

- `number` answers (dates, times, counts, amounts): exact match after normalisation, 1 or 0;
- `list_recall` answers (lists of memory item ids): Jaccard similarity of the item sets;
- `open_end` answers: an LLM judge's true/false verdict, 1 or 0.

The question's type is its ground-truth record's `qtype` when it has one, else detected from the
gold answer. The score of a run is the mean over its questions, overall and per type
(evaluate_qa.summarize_atm). This module is a port of the benchmark's evaluator
(memqa/utils/evaluator/evaluate_qa.py, qtype_utils.py, config.py; normalisation in
aml_evaluation.atmbench.normalizer; MIT licence, its notice in LICENSE-ATM-Bench.txt beside this
file); each function names the original it follows and any deliberate difference.
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Final, Literal, NamedTuple

from aml_evaluation.atmbench.normalizer import (
    DAY_PATTERN,
    EN_DASH,
    aggressive_preprocess,
    dates_match,
    extract_codes,
    extract_currency_amounts,
    extract_dates,
    extract_list_ids,
    extract_numbers,
    extract_reference_date,
    extract_times,
    is_abstention,
    location_token_match,
    normalize_between_to_range,
    normalize_currency_codes,
    normalize_text,
    remove_date_time_text,
    resolve_relative_dates,
    semantic_units_match,
    split_list_items,
    strip_context_phrases,
    strip_currency_breakdowns,
    strip_leading_articles,
    strip_parenthetical_details,
    token_subset_match,
    tokens_match,
)
from aml_evaluation.datasets import AnswerType

# What a run records as the scoring rule it was scored with; a change to any rule here that can
# change a score needs a new version.
ATM_QS_VERSION: Final = "atm-qs-v1"
# The reply budget of ATM-Bench's judge (memqa/utils/evaluator/config.py, EVALUATOR_CONFIG
# ["llm_judge"]["max_tokens"]): its prompt asks for a short explanation before the verdict, so a
# smaller budget would cut the verdict off.
ATM_JUDGE_MAX_TOKENS: Final = 600
# The manifest scorer of an ATM-Bench dataset (aml_evaluation.scoring.scoring_method: "atm").
ATM_SCORER: Final = "atm_qs"
# The judge prompt for `open_end` answers: prompts/judge_atm_v1.txt, the benchmark's
# LLM_JUDGE_PROMPT (memqa/utils/evaluator/config.py) byte for byte.
ATM_JUDGE_PROMPT_NAME: Final = "judge_atm_v1"

ScoreMethod = Literal["exact_match", "jaccard", "judge"]

# evaluate_qa.normalize_qtype_value's accepted spellings.
_NUMBER_SPELLINGS: Final = frozenset({"number", "num", "numeric"})
_LIST_SPELLINGS: Final = frozenset({"list_recall", "list-recall", "list", "listrecall"})
_OPEN_SPELLINGS: Final = frozenset(
    {"open_end", "open-end", "open", "openended", "open-ended", "open_ended"}
)

# qtype_utils' patterns.
_LIST_SEPARATOR_PATTERN: Final = re.compile(r"[,;\n/]+")
_EVIDENCE_IMAGE_PATTERN: Final = re.compile(r"\b\d{8}_\d{6}(?:_resized)?\b")
_EVIDENCE_EMAIL_PATTERN: Final = re.compile(r"\bemail\d{12}\b", re.IGNORECASE)
_NUMBER_CONNECTORS: Final = re.compile(
    r"\b(on|at|from|to|between|and|or|around|about|approx|approximately|before|after|"
    r"until|till|by|in|of|for)\b",
    re.IGNORECASE,
)
_CURRENCY_WORDS: Final = re.compile(
    r"\b(usd|gbp|eur|aud|jod|dollars?|pounds?|euros?)\b", re.IGNORECASE
)
_LABEL_PREFIX: Final = re.compile(r"\b(?:CODE|ID|REFERENCE|REF|NUMBER|NUM|LABEL):\s*")


class AtmScore(NamedTuple):
    """One answer's score: its type, the rule that scores it and the score in [0, 1] (None for
    `open_end` until the judge's verdict is in)."""

    answer_type: AnswerType
    method: ScoreMethod
    score: float | None


def _is_number_answer(answer: str) -> bool:
    # qtype_utils.is_number_answer: some date, time, number or currency, and nothing else once
    # those, day names, connecting words and punctuation are removed.
    if not answer or is_abstention(answer):
        return False
    cleaned = aggressive_preprocess(answer)
    cleaned = strip_parenthetical_details(cleaned)
    cleaned = strip_currency_breakdowns(cleaned)
    cleaned = normalize_between_to_range(cleaned)

    numbers, currencies = extract_numbers(cleaned)
    has_numeric = bool(extract_dates(cleaned) or extract_times(cleaned)) or bool(
        numbers or currencies or extract_currency_amounts(cleaned)
    )
    if not has_numeric:
        return False

    remainder = remove_date_time_text(cleaned)
    remainder = DAY_PATTERN.sub(" ", remainder)
    remainder = _NUMBER_CONNECTORS.sub(" ", remainder)
    remainder = _CURRENCY_WORDS.sub(" ", remainder)
    remainder = re.sub(r"[£$€]", " ", remainder)
    remainder = re.sub(r"\d", " ", remainder)
    remainder = re.sub(r"[-" + EN_DASH + r"~/:,.;]", " ", remainder)
    return not re.sub(r"\s+", " ", remainder).strip()


def _is_evidence_id_list(answer: str) -> bool:
    # qtype_utils._is_evidence_id_list: memory item ids and separators only.
    ids = [*_EVIDENCE_IMAGE_PATTERN.findall(answer), *_EVIDENCE_EMAIL_PATTERN.findall(answer)]
    if not ids:
        return False
    remainder = answer
    for item_id in ids:
        remainder = remainder.replace(item_id, " ")
    remainder = _LIST_SEPARATOR_PATTERN.sub(" ", remainder)
    remainder = re.sub(r"[\s\-" + EN_DASH + r"~:.]+", " ", remainder).strip()
    return not re.search(r"[A-Za-z0-9]", remainder)


def detect_qtype(answer: str) -> AnswerType:
    """The type of a gold answer: qtype_utils.detect_qtype of JingbiaoMei/ATM-Bench. "number"
    when it is only dates, times, numbers or amounts (is_number_answer), else "list_recall"
    when it is only memory item ids (is_list_answer), else "open_end"."""
    if _is_number_answer(answer):
        return "number"
    if answer and _is_evidence_id_list(answer):
        return "list_recall"
    return "open_end"


def answer_type(raw: str | None, answer: str) -> AnswerType:
    """The type a question is scored as: evaluate_qa.normalize_qtype_value of
    JingbiaoMei/ATM-Bench. A QA record's `qtype` field, trimmed and lower-cased, decides when it
    is one of the spellings the original knows ("number"/"num"/"numeric", "list_recall"/
    "list-recall"/"list"/"listrecall", "open_end"/"open-end"/"open"/"openended"/"open-ended"/
    "open_ended"); otherwise, an empty or unknown value included, the type is detected from the
    gold answer (detect_qtype). The original rejects no value, so neither does this."""
    if raw:
        value = raw.strip().lower()
        if value in _NUMBER_SPELLINGS:
            return "number"
        if value in _LIST_SPELLINGS:
            return "list_recall"
        if value in _OPEN_SPELLINGS:
            return "open_end"
    return detect_qtype(answer)


def _cleaned(text: str, reference_date: date | None) -> str:
    # The first steps of _deterministic_accuracy_core, in its order, for either side.
    text = aggressive_preprocess(resolve_relative_dates(text, reference_date))
    text = strip_parenthetical_details(text)
    text = strip_currency_breakdowns(text)
    text = normalize_between_to_range(text)
    return strip_leading_articles(text)


def exact_match(gold: str, prediction: str, *, question: str | None = None) -> bool:
    """Whether `prediction` matches `gold` by the benchmark's `number` rule:
    evaluate_qa.deterministic_accuracy (`_deterministic_accuracy_core`) of JingbiaoMei/ATM-Bench.

    Both sides are normalised (relative dates resolved against the first full date in
    `question`, parentheticals, currency breakdowns and leading articles dropped, "between X and
    Y" made a range). Abstentions match only abstentions. Then gold codes, dates (a date without
    a year matches on month and day), times, currencies, amounts and numbers must all be in the
    prediction, after which list items, yes/no, address words, containment either way, gold
    tokens or the semantic-units fallback can accept it.

    `question` is the original's `question` argument, which run_atm passes for every `number`
    question: leaving it out scores as the original does for a question without a date. As in
    the original, a question with an impossible full date ("2024-02-30") raises ValueError."""
    is_abst_gt = is_abstention(gold)
    is_abst_pred = is_abstention(prediction)

    reference_date = extract_reference_date(question or "")
    gt_clean = _cleaned(gold, reference_date)
    pred_clean = _cleaned(prediction, reference_date)
    gt_normalized = normalize_text(gt_clean)
    pred_normalized = normalize_text(pred_clean)

    if is_abst_gt or is_abst_pred:
        return is_abst_gt and is_abst_pred

    gt_codes = extract_codes(gt_clean)
    if gt_codes:
        pred_stripped = _LABEL_PREFIX.sub("", pred_clean.upper())
        if not all(code in pred_stripped for code in gt_codes):
            return False

    gt_dates = extract_dates(gt_clean)
    pred_dates = extract_dates(pred_clean)
    if gt_dates and (not pred_dates or not dates_match(gt_dates, pred_dates)):
        return False

    gt_times = extract_times(gt_clean)
    pred_times = extract_times(pred_clean)
    if gt_times and pred_times and not tokens_match(gt_times, pred_times):
        return False

    if gt_dates or gt_times:
        gt_remainder = strip_context_phrases(normalize_text(remove_date_time_text(gt_clean)))
        pred_remainder = strip_context_phrases(normalize_text(remove_date_time_text(pred_clean)))
        if not gt_remainder or token_subset_match(gt_remainder, pred_remainder):
            return True

    gt_rest = remove_date_time_text(gt_clean)
    pred_rest = remove_date_time_text(pred_clean)
    gt_numbers, gt_currencies = extract_numbers(gt_rest)
    pred_numbers, pred_currencies = extract_numbers(pred_rest)
    gt_amounts = extract_currency_amounts(gt_rest)
    pred_amounts = extract_currency_amounts(pred_rest)

    if gt_currencies:
        pred_codes = normalize_currency_codes(pred_currencies)
        if pred_codes and not tokens_match(normalize_currency_codes(gt_currencies), pred_codes):
            return False

    if gt_amounts:
        if not pred_amounts or not tokens_match(gt_amounts, pred_amounts):
            return False
        gt_numbers = tuple(num for num in gt_numbers if num not in gt_amounts)
        pred_numbers = tuple(num for num in pred_numbers if num not in pred_amounts)

    if gt_numbers and (not pred_numbers or not tokens_match(gt_numbers, pred_numbers)):
        return False

    gt_items = split_list_items(gt_clean)
    if len(gt_items) >= 2:
        return all(item in pred_normalized for item in gt_items)

    if (gt_normalized.startswith("yes") or gt_normalized.startswith("no")) and pred_normalized in (
        "yes",
        "no",
    ):
        return gt_normalized.startswith(pred_normalized)

    return (
        location_token_match(gt_clean, pred_clean)
        or (len(gt_normalized) >= 3 and gt_normalized in pred_normalized)
        or (len(pred_normalized) >= 3 and pred_normalized in gt_normalized)
        or token_subset_match(gt_clean, pred_clean)
        or semantic_units_match(gt_clean, pred_clean)
        or gt_normalized == pred_normalized
    )


def prediction_list_items(prediction: str) -> tuple[str, ...]:
    """The items of a predicted list: evaluate_qa._prediction_list_items of
    JingbiaoMei/ATM-Bench. The memory item ids it mentions, wherever they are in the text, or,
    when it mentions none, its list items (split_list_items)."""
    ids = extract_list_ids(prediction)
    if ids:
        return ids
    return tuple(item for item in split_list_items(prediction) if item)


def list_jaccard(gold: str, prediction: str) -> float:
    """The `list_recall` score: evaluate_qa.list_jaccard_score (`_list_jaccard_core`) of
    JingbiaoMei/ATM-Bench. The size of the intersection over the size of the union of the
    gold's list items (split_list_items) and the prediction's (prediction_list_items); 1.0 when
    both are empty, 0.0 when only the gold is."""
    gt_items = {item for item in split_list_items(gold) if item}
    pred_items = set(prediction_list_items(prediction))
    if not gt_items and not pred_items:
        return 1.0
    if not gt_items:
        return 0.0
    return len(gt_items & pred_items) / len(gt_items | pred_items)


def parse_judge_reply(text: str) -> bool | None:
    """The judge's verdict in its reply: evaluate_qa.parse_judge_response of
    JingbiaoMei/ATM-Bench, with the verdict read as run_llm_judge reads it.

    The text from the first "{" to the last "}", when it is a JSON object with an "accuracy"
    field, decides: correct when that field, as a string, is "true" in any case (so true and
    "True" are correct; false, "no", 1 or null are not). Otherwise the reply decides when it
    contains `"accuracy": true` or `"accuracy":true` (correct) or the same with false (wrong),
    in any case.

    Deliberate difference: for any other reply the original guesses (correct when the reply
    contains "accurate", "correct", "matches", "true" or "yes" anywhere, "incorrect" included,
    else wrong) and flags the row `parse_fallback`; this returns None, an unreadable reply,
    which AML never counts as a wrong answer."""
    start = text.find("{")
    end = text.rfind("}")
    if start != -1 and end != -1 and end > start:
        try:
            payload = json.loads(text[start : end + 1])
        except json.JSONDecodeError:
            payload = None
        if isinstance(payload, dict) and "accuracy" in payload:
            return str(payload["accuracy"]).lower() == "true"

    lowered = text.lower()
    if '"accuracy": true' in lowered or '"accuracy":true' in lowered:
        return True
    if '"accuracy": false' in lowered or '"accuracy":false' in lowered:
        return False
    return None


def judge_prompt_text(question: str, gold: str, prediction: str, template: str) -> str:
    """The judge's prompt: evaluate_qa.build_judge_prompt of JingbiaoMei/ATM-Bench, `template`
    (the text of prompts/judge_atm_v1.txt) with "{{question}}", then "{{answer}}", then
    "{{prediction}}" replaced by plain str.replace, in that order, as the original does (so a
    placeholder written inside the question is replaced too). Not str.format: the template's
    double braces are the benchmark's placeholders, not escapes."""
    prompt = template.replace("{{question}}", question)
    prompt = prompt.replace("{{answer}}", gold)
    return prompt.replace("{{prediction}}", prediction)


def score_deterministic(
    answer_type: AnswerType, gold: str, prediction: str, *, question: str | None = None
) -> AtmScore:
    """An answer's score by its type, as evaluate_qa.run_atm of JingbiaoMei/ATM-Bench scores it:
    `number` by exact_match (1.0 or 0.0, with `question` as run_atm passes it), `list_recall`
    by list_jaccard; `open_end` gets method "judge" and score None, for the caller to set 1.0
    or 0.0 from the judge's verdict (parse_judge_reply)."""
    if answer_type == "number":
        matched = exact_match(gold, prediction, question=question)
        return AtmScore(answer_type, "exact_match", 1.0 if matched else 0.0)
    if answer_type == "list_recall":
        return AtmScore(answer_type, "jaccard", list_jaccard(gold, prediction))
    return AtmScore(answer_type, "judge", None)
