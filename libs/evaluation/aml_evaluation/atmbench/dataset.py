"""The ATM-Bench format (Mei et al., JingbiaoMei/ATM-Bench: about four years of one person's
images, videos and emails, and questions whose answers need them), format ``"atm-bench"``, read
into a :class:`Dataset` of the multimodal track. Source files cited below are the benchmark's.

**Files** (the parser tells them apart by path; the source's layout is ``docs/data.md``).

- A name ending in an image suffix (:data:`aml_evaluation.media.IMAGE_SUFFIXES`) under a
  directory named ``image`` (at any depth: ``image/x.jpg``, ``data/raw_memory/image/x.jpg``) is
  a raw image; one ending in a video suffix (:data:`VIDEO_SUFFIXES`) under a directory named
  ``video`` is a raw video. Its *reference* is its path below the last such directory
  (``x.jpg``) and its unit id its file stem, as the benchmark keys media
  (``memqa/retrieve/utils.py``, ``build_batch_index``: ``Path(image_path).stem``).
- ``emails.json`` (anywhere, at most one) is the email file: a JSON list of
  ``{id, timestamp, short_summary, detail}``.
- ``batch_results.json`` under a directory named ``image`` or ``video`` (the nearest one
  decides: ``output/image/qwen3vl2b/batch_results.json`` is the images'), or the release's
  ``image_batch_results.json`` / ``video_batch_results.json``, is that modality's text metadata:
  a JSON list of ``{image_path|video_path, timestamp, location_name, short_caption, caption,
  ocr_text, tags}``, at most one per modality.
- Any other ``.json`` is a QA file: a JSON list of QA records, or an object with a ``qas`` list
  (``load_qa_list``), each ``{id, question, answer, evidence_ids, [qtype],
  [niah_evidence_ids]}``. At least one is needed.

Anything else (another suffix, media outside its directory) is an error naming the file. The
email and batch files are optional; media without a batch entry, and batch entries without
media, are allowed (see **Units**).

**The corpus.** ATM-Bench is one person's memory, so a bundle is ONE conversation,
:data:`CONVERSATION_ID` (``"owner"``), whose speakers are the roles ``("user", "assistant")``
(``speakers_are_roles``). The whole memory is written, whatever the questions' evidence: the
hard split's ``niah_evidence_ids`` (fixed candidate pools for its needle-in-a-haystack runs) are
read past and play no part.

**Units.** Every email, image and video is one memory unit: an email is an entry of the email
file; an image (a video) is a batch entry, keyed by the stem of its ``image_path``
(``video_path``; an entry without one is skipped, as ``build_retrieval_items`` skips it), joined
by id with the raw file of the same stem when the bundle lists one. A raw file without a batch
entry is a unit with empty metadata; a batch entry without a raw file is a text-only unit (the
benchmark's own text-only "SGM" evidence). Unit ids are distinct across the corpus (two raw files
or batch entries of one stem, an email id equal to a media stem: an error naming it), at most
:data:`MAX_UNIT_ID_LENGTH` printable characters without surrounding spaces.

**Sessions.** Each unit is ONE session, in time order (timestamp, then unit id): ``session_key``
the unit id, ``index`` 1-based, ``date_text`` the source's timestamp, ``timestamp_ms`` its Unix
ms. A timestamp is read as ISO 8601 (``YYYY-MM-DD``, optionally ``[ T]HH:MM[:SS[.ffffff]]`` and
``Z`` or ``±HH[:]MM``); one with an offset is that instant, one without (EXIF times, the email
file's ``"2024-01-01 12:34:56"``) is taken **as UTC** wall-clock time, as AML reads LoCoMo's: the
source says nothing of its time zones, and AML does not guess them. A unit whose timestamp is
empty, absent or in no such form is dated by its id: media ids are ``YYYYMMDD_HHMMSS`` stems
(the first such run in the id, UTC), email ids ``emailYYYYMMDDnnnn`` (midnight UTC of that
date); ``date_text`` is then the date read from the id, ``YYYY-MM-DD HH:MM:SS``. A unit dated by
neither is an error naming it.

**Turns** (rule ``atm-unit-v1``, :data:`UNIT_TEXT_VERSION`). A session holds one turn, speaker
``"user"``, ``turn_id`` the unit id, whose text is the unit as the benchmark renders evidence
(``memqa/retrieve/utils.py``, ``format_media_text`` and ``format_email_text`` with every field
included), lines joined by ``"\\n"``:

- an image or video: ``ID: <id>``, ``Type: image|video``, ``Timestamp: <timestamp>``,
  ``Location: <location_name>``, ``Short Caption: <short_caption>``, ``Caption: <caption>``,
  ``OCR: <ocr_text>``, ``Tags: <tags joined by ", ">`` (a field that is absent or empty is
  written empty; tags that are not a list are written as they are);
- an email: ``ID: <id>``, ``Timestamp: <timestamp>``, ``Summary: <short_summary>``,
  ``Detail: <detail>``.

The first line, ``ID: <unit id>``, is how AML recognises a question's evidence among a
participant's Search candidates (:attr:`Dataset.evidence_rule` ``"unit-id-v1"``), and what
makes list_recall answers (lists of unit ids) answerable at all. An image's turn shows the image
(``images`` = its reference); a video's shows its frames sampled by rule ``frames-v1``
(:mod:`aml_evaluation.atmbench.frames`), referenced ``<video reference>.frame-<i>.jpg``
(``i`` from 1). The bytes of both are in :attr:`Dataset.image_files`, so the chunker sends
them as a text part and ``image_url`` parts; a frame reference equal to an image's is an error.
Videos' own bytes are not kept.

**Questions.** One per QA record, QA files in bundle order: ``question_id``
``f"{conversation_id}:{record id}"`` (record ids distinct across the QA files), ``question``
verbatim, ``answer`` the gold as a string (ATM-Bench has no abstention), ``evidence`` the
record's ``evidence_ids`` in order, each once, each a unit id; an id naming no unit is taken,
as the benchmark resolves media evidence (``Path(evidence_id).stem``), as its stem when that is
a unit's, and is otherwise an error naming the record and the id. ``answer_type`` is the
record's ``qtype`` as the benchmark normalises it, else told from the answer
(:func:`aml_evaluation.atmbench.scoring.answer_type`); the category is 1, 2, 3 for ``number``,
``list_recall``, ``open_end`` (:data:`ATM_CATEGORIES`), none left out of Overall.

**The dataset.** Scorer ``"atm_qs"`` (``aml_evaluation.atmbench.scoring.ATM_SCORER``), track
``"multimodal"``, evidence rule ``"unit-id-v1"``. Bounds: a JSON file at most
:data:`MAX_JSON_BYTES`, at most :data:`MAX_UNITS` units and :data:`MAX_QUESTIONS` questions,
media within their own limits
(images :data:`aml_evaluation.media.MAX_SOURCE_IMAGE_BYTES`, videos
:data:`aml_evaluation.atmbench.frames.MAX_VIDEO_BYTES`); over one is an error, before more is
read. Malformed input raises ValueError naming the file and the record or unit.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any, Final, Literal

from aml_evaluation.atmbench.frames import MAX_VIDEO_BYTES, VideoError, sample_frames
from aml_evaluation.atmbench.scoring import answer_type
from aml_evaluation.datasets import (
    AnswerType,
    BundleManifest,
    Conversation,
    Dataset,
    Question,
    Session,
    Turn,
)
from aml_evaluation.media import (
    IMAGE_SUFFIXES,
    MAX_SOURCE_IMAGE_BYTES,
    MIB,
    ImageError,
    check_image,
    check_reference,
)

FORMAT: Final = "atm-bench"
TRACK: Final = "multimodal"
UNIT_TEXT_VERSION: Final = "atm-unit-v1"
EVIDENCE_RULE: Final = "unit-id-v1"
CONVERSATION_ID: Final = "owner"
SPEAKERS: Final = ("user", "assistant")
ATM_CATEGORIES: Final[Mapping[int, str]] = {1: "number", 2: "list_recall", 3: "open_end"}
CATEGORY_OF_TYPE: Final[Mapping[AnswerType, int]] = {"number": 1, "list_recall": 2, "open_end": 3}
VIDEO_SUFFIXES: Final[frozenset[str]] = frozenset({".mp4", ".mov", ".m4v", ".webm", ".mkv", ".avi"})
EMAILS_FILE: Final = "emails.json"
BATCH_RESULTS_FILE: Final = "batch_results.json"
RELEASE_BATCH_FILES: Final[Mapping[str, str]] = {
    "image_batch_results.json": "image",
    "video_batch_results.json": "video",
}
IMAGE_DIR: Final = "image"
VIDEO_DIR: Final = "video"
MAX_JSON_BYTES: Final = 256 * MIB
MAX_UNITS: Final = 200_000
MAX_QUESTIONS: Final = 100_000
MAX_UNIT_ID_LENGTH: Final = 256

FileKind = Literal["qa", "emails", "image-batch", "video-batch", "image", "video"]
UnitKind = Literal["email", "image", "video"]

_ISO_TIMESTAMP: Final = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)?(?:Z|[+-]\d{2}:?\d{2})?"
)
_MEDIA_ID_TIME: Final = re.compile(r"(\d{4})(\d{2})(\d{2})_(\d{2})(\d{2})(\d{2})")
_EMAIL_ID_DATE: Final = re.compile(r"email(\d{4})(\d{2})(\d{2})", re.IGNORECASE)


@dataclass(frozen=True)
class _Unit:
    unit_id: str
    kind: UnitKind
    timestamp_ms: int
    date_text: str
    text: str
    images: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Media:
    """A raw media file of the bundle."""

    path: str
    reference: str
    content: bytes


# --- files ------------------------------------------------------------------------------------


def file_kind(path: str) -> FileKind:
    """What a bundle file is, by its path (see the module docstring); ValueError naming it."""
    posix = PurePosixPath(path)
    suffix, name = posix.suffix.lower(), posix.name
    directories = posix.parent.parts
    if suffix in IMAGE_SUFFIXES:
        if IMAGE_DIR not in directories:
            raise ValueError(f"dataset file {path!r}: an image must be under an {IMAGE_DIR}/ dir")
        return "image"
    if suffix in VIDEO_SUFFIXES:
        if VIDEO_DIR not in directories:
            raise ValueError(f"dataset file {path!r}: a video must be under a {VIDEO_DIR}/ dir")
        return "video"
    if suffix != ".json":
        raise ValueError(
            f"dataset file {path!r}: an ATM-Bench bundle holds QA files, {EMAILS_FILE}, "
            f"{BATCH_RESULTS_FILE} files (.json), images ({', '.join(sorted(IMAGE_SUFFIXES))}) "
            f"and videos ({', '.join(sorted(VIDEO_SUFFIXES))})"
        )
    if name == EMAILS_FILE:
        return "emails"
    if name in RELEASE_BATCH_FILES:
        return "image-batch" if RELEASE_BATCH_FILES[name] == IMAGE_DIR else "video-batch"
    if name == BATCH_RESULTS_FILE:
        for directory in reversed(directories):
            if directory in (IMAGE_DIR, VIDEO_DIR):
                return "image-batch" if directory == IMAGE_DIR else "video-batch"
        raise ValueError(
            f"dataset file {path!r}: a {BATCH_RESULTS_FILE} must be under an {IMAGE_DIR}/ or "
            f"{VIDEO_DIR}/ dir (which says whose metadata it is)"
        )
    return "qa"


def max_file_bytes(path: str) -> int:
    """The largest a bundle file of this path may be (so that a registration can refuse an
    oversized one before reading it); ValueError when the path is no bundle file."""
    kind = file_kind(path)
    if kind == "image":
        return MAX_SOURCE_IMAGE_BYTES
    if kind == "video":
        return MAX_VIDEO_BYTES
    return MAX_JSON_BYTES


def media_reference(path: str) -> str:
    """A raw media file's reference: its path below the last ``image``/``video`` directory."""
    parts = PurePosixPath(path).parts
    anchor = max(i for i, part in enumerate(parts[:-1]) if part in (IMAGE_DIR, VIDEO_DIR))
    try:
        return check_reference("/".join(parts[anchor + 1 :]))
    except ImageError as error:
        raise ValueError(f"dataset file {path!r}: {error}") from None


