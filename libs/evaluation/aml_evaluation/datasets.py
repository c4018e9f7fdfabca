"""Benchmark datasets: the domain models and the LoCoMo parser (bundles: aml_evaluation.registry).

**Session date rule (LoCoMo).** LoCoMo stamps each session with a wall-clock string such as
``"1:56 pm on 8 May, 2023"`` or ``"10:37 am on 27 June, 2023"`` and gives no time zone. AML reads
it as ``H:MM am|pm on D Month, YYYY`` (12-hour clock, English month name, case-insensitive
``am``/``pm`` and month, any run of spaces between tokens), takes that wall-clock time **as UTC**,
and stores ``Session.timestamp_ms`` = Unix milliseconds of that instant (seconds and milliseconds
are 0). ``12:xx am`` is just after midnight and ``12:xx pm`` just after noon. Parsing is done by
hand rather than with ``strptime`` so the result never depends on the process locale. A string
that does not match raises ``ValueError`` naming the sample and the session.

**Question ids.** LoCoMo repeats question strings within a sample, so a question is identified by
its position in the sample's ``qa`` list: ``f"{sample_id}:q{index:04d}"``, ``index`` 0-based.
Ids are stable for a given file; a file that removes a question (the dial481 fix) shifts the ids
after it, which is fine because ids are only compared within one dataset bundle.

**Answers.** Some answers are integers in the source and become strings. Category 5
(adversarial) items usually carry only ``adversarial_answer``: the answer a question with a
false premise invites (it is about the other speaker, or never said), NOT the truth. The gold of
such a question is that the conversation does not contain the answer, so its ``answer`` is
``None`` (:attr:`Question.unanswerable`) and the trap is kept apart in ``adversarial_answer``,
never used as a gold. Two items in locomo10 carry both ``answer`` and ``adversarial_answer``;
there the transcript supports ``answer``, which stays their gold. Any other item needs an
``answer``.

**Bundles.** Hash-checked dataset bundles, their manifests and the registry of shipped and
operator-registered datasets live in :mod:`aml_evaluation.registry`; it hands a LoCoMo bundle's
verified file contents to :func:`parse_locomo_bundle`.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from aml_evaluation.media import fit_image

LOCOMO_CATEGORIES: Final[Mapping[int, str]] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
LOCOMO_ADVERSARIAL_CATEGORY: Final = 5
DEFAULT_SCORER: Final = "llm_judge+token_f1"
DEFAULT_F1_VARIANT: Final = "f1-locomo-v1"

_SESSION_KEY = re.compile(r"session_(\d+)")
_LOCOMO_DATE = re.compile(
    r"\s*(\d{1,2}):(\d{2})\s+(am|pm)\s+on\s+(\d{1,2})\s+([A-Za-z]+),\s*(\d{4})\s*",
    re.IGNORECASE,
)
# Spelled out rather than taken from calendar.month_name, which follows the process locale.
_MONTHS: Final[Mapping[str, int]] = {
    "january": 1,
    "february": 2,
    "march": 3,
    "april": 4,
    "may": 5,
    "june": 6,
    "july": 7,
    "august": 8,
    "september": 9,
    "october": 10,
    "november": 11,
    "december": 12,
}


class BundleManifest(Protocol):
    """What a format's parser reads of a bundle manifest (registry.DatasetManifest has it).

    Declared here, below the registry, so that a parser never imports the registry that
    calls it."""

    @property
    def dataset_id(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def scorer(self) -> str: ...

    @property
    def f1_variant(self) -> str: ...

    @property
    def categories(self) -> Mapping[int, str]: ...


@dataclass(frozen=True)
class ItemFormat:
    """A format whose every file is a JSON list of objects ("items"), each one conversation with
    its questions, so that a bundle can be read an item at a time
    (:func:`aml_evaluation.registry.open_dataset_stream`) by the format's own rules.

    ``parse`` is those rules over some of the bundle's items, as (file name, item) in bundle
    order; parsing the items a few at a time gives the dataset's conversations and questions, in
    order, that parsing them all at once does. What the whole parse checks across items is then
    checked over the whole read: conversation ids (each item's) are distinct, at most
    ``max_items`` items and ``max_turns`` turns in all (None: no bound); a read that breaks one
    of them is parsed whole again, which refuses it with the format's own error."""

    parse: Callable[[Sequence[tuple[str, Mapping[str, Any]]], BundleManifest], Dataset]
    max_items: int | None = None
    max_turns: int | None = None


# ATM-Bench's answer types (its "qtype"), in the order of its categories.
AnswerType = Literal["number", "list_recall", "open_end"]
# How the platform tells which returned candidates are a question's evidence
# (aml_evaluation.evidence): "turn-text-v1", by the text it wrote for the evidence turns;
# "unit-id-v1", by the id it wrote at the head of each memory unit (ATM-Bench).
EvidenceRule = Literal["turn-text-v1", "unit-id-v1"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Turn(_Frozen):
    turn_id: str = Field(description='LoCoMo dia_id, e.g. "D1:3"')
    speaker: str
    text: str
    image_caption: str | None = None
    # Multimodal datasets (aml_evaluation.memgallery): the images the turn shares, as references
    # relative to the dataset's image directory (read by aml_evaluation.media), and the source's
    # ids of those images, in the same order (Mem-Gallery's visual-search answers name them).
    images: tuple[str, ...] = ()
    image_ids: tuple[str, ...] = ()
    # Coding datasets (aml_evaluation.coding.dataset): the trajectory step the turn is part of,
    # which an Add never splits (rule coding-v1), and the turn's own time in Unix ms when the
    # source dates it (None: the session's).
    step: int | None = None
    timestamp_ms: int | None = None


class Session(_Frozen):
    session_key: str = Field(description='e.g. "session_1"')
    index: int
    date_text: str
    timestamp_ms: int | None = Field(description="None: the source dates no session (PersonaMem)")
    turns: list[Turn]


class Conversation(_Frozen):
    conversation_id: str = Field(description="LoCoMo sample_id")
    speakers: tuple[str, str]
    sessions: list[Session]
    # True: a chat between a user and an assistant whose turns carry those roles (LongMemEval):
    # `speakers` are the roles ("user", "assistant") and the chunker sends each turn under its
    # role with its text unchanged, without LoCoMo's "speaker: " prefix.
    speakers_are_roles: bool = False

    @property
    def turn_count(self) -> int:
        return sum(len(session.turns) for session in self.sessions)


class Question(_Frozen):
    question_id: str
    conversation_id: str
    question: str
    answer: str | None = Field(
        description="The gold answer; None: the conversation does not contain the answer, "
        "and the correct response is to say so."
    )
    adversarial_answer: str | None = Field(
        default=None, description="LoCoMo's trap answer of an adversarial question; not a gold."
    )
    category: int
    category_name: str
    evidence: list[str]
    adversarial: bool
    options: list[str] | None = None
    # Which judge prompt grades the question (aml_evaluation.judging.JUDGE_RULE_PROMPTS);
    # None: the default judge, or the abstention judge when `answer` is None.
    judge_rule: str | None = None
    # Why the conversation does not contain the answer (LongMemEval's abstention "answer"):
    # shown to the judge of such a question, never a gold, never sent to the participant.
    gold_explanation: str | None = None
    # When the question is asked, as the source writes it (LongMemEval's question_date): the
    # answer model is told it ("Current date: ..."), so "how many days ago" has an anchor.
    question_date: str | None = None
    # Multimodal datasets: the images the question shows (Mem-Gallery's question_image), as
    # references relative to the dataset's image directory, and the source's caption of them.
    images: tuple[str, ...] = ()
    image_caption: str | None = None
    # Streaming datasets (SPEC ): where the question is asked, as numbers of the
    # conversation's turns written before it is searched, increasing; the question is searched
    # once at each. Empty: once, after the whole conversation.
    asked_at: tuple[int, ...] = ()
    # Coding datasets (SPEC ): the task attempted, and its type as the dataset declares it
    # ("debug", "development"); the planned question carries both to the solve and verify
    # stages.
    coding_task: str | None = None
    task_type: str | None = None
    # ATM-Bench (aml_evaluation.atmbench): the answer type that decides how the answer is scored
    # ("number": exact match, "list_recall": Jaccard, "open_end": the benchmark's judge).
    answer_type: AnswerType | None = None

    @field_validator("asked_at")
    @classmethod
    def _increasing_points(cls, points: tuple[int, ...]) -> tuple[int, ...]:
        if any(point < 0 for point in points) or any(a >= b for a, b in pairwise(points)):
            raise ValueError(f"asked_at {list(points)} must be increasing turn counts from 0")
        return points

    @property
    def unanswerable(self) -> bool:
        """The gold is that the conversation does not contain the answer (abstention)."""
        return self.answer is None


def question_at_point(question_id: str, point: int) -> str:
    """A streaming question asked at one point, `<question_id>@<point>` (the point in turns
    written, not its ordinal): the tail of the pipeline's item id, and the key of its
    prediction in `aml rescore`."""
    return f"{question_id}@{point}"


class Dataset(_Frozen):
    dataset_id: str
    version: str
    categories: dict[int, str]
    scorer: str
    f1_variant: str = DEFAULT_F1_VARIANT
    conversations: list[Conversation]
    questions: list[Question]
    # The manifest's track (the registry sets it): "multimodal" sends a turn's images to the
    # participant (aml_evaluation.chunker, chunk-mm-v1); otherwise turns are text only.
    track: str = "textual"
    # A format's own chunk rule, set by its parser (coding: "coding-v1", steps kept whole and
    # every turn under its own role and time); None: the track's rule (chunk-v1, chunk-mm-v1).
    chunk_rule: Literal["coding-v1"] | None = None
    # The Search top_k the manifest declares for the dataset's questions (the coding track's
    # 100, R-2.5), in place of the job's; None: the job's (the registry sets it).
    search_top_k: int | None = Field(default=None, ge=1)
    # How a question's evidence is found among its candidates (set by the format's parser).
    evidence_rule: EvidenceRule = "turn-text-v1"
    # Multimodal datasets: reference -> the image's bytes, read from the bundle and checked
    # against the manifest's sha256 (Add and Search bodies are built from these). Never dumped.
    image_files: dict[str, bytes] = Field(default_factory=dict, exclude=True, repr=False)
    # (reference, the bytes' hash, limit) -> the bytes sent: fitting an image is done once.
    _sendable: dict[tuple[str, int, int], bytes] = PrivateAttr(default_factory=dict)

    def sendable_image(self, reference: str, max_bytes: int) -> bytes | None:
        """The bytes of an image as sent where at most ``max_bytes`` fit (its verified bytes,
        or fitted: :func:`aml_evaluation.media.fit_image`); None when it has no verified
        bytes."""
        data = self.image_files.get(reference)
        if data is None:
            return None
        key = (reference, hash(data), max_bytes)
        if key not in self._sendable:
            self._sendable[key] = fit_image(reference, data, max_bytes)
        return self._sendable[key]

    @model_validator(mode="after")
    def _points_inside_their_conversation(self) -> Dataset:
        asked = [question for question in self.questions if question.asked_at]
        if asked:
            turns = {c.conversation_id: c.turn_count for c in self.conversations}
            for question in asked:
                written = turns.get(question.conversation_id, 0)
                if question.asked_at[-1] > written:
                    raise ValueError(
                        f"question {question.question_id!r}: asked_at {question.asked_at[-1]} "
                        f"is past its conversation's {written} turns"
                    )
        return self

    @property
    def streaming(self) -> bool:
        """A streaming dataset asks some question at declared points of its conversation."""
        return any(question.asked_at for question in self.questions)

    def asked_points(self) -> dict[str, tuple[int, ...]]:
        """Per conversation, every point some question of it is asked at, in order."""
        points: dict[str, set[int]] = {}
        for question in self.questions:
            points.setdefault(question.conversation_id, set()).update(question.asked_at)
        return {conversation: tuple(sorted(p)) for conversation, p in points.items() if p}


# --- LoCoMo parsing -------------------------------------------------------------------------


def parse_locomo_datetime(text: str) -> int:
    """Unix ms of a LoCoMo date string read as UTC wall-clock time (see the module docstring)."""
    match = _LOCOMO_DATE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a LoCoMo date: {text!r}")
    hour_text, minute_text, meridiem, day_text, month_text, year_text = match.groups()
    hour, minute = int(hour_text), int(minute_text)
    month = _MONTHS.get(month_text.lower())
    if month is None or not 1 <= hour <= 12 or minute > 59:
        raise ValueError(f"not a LoCoMo date: {text!r}")
    hour24 = hour % 12 + (12 if meridiem.lower() == "pm" else 0)
    year, day = int(year_text), int(day_text)
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        raise ValueError(f"not a LoCoMo date: {text!r}")
    seconds = calendar.timegm((year, month, day, hour24, minute, 0, 0, 0, 0))
    return seconds * 1000


def _turn(raw: Mapping[str, Any]) -> Turn:
    caption = raw.get("blip_caption")
    return Turn(
        turn_id=str(raw["dia_id"]),
        speaker=str(raw["speaker"]),
        text=str(raw["text"]),
        image_caption=caption if isinstance(caption, str) and caption.strip() else None,
    )


def _sessions(sample_id: str, conversation: Mapping[str, Any]) -> list[Session]:
    numbered: list[tuple[int, str]] = []
    for key in conversation:
        match = _SESSION_KEY.fullmatch(key)
        if match is not None:
            numbered.append((int(match.group(1)), key))
    sessions: list[Session] = []
    # Numeric order: lexical order would put session_10 before session_2.
    for index, key in sorted(numbered):
        raw_turns = conversation[key]
        if not raw_turns:
            continue
        date_text = conversation.get(f"{key}_date_time")
        if not isinstance(date_text, str):
            raise ValueError(f"sample {sample_id!r} {key}: missing {key}_date_time")
        try:
            timestamp_ms = parse_locomo_datetime(date_text)
        except ValueError as error:
            raise ValueError(f"sample {sample_id!r} {key}: {error}") from None
        sessions.append(
            Session(
                session_key=key,
                index=index,
                date_text=date_text,
                timestamp_ms=timestamp_ms,
                turns=[_turn(raw) for raw in raw_turns],
            )
        )
    return sessions


def _answer(sample_id: str, index: int, raw: Mapping[str, Any], category: int) -> str | None:
    """The gold answer; None for an adversarial item without one (see the module docstring)."""
    value = raw.get("answer")
    if value is not None:
        return str(value)
    if category == LOCOMO_ADVERSARIAL_CATEGORY and raw.get("adversarial_answer") is not None:
        return None
    raise ValueError(
        f"sample {sample_id!r} qa[{index}]: no answer (only an adversarial item, category "
        f"{LOCOMO_ADVERSARIAL_CATEGORY}, may have just an adversarial_answer)"
    )


def question_id(sample_id: str, index: int) -> str:
    return f"{sample_id}:q{index:04d}"


def _question(
    sample_id: str, index: int, raw: Mapping[str, Any], categories: Mapping[int, str]
) -> Question:
    category = int(raw["category"])
    if category not in categories:
        raise ValueError(f"sample {sample_id!r} qa[{index}]: unknown category {category}")
    return Question(
        question_id=question_id(sample_id, index),
        conversation_id=sample_id,
        question=str(raw["question"]),
        answer=_answer(sample_id, index, raw, category),
        adversarial_answer=_optional_text(raw.get("adversarial_answer")),
        category=category,
        category_name=categories[category],
        evidence=[str(item) for item in raw.get("evidence", [])],
        adversarial=category == LOCOMO_ADVERSARIAL_CATEGORY,
        options=_options(sample_id, index, raw),
        asked_at=_asked_at(sample_id, index, raw),
    )


def _asked_at(sample_id: str, index: int, raw: Mapping[str, Any]) -> tuple[int, ...]:
    """A streaming item's points (an optional AML field, see docs/evaluation.md)."""
    points = raw.get("asked_at", [])
    if not isinstance(points, list) or not all(
        isinstance(point, int) and not isinstance(point, bool) for point in points
    ):
        raise ValueError(f"sample {sample_id!r} qa[{index}]: asked_at must be a list of integers")
    return tuple(points)


def _optional_text(value: object) -> str | None:
    return None if value is None else str(value)


def _options(sample_id: str, index: int, raw: Mapping[str, Any]) -> list[str] | None:
    """A multiple-choice question lists its options; its answer is one of them, verbatim."""
    options = raw.get("options")
    if options is None:
        return None
    if not (
        isinstance(options, list) and len(options) >= 2 and all(isinstance(o, str) for o in options)
    ):
        raise ValueError(f"sample {sample_id!r} qa[{index}]: options must be 2+ strings")
    if str(raw.get("answer")) not in options:
        raise ValueError(f"sample {sample_id!r} qa[{index}]: the answer is not one of the options")
    return [str(option) for option in options]


def _sample(
    raw: Mapping[str, Any], categories: Mapping[int, str]
) -> tuple[Conversation, list[Question]]:
    sample_id = str(raw["sample_id"])
    conversation = raw["conversation"]
    parsed = Conversation(
        conversation_id=sample_id,
        speakers=(str(conversation["speaker_a"]), str(conversation["speaker_b"])),
        sessions=_sessions(sample_id, conversation),
    )
    questions = [
        _question(sample_id, index, item, categories) for index, item in enumerate(raw["qa"])
    ]
    return parsed, questions


def parse_locomo(
    samples: Sequence[Mapping[str, Any]],
    dataset_id: str,
    version: str,
    *,
    categories: Mapping[int, str] = LOCOMO_CATEGORIES,
    scorer: str = DEFAULT_SCORER,
    f1_variant: str = DEFAULT_F1_VARIANT,
) -> Dataset:
    conversations: list[Conversation] = []
    questions: list[Question] = []
    for raw in samples:
        conversation, sample_questions = _sample(raw, categories)
        conversations.append(conversation)
        questions.extend(sample_questions)
    ids = [conversation.conversation_id for conversation in conversations]
    if len(set(ids)) != len(ids):
        raise ValueError(f"dataset {dataset_id!r}: duplicate sample_id")
    return Dataset(
        dataset_id=dataset_id,
        version=version,
        categories=dict(categories),
        scorer=scorer,
        f1_variant=f1_variant,
        conversations=conversations,
        questions=questions,
    )


def parse_locomo_bundle(contents: Sequence[tuple[str, bytes]], manifest: BundleManifest) -> Dataset:
    """A LoCoMo bundle (the registry's parser of format "locomo"): every file is a JSON list of
    samples, concatenated in manifest order. A manifest without categories (a draft that
    `aml dataset add` is checking) gets LoCoMo's own."""
    samples: list[tuple[str, Mapping[str, Any]]] = []
    for name, content in contents:
        try:
            parsed = json.loads(content)
        except ValueError as error:
            raise ValueError(f"dataset file {name!r}: not JSON: {error}") from None
        if not isinstance(parsed, list) or not all(isinstance(item, dict) for item in parsed):
            raise ValueError(f"dataset file {name!r}: a LoCoMo file is a JSON list of samples")
        samples.extend((name, sample) for sample in parsed)
    return parse_locomo_samples(samples, manifest)


def parse_locomo_samples(
    samples: Sequence[tuple[str, Mapping[str, Any]]], manifest: BundleManifest
) -> Dataset:
    """The dataset of LoCoMo samples read from a bundle's files, as (file name, sample): what
    :func:`parse_locomo_bundle` does once the files are read, and the registry's streaming
    read (:data:`LOCOMO_ITEMS`) a few samples at a time."""
    try:
        return parse_locomo(
            [sample for _, sample in samples],
            manifest.dataset_id,
            manifest.version,
            categories=manifest.categories or LOCOMO_CATEGORIES,
            scorer=manifest.scorer,
            f1_variant=manifest.f1_variant,
        )
    except (KeyError, TypeError, AttributeError) as error:
        # A sample without a required field: one line naming what is missing.
        raise ValueError(f"not a LoCoMo sample: {type(error).__name__}: {error}") from None


LOCOMO_ITEMS: Final = ItemFormat(parse=parse_locomo_samples)
