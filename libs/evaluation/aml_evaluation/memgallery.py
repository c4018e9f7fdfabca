"""The Mem-Gallery format (Bei et al., "Mem-Gallery: Benchmarking Multimodal Long-Term
Conversational Memory for MLLM Agents", arXiv:2601.03515), format ``"mem-gallery"``, read into a
:class:`Dataset` of the multimodal track.

**Files.** A bundle lists one or more dialog files (``.json``), one per conversation, in the
source's layout ``<dir>/dialog/<Name>.json``, whose images live in ``<dir>/image/<Name>/``. A file
is a JSON object ``{character_profile, multi_session_dialogues, "human-annotated QAs"}``.
A bundle may also list image files (a name ending in ``.png``, ``.jpg``, ``.jpeg``, ``.gif`` or
``.webp``): the registry then hash-checks them like any bundle file, and the parser takes them as
present (see **Images**) without looking at their bytes. Any other file is an error.

**Conversations.** One file is one conversation between one user (the persona of
``character_profile``) and an assistant: ``conversation_id`` is the file's name without
``.json`` (it must match ``[A-Za-z0-9][A-Za-z0-9_.-]*``: it becomes part of user ids), its
speakers are the roles ``("user", "assistant")`` and ``speakers_are_roles`` is set, so the
chunker sends each turn under its role without a speaker prefix. ``character_profile`` is the
benchmark's set-up, not something said, and is not written.

**Sessions.** ``multi_session_dialogues`` in source order; ``session_key`` is the source's
``session_id`` (``"D1"``), ``index`` its 1-based position, ``date_text`` the source's ``date``
(``YYYY-MM-DD``) and ``timestamp_ms`` midnight UTC of that date. Session ids must be distinct.

**Turns.** Each round ``{round, user, assistant}`` gives two turns, the user's then the
assistant's, with ``turn_id`` ``f"{round}:user"`` and ``f"{round}:assistant"``; a question's
evidence (``clue``) names rounds (``"D1:2"``), i.e. both turns. The round's images are the
user's: ``input_image`` (a list of paths) becomes :attr:`Turn.images`, ``image_id`` (a list
such as ``["D1:IMG_001"]``, the ids that visual-search answers name) :attr:`Turn.image_ids`,
and ``image_caption`` (a list) :attr:`Turn.image_caption`, its entries joined by ``" | "``. When
given, ``image_id`` and ``image_caption`` have one entry per image. A turn with empty text and
no image is left out.

**Images.** The source writes an image path relative to the dialog file's directory:
``"../image/<Name>/D1_IMG_001.jpg"``. AML stores the *reference* ``"<Name>/D1_IMG_001.jpg"``: the
path with its leading ``"../image/"`` removed, relative to the **image directory** (the source's
``benchmark/data/image``); a path that does not start with ``"../image/"`` is an error, and the
rest must be a clean relative path (:func:`aml_evaluation.media.check_reference`). The same
mapping applies to a question's ``question_image``. :func:`parse` checks that every referenced
image is there: an image is there when the bundle lists it (at
``<dialog dir>/../image/<reference>``, as :func:`bundle_image_path` says) or when it is a
regular file under the ``image_dir`` given (such an image has no bytes in the dataset, so only
bundle-listed images can be sent to a participant). A manifest whose ``image_dir`` names a bundle
directory (``aml dataset add --images``) lists its images at ``<image_dir>/<reference>``
instead. The bytes of listed images, verified by the registry, are kept in
:attr:`Dataset.image_files` for the Add and Search bodies. Mem-Gallery's images are not
shipped with the dialog files; a missing one is a :class:`MissingImagesError` naming the images
and the place looked in.

**Questions.** ``"human-annotated QAs"`` in order; ``question_id`` is
``f"{conversation_id}:q{index:04d}"`` (``index`` 0-based), ``evidence`` the ``clue`` round ids,
``images`` the ``question_image`` reference (if any) and ``image_caption`` its caption. The
task type ``point`` is the category, numbered in the fixed order of
:data:`MEMGALLERY_TASK_TYPES` (the order of the paper's task list), named by
:data:`MEMGALLERY_CATEGORIES`; another type is an error. Answers are strings (visual-search
answers are image ids, ``"D3:IMG_001, D3:IMG_002"``; conflict detection's ``"Yes."``/``"No."``).

**Answer refusal (AR).** An AR question asks what the conversation never says; its gold is the
fixed reply ``"Not mentioned."``. AML treats it like LoCoMo's adversarial category: ``answer``
is None (:attr:`Question.unanswerable`), so the answer is right when it abstains, the judge gets
the abstention prompt, and an F1 variant scores it by its abstention rule rather than by word
overlap with one wording (AML's answer prompt abstains with "Not mentioned in the memories.",
which overlaps "Not mentioned." at F1 0.67 only). Unlike LoCoMo's, it has no trap answer
(``adversarial`` is False), and Mem-Gallery counts it in its overall score, so its manifest
excludes no category from Overall. An AR item whose answer is anything else keeps that answer.

Malformed input raises ValueError naming the file and the session, round or question.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Final, Protocol

from aml_evaluation.datasets import BundleManifest, Conversation, Dataset, Question, Session, Turn
from aml_evaluation.media import (
    IMAGE_SUFFIXES,
    ImageError,
    MissingImagesError,
    check_reference,
    resolve_image,
)

FORMAT: Final = "mem-gallery"
# The task types in their fixed order; category n is MEMGALLERY_TASK_TYPES[n - 1].
MEMGALLERY_TASK_TYPES: Final[tuple[str, ...]] = (
    "FR",
    "MR",
    "TR",
    "VR",
    "TTL",
    "VS",
    "CD",
    "KR",
    "AR",
)
MEMGALLERY_CATEGORIES: Final[Mapping[int, str]] = {
    1: "factual-retrieval",
    2: "multi-entity-reasoning",
    3: "temporal-reasoning",
    4: "visual-reasoning",
    5: "test-time-learning",
    6: "visual-search",
    7: "conflict-detection",
    8: "knowledge-resolution",
    9: "answer-refusal",
}
MEMGALLERY_CATEGORY_OF_TYPE: Final[Mapping[str, int]] = {
    code: number for number, code in enumerate(MEMGALLERY_TASK_TYPES, start=1)
}
ANSWER_REFUSAL: Final = MEMGALLERY_CATEGORY_OF_TYPE["AR"]
REFUSAL_GOLD: Final = "not mentioned"  # AR's gold, compared without case and punctuation
# The scorer and F1 a Mem-Gallery manifest declares: Mem-Gallery reports token F1, normalised
# its own way (aml_evaluation.scoring.F1_MEMGALLERY_VERSION, named here rather than imported so
# parsing does not load the scorer's NLTK).
DEFAULT_SCORER: Final = "token_f1"
DEFAULT_F1_VARIANT: Final = "f1-memgallery-v1"
SPEAKERS: Final = ("user", "assistant")
IMAGE_PREFIX: Final = "../image/"
CAPTION_SEPARATOR: Final = " | "
QA_KEY: Final = "human-annotated QAs"
MISSING_LISTED: Final = 10  # missing images named in an error; the rest are counted

_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_DATE: Final = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


class MemGalleryManifest(BundleManifest, Protocol):
    """A bundle manifest with the directory its images are under."""

    @property
    def image_dir(self) -> str | None: ...


# --- the bundle parser ------------------------------------------------------------------------


def parse(
    contents: Sequence[tuple[str, bytes]],
    manifest: MemGalleryManifest,
    image_dir: Path | None = None,
) -> Dataset:
    """The dataset of a Mem-Gallery bundle: ``contents`` are its (path, bytes) files, hash-checked
    by the caller; ``image_dir`` is where images the bundle does not list are looked for (see
    the module docstring). A manifest without categories (a draft) gets Mem-Gallery's."""
    documents: list[tuple[str, Mapping[str, Any]]] = []
    dialog_paths: dict[str, str] = {}  # conversation id -> its file's bundle path
    listed: dict[str, bytes] = {}
    for name, content in contents:
        suffix = PurePosixPath(name).suffix.lower()
        if suffix in IMAGE_SUFFIXES:
            listed[PurePosixPath(name).as_posix()] = content
            continue
        if suffix != ".json":
            raise ValueError(
                f"dataset file {name!r}: a Mem-Gallery bundle holds dialog files (.json) and "
                f"images ({', '.join(sorted(IMAGE_SUFFIXES))})"
            )
        try:
            parsed = json.loads(content)
        except ValueError as error:
            raise ValueError(f"dataset file {name!r}: not JSON: {error}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"dataset file {name!r}: a Mem-Gallery dialog file is a JSON object")
        conversation_id = PurePosixPath(name).stem
        if conversation_id in dialog_paths:
            raise ValueError(
                f"dataset file {name!r}: conversation {conversation_id!r} is also "
                f"{dialog_paths[conversation_id]!r}"
            )
        dialog_paths[conversation_id] = name
        documents.append((conversation_id, parsed))
    if not documents:
        raise ValueError("a Mem-Gallery bundle lists no dialog file (.json)")
    dataset = parse_memgallery(
        documents,
        manifest.dataset_id,
        manifest.version,
        categories=manifest.categories or MEMGALLERY_CATEGORIES,
        scorer=manifest.scorer,
        f1_variant=manifest.f1_variant,
    )
    unlisted: list[str] = []
    image_files: dict[str, bytes] = {}
    for conversation_id, references in _references_by_conversation(dataset).items():
        for reference in references:
            path = listed_image_path(dialog_paths[conversation_id], reference, manifest.image_dir)
            if path not in listed:
                unlisted.append(reference)
            elif image_files.setdefault(reference, listed[path]) != listed[path]:
                raise ValueError(f"image {reference!r} is listed twice with different bytes")
    check_images(unlisted, image_dir)
    return dataset.model_copy(update={"image_files": image_files})


def listed_image_path(dialog_path: str, reference: str, image_dir: str | None) -> str | None:
    """The bundle path of a referenced image: under the manifest's ``image_dir`` when it names
    one (an operator's image directory, ``aml dataset add --images``), else where the source's
    layout puts it (:func:`bundle_image_path`)."""
    if image_dir is not None:
        return f"{image_dir.rstrip('/')}/{reference}"
    return bundle_image_path(dialog_path, reference)


def bundle_image_path(dialog_path: str, reference: str) -> str | None:
    """The bundle path where a dialog file's image would be listed: the source's own relative
    path (``../image/<reference>``) taken from the dialog file's directory; None when that
    leaves the bundle root (a dialog file at the root)."""
    parts = PurePosixPath(dialog_path).parent.parts
    if not parts:
        return None
    return PurePosixPath(*parts[:-1], "image", reference).as_posix()


def image_dir_of(root: Path, dialog_path: str) -> Path:
    """The image directory of a dialog file at ``dialog_path`` under the bundle ``root`` in the
    source's layout: ``<dialog dir>/../image``."""
    return root / PurePosixPath(dialog_path).parent.parent / "image"


def check_images(references: Iterable[str], image_dir: Path | None) -> None:
    """MissingImagesError unless every reference is a regular file under ``image_dir`` (its
    bytes are not read). With no ``image_dir``, every reference given is missing."""
    wanted = sorted(set(references))
    if not wanted:
        return
    if image_dir is None:
        raise MissingImagesError(
            f"{len(wanted)} referenced images are not in the bundle and no image directory was "
            f"given (the images are not shipped; point the loader at the image directory, the "
            f"source's benchmark/data/image): {_listing(wanted)}",
            wanted,
        )
    missing: list[str] = []
    for reference in wanted:
        try:
            resolve_image(image_dir, reference)
        except ImageError:
            missing.append(reference)
    if missing:
        raise MissingImagesError(
            f"{len(missing)} of {len(wanted)} referenced images are missing under the image "
            f"directory {image_dir}: {_listing(missing)}",
            missing,
        )


def referenced_images(dataset: Dataset) -> list[str]:
    """Every image reference of the dataset (turns and questions), sorted, each once."""
    found = {
        reference
        for references in _references_by_conversation(dataset).values()
        for reference in references
    }
    return sorted(found)


def _references_by_conversation(dataset: Dataset) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for conversation in dataset.conversations:
        found.setdefault(conversation.conversation_id, []).extend(
            reference
            for session in conversation.sessions
            for turn in session.turns
            for reference in turn.images
        )
    for question in dataset.questions:
        found.setdefault(question.conversation_id, []).extend(question.images)
    return found


def _listing(references: Sequence[str]) -> str:
    shown = ", ".join(references[:MISSING_LISTED])
    more = len(references) - MISSING_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


# --- pure parsing -----------------------------------------------------------------------------


def parse_memgallery(
    documents: Sequence[tuple[str, Mapping[str, Any]]],
    dataset_id: str,
    version: str,
    *,
    categories: Mapping[int, str] = MEMGALLERY_CATEGORIES,
    scorer: str = DEFAULT_SCORER,
    f1_variant: str = DEFAULT_F1_VARIANT,
) -> Dataset:
    """The dataset of Mem-Gallery dialog files, each given as (conversation id, parsed JSON
    object). Pure: image references are mapped, not looked up (see :func:`parse`)."""
    for number in MEMGALLERY_CATEGORY_OF_TYPE.values():
        if number not in categories:
            raise ValueError(f"the categories do not name Mem-Gallery's category {number}")
    conversations: list[Conversation] = []
    questions: list[Question] = []
    for conversation_id, document in documents:
        conversation, conversation_questions = _document(conversation_id, document, categories)
        conversations.append(conversation)
        questions.extend(conversation_questions)
    return Dataset(
        dataset_id=dataset_id,
        version=version,
        categories=dict(categories),
        scorer=scorer,
        f1_variant=f1_variant,
        conversations=conversations,
        questions=questions,
    )


def image_reference(path: object, where: str) -> str:
    """The reference of a source image path: ``"../image/<reference>"`` -> ``"<reference>"``."""
    if not isinstance(path, str) or not path.startswith(IMAGE_PREFIX):
        raise ValueError(f"{where}: image path {path!r} does not start with {IMAGE_PREFIX!r}")
    try:
        return check_reference(path[len(IMAGE_PREFIX) :])
    except ImageError as error:
        raise ValueError(f"{where}: {error}") from None


def date_timestamp_ms(text: str) -> int:
    """Unix ms of midnight UTC of a ``YYYY-MM-DD`` date; ValueError for anything else."""
    match = _DATE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a YYYY-MM-DD date: {text!r}")
    year, month, day = (int(group) for group in match.groups())
    if not 1 <= month <= 12 or not 1 <= day <= calendar.monthrange(year, month)[1]:
        raise ValueError(f"not a YYYY-MM-DD date: {text!r}")
    return calendar.timegm((year, month, day, 0, 0, 0, 0, 0, 0)) * 1000


def question_id(conversation_id: str, index: int) -> str:
    return f"{conversation_id}:q{index:04d}"


def _document(
    conversation_id: str, document: Mapping[str, Any], categories: Mapping[int, str]
) -> tuple[Conversation, list[Question]]:
    where = f"conversation {conversation_id!r}"
    if _ID.fullmatch(conversation_id) is None:
        raise ValueError(f"{where}: the file name must match {_ID.pattern} (it becomes an id)")
    raw_sessions = document.get("multi_session_dialogues")
    raw_questions = document.get(QA_KEY)
    if not isinstance(raw_sessions, list) or not isinstance(raw_questions, list):
        raise ValueError(f"{where}: needs the lists multi_session_dialogues and {QA_KEY!r}")
    sessions = [_session(where, index, raw) for index, raw in enumerate(raw_sessions, start=1)]
    keys = [session.session_key for session in sessions]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}: a session_id is given twice")
    conversation = Conversation(
        conversation_id=conversation_id,
        speakers=SPEAKERS,
        sessions=sessions,
        speakers_are_roles=True,
    )
    questions = [
        _question(conversation_id, index, raw, categories)
        for index, raw in enumerate(raw_questions)
    ]
    return conversation, questions