def frame_reference(video_reference: str, index: int) -> str:
    """The reference of a video's ``index``-th (1-based) sampled frame."""
    return f"{video_reference}.frame-{index}.jpg"


# --- the bundle parser ------------------------------------------------------------------------


def parse(contents: Sequence[tuple[str, bytes]], manifest: BundleManifest) -> Dataset:
    """The dataset of an ATM-Bench bundle: ``contents`` are its (path, bytes) files, verified
    by the caller. A manifest without categories (a draft) gets ATM-Bench's."""
    categories = dict(manifest.categories or ATM_CATEGORIES)
    for number in CATEGORY_OF_TYPE.values():
        if number not in categories:
            raise ValueError(f"the categories do not name ATM-Bench's category {number}")
    qa_files: list[tuple[str, Any]] = []
    singles: dict[FileKind, tuple[str, Any]] = {}
    media: dict[UnitKind, list[_Media]] = {"image": [], "video": []}
    for name, content in contents:
        kind = file_kind(name)
        if kind in ("image", "video"):
            limit = max_file_bytes(name)
            if len(content) > limit:
                raise ValueError(
                    f"dataset file {name!r} is {len(content)} bytes, over the {kind} limit of "
                    f"{limit // MIB} MiB"
                )
            media["image" if kind == "image" else "video"].append(
                _Media(name, media_reference(name), content)
            )
        elif kind == "qa":
            qa_files.append((name, _load_json(name, content)))
        else:
            if kind in singles:
                raise ValueError(
                    f"dataset file {name!r}: the bundle already has its {kind} file, "
                    f"{singles[kind][0]!r}"
                )
            singles[kind] = (name, _load_json(name, content))
    if not qa_files:
        raise ValueError("an ATM-Bench bundle lists no QA file (.json of QA records)")
    units, image_files = _units(singles, media)
    questions = _questions(qa_files, {unit.unit_id for unit in units}, categories)
    sessions = [
        Session(
            session_key=unit.unit_id,
            index=index,
            date_text=unit.date_text,
            timestamp_ms=unit.timestamp_ms,
            turns=[
                Turn(turn_id=unit.unit_id, speaker=SPEAKERS[0], text=unit.text, images=unit.images)
            ],
        )
        for index, unit in enumerate(units, start=1)
    ]
    conversation = Conversation(
        conversation_id=CONVERSATION_ID,
        speakers=SPEAKERS,
        sessions=sessions,
        speakers_are_roles=True,
    )
    return Dataset(
        dataset_id=manifest.dataset_id,
        version=manifest.version,
        categories=categories,
        scorer=manifest.scorer,
        f1_variant=manifest.f1_variant,
        conversations=[conversation],
        questions=questions,
        track=TRACK,
        evidence_rule=EVIDENCE_RULE,
        image_files=image_files,
    )


