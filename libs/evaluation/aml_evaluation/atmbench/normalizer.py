"""ATM-Bench's answer normalisation: text clean-up, extraction of dates, times, numbers,
currency amounts and codes, abstention, list splitting, and the matching helpers its exact-match
rule is built from.

A port of JingbiaoMei/ATM-Bench `memqa/utils/evaluator/normalizer.py` (MIT licence, its notice
in LICENSE-ATM-Bench.txt beside this file), with the
date/token matching helpers and the memory-id extraction of
`memqa/utils/evaluator/evaluate_qa.py` (`date_component_match`, `date_token_match`,
`dates_match`, `tokens_match`, `_extract_list_ids_from_text`). Every regular expression, list
and step order is the original's, so that each function returns what the original returns for
the same input; tests/unit/test_atm_scoring.py checks that against outputs of the original.

Differences that do not change a result: the original's `DateToken`/`TimeToken` wrappers are
plain strings here (only their `.value` is ever read), results are tuples, and the constant
tables are immutable. `resolve_relative_dates` spells month names from its own English table
where the original calls `strftime("%B")`, which is the same under the C locale Python starts
with and does not change if a process calls `locale.setlocale`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Final, TypeVar

_T = TypeVar("_T", bound=Hashable)

# The original's ABSTENTION_PHRASES (memqa/utils/evaluator/config.py), misspelling included:
# an answer containing one of them, after normalize_text, is an abstention.
ABSTENTION_PHRASES: Final = (
    "unknown",
    "abstention",
    "no information",
    "not available",
    "no evidence",
    "no evidnece",
    "insufficient information",
)

# Insertion order matters: MONTH_PATTERN's alternation is built from it, as in the original.
MONTHS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "january": 1,
        "jan": 1,
        "february": 2,
        "feb": 2,
        "march": 3,
        "mar": 3,
        "april": 4,
        "apr": 4,
        "may": 5,
        "june": 6,
        "jun": 6,
        "july": 7,
        "jul": 7,
        "august": 8,
        "aug": 8,
        "september": 9,
        "sep": 9,
        "sept": 9,
        "october": 10,
        "oct": 10,
        "november": 11,
        "nov": 11,
        "december": 12,
        "dec": 12,
    }
)

MONTH_PATTERN: Final = "|".join(MONTHS.keys())
# The original's patterns accept an en dash wherever they accept "-" in a range.
EN_DASH: Final = "\u2013"

RE_ISO_DATE: Final = re.compile(r"\b(\d{4})[-/](\d{1,2})[-/](\d{1,2})\b")
RE_COMPACT_DATE: Final = re.compile(r"\b((?:19|20)\d{2})(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])\b")
RE_MONTH_DAY: Final = re.compile(
    rf"\b({MONTH_PATTERN})\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s*(\d{{4}}))?\b",
    re.IGNORECASE,
)
RE_DAY_MONTH: Final = re.compile(
    rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({MONTH_PATTERN})(?:,?\s*(\d{{4}}))?\b",
    re.IGNORECASE,
)
RE_MONTH_RANGE: Final = re.compile(
    rf"\b({MONTH_PATTERN})\s+(\d{{1,2}})(?:st|nd|rd|th)?\s*(?:-|to|{EN_DASH})\s*(\d{{1,2}})"
    rf"(?:st|nd|rd|th)?(?:,?\s*(\d{{4}}))?\b",
    re.IGNORECASE,
)
RE_TIME_RANGE: Final = re.compile(
    r"\b(\d{1,2})(?::(\d{2}))?\s*(am|pm)?\s*(?:-|to|"
    + EN_DASH
    + r"|and)\s*(\d{1,2})(?::(\d{2}))?\s*(am|pm)?\b",
    re.IGNORECASE,
)
RE_TIME_AMPM: Final = re.compile(r"\b(\d{1,2})(?::(\d{2}))?\s*(am|pm)\b", re.IGNORECASE)
RE_TIME_24H: Final = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)\b")

RE_CURRENCY_SYMBOL: Final = re.compile(r"[£$€]")
RE_CURRENCY_CODE: Final = re.compile(r"\b(USD|GBP|EUR|AUD|JOD)\b", re.IGNORECASE)
RE_CURRENCY_WORDS: Final = re.compile(r"\b(dollars?|usd|pounds?|gbp|euros?|eur)\b", re.IGNORECASE)
RE_NUMBER: Final = re.compile(r"\b\d{1,3}(?:,\d{3})*(?:\.\d+)?\b")
RE_CODE: Final = re.compile(r"\b[A-Z0-9]{4,}\b", re.IGNORECASE)
RE_TIME_AMPM_DOTS: Final = re.compile(
    r"\b(\d{1,2})(?::(\d{2}))?\s*(a\.m\.|p\.m\.)\b", re.IGNORECASE
)
RE_CURRENCY_AMOUNT_PREFIX: Final = re.compile(
    r"(?P<symbol>[£$€])\s*(?P<number>\d{1,3}(?:,\d{3})*(?:\.\d+)?)"
)
RE_CURRENCY_AMOUNT_SUFFIX: Final = re.compile(
    r"(?P<number>\d{1,3}(?:,\d{3})*(?:\.\d+)?)\s*"
    r"(?P<code>USD|GBP|EUR|AUD|JOD|dollars?|pounds?|euros?)\b",
    re.IGNORECASE,
)

LIST_SPLIT_PATTERN: Final = re.compile(r"\s*(?:,|;|\band\b|/)\s*", re.IGNORECASE)
TOKEN_PATTERN: Final = re.compile(r"[a-z0-9]+", re.IGNORECASE)

STOPWORDS: Final = frozenset(
    {
        "the",
        "a",
        "an",
        "of",
        "in",
        "at",
        "on",
        "for",
        "to",
        "and",
        "or",
        "by",
        "from",
        "with",
        "into",
        "is",
        "was",
        "were",
        "be",
        "been",
        "being",
    }
)

ADDRESS_KEYWORDS: Final = frozenset(
    {
        "street",
        "st",
        "road",
        "rd",
        "lane",
        "ln",
        "avenue",
        "ave",
        "drive",
        "dr",
        "place",
        "pl",
        "square",
        "sq",
        "close",
        "court",
        "ct",
        "way",
        "high",
        "highstreet",
        "boulevard",
        "blvd",
        "city",
        "town",
        "village",
        "county",
        "country",
        "oxford",
        "cambridge",
    }
)

NUMBER_WORDS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "zero": 0,
        "one": 1,
        "two": 2,
        "three": 3,
        "four": 4,
        "five": 5,
        "six": 6,
        "seven": 7,
        "eight": 8,
        "nine": 9,
        "ten": 10,
        "eleven": 11,
        "twelve": 12,
        "thirteen": 13,
        "fourteen": 14,
        "fifteen": 15,
        "sixteen": 16,
        "seventeen": 17,
        "eighteen": 18,
        "nineteen": 19,
        "twenty": 20,
    }
)

# The original joins a set here, so its alternation order varies between runs; every
# alternative is enclosed in \b...\b, so what the pattern matches does not depend on the order.
DAYS_OF_WEEK: Final = (
    "monday",
    "mon",
    "tuesday",
    "tue",
    "tues",
    "wednesday",
    "wed",
    "thursday",
    "thu",
    "thurs",
    "friday",
    "fri",
    "saturday",
    "sat",
    "sunday",
    "sun",
)

DAY_PATTERN: Final = re.compile(r"\b(" + "|".join(DAYS_OF_WEEK) + r")\b", re.IGNORECASE)

_CONTEXT_PATTERNS: Final = (
    r"\bit happened on\b",
    r"\bstarting at\b",
    r"\bfrom\s+\d",
    r"\bonwards\b",
    r"\btotaling\b",
    r"\bcomprising\b",
    r"\bwith pre-drinks at\b",
    r"\bwith pre-\w+\b",
    r"\band dinner at\b",
    r"\bdress code is\b",
    r"\bthe total cost was\b",
    r"\bcode:\s*",
    r"\bexpires?\s*",
)

_CURRENCY_SYMBOLS: Final[Mapping[str, str]] = MappingProxyType({"£": "GBP", "$": "USD", "€": "EUR"})

# strftime("%B") under the C locale.
_MONTH_NAMES: Final = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)

# Memory item ids: YYYYMMDD_HHMMSS (image/video) and emailNNNN (email).
_RE_MEDIA_ID: Final = re.compile(r"\b(\d{8}_\d{6})\b")
_RE_EMAIL_ID: Final = re.compile(r"\b(email\d+)\b", re.IGNORECASE)


def aggressive_preprocess(text: str) -> str:
    """normalizer.aggressive_preprocess: drop trailing periods, commas inside numbers and unit
    words after a count ("3 sessions" -> "3")."""
    cleaned = text.rstrip(".")
    cleaned = re.sub(r"(\d),(\d)", r"\1\2", cleaned)
    return re.sub(
        r"\b(\d+)\s+(spots?|hours?|sessions?|days?)\b",
        r"\1",
        cleaned,
        flags=re.IGNORECASE,
    )


def normalize_text(text: str) -> str:
    """normalizer.normalize_text: lower case, single spaces, no ordinal suffixes, no
    parentheticals, no commas inside numbers, no surrounding quotes or punctuation."""
    cleaned = re.sub(r"\s+", " ", text.strip().lower())
    cleaned = re.sub(r"\b(\d+)(st|nd|rd|th)\b", r"\1", cleaned)
    cleaned = re.sub(r"\([^)]+\)", "", cleaned)
    cleaned = re.sub(r"\s+", " ", cleaned)
    cleaned = re.sub(r"(\d),(\d)", r"\1\2", cleaned)
    return cleaned.strip("\t\n\r \"'`.,;:!?()[]{}")


def strip_parenthetical_details(text: str) -> str:
    """normalizer.strip_parenthetical_details: "£12.85 (with discount)" -> "£12.85"."""
    cleaned = re.sub(r"\([^)]+\)", "", text)
    return re.sub(r"\s+", " ", cleaned).strip()


def strip_currency_breakdowns(text: str) -> str:
    """normalizer.strip_currency_breakdowns: drops "totaling £30 for three sessions" and
    "comprising ..." tails, and "per 60-minute session" becomes "per session"."""
    cleaned = re.sub(
        r",?\s*totaling\s+[£$€]\d+(?:\.\d+)?\s+for\s+\w+\s+sessions?",
        "",
        text,
        flags=re.IGNORECASE,
    )
    cleaned = re.sub(r",?\s*comprising\s+.*$", "", cleaned, flags=re.IGNORECASE)
    cleaned = re.sub(r"per\s+\d+[- ]minute\s+session", "per session", cleaned, flags=re.IGNORECASE)
    return re.sub(r"\s+", " ", cleaned).strip()


def normalize_between_to_range(text: str) -> str:
    """normalizer.normalize_between_to_range: "Between April 20 and April 26" -> "April 20 to
    April 26". As in the original, every " and " becomes " to ", not only after "between"."""
    cleaned = re.sub(r"\bbetween\s+", "", text, flags=re.IGNORECASE)
    return re.sub(r"\s+and\s+", " to ", cleaned, flags=re.IGNORECASE)


