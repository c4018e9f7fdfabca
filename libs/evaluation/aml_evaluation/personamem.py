"""The PersonaMem format (bowen-upenn/PersonaMem, "Know Me, Respond to Me", COLM 2025): a
multiple-choice benchmark of a user's evolving preferences, read into a :class:`Dataset`.

**Files.** A bundle lists two files, told apart by their extension:

- the questions, ``.csv`` (``questions_32k.csv``, ...), one row per question with the columns
  ``persona_id``, ``question_id``, ``question_type``, ``user_question_or_message``,
  ``correct_answer``, ``all_options``, ``shared_context_id`` and
  ``end_index_in_shared_context`` (other columns, such as ``topic`` or the context lengths, are
  ignored);
- the shared contexts, ``.jsonl`` (``shared_contexts_32k.jsonl``, ...), one JSON object per
  line, ``{context_id: [{"role": ..., "content": ...}, ...]}``.

**Conversations.** Each shared context that a question refers to is one conversation, so one
memory user, with ``conversation_id`` = the context id; contexts no question refers to are not
written. Every question of a context must name the same ``persona_id``. The context's messages
are its turns, in order, with their roles kept: :attr:`Turn.speaker` is the role and
:attr:`Conversation.speakers` is ``("user", "assistant")``, so the chunker sends each turn under
its own role. ``turn_id`` is ``f"{context_id}:m{index}"``, ``index`` being the message's
0-based position in the context (the position ``end_index_in_shared_context`` counts).

**Sessions.** PersonaMem builds a context by concatenating conversation blocks, each opened by a
``system`` message (the persona card and the block's setting). A session is the run of messages
from one ``system`` message to the next (messages before the first one form a session too);
the ``system`` messages themselves are not written: they are the benchmark's set-up, not
something the user said, and the persona card would hand the memory system the profile it is
meant to build. Sessions are keyed ``session_<n>``, ``n`` counting the blocks from 1; a block
with no user or assistant message is skipped. The format dates nothing, so sessions have no date
(``date_text`` "", ``timestamp_ms`` None) and messages go out without a timestamp. A leading
``"User:"`` on a user message or ``"Assistant:"`` on an assistant message (the source's own
speaker tag, repeated in the text) is removed; a message left empty is skipped.

**Questions.** ``question_id`` is the row's ``question_id``; ``question`` is
``user_question_or_message``. ``all_options`` is a list literal (JSON or Python, as the source
writes it) of 2 to 26 strings, each optionally labelled ``(a)``, ``(b)``, ...: labels, when
present, must be on every option and in order, and are removed, so the options are the clean
texts in their original order (they must be distinct and non-empty). ``correct_answer`` is a
label such as ``(c)`` (``c``, ``(C)`` too); the gold answer is the text of the option it names.
The options go to the participant's Search and to the answer model; the gold never does.

**Categories.** ``question_type`` maps to the seven skills of the PersonaMem paper, numbered in
the paper's order (:data:`PERSONAMEM_CATEGORIES`); released files spell some types differently
(the generator's older names and later renames), and those spellings are listed in
:data:`PERSONAMEM_TYPE_ALIASES`. Any other type is an error. The category's name is the
manifest's name for that number, so the manifest must declare it; a manifest that declares no
categories (a draft, while ``aml dataset add`` checks the files) gets the paper's seven.

**Where a question is asked: a streaming dataset.** ``end_index_in_shared_context`` says how
far into its context a question is asked: PersonaMem asks it after the first ``end_index``
messages. The index must be an integer from 0 to the context's length. The question is searched
once, at that point (:attr:`Question.asked_at`, docs/evaluation.md "Streaming datasets"): after
the turns written from those ``end_index`` messages, i.e. the messages before the index less the
``system`` messages and the messages left empty, which are not written. A question whose end
index has no written turn before it (0, or only system messages before it) is searched before
the context's first Add, against a memory that holds nothing of the user yet, which is where
the benchmark asks it; one at the context's end is searched after the whole context.

Malformed input raises ValueError naming the file and the row (1-based, header excluded) or the
context and message. Work is linear in the input; an ``all_options`` cell longer than
:data:`MAX_OPTIONS_CHARS` is refused before it is parsed.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aml_evaluation.datasets import BundleManifest, Conversation, Dataset, Question, Session, Turn

PERSONAMEM_CATEGORIES: Final[Mapping[int, str]] = {
    1: "recall_user_shared_facts",
    2: "suggest_new_ideas",
    3: "acknowledge_latest_user_preferences",
    4: "track_full_preference_evolution",
    5: "revisit_reasons_behind_preference_updates",
    6: "provide_preference_aligned_recommendations",
    7: "generalize_to_new_scenarios",
}
# Other spellings of the same types in released files: the question generator's older names
# (its `question_type_mapping`) and the variants the 32k, 128k and 1M files use.
PERSONAMEM_TYPE_ALIASES: Final[Mapping[str, int]] = {
    "recalling_facts_mentioned_by_the_user": 1,
    "identifying_new_things_not_mentioned_by_the_user": 2,
    "acknowledge_latest_preferences": 3,
    "recalling_the_latest_user_preferences": 3,
    "track_full_preference_updates": 4,
    "tracking_the_full_sequence_of_preference_updates": 4,
    "recalling_the_reasons_behind_previous_updates": 5,
    "recommendation_aligned_with_users_latest_preferences": 6,
    "generalizing_to_new_scenarios": 7,
    "generalizing_past_reasons_in_memory_to_new_scenarios": 7,
}
SPEAKERS: Final = ("user", "assistant")
SYSTEM_ROLE: Final = "system"
MAX_OPTIONS: Final = 26  # lettered A-Z in the answer prompt
MAX_OPTIONS_CHARS: Final = 200_000

REQUIRED_COLUMNS: Final = (
    "persona_id",
    "question_id",
    "question_type",
    "user_question_or_message",
    "correct_answer",
    "all_options",
    "shared_context_id",
    "end_index_in_shared_context",
)
_TYPE_IDS: Final[Mapping[str, int]] = {
    **{name: number for number, name in PERSONAMEM_CATEGORIES.items()},
    **PERSONAMEM_TYPE_ALIASES,
}
# Ids become parts of user ids, item ids and URLs: no separators, no spaces.
_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_LABEL: Final = re.compile(r"\s*\(\s*([A-Za-z])\s*\)\s*")
_ANSWER: Final = re.compile(r"\s*\(?\s*([A-Za-z])\s*\)?\s*")
_SPEAKER_TAGS: Final[Mapping[str, str]] = {"user": "User:", "assistant": "Assistant:"}


# What the parser reads of a bundle manifest.
PersonaMemManifest = BundleManifest


@dataclass
class _Row:
    where: str
    persona_id: str
    question: Question


def parse(contents: Sequence[tuple[str, bytes]], manifest: PersonaMemManifest) -> Dataset:
    """The dataset of a PersonaMem bundle: ``contents`` are its (path, bytes) files, hash-checked
    by the caller; see the module docstring for the rules."""
    questions_file, contexts_file = _split_files(contents)
    # A draft manifest (`aml dataset add` checking new files) declares no categories yet: the
    # format's own become the dataset's, and so the manifest's.
    categories = manifest.categories or PERSONAMEM_CATEGORIES
    contexts = _read_contexts(*contexts_file)
    written = {context_id: _written_before(messages) for context_id, messages in contexts.items()}
    rows = list(_read_questions(*questions_file, contexts, written, categories))
    personas: dict[str, str] = {}  # context id -> the persona_id its questions name
    seen: set[str] = set()
    for row in rows:
        question = row.question
        if question.question_id in seen:
            raise ValueError(f"{row.where}: question_id {question.question_id!r} given twice")
        seen.add(question.question_id)
        persona_id = personas.setdefault(question.conversation_id, row.persona_id)
        if persona_id != row.persona_id:
            raise ValueError(
                f"{row.where}: persona_id {row.persona_id!r}, but an earlier question of "
                f"shared context {question.conversation_id!r} names {persona_id!r}"
            )
    conversations = [
        _conversation(context_id, messages)
        for context_id, messages in contexts.items()
        if context_id in personas
    ]
    return Dataset(
        dataset_id=manifest.dataset_id,
        version=manifest.version,
        categories=dict(categories),
        scorer=manifest.scorer,
        f1_variant=manifest.f1_variant,
        conversations=conversations,
        questions=[row.question for row in rows],
    )


def category_of(question_type: str) -> int:
    """The category number of a PersonaMem ``question_type`` (KeyError for an unknown one)."""
    return _TYPE_IDS[question_type.strip()]


# --- files ------------------------------------------------------------------------------------


def _split_files(
    contents: Sequence[tuple[str, bytes]],
) -> tuple[tuple[str, bytes], tuple[str, bytes]]:
    csvs = [item for item in contents if item[0].lower().endswith(".csv")]
    jsonls = [item for item in contents if item[0].lower().endswith(".jsonl")]
    if len(csvs) != 1 or len(jsonls) != 1 or len(contents) != 2:
        names = ", ".join(repr(name) for name, _ in contents) or "none"
        raise ValueError(
            f"a PersonaMem bundle is one questions .csv and one shared contexts .jsonl; got {names}"
        )
    return csvs[0], jsonls[0]


def _text(name: str, data: bytes) -> str:
    try:
        # utf-8-sig: a spreadsheet's byte order mark is not part of the first column's name.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"{name}: not UTF-8 ({error.reason} at byte {error.start})") from None


# --- shared contexts --------------------------------------------------------------------------


def _read_contexts(name: str, data: bytes) -> dict[str, list[Mapping[str, Any]]]:
    contexts: dict[str, list[Mapping[str, Any]]] = {}
    for number, line in enumerate(_text(name, data).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error.msg})") from None
        if not isinstance(value, dict) or len(value) != 1:
            raise ValueError(f"{where}: expected one object {{context_id: [messages]}}")
        ((context_id, messages),) = value.items()
        _check_id(where, "context id", context_id)
        if context_id in contexts:
            raise ValueError(f"{where}: shared context {context_id!r} given twice")
        if not isinstance(messages, list):
            raise ValueError(f"{where}: shared context {context_id!r} is not a list of messages")
        for index, message in enumerate(messages):
            _check_message(f"{where}: shared context {context_id!r} message {index}", message)
        contexts[context_id] = messages
    return contexts


def _check_message(where: str, message: object) -> None:
    if not isinstance(message, dict):
        raise ValueError(f"{where}: not an object with role and content")
    role, content = message.get("role"), message.get("content")
    if role not in (*SPEAKERS, SYSTEM_ROLE):
        raise ValueError(f"{where}: role {role!r} is none of user, assistant, system")
    if not isinstance(content, str):
        raise ValueError(f"{where}: content is not a string")


def _conversation(context_id: str, messages: list[Mapping[str, Any]]) -> Conversation:
    sessions: list[Session] = []
    for number, block in enumerate(_blocks(messages), start=1):
        turns = [
            Turn(turn_id=f"{context_id}:m{index}", speaker=role, text=text)
            for index, role, text in block
        ]
        if turns:
            sessions.append(
                Session(
                    session_key=f"session_{number}",
                    index=number,
                    date_text="",
                    timestamp_ms=None,
                    turns=turns,
                )
            )
    if not sessions:
        raise ValueError(f"shared context {context_id!r}: no user or assistant message")
    return Conversation(
        conversation_id=context_id, speakers=SPEAKERS, sessions=sessions, speakers_are_roles=True
    )


def _written_before(messages: list[Mapping[str, Any]]) -> list[int]:
    """For each index 0..len(messages), how many turns the messages before it write."""
    counts = [0]
    for message in messages:
        role, content = str(message["role"]), str(message["content"])
        kept = role != SYSTEM_ROLE and bool(_without_speaker_tag(role, content))
        counts.append(counts[-1] + kept)
    return counts


def _blocks(messages: list[Mapping[str, Any]]) -> Iterator[list[tuple[int, str, str]]]:
    """The context split at its system messages: (index, role, text) of each kept message."""
    block: list[tuple[int, str, str]] = []
    for index, message in enumerate(messages):
        role, content = str(message["role"]), str(message["content"])
        if role == SYSTEM_ROLE:
            if index:  # a context that opens with a system message has no block before it
                yield block
            block = []
            continue
        text = _without_speaker_tag(role, content)
        if text:
            block.append((index, role, text))
    yield block


def _without_speaker_tag(role: str, content: str) -> str:
    text = content.strip()
    tag = _SPEAKER_TAGS[role]
    return text[len(tag) :].strip() if text.startswith(tag) else text


# --- questions --------------------------------------------------------------------------------


def _read_questions(
    name: str,
    data: bytes,
    contexts: Mapping[str, list[Mapping[str, Any]]],
    written: Mapping[str, list[int]],
    categories: Mapping[int, str],
) -> Iterator[_Row]:
    reader = csv.DictReader(io.StringIO(_text(name, data), newline=""))
    try:
        header = reader.fieldnames or []
    except csv.Error as error:
        raise ValueError(f"{name} header: {error}") from None
    missing = [column for column in REQUIRED_COLUMNS if column not in header]
    if missing:
        raise ValueError(f"{name}: missing column(s) {', '.join(missing)}")
    number = 0
    while True:
        number += 1
        where = f"{name} row {number}"
        try:
            raw = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise ValueError(f"{where}: {error}") from None
        if None in raw or any(raw[column] is None for column in REQUIRED_COLUMNS):
            raise ValueError(f"{where}: {len(header)} columns expected")
        question_id = raw["question_id"].strip()
        _check_id(where, "question_id", question_id)
        where = f"{where} (question_id {question_id})"
        yield _row(where, question_id, raw, contexts, written, categories)


def _row(
    where: str,
    question_id: str,
    raw: Mapping[str, str],
    contexts: Mapping[str, list[Mapping[str, Any]]],
    written: Mapping[str, list[int]],
    categories: Mapping[int, str],
) -> _Row:
    context_id = raw["shared_context_id"].strip()
    if context_id not in contexts:
        raise ValueError(f"{where}: shared context {context_id!r} is not in the contexts file")
    end = _end_index(where, raw["end_index_in_shared_context"], len(contexts[context_id]))
    question_type = raw["question_type"].strip()
    category = _TYPE_IDS.get(question_type)
    if category is None:
        known = ", ".join(PERSONAMEM_CATEGORIES.values())
        raise ValueError(f"{where}: unknown question_type {question_type!r} (known: {known})")
    if category not in categories:
        raise ValueError(
            f"{where}: question_type {question_type!r} is category {category}, which the "
            "manifest does not declare"
        )
    text = raw["user_question_or_message"].strip()
    if not text:
        raise ValueError(f"{where}: empty user_question_or_message")
    persona_id = raw["persona_id"].strip()
    if not persona_id:
        raise ValueError(f"{where}: empty persona_id")
    options = parse_options(where, raw["all_options"])
    gold = options[_answer_index(where, raw["correct_answer"], len(options))]
    question = Question(
        question_id=question_id,
        conversation_id=context_id,
        question=text,
        answer=gold,
        category=category,
        category_name=categories[category],
        evidence=[],
        adversarial=False,
        options=options,
        asked_at=(written[context_id][end],),
    )
    return _Row(where=where, persona_id=persona_id, question=question)


def _check_id(where: str, what: str, value: object) -> None:
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise ValueError(
            f"{where}: {what} {value!r} must be letters, digits, '_', '.' or '-' "
            "(not starting with '_', '.' or '-')"
        )


def _end_index(where: str, text: str, length: int) -> int:
    try:
        end = int(text.strip())
    except ValueError:
        raise ValueError(
            f"{where}: end_index_in_shared_context {text!r} is not an integer"
        ) from None
    if not 0 <= end <= length:
        raise ValueError(
            f"{where}: end_index_in_shared_context {end} is outside its context's "
            f"0..{length} messages"
        )
    return end


def parse_options(where: str, text: str) -> list[str]:
    """The clean option texts of an ``all_options`` cell, in order (see the module docstring);
    ``where`` names the row in errors."""
    if len(text) > MAX_OPTIONS_CHARS:
        raise ValueError(f"{where}: all_options is longer than {MAX_OPTIONS_CHARS} characters")
    value = _list_literal(where, text)
    if not (
        isinstance(value, list)
        and 2 <= len(value) <= MAX_OPTIONS
        and all(isinstance(option, str) for option in value)
    ):
        raise ValueError(f"{where}: all_options must be a list of 2 to {MAX_OPTIONS} strings")
    options = [option.strip() for option in value]
    if any(_LABEL.match(option) for option in value):
        for index, option in enumerate(value):
            match = _LABEL.match(option)
            expected = chr(ord("a") + index)
            if match is None or match.group(1).lower() != expected:
                raise ValueError(
                    f"{where}: option {index + 1} {option[:40]!r} is not labelled ({expected}); "
                    "labels must be on every option, in order"
                )
            options[index] = option[match.end() :].strip()
    if not all(options):
        raise ValueError(f"{where}: an option is empty")
    if len(set(options)) != len(options):
        raise ValueError(f"{where}: two options have the same text")
    return options


def _list_literal(where: str, text: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    try:
        # Literals only: ast.literal_eval evaluates no names, calls or operators.
        return ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"{where}: all_options is not a list literal") from None


def _answer_index(where: str, text: str, count: int) -> int:
    match = _ANSWER.fullmatch(text)
    if match is None:
        raise ValueError(f"{where}: correct_answer {text!r} is not an option label like (c)")
    index = ord(match.group(1).lower()) - ord("a")
    if index >= count:
        raise ValueError(f"{where}: correct_answer {text!r} names no option (there are {count})")
    return index