def _load_json(name: str, content: bytes) -> Any:
    if len(content) > MAX_JSON_BYTES:
        raise ValueError(
            f"dataset file {name!r} is {len(content)} bytes, over the {MAX_JSON_BYTES // MIB} "
            "MiB limit of a JSON file"
        )
    try:
        return json.loads(content)
    except ValueError as error:
        raise ValueError(f"dataset file {name!r}: not JSON: {error}") from None


# --- units ------------------------------------------------------------------------------------


def _units(
    singles: Mapping[FileKind, tuple[str, Any]], media: Mapping[UnitKind, list[_Media]]
) -> tuple[list[_Unit], dict[str, bytes]]:
    """Every unit in session order, and the bytes of the images and frames they show."""
    units: dict[str, _Unit] = {}
    where_of: dict[str, str] = {}
    image_files: dict[str, bytes] = {}

    def add(unit: _Unit, where: str) -> None:
        if unit.unit_id in units:
            raise ValueError(f"{where}: unit id {unit.unit_id!r} is also {where_of[unit.unit_id]}")
        if len(units) >= MAX_UNITS:
            raise ValueError(f"{where}: more than {MAX_UNITS} memory units")
        units[unit.unit_id] = unit
        where_of[unit.unit_id] = where

    if "emails" in singles:
        name, raw = singles["emails"]
        for index, entry in enumerate(_object_list(name, raw, "emails")):
            add(_email_unit(name, index, entry), f"dataset file {name!r} email {index}")
    for kind in ("image", "video"):
        batch = singles.get("image-batch" if kind == "image" else "video-batch")
        files = _media_by_id(media[kind])
        entries = {} if batch is None else _batch_entries(batch[0], batch[1], kind)
        for unit_id in sorted({*entries, *files}):
            file = files.get(unit_id)
            if unit_id in entries:
                where, entry = entries[unit_id]
            else:
                assert file is not None
                where, entry = f"dataset file {file.path!r}", {}
            images = () if file is None else _shown(kind, file, where, image_files)
            add(_media_unit(unit_id, kind, entry, images, where), where)
    ordered = sorted(units.values(), key=lambda unit: (unit.timestamp_ms, unit.unit_id))
    return ordered, image_files