def _session(where: str, index: int, raw: object) -> Session:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} session {index}: not an object")
    key, date, rounds = raw.get("session_id"), raw.get("date"), raw.get("dialogues")
    if not isinstance(key, str) or not key or not isinstance(rounds, list):
        raise ValueError(f"{where} session {index}: needs session_id and dialogues")
    here = f"{where} session {key!r}"
    if not isinstance(date, str):
        raise ValueError(f"{here}: needs a date")
    try:
        timestamp_ms = date_timestamp_ms(date)
    except ValueError as error:
        raise ValueError(f"{here}: {error}") from None
    turns: list[Turn] = []
    for number, item in enumerate(rounds, start=1):
        turns.extend(_round(here, number, item))
    return Session(
        session_key=key, index=index, date_text=date, timestamp_ms=timestamp_ms, turns=turns
    )


def _round(where: str, number: int, raw: object) -> list[Turn]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where} round {number}: not an object")
    round_id, user, assistant = raw.get("round"), raw.get("user"), raw.get("assistant")
    if not isinstance(round_id, str) or not round_id:
        raise ValueError(f"{where} round {number}: needs a round id")
    here = f"{where} round {round_id!r}"
    if not isinstance(user, str) or not isinstance(assistant, str):
        raise ValueError(f"{here}: user and assistant must be strings")
    paths = _string_list(raw.get("input_image"), f"{here} input_image")
    images = tuple(image_reference(path, f"{here}") for path in paths)
    ids = _string_list(raw.get("image_id"), f"{here} image_id")
    captions = _string_list(raw.get("image_caption"), f"{here} image_caption")
    for name, values in (("image_id", ids), ("image_caption", captions)):
        if values and len(values) != len(images):
            raise ValueError(
                f"{here}: {len(values)} {name} entries for {len(images)} input_image entries"
            )
    caption = CAPTION_SEPARATOR.join(text.strip() for text in captions if text.strip())
    turns: list[Turn] = []
    if user.strip() or images:
        turns.append(
            Turn(
                turn_id=f"{round_id}:user",
                speaker=SPEAKERS[0],
                text=user,
                image_caption=caption or None,
                images=images,
                image_ids=tuple(ids),
            )
        )
    if assistant.strip():
        turns.append(Turn(turn_id=f"{round_id}:assistant", speaker=SPEAKERS[1], text=assistant))
    return turns