def strip_leading_articles(text: str) -> str:
    """normalizer.strip_leading_articles: "A Star Wars-themed event" -> "Star Wars-themed
    event"."""
    return re.sub(r"^\s*(a|an|the)\s+", "", text, flags=re.IGNORECASE)


def strip_context_phrases(text: str) -> str:
    """normalizer.strip_context_phrases: lower case, without filler phrases ("it happened on",
    "starting at", ...) and day-of-week names."""
    cleaned = text.lower()
    for pattern in _CONTEXT_PATTERNS:
        cleaned = re.sub(pattern, " ", cleaned, flags=re.IGNORECASE)
    cleaned = DAY_PATTERN.sub(" ", cleaned)
    return re.sub(r"\s+", " ", cleaned).strip()


def is_abstention(text: str) -> bool:
    """normalizer.is_abstention: an abstention phrase occurs anywhere in the normalised text
    (a substring test, so "the unknown soldier" counts too, as in the original)."""
    normalized = normalize_text(text)
    return any(phrase in normalized for phrase in ABSTENTION_PHRASES)


def _month_to_number(name: str) -> int | None:
    return MONTHS.get(name.lower())


def _format_date(year: int | None, month: int, day: int) -> str:
    # `if year` as in the original: a year 0 is written as no year.
    if year:
        return f"{year:04d}{month:02d}{day:02d}"
    return f"{month:02d}{day:02d}"