def _shown(
    kind: UnitKind, file: _Media, where: str, image_files: dict[str, bytes]
) -> tuple[str, ...]:
    """The references a media unit shows, their bytes added to ``image_files``."""
    if kind == "image":
        try:
            check_image(file.path, file.content, MAX_SOURCE_IMAGE_BYTES)
        except ImageError as error:
            raise ValueError(f"{where}: {error}") from None
        shown = {file.reference: file.content}
    else:
        try:
            frames = sample_frames(file.path, file.content)
        except VideoError as error:
            raise ValueError(f"{where}: {error}") from None
        shown = {
            frame_reference(file.reference, index): frame
            for index, frame in enumerate(frames, start=1)
        }
    for reference, content in shown.items():
        if reference in image_files:
            raise ValueError(f"{where}: image reference {reference!r} is given twice")
        image_files[reference] = content
    return tuple(shown)


def _media_by_id(files: Sequence[_Media]) -> dict[str, _Media]:
    by_id: dict[str, _Media] = {}
    for file in files:
        unit_id = _unit_id(PurePosixPath(file.path).stem, f"dataset file {file.path!r}")
        if unit_id in by_id:
            raise ValueError(
                f"dataset file {file.path!r}: unit id {unit_id!r} is also {by_id[unit_id].path!r}"
            )
        by_id[unit_id] = file
    return by_id