def _string_list(value: object, where: str) -> list[str]:
    """A list of strings (None or absent: empty)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where}: must be a list of strings")
    return list(value)


def _question(
    conversation_id: str, index: int, raw: object, categories: Mapping[int, str]
) -> Question:
    where = f"conversation {conversation_id!r} question {index}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: not an object")
    point, text, answer = raw.get("point"), raw.get("question"), raw.get("answer")
    if not isinstance(point, str) or point.strip() not in MEMGALLERY_CATEGORY_OF_TYPE:
        raise ValueError(
            f"{where}: unknown task type {point!r}; known: {', '.join(MEMGALLERY_TASK_TYPES)}"
        )
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: needs a question")
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
        raise ValueError(f"{where}: needs an answer")
    category = MEMGALLERY_CATEGORY_OF_TYPE[point.strip()]
    gold: str | None = str(answer)
    if category == ANSWER_REFUSAL and _is_refusal(str(answer)):
        gold = None
    question_image = raw.get("question_image")
    images = () if question_image is None else (image_reference(question_image, where),)
    caption = raw.get("image_caption")
    if caption is not None and not isinstance(caption, str):
        raise ValueError(f"{where}: image_caption must be a string")
    return Question(
        question_id=question_id(conversation_id, index),
        conversation_id=conversation_id,
        question=text,
        answer=gold,
        category=category,
        category_name=categories[category],
        evidence=_string_list(raw.get("clue"), f"{where} clue"),
        adversarial=False,
        images=images,
        image_caption=caption.strip() or None if isinstance(caption, str) else None,
    )


def _is_refusal(answer: str) -> bool:
    return " ".join(re.sub(r"[^\w\s]", " ", answer.lower()).split()) == REFUSAL_GOLD