def _format_range(year: int | None, month: int, start_day: int, end_day: int) -> str:
    if year:
        start = f"{year:04d}{month:02d}{start_day:02d}"
        end = f"{year:04d}{month:02d}{end_day:02d}"
    else:
        start = f"{month:02d}{start_day:02d}"
        end = f"{month:02d}{end_day:02d}"
    return f"{start}-{end}"


def extract_dates(text: str) -> tuple[str, ...]:
    """normalizer.extract_dates: the dates in `text`, as "YYYYMMDD", "MMDD" without a year, or
    "start-end" for a day range within a month, first occurrence order, without repeats."""
    tokens: list[str] = []
    for match in RE_ISO_DATE.finditer(text):
        year, month, day = int(match.group(1)), int(match.group(2)), int(match.group(3))
        tokens.append(_format_date(year, month, day))
    for match in RE_COMPACT_DATE.finditer(text):
        year, month, day = int(match.group(1)), int(match.group(2)), int(match.group(3))
        tokens.append(_format_date(year, month, day))
    for match in RE_MONTH_RANGE.finditer(text):
        range_month = _month_to_number(match.group(1))
        if not range_month:
            continue
        range_year = int(match.group(4)) if match.group(4) else None
        tokens.append(
            _format_range(range_year, range_month, int(match.group(2)), int(match.group(3)))
        )

    text_without_ranges = RE_MONTH_RANGE.sub(" ", text)
    for match in RE_MONTH_DAY.finditer(text_without_ranges):
        named_month = _month_to_number(match.group(1))
        if not named_month:
            continue
        named_year = int(match.group(3)) if match.group(3) else None
        tokens.append(_format_date(named_year, named_month, int(match.group(2))))
    for match in RE_DAY_MONTH.finditer(text_without_ranges):
        named_month = _month_to_number(match.group(2))
        if not named_month:
            continue
        named_year = int(match.group(3)) if match.group(3) else None
        tokens.append(_format_date(named_year, named_month, int(match.group(1))))
    return dedupe_tokens(tokens)