def _batch_entries(name: str, raw: Any, kind: UnitKind) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Unit id -> (where, entry) of a batch file's entries that name a media path."""
    path_key = f"{kind}_path"
    entries: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for index, entry in enumerate(_object_list(name, raw, f"{kind} entries")):
        where = f"dataset file {name!r} entry {index}"
        raw_path = entry.get(path_key)
        if not raw_path:
            continue
        unit_id = _unit_id(PurePosixPath(str(raw_path)).stem, where)
        if unit_id in entries:
            raise ValueError(f"{where}: unit id {unit_id!r} is also {entries[unit_id][0]}")
        entries[unit_id] = (where, entry)
    return entries


def _object_list(name: str, raw: Any, what: str) -> list[Mapping[str, Any]]:
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise ValueError(f"dataset file {name!r}: must be a JSON list of {what} (objects)")
    return raw


def _unit_id(value: object, where: str) -> str:
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_UNIT_ID_LENGTH
        or value != value.strip()
        or not value.isprintable()
    ):
        raise ValueError(
            f"{where}: unit id {str(value)[:80]!r} must be 1 to {MAX_UNIT_ID_LENGTH} printable "
            "characters without surrounding spaces"
        )
    return value


def _field(entry: Mapping[str, Any], key: str) -> str:
    """A field as the benchmark writes it: ``item.get(key, "") or ""``."""
    value = entry.get(key, "") or ""
    return str(value)


