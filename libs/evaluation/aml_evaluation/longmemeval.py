"""The LongMemEval format (xiaowu0162/LongMemEval, "LongMemEval: Benchmarking Chat Assistants on
Long-Term Interactive Memory", ICLR 2025; the cleaned release is HF
``xiaowu0162/longmemeval-cleaned``, e.g. ``longmemeval_s_cleaned.json``), read into a
:class:`Dataset`. No LongMemEval data is shipped: the operator places the files.

**Files.** Every file of a bundle is a JSON list of instances, concatenated in manifest order.
An instance (the repository's README, "Dataset Format") has ``question_id``, ``question_type``,
``question``, ``answer``, ``question_date``, ``haystack_session_ids``, ``haystack_dates`` and
``haystack_sessions`` (a list of sessions, each a list of ``{"role", "content"}`` turns; a turn
holding evidence also carries ``has_answer: true``), and usually ``answer_session_ids``. Other
fields are ignored.

**Conversations.** Each instance is its own user: one :class:`Conversation` per instance, with
``conversation_id`` = ``question_id``, holding the instance's haystack and then its one
question. Session ``i`` is ``haystack_session_ids[i]`` (its ``session_key``, kept as is) dated
``haystack_dates[i]`` with the turns ``haystack_sessions[i]``; ``Session.index`` is ``i + 1``,
the source position. Sessions are sorted by date (stable: equal dates keep source order), so
memory is written in the order the user lived it; the ``_s`` and ``_m`` files are already
sorted, the oracle file is not. The three lists must have the same length and the session ids
must be distinct within an instance. The turns keep their role (``user`` or ``assistant``; any
other role is an error) and their text: the conversation has ``speakers_are_roles`` set, so the
chunker sends each turn under its own role with the content unchanged, and every message carries
its session's date as its timestamp. ``turn_id`` is ``f"{session_id}:t{j}"``, ``j`` the turn's
0-based position in the source session. A turn whose content is empty (or only whitespace) is
skipped, because the participant contract forbids empty content; a session left without turns
is skipped too.

**Dates.** LongMemEval writes dates as ``"2023/05/20 (Sat) 02:21"``: ``YYYY/MM/DD``, an
optional English weekday abbreviation in parentheses, and a 24-hour ``HH:MM``. They carry no
time zone; AML reads the wall-clock time **as UTC** (like LoCoMo's, see
:mod:`aml_evaluation.datasets`) and parses by hand, never with ``strptime``, so nothing depends
on the process locale. The date decides; the weekday is checked only to be a weekday name.

**Categories.** ``question_type`` is one of LongMemEval's six types, numbered in a fixed order
(:data:`LONGMEMEVAL_CATEGORIES`): 1 ``single-session-user``, 2 ``single-session-assistant``,
3 ``single-session-preference``, 4 ``multi-session``, 5 ``temporal-reasoning``, 6
``knowledge-update``. Any other type is an error. The category's name is the manifest's name for
that number (a draft manifest without categories, while ``aml dataset add`` checks the file,
gets these six).

**Abstention.** A ``question_id`` ending in ``_abs`` is an abstention question: the history does
not contain what it asks. It is NOT a category of its own (LongMemEval reports it within its
type, as here). Its gold is that the answer is not there: ``Question.answer`` is None
(:attr:`Question.unanswerable`, the same path as LoCoMo's adversarial questions: the F1
variants' abstention rule, no BLEU-1), and the source's ``answer``, an explanation of why it
cannot be answered, is kept as ``gold_explanation`` and shown only to the judge.

**Judging.** Each question carries the judge rule of its type (``judge_rule``, see
:data:`aml_evaluation.judging.JUDGE_RULE_PROMPTS`), following LongMemEval's own answer check
(``src/evaluation/evaluate_qa.py``, ``get_anscheck_prompt``): temporal-reasoning tolerates
off-by-one counts, knowledge-update accepts older information next to the updated answer,
single-session-preference is graded against the rubric that its ``answer`` is, an ``_abs``
question is correct iff the response says it cannot be answered; the other three types use the
release's standard judge. Token F1 is still computed, in the manifest's variant.

**Question date.** ``question_date`` (when the user asks) is checked like the session dates and
kept as written in ``Question.question_date``: the answer model is told ``Current date: ...``
(:func:`aml_evaluation.prompts.question_with_options`), as LongMemEval's own answer prompts do;
the participant's Search receives the question text alone (R-4.7).

**Errors and bounds.** Malformed input raises ValueError naming the file and the instance (by
``question_id`` when it has one, else by position). Work is linear in the input, and inputs
beyond :data:`MAX_INSTANCES` instances, :data:`MAX_SESSIONS` sessions per instance,
:data:`MAX_TURNS` turns per session, :data:`MAX_TOTAL_TURNS` turns in all or
:data:`MAX_TEXT_CHARS` characters in one text are refused before they are processed further.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from aml_evaluation.datasets import (
    DEFAULT_F1_VARIANT,
    DEFAULT_SCORER,
    BundleManifest,
    Conversation,
    Dataset,
    ItemFormat,
    Question,
    Session,
    Turn,
)
from aml_evaluation.judging import LONGMEMEVAL_ABSTENTION_RULE

LONGMEMEVAL_CATEGORIES: Final[Mapping[int, str]] = {
    1: "single-session-user",
    2: "single-session-assistant",
    3: "single-session-preference",
    4: "multi-session",
    5: "temporal-reasoning",
    6: "knowledge-update",
}
# The judge rule of each question type (None: the release's standard judge prompt).
TYPE_JUDGE_RULES: Final[Mapping[str, str | None]] = {
    "single-session-user": None,
    "single-session-assistant": None,
    "single-session-preference": "longmemeval-preference",
    "multi-session": None,
    "temporal-reasoning": "longmemeval-temporal",
    "knowledge-update": "longmemeval-knowledge-update",
}
ABSTENTION_SUFFIX: Final = "_abs"
ROLES: Final = ("user", "assistant")
REQUIRED_FIELDS: Final = (
    "question_id",
    "question_type",
    "question",
    "answer",
    "question_date",
    "haystack_session_ids",
    "haystack_dates",
    "haystack_sessions",
)

# Bounds (the real files: 500 instances; _s about 50 sessions each, _m about 500).
MAX_INSTANCES: Final = 100_000
MAX_SESSIONS: Final = 10_000
MAX_TURNS: Final = 10_000
MAX_TOTAL_TURNS: Final = 20_000_000
MAX_TEXT_CHARS: Final = 1_000_000

_TYPE_IDS: Final[Mapping[str, int]] = {name: n for n, name in LONGMEMEVAL_CATEGORIES.items()}
# Ids become parts of user ids, session ids, item ids and URLs: no separators, no spaces.
_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_DATE: Final = re.compile(
    r"\s*(\d{4})/(\d{1,2})/(\d{1,2})(?:\s*\(([A-Za-z]{3})\))?\s+(\d{1,2}):(\d{2})\s*"
)
_WEEKDAYS: Final = frozenset({"mon", "tue", "wed", "thu", "fri", "sat", "sun"})


# What the parser reads of a bundle manifest.
LongMemEvalManifest = BundleManifest


def parse_longmemeval_datetime(text: str) -> int:
    """Unix ms of a LongMemEval date string read as UTC wall-clock time (module docstring)."""
    if len(text) > 100:
        raise ValueError(f"not a LongMemEval date: {text[:100]!r}...")
    match = _DATE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a LongMemEval date: {text!r}")
    year_text, month_text, day_text, weekday, hour_text, minute_text = match.groups()
    year, month, day = int(year_text), int(month_text), int(day_text)
    hour, minute = int(hour_text), int(minute_text)
    if (
        not 1 <= month <= 12
        or not 1 <= day <= calendar.monthrange(year, month)[1]
        or hour > 23
        or minute > 59
        or (weekday is not None and weekday.lower() not in _WEEKDAYS)
    ):
        raise ValueError(f"not a LongMemEval date: {text!r}")
    return calendar.timegm((year, month, day, hour, minute, 0, 0, 0, 0)) * 1000


def parse(contents: Sequence[tuple[str, bytes]], manifest: LongMemEvalManifest) -> Dataset:
    """The dataset of a LongMemEval bundle (the registry's parser of format "longmemeval"):
    every file is a JSON list of instances, concatenated in manifest order."""
    instances: list[tuple[str, Mapping[str, Any]]] = []
    for name, content in contents:
        try:
            parsed = json.loads(content)
        except ValueError as error:
            raise ValueError(f"{name}: not JSON: {error}") from None
        if not isinstance(parsed, list):
            raise ValueError(f"{name}: a LongMemEval file is a JSON list of instances")
        if len(instances) + len(parsed) > MAX_INSTANCES:
            raise ValueError(f"{name}: more than {MAX_INSTANCES} instances in the bundle")
        for position, item in enumerate(parsed):
            if not isinstance(item, dict):
                raise ValueError(f"{name} instance [{position}]: not a JSON object")
            instances.append((name, item))
    return parse_instances(instances, manifest)


def parse_instances(
    instances: Sequence[tuple[str, Mapping[str, Any]]], manifest: LongMemEvalManifest
) -> Dataset:
    """The dataset of LongMemEval instances read from a bundle's files, as (file name,
    instance): what :func:`parse` does once the files are read, and the registry's streaming
    read (:data:`ITEMS`) a few instances at a time."""
    return _dataset(
        instances,
        manifest.dataset_id,
        manifest.version,
        categories=manifest.categories or LONGMEMEVAL_CATEGORIES,
        scorer=manifest.scorer,
        f1_variant=manifest.f1_variant,
    )


def parse_longmemeval(
    instances: Sequence[Mapping[str, Any]],
    dataset_id: str,
    version: str,
    *,
    categories: Mapping[int, str] = LONGMEMEVAL_CATEGORIES,
    scorer: str = DEFAULT_SCORER,
    f1_variant: str = DEFAULT_F1_VARIANT,
) -> Dataset:
    """The dataset of parsed LongMemEval instances (pure; see the module docstring)."""
    if len(instances) > MAX_INSTANCES:
        raise ValueError(f"dataset {dataset_id!r}: more than {MAX_INSTANCES} instances")
    return _dataset(
        [("instances", item) for item in instances],
        dataset_id,
        version,
        categories=categories,
        scorer=scorer,
        f1_variant=f1_variant,
    )


def _dataset(
    instances: Sequence[tuple[str, Mapping[str, Any]]],
    dataset_id: str,
    version: str,
    *,
    categories: Mapping[int, str],
    scorer: str,
    f1_variant: str,
) -> Dataset:
    if f1_variant == "f1-locomo-category-v1":
        # That variant decides by LoCoMo's category numbers, which these are not.
        raise ValueError(
            f"dataset {dataset_id!r}: f1 variant {f1_variant!r} applies to LoCoMo's categories "
            "only; a LongMemEval dataset takes f1-locomo-v1 or f1-set-v1"
        )
    conversations: list[Conversation] = []
    questions: list[Question] = []
    seen: dict[str, str] = {}
    budget = _TurnBudget()
    for position, (file_name, raw) in enumerate(instances):
        where = _where(file_name, position, raw)
        conversation, question = _instance(where, raw, categories, budget)
        if question.question_id in seen:
            raise ValueError(
                f"{where}: question_id given twice (also in {seen[question.question_id]})"
            )
        seen[question.question_id] = file_name
        conversations.append(conversation)
        questions.append(question)
    return Dataset(
        dataset_id=dataset_id,
        version=version,
        categories=dict(categories),
        scorer=scorer,
        f1_variant=f1_variant,
        conversations=conversations,
        questions=questions,
    )


# Read an instance at a time (aml_evaluation.registry.open_dataset_stream): every instance is
# one conversation, its question_id; the bundle's bounds are checked over the whole read.
ITEMS: Final = ItemFormat(parse=parse_instances, max_items=MAX_INSTANCES, max_turns=MAX_TOTAL_TURNS)


class _TurnBudget:
    """Counts turns across the whole input, to refuse an absurd one early."""

    def __init__(self) -> None:
        self.turns = 0

    def take(self, where: str, turns: int) -> None:
        self.turns += turns
        if self.turns > MAX_TOTAL_TURNS:
            raise ValueError(f"{where}: more than {MAX_TOTAL_TURNS} turns in the dataset")


def _where(file_name: str, position: int, raw: Mapping[str, Any]) -> str:
    question_id = raw.get("question_id")
    if isinstance(question_id, str) and _ID.fullmatch(question_id):
        return f"{file_name} instance {question_id!r}"
    return f"{file_name} instance [{position}]"


def _text(where: str, field: str, value: object, *, numbers: bool = False) -> str:
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {field} is not a string")
    if len(value) > MAX_TEXT_CHARS:
        raise ValueError(f"{where}: {field} is longer than {MAX_TEXT_CHARS} characters")
    return value


def _list(where: str, field: str, value: object, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: {field} is not a list")
    if len(value) > limit:
        raise ValueError(f"{where}: {field} has more than {limit} items")
    return value


def _date(where: str, field: str, value: object) -> tuple[str, int]:
    text = _text(where, field, value)
    try:
        return text, parse_longmemeval_datetime(text)
    except ValueError as error:
        raise ValueError(f"{where}: {field}: {error}") from None


def _instance(
    where: str, raw: Mapping[str, Any], categories: Mapping[int, str], budget: _TurnBudget
) -> tuple[Conversation, Question]:
    missing = [field for field in REQUIRED_FIELDS if field not in raw]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    question_id = _text(where, "question_id", raw["question_id"])
    if not _ID.fullmatch(question_id):
        raise ValueError(f"{where}: question_id {question_id!r} is not a plain id")
    question_type = _text(where, "question_type", raw["question_type"])
    number = _TYPE_IDS.get(question_type)
    if number is None:
        raise ValueError(
            f"{where}: unknown question_type {question_type!r} "
            f"(one of {', '.join(LONGMEMEVAL_CATEGORIES.values())})"
        )
    if number not in categories:
        raise ValueError(f"{where}: the manifest declares no category {number} ({question_type})")
    question_date, _ = _date(where, "question_date", raw["question_date"])
    conversation = Conversation(
        conversation_id=question_id,
        speakers=ROLES,
        sessions=_sessions(where, raw, budget),
        speakers_are_roles=True,
    )
    abstention = question_id.endswith(ABSTENTION_SUFFIX)
    answer = _text(where, "answer", raw["answer"], numbers=True)
    evidence = _list(where, "answer_session_ids", raw.get("answer_session_ids", []), MAX_SESSIONS)
    question = Question(
        question_id=question_id,
        conversation_id=question_id,
        question=_text(where, "question", raw["question"]),
        answer=None if abstention else answer,
        category=number,
        category_name=categories[number],
        evidence=[_text(where, "answer_session_ids", item) for item in evidence],
        adversarial=False,
        judge_rule=LONGMEMEVAL_ABSTENTION_RULE if abstention else TYPE_JUDGE_RULES[question_type],
        gold_explanation=answer if abstention else None,
        question_date=question_date,
    )
    return conversation, question


def _sessions(where: str, raw: Mapping[str, Any], budget: _TurnBudget) -> list[Session]:
    ids = _list(where, "haystack_session_ids", raw["haystack_session_ids"], MAX_SESSIONS)
    dates = _list(where, "haystack_dates", raw["haystack_dates"], MAX_SESSIONS)
    bodies = _list(where, "haystack_sessions", raw["haystack_sessions"], MAX_SESSIONS)
    if not len(ids) == len(dates) == len(bodies):
        raise ValueError(
            f"{where}: {len(ids)} haystack_session_ids, {len(dates)} haystack_dates and "
            f"{len(bodies)} haystack_sessions; they must be as many"
        )
    seen: set[str] = set()
    dated: list[tuple[int, int, Session]] = []
    for position, (session_id, date, body) in enumerate(zip(ids, dates, bodies, strict=True)):
        at = f"{where} session [{position}]"
        key = _text(at, "haystack_session_ids", session_id)
        if not _ID.fullmatch(key):
            raise ValueError(f"{at}: session id {key!r} is not a plain id")
        if key in seen:
            raise ValueError(f"{at}: session id {key!r} given twice")
        seen.add(key)
        at = f"{where} session {key!r}"
        date_text, timestamp_ms = _date(at, "haystack_dates", date)
        turns = _turns(at, key, _list(at, "haystack_sessions", body, MAX_TURNS))
        budget.take(at, len(turns))
        if turns:
            session = Session(
                session_key=key,
                index=position + 1,
                date_text=date_text,
                timestamp_ms=timestamp_ms,
                turns=turns,
            )
            dated.append((timestamp_ms, position, session))
    # By date; equal dates keep the source order.
    return [session for _, _, session in sorted(dated, key=lambda item: item[:2])]


def _turns(where: str, session_id: str, raw_turns: list[Any]) -> list[Turn]:
    turns: list[Turn] = []
    for index, raw in enumerate(raw_turns):
        at = f"{where} turn [{index}]"
        if not isinstance(raw, dict) or "role" not in raw or "content" not in raw:
            raise ValueError(f"{at}: not an object with role and content")
        role = raw["role"]
        if role not in ROLES:
            raise ValueError(f"{at}: role {role!r} is neither user nor assistant")
        content = _text(at, "content", raw["content"])
        if content.strip():
            turns.append(Turn(turn_id=f"{session_id}:t{index}", speaker=role, text=content))
    return turns