def _normalize_time(hour: int, minute: int, ampm: str | None) -> str:
    if ampm:
        ampm = ampm.lower()
        if hour == 12:
            hour = 0
        if ampm == "pm":
            hour += 12
    return f"{hour:02d}:{minute:02d}"


def extract_times(text: str) -> tuple[str, ...]:
    """normalizer.extract_times: the times in `text` as "HH:MM" (24 h) and ranges as
    "HH:MM-HH:MM", first occurrence order, without repeats. A range's start takes the end's
    am/pm when it has none."""
    tokens: list[str] = []

    normalized = text.lower()
    normalized = normalized.replace("noon", "12:00")
    normalized = normalized.replace("midday", "12:00")
    normalized = normalized.replace("midnight", "00:00")
    normalized = normalized.replace("a.m.", "am").replace("p.m.", "pm")
    normalized = normalized.replace("a. m.", "am").replace("p. m.", "pm")
    normalized = RE_TIME_AMPM_DOTS.sub(
        lambda m: f"{m.group(1)}:{m.group(2) or '00'}{m.group(3)[0]}m", normalized
    )

    for match in RE_TIME_RANGE.finditer(normalized):
        start_ampm = match.group(3)
        end_ampm = match.group(6)
        if start_ampm is None and end_ampm is not None:
            start_ampm = end_ampm
        start = _normalize_time(int(match.group(1)), int(match.group(2) or 0), start_ampm)
        end = _normalize_time(int(match.group(4)), int(match.group(5) or 0), end_ampm)
        tokens.append(f"{start}-{end}")

    text_without_ranges = RE_TIME_RANGE.sub(" ", normalized)
    for match in RE_TIME_24H.finditer(text_without_ranges):
        tokens.append(_normalize_time(int(match.group(1)), int(match.group(2)), None))
    for match in RE_TIME_AMPM.finditer(text_without_ranges):
        tokens.append(
            _normalize_time(int(match.group(1)), int(match.group(2) or 0), match.group(3))
        )
    return dedupe_tokens(tokens)