def _tags(entry: Mapping[str, Any], where: str) -> str:
    tags = entry.get("tags", []) or []
    if not isinstance(tags, list):
        return str(tags)
    if not all(isinstance(tag, str) for tag in tags):
        raise ValueError(f"{where}: tags must be strings")
    return ", ".join(tags)


def media_text(unit_id: str, kind: UnitKind, entry: Mapping[str, Any], where: str = "") -> str:
    """A media unit's text: ``format_media_text`` with every field (rule atm-unit-v1)."""
    return "\n".join(
        [
            f"ID: {unit_id}",
            f"Type: {kind}",
            f"Timestamp: {_field(entry, 'timestamp')}",
            f"Location: {_field(entry, 'location_name')}",
            f"Short Caption: {_field(entry, 'short_caption')}",
            f"Caption: {_field(entry, 'caption')}",
            f"OCR: {_field(entry, 'ocr_text')}",
            f"Tags: {_tags(entry, where or f'unit {unit_id!r}')}",
        ]
    )


def email_text(entry: Mapping[str, Any]) -> str:
    """An email unit's text: ``format_email_text`` with every field (rule atm-unit-v1)."""
    return "\n".join(
        [
            f"ID: {_field(entry, 'id')}",
            f"Timestamp: {_field(entry, 'timestamp')}",
            f"Summary: {_field(entry, 'short_summary')}",
            f"Detail: {_field(entry, 'detail')}",
        ]
    )


def _email_unit(name: str, index: int, entry: Mapping[str, Any]) -> _Unit:
    where = f"dataset file {name!r} email {index}"
    unit_id = _unit_id(entry.get("id"), where)
    timestamp_ms, date_text = unit_time(unit_id, "email", entry.get("timestamp"), where)
    return _Unit(unit_id, "email", timestamp_ms, date_text, email_text(entry))


def _media_unit(
    unit_id: str,
    kind: UnitKind,
    entry: Mapping[str, Any],
    images: tuple[str, ...],
    where: str,
) -> _Unit:
    timestamp_ms, date_text = unit_time(unit_id, kind, entry.get("timestamp"), where)
    text = media_text(unit_id, kind, entry, where)
    return _Unit(unit_id, kind, timestamp_ms, date_text, text, images)


# --- time -------------------------------------------------------------------------------------


def parse_timestamp(text: str) -> int | None:
    """Unix ms of an ISO 8601 timestamp (no offset: UTC wall-clock time); None when ``text`` is
    in no accepted form (see the module docstring)."""
    stripped = text.strip()
    if _ISO_TIMESTAMP.fullmatch(stripped) is None:
        return None
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def id_time(unit_id: str, kind: UnitKind) -> tuple[int, str] | None:
    """(Unix ms, ``YYYY-MM-DD HH:MM:SS``) of the time a unit id carries, UTC; None if none."""
    if kind == "email":
        match = _EMAIL_ID_DATE.match(unit_id)
        fields = None if match is None else (*match.groups(), "00", "00", "00")
    else:
        found = _MEDIA_ID_TIME.search(unit_id)
        fields = None if found is None else found.groups()
    if fields is None:
        return None
    year, month, day, hour, minute, second = (int(value) for value in fields)
    if (
        not 1 <= month <= 12
        or not 1 <= day <= calendar.monthrange(year, month)[1]
        or hour > 23
        or minute > 59
        or second > 59
    ):
        return None
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    text = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
    return seconds * 1000, text