def remove_date_time_text(text: str) -> str:
    """normalizer.remove_date_time_text: `text` with every date and time blanked out."""
    cleaned = RE_ISO_DATE.sub(" ", text)
    cleaned = RE_COMPACT_DATE.sub(" ", cleaned)
    cleaned = RE_MONTH_RANGE.sub(" ", cleaned)
    cleaned = RE_MONTH_DAY.sub(" ", cleaned)
    cleaned = RE_DAY_MONTH.sub(" ", cleaned)
    cleaned = RE_TIME_RANGE.sub(" ", cleaned)
    cleaned = RE_TIME_24H.sub(" ", cleaned)
    cleaned = RE_TIME_AMPM.sub(" ", cleaned)
    cleaned = RE_TIME_AMPM_DOTS.sub(" ", cleaned)
    cleaned = cleaned.replace("noon", " ").replace("midday", " ").replace("midnight", " ")
    cleaned = cleaned.replace("a.m.", " ").replace("p.m.", " ")
    return cleaned.replace("a. m.", " ").replace("p. m.", " ")


def _normalize_decimal(value: str) -> Decimal | None:
    try:
        return Decimal(value.replace(",", ""))
    except (InvalidOperation, ValueError):
        return None


def _replace_number_words(text: str) -> str:
    # Case-sensitive per token, as in the original: "Three" and "three" are replaced in turn.
    for token in TOKEN_PATTERN.findall(text):
        lower = token.lower()
        if lower in NUMBER_WORDS:
            text = re.sub(rf"\b{re.escape(token)}\b", str(NUMBER_WORDS[lower]), text)
    return text


def extract_currency_amounts(text: str) -> tuple[Decimal, ...]:
    """normalizer.extract_currency_amounts: the amounts written with a currency symbol before or
    a currency code/word after them ("£12.85", "12.85 pounds", "three dollars"), normalised
    Decimals, without repeats."""
    amounts: list[Decimal] = []
    normalized = _replace_number_words(text)
    normalized = re.sub(r"(\d),(\d)", r"\1\2", normalized)
    for pattern in (RE_CURRENCY_AMOUNT_PREFIX, RE_CURRENCY_AMOUNT_SUFFIX):
        for match in pattern.finditer(normalized):
            number = _normalize_decimal(match.group("number"))
            if number is not None:
                amounts.append(number.normalize())
    return dedupe_tokens(amounts)


def extract_numbers(text: str) -> tuple[tuple[Decimal, ...], tuple[str, ...]]:
    """normalizer.extract_numbers: (the numbers in `text`, number words included, as normalised
    Decimals with repeats; the currencies it names, by code, word or symbol, with repeats)."""
    currencies: list[str] = [match.group(1).upper() for match in RE_CURRENCY_CODE.finditer(text)]
    for match in RE_CURRENCY_WORDS.finditer(text):
        word = match.group(1).lower()
        if "usd" in word or "dollar" in word:
            currencies.append("USD")
        elif "gbp" in word or "pound" in word:
            currencies.append("GBP")
        elif "eur" in word or "euro" in word:
            currencies.append("EUR")
    for symbol_match in RE_CURRENCY_SYMBOL.finditer(text):
        mapped = _CURRENCY_SYMBOLS.get(symbol_match.group(0))
        if mapped:
            currencies.append(mapped)

    values: list[Decimal] = []
    for match in RE_NUMBER.finditer(_replace_number_words(text)):
        number = _normalize_decimal(match.group(0))
        if number is not None:
            values.append(number.normalize())
    return tuple(values), tuple(currencies)


def extract_codes(text: str) -> tuple[str, ...]:
    """normalizer.extract_codes: upper-cased alphanumeric codes of 4+ characters mixing letters
    and digits (booking references and the like), ordinal dates such as "25TH" excepted."""
    tokens: list[str] = []
    for match in RE_CODE.finditer(text):
        value = match.group(0)
        if re.match(r"^\d{1,2}(ST|ND|RD|TH)$", value.upper()):
            continue
        if any(char.isalpha() for char in value) and any(char.isdigit() for char in value):
            tokens.append(value.upper())
    return dedupe_tokens(tokens)


def normalize_currency_codes(currencies: Iterable[str]) -> tuple[str, ...]:
    """normalizer.normalize_currency_codes: the distinct currency codes, sorted."""
    normalized: set[str] = set()
    for currency in currencies:
        upper = currency.upper()
        if upper in ("GBP", "POUNDS", "POUND", "£"):
            normalized.add("GBP")
        elif upper in ("USD", "DOLLARS", "DOLLAR", "$"):
            normalized.add("USD")
        elif upper in ("EUR", "EUROS", "EURO", "€"):
            normalized.add("EUR")
        else:
            normalized.add(upper)
    return tuple(sorted(normalized))


def tokenize(text: str) -> list[str]:
    """normalizer.tokenize: the lower-cased runs of ASCII letters and digits."""
    return [token.lower() for token in TOKEN_PATTERN.findall(text)]


def split_list_items(text: str) -> list[str]:
    """normalizer.split_list_items: the items of a list answer, split on commas, semicolons,
    the word "and" and slashes, each normalize_text-ed; empty items are dropped before
    normalising (so an item normalising to "" stays, as in the original)."""
    items = [item.strip() for item in LIST_SPLIT_PATTERN.split(text) if item.strip()]
    return [normalize_text(item) for item in items if item]


def token_subset_match(ground_truth: str, prediction: str) -> bool:
    """normalizer.token_subset_match: every non-stopword gold token occurs in the prediction;
    true when the gold answer has none."""
    gt_tokens = [token for token in tokenize(ground_truth) if token not in STOPWORDS]
    pred_tokens = set(tokenize(prediction))
    return all(token in pred_tokens for token in gt_tokens)


def location_token_match(ground_truth: str, prediction: str) -> bool:
    """normalizer.location_token_match: for a gold answer with an address word ("street",
    "road", ...), every non-stopword, non-numeric gold token occurs in the prediction."""
    gt_tokens = tokenize(ground_truth)
    if not any(token in ADDRESS_KEYWORDS for token in gt_tokens):
        return False
    filtered = [token for token in gt_tokens if token not in STOPWORDS and not token.isdigit()]
    if not filtered:
        return False
    pred_tokens = set(tokenize(prediction))
    return all(token in pred_tokens for token in filtered)


def extract_reference_date(text: str) -> date | None:
    """normalizer.extract_reference_date: the first full date (with a year) in `text`. Like the
    original it raises ValueError for an impossible one ("2024-02-30")."""
    for value in extract_dates(text):
        if len(value) == 8:
            return date(int(value[0:4]), int(value[4:6]), int(value[6:8]))
    return None