def unit_time(unit_id: str, kind: UnitKind, timestamp: object, where: str) -> tuple[int, str]:
    """(``timestamp_ms``, ``date_text``) of a unit: its timestamp's, else its id's."""
    if isinstance(timestamp, str) and timestamp.strip():
        parsed = parse_timestamp(timestamp)
        if parsed is not None:
            return parsed, timestamp
    from_id = id_time(unit_id, kind)
    if from_id is None:
        raise ValueError(
            f"{where}: unit {unit_id!r} has no usable timestamp ({timestamp!r}) and its id "
            "carries no date"
        )
    return from_id


# --- questions --------------------------------------------------------------------------------


def question_id(record_id: str) -> str:
    return f"{CONVERSATION_ID}:{record_id}"


def _qa_records(name: str, raw: Any) -> list[Any]:
    if isinstance(raw, list):
        return raw
    if isinstance(raw, dict) and isinstance(raw.get("qas"), list):
        records: list[Any] = raw["qas"]
        return records
    raise ValueError(
        f"dataset file {name!r}: a QA file is a JSON list of QA records or an object with a "
        "'qas' list"
    )


def _questions(
    qa_files: Sequence[tuple[str, Any]], units: set[str], categories: Mapping[int, str]
) -> list[Question]:
    questions: list[Question] = []
    seen: dict[str, str] = {}
    for name, raw in qa_files:
        for index, record in enumerate(_qa_records(name, raw)):
            where = f"dataset file {name!r} record {index}"
            if len(questions) >= MAX_QUESTIONS:
                raise ValueError(f"{where}: more than {MAX_QUESTIONS} questions")
            question = _question(where, record, units, categories)
            if question.question_id in seen:
                raise ValueError(
                    f"{where}: question id {question.question_id!r} is also "
                    f"{seen[question.question_id]}"
                )
            seen[question.question_id] = where
            questions.append(question)
    return questions


def _question(
    where: str, record: object, units: set[str], categories: Mapping[int, str]
) -> Question:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: not an object")
    record_id, text, answer = record.get("id"), record.get("question"), record.get("answer")
    if not isinstance(record_id, (str, int)) or isinstance(record_id, bool) or record_id == "":
        raise ValueError(f"{where}: needs an id")
    here = f"{where} (id {record_id!r})"
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{here}: needs a question")
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
        raise ValueError(f"{here}: needs an answer (a string)")
    gold = str(answer)
    qtype = record.get("qtype")
    kind = answer_type(None if qtype is None else str(qtype), gold)
    category = CATEGORY_OF_TYPE[kind]
    return Question(
        question_id=question_id(str(record_id)),
        conversation_id=CONVERSATION_ID,
        question=text,
        answer=gold,
        category=category,
        category_name=categories[category],
        evidence=evidence_units(record.get("evidence_ids"), units, here),
        adversarial=False,
        answer_type=kind,
    )


def evidence_units(raw: object, units: set[str], where: str) -> list[str]:
    """The unit ids a record's ``evidence_ids`` name, in order, each once (see the module
    docstring); ValueError naming an id that names no unit."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise ValueError(f"{where}: evidence_ids must be a list of strings")
    found: list[str] = []
    for evidence_id in raw:
        if not evidence_id:
            continue  # the benchmark drops empty ids (extract_evidence_ids)
        unit_id = evidence_id
        if unit_id not in units and not evidence_id.lower().startswith("email"):
            unit_id = PurePosixPath(evidence_id).stem
        if unit_id not in units:
            raise ValueError(f"{where}: evidence id {evidence_id!r} is no unit of the corpus")
        if unit_id not in found:
            found.append(unit_id)
    return found