def resolve_relative_dates(text: str, reference: date | None) -> str:
    """normalizer.resolve_relative_dates: "today", "tonight", "tomorrow", "yesterday" (lower,
    capitalised or upper case, as substrings) become "<Month> <DD>" relative to `reference`."""
    if not reference:
        return text
    mapping = (
        ("today", reference),
        ("tonight", reference),
        ("tomorrow", reference + timedelta(days=1)),
        ("yesterday", reference - timedelta(days=1)),
    )
    resolved = text
    for key, value in mapping:
        month_day = f"{_MONTH_NAMES[value.month - 1]} {value.day:02d}"
        if key in resolved.lower():
            for pattern in (key, key.capitalize(), key.upper()):
                if pattern in resolved:
                    resolved = resolved.replace(pattern, month_day)
                    break
    return re.sub(
        r"(today|tonight|tomorrow|yesterday)\s*\([^)]+\)",
        r"\1",
        resolved,
        flags=re.IGNORECASE,
    )


def semantic_units_match(ground_truth: str, prediction: str) -> bool:
    """normalizer.semantic_units_match, the exact-match rule's last resort: gold dates (by month
    and day), times (when both have some) and currency amounts are in the prediction, and at
    least 80% of the gold content words (3+ letters, not stopwords) are too."""
    gt_dates = extract_dates(ground_truth)
    pr_dates = extract_dates(prediction)
    gt_times = extract_times(ground_truth)
    pr_times = extract_times(prediction)
    gt_amounts = extract_currency_amounts(ground_truth)
    pr_amounts = extract_currency_amounts(prediction)

    if gt_dates:
        if not pr_dates:
            return False
        if not any(gt[-4:] == pr[-4:] for gt in set(gt_dates) for pr in set(pr_dates)):
            return False
    if gt_times and pr_times and not set(gt_times) & set(pr_times):
        return False
    if gt_amounts and (not pr_amounts or set(gt_amounts) != set(pr_amounts)):
        return False

    gt_content = {t for t in tokenize(ground_truth) if t not in STOPWORDS and len(t) > 2}
    pr_content = {t for t in tokenize(prediction) if t not in STOPWORDS and len(t) > 2}
    if not gt_content:
        return True
    return len(gt_content & pr_content) / len(gt_content) >= 0.8


def dedupe_tokens(tokens: Iterable[_T]) -> tuple[_T, ...]:
    """normalizer.dedupe_tokens: `tokens` in order, each kept at its first occurrence."""
    return tuple(dict.fromkeys(tokens))


def date_component_match(gt: str, pred: str) -> bool:
    """evaluate_qa.date_component_match: when either side has no year ("MMDD"), month and day
    decide; otherwise the whole date."""
    if len(gt) == 4 or len(pred) == 4:
        return gt[-4:] == pred[-4:]
    return gt == pred


def date_token_match(gt_token: str, pred_token: str) -> bool:
    """evaluate_qa.date_token_match: a gold range matches only a range with matching ends."""
    if "-" in gt_token:
        if "-" not in pred_token:
            return False
        gt_start, gt_end = gt_token.split("-", 1)
        pred_start, pred_end = pred_token.split("-", 1)
        return date_component_match(gt_start, pred_start) and date_component_match(gt_end, pred_end)
    return date_component_match(gt_token, pred_token)


def dates_match(gt_tokens: Iterable[str], pred_tokens: Iterable[str]) -> bool:
    """evaluate_qa.dates_match: each gold date consumes a distinct matching predicted date,
    greedily in order."""
    remaining = list(pred_tokens)
    for gt_token in gt_tokens:
        for index, pred_token in enumerate(remaining):
            if date_token_match(gt_token, pred_token):
                del remaining[index]
                break
        else:
            return False
    return True


def tokens_match(expected: Iterable[Hashable], actual: Iterable[Hashable]) -> bool:
    """evaluate_qa.tokens_match: equal as multisets."""
    return Counter(expected) == Counter(actual)


def extract_list_ids(text: str) -> tuple[str, ...]:
    """evaluate_qa._extract_list_ids_from_text: the memory item ids in `text`, media ids
    (YYYYMMDD_HHMMSS) first, then email ids lower-cased, each once."""
    if not text:
        return ()
    media = (match.group(1) for match in _RE_MEDIA_ID.finditer(text))
    emails = (match.group(1).lower() for match in _RE_EMAIL_ID.finditer(text))
    return dedupe_tokens([*media, *emails])
