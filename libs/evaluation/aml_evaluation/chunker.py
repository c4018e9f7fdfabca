"""Chunking of plain-text conversations into Add requests (SPEC R-4.4, R-4.5), ``chunk-v1``.

**Messages.** Each turn of a session becomes one contract :class:`Message`:

- ``role`` is ``"user"`` for the conversation's first speaker (LoCoMo ``speaker_a``) and
  ``"assistant"`` for the second (``speaker_b``). LoCoMo is a dialogue between two people, so the
  roles only tell the two sides apart; the speaker's name stays in the content.
- ``content`` is ``f"{speaker}: {text}"``; a turn that shared an image gets
  ``f" [shares an image: {caption}]"`` appended, because the text track carries no media and the
  caption is the only trace of the image that the dialogue refers to.
- ``timestamp`` is the session's ``timestamp_ms`` for every message of the session: the source
  dates sessions, not turns, and AML does not invent per-turn offsets.
- A conversation whose ``speakers_are_roles`` is set (LongMemEval: a user chatting with an
  assistant) is different: each turn's speaker IS its role, ``"user"`` or ``"assistant"``, and
  the message is sent under that role with ``content`` = the turn's text, unchanged (no
  ``"speaker: "`` prefix, which exists only to name the two people of a LoCoMo dialogue).

**Chunks.** Messages are packed greedily in order. A new chunk starts when adding the next message
would make the current chunk exceed ``max_messages`` (20) messages or ``max_words`` (2,000) words,
words being counted on each message's ``content`` as sent, with the frozen counter
:data:`aml_evaluation.wordcount.WORD_COUNTER_VERSION`. A message is never split: one longer than
``max_words`` forms a chunk of its own. Chunks never span sessions.

**Streaming datasets** (SPEC R-4.5): a chunk is also cut at every point where a question of the
conversation is asked (:attr:`Question.asked_at`, in turns written before it), so that once Add
``seq`` n is confirmed exactly the first P turns are written and the question can be searched
there. Chunks are packed as above, then a chunk that holds a point's boundary is cut there (a
point inside a session thus splits that session's Add); a conversation without points is
chunked exactly as before.

**Multimodal datasets** (track ``"multimodal"``): ``chunk-mm-v1``
(:data:`MULTIMODAL_CHUNKER_VERSION`).

- A turn that shares images becomes a message whose ``content`` is an ordered array: a ``text``
  part holding the turn's text as above but *without* the ``[shares an image: ...]`` suffix (the
  participant gets the image itself; no text part when the turn's text is blank), then one
  ``image_url`` part per image, in the turn's order, whose URL is the image as a
  ``data:<mime>;base64,...`` URL (:func:`aml_evaluation.media.data_url`) of the bytes the
  registry verified against the manifest (:attr:`Dataset.image_files`). A turn without images
  is sent exactly as by ``chunk-v1``.
- Chunks follow the rule above (words counted on text parts only) and also the media limits:
  a new chunk starts when the next message's images would take the Add over
  :data:`aml_evaluation.media.MAX_IMAGES_PER_ADD` images or
  :data:`aml_evaluation.media.MAX_ADD_IMAGE_BYTES` bytes (:func:`aml_evaluation.media.fits_in_add`).
- An image over the limit of where it goes (5 MiB in an Add, 512 KiB in a Search) is sent
  fitted (rule ``fit-v1``, :func:`aml_evaluation.media.fit_image`); a message over the
  per-message limits, an image that cannot be fitted, or a question showing more images than
  a Search may carry is an :class:`aml_evaluation.media.ImageError` (:func:`check_media_limits`,
  run when the dataset is loaded and again when bodies are built): an image is never dropped.
- A question that shows images is searched with ``query`` = [the question's text part, its
  ``image_url`` parts] (:func:`search_query`); any other query stays the plain string.

**Coding datasets** (a format with its own rule, :attr:`Dataset.chunk_rule`): ``coding-v1``
(:data:`CODING_CHUNKER_VERSION`, :mod:`aml_evaluation.coding.chunking` states it). A session is
one trajectory; each turn is sent under its own role (``user``, ``assistant``, ``tool``) with
its text unchanged and its own time (the session's when undated), and a chunk never splits a
step (:attr:`Turn.step`): steps are packed whole by :func:`pack_steps`, under the same limits.

``chunk-v1`` is what the evaluation spec records; jobs over text datasets are unchanged by the
multimodal and coding rules (:func:`chunker_version` names the rule a dataset's Adds follow).

**Add requests.** Per conversation, chunks are numbered ``seq`` = 1, 2, ... across its sessions
in session order; ids come from the contract helpers. The request body is serialised once by
``aml_contract.participant.encode`` and those bytes are what every retry re-sends (R-4.10).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Final

from pydantic import BaseModel, ConfigDict

from aml_contract.participant import (
    AddRequest,
    Content,
    ContentPart,
    ImageUrl,
    ImageUrlPart,
    Message,
    TextPart,
    add_request_id,
    memory_session_id,
    memory_user_id,
)
from aml_evaluation.datasets import Conversation, Dataset, Question, Session, Turn
from aml_evaluation.media import (
    MAX_IMAGE_BYTES,
    MAX_QUERY_IMAGE_BYTES,
    ImageError,
    check_message_images,
    check_query_images,
    data_url,
    fits_in_add,
)
from aml_evaluation.wordcount import count_words

CHUNKER_VERSION: Final = "chunk-v1"
MULTIMODAL_CHUNKER_VERSION: Final = "chunk-mm-v1"
CODING_CHUNKER_VERSION: Final = "coding-v1"
MULTIMODAL_TRACK: Final = "multimodal"
MAX_MESSAGES: Final = 20
MAX_WORDS: Final = 2000

USER_ROLE: Final = "user"
ASSISTANT_ROLE: Final = "assistant"


class AddChunk(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    request_id: str
    user_id: str
    session_id: str
    conversation_id: str
    seq: int  # 1-based per conversation, across its sessions in order
    request: AddRequest


def turn_text(turn: Turn) -> str:
    return f"{turn.speaker}: {turn.text}"


def turn_content(turn: Turn) -> str:
    content = turn_text(turn)
    if turn.image_caption is not None:
        content += f" [shares an image: {turn.image_caption}]"
    return content


def _role(speaker: str, speakers: tuple[str, str]) -> str:
    if speaker == speakers[0]:
        return USER_ROLE
    if speaker == speakers[1]:
        return ASSISTANT_ROLE
    raise ValueError(f"speaker {speaker!r} is neither of {speakers!r}")


def _chat_turn(turn: Turn) -> tuple[str, str]:
    """(role, content) of a turn of a conversation whose speakers are the roles."""
    if turn.speaker not in (USER_ROLE, ASSISTANT_ROLE):
        raise ValueError(
            f"turn {turn.turn_id!r}: role {turn.speaker!r} is neither user nor assistant"
        )
    return turn.speaker, turn.text


def conversation_messages(
    session: Session, speakers: tuple[str, str], *, speakers_are_roles: bool = False
) -> list[Message]:
    if speakers_are_roles:
        pairs = [_chat_turn(turn) for turn in session.turns]
    else:
        pairs = [(_role(turn.speaker, speakers), turn_content(turn)) for turn in session.turns]
    return [
        Message(role=role, content=content, timestamp=session.timestamp_ms)
        for role, content in pairs
    ]


def message_words(message: Message) -> int:
    if isinstance(message.content, str):
        return count_words(message.content)
    # Multimodal content: only text parts carry words; image parts count 0.
    return sum(count_words(part.text) for part in message.content if isinstance(part, TextPart))


def chunk_messages(
    messages: Sequence[Message],
    max_messages: int = MAX_MESSAGES,
    max_words: int = MAX_WORDS,
) -> list[list[Message]]:
    chunks: list[list[Message]] = []
    current: list[Message] = []
    current_words = 0
    for message in messages:
        words = message_words(message)
        if current and (len(current) + 1 > max_messages or current_words + words > max_words):
            chunks.append(current)
            current, current_words = [], 0
        current.append(message)
        current_words += words
    if current:
        chunks.append(current)
    return chunks


# --- coding (coding-v1) ------------------------------------------------------------------------


def pack_steps(
    steps: Sequence[Sequence[Message]],
    max_messages: int = MAX_MESSAGES,
    max_words: int = MAX_WORDS,
) -> list[list[Message]]:
    """Steps (runs of messages kept together) packed greedily into chunks, a new one only when
    the next step would take the current one over a limit; a step over a limit alone is a chunk
    of its own, never split (``coding-v1``)."""
    chunks: list[list[Message]] = []
    current: list[Message] = []
    words = 0
    for step in steps:
        step_words = sum(message_words(message) for message in step)
        if current and (len(current) + len(step) > max_messages or words + step_words > max_words):
            chunks.append(current)
            current, words = [], 0
        current.extend(step)
        words += step_words
    if current:
        chunks.append(current)
    return chunks


def coding_steps(session: Session) -> list[list[Message]]:
    """A coding session's (one trajectory's) messages grouped by step, in order: each turn under
    its own role with its text unchanged, at its own time or else the session's. A turn without
    a step is a step of its own."""
    steps: list[list[Message]] = []
    previous: int | None = None
    for turn in session.turns:
        timestamp = session.timestamp_ms if turn.timestamp_ms is None else turn.timestamp_ms
        if not steps or turn.step is None or turn.step != previous:
            steps.append([])
        steps[-1].append(Message(role=turn.speaker, content=turn.text, timestamp=timestamp))
        previous = turn.step
    return steps


# --- multimodal (chunk-mm-v1) -----------------------------------------------------------------


def chunker_version(dataset: Dataset) -> str:
    """The chunk rule the dataset's Add requests follow."""
    if dataset.chunk_rule is not None:
        return dataset.chunk_rule
    return MULTIMODAL_CHUNKER_VERSION if dataset.track == MULTIMODAL_TRACK else CHUNKER_VERSION


def _image_bytes(dataset: Dataset, reference: str, max_bytes: int) -> bytes:
    """What is sent of an image where at most `max_bytes` fit (fitted when larger)."""
    data = dataset.sendable_image(reference, max_bytes)
    if data is None:
        raise ImageError(
            f"dataset {dataset.dataset_id!r}: image {reference!r} is not among the bundle's "
            "verified files"
        )
    return data


def _image_sizes(
    dataset: Dataset, references: Sequence[str], max_bytes: int
) -> list[tuple[str, int]]:
    return [
        (reference, len(_image_bytes(dataset, reference, max_bytes))) for reference in references
    ]


def check_media_limits(dataset: Dataset) -> None:
    """ImageError naming the turn or question whose images break a media limit (per image,
    per message, per Search query), or whose image has no verified bytes."""
    for conversation in dataset.conversations:
        for session in conversation.sessions:
            for turn in session.turns:
                where = (
                    f"conversation {conversation.conversation_id!r} session "
                    f"{session.session_key!r} turn {turn.turn_id!r}"
                )
                check_message_images(_image_sizes(dataset, turn.images, MAX_IMAGE_BYTES), where)
    for question in dataset.questions:
        where = f"question {question.question_id!r}"
        check_query_images(_image_sizes(dataset, question.images, MAX_QUERY_IMAGE_BYTES), where)


def fitted_images(dataset: Dataset) -> list[str]:
    """The images whose source is over the limit of a place it is sent to (an Add's or a
    Search's), so that they are sent fitted there (rule fit-v1), sorted."""
    fitted = {
        reference
        for conversation in dataset.conversations
        for session in conversation.sessions
        for turn in session.turns
        for reference in turn.images
        if len(dataset.image_files.get(reference, b"")) > MAX_IMAGE_BYTES
    }
    fitted |= {
        reference
        for question in dataset.questions
        for reference in question.images
        if len(dataset.image_files.get(reference, b"")) > MAX_QUERY_IMAGE_BYTES
    }
    return sorted(fitted)


def _image_parts(dataset: Dataset, references: Sequence[str], max_bytes: int) -> list[ContentPart]:
    return [
        ImageUrlPart(
            type="image_url",
            image_url=ImageUrl(
                url=data_url(reference, _image_bytes(dataset, reference, max_bytes), max_bytes)
            ),
        )
        for reference in references
    ]


def multimodal_message(
    dataset: Dataset, turn: Turn, role: str, text: str, timestamp: int | None
) -> Message:
    """A turn's message under chunk-mm-v1: ``text`` (the turn's text without the caption
    suffix), then its images as data URLs; a turn without images keeps ``content`` (str)."""
    parts: list[ContentPart] = [TextPart(type="text", text=text)] if turn.text.strip() else []
    parts += _image_parts(dataset, turn.images, MAX_IMAGE_BYTES)
    return Message(role=role, content=parts, timestamp=timestamp)


def multimodal_messages(
    dataset: Dataset, session: Session, conversation: Conversation
) -> list[tuple[Message, int, int]]:
    """(message, image count, image bytes) of each turn of a session under chunk-mm-v1."""
    out: list[tuple[Message, int, int]] = []
    plain = conversation_messages(
        session, conversation.speakers, speakers_are_roles=conversation.speakers_are_roles
    )
    for turn, message in zip(session.turns, plain, strict=True):
        if not turn.images:
            out.append((message, 0, 0))
            continue
        where = f"conversation {conversation.conversation_id!r} turn {turn.turn_id!r}"
        sizes = _image_sizes(dataset, turn.images, MAX_IMAGE_BYTES)
        check_message_images(sizes, where)
        text = turn.text if conversation.speakers_are_roles else turn_text(turn)
        out.append(
            (
                multimodal_message(dataset, turn, message.role, text, message.timestamp),
                len(sizes),
                sum(size for _, size in sizes),
            )
        )
    return out


def chunk_multimodal_messages(
    messages: Sequence[tuple[Message, int, int]],
    max_messages: int = MAX_MESSAGES,
    max_words: int = MAX_WORDS,
) -> list[list[Message]]:
    """chunk_messages' rule plus the per-Add media limits (see the module docstring)."""
    chunks: list[list[Message]] = []
    current: list[Message] = []
    words = count = size = 0
    for message, images, image_bytes in messages:
        message_word_count = message_words(message)
        if current and (
            len(current) + 1 > max_messages
            or words + message_word_count > max_words
            or not fits_in_add(count, size, images, image_bytes)
        ):
            chunks.append(current)
            current, words, count, size = [], 0, 0, 0
        current.append(message)
        words, count, size = words + message_word_count, count + images, size + image_bytes
    if current:
        chunks.append(current)
    return chunks


def search_query(dataset: Dataset, question: Question) -> Content:
    """A question's Search ``query``: the plain text, or under chunk-mm-v1 for a question that
    shows images, [its text part, its images as data URLs] within the Search media limits."""
    if dataset.track != MULTIMODAL_TRACK or not question.images:
        return question.question
    where = f"question {question.question_id!r}"
    check_query_images(_image_sizes(dataset, question.images, MAX_QUERY_IMAGE_BYTES), where)
    return [
        TextPart(type="text", text=question.question),
        *_image_parts(dataset, question.images, MAX_QUERY_IMAGE_BYTES),
    ]


def _session_chunks(
    dataset: Dataset, conversation: Conversation, session: Session
) -> list[list[Message]]:
    if dataset.chunk_rule == CODING_CHUNKER_VERSION:
        return pack_steps(coding_steps(session))
    if dataset.track == MULTIMODAL_TRACK:
        return chunk_multimodal_messages(multimodal_messages(dataset, session, conversation))
    messages = conversation_messages(
        session, conversation.speakers, speakers_are_roles=conversation.speakers_are_roles
    )
    return chunk_messages(messages)


def cut_at_points(
    chunks: Sequence[list[Message]], written: int, points: Sequence[int]
) -> list[list[Message]]:
    """A session's chunks, each cut wherever the conversation's written turns reach one of
    `points` inside it (`written` turns precede the session): an Add ends at every point."""
    cut: list[list[Message]] = []
    for chunk in chunks:
        inside = [point - written for point in points if written < point < written + len(chunk)]
        cut += [chunk[start:end] for start, end in pairwise([0, *inside, len(chunk)])]
        written += len(chunk)
    return cut


def _conversation_adds(
    dataset: Dataset, conversation: Conversation, run: str, points: Sequence[int] = ()
) -> list[AddChunk]:
    dataset_id = dataset.dataset_id
    user_id = memory_user_id(run, dataset_id, conversation.conversation_id)
    adds: list[AddChunk] = []
    written = 0  # turns of the conversation in earlier sessions (one message per turn)
    for session in conversation.sessions:
        session_id = memory_session_id(run, conversation.conversation_id, session.session_key)
        chunks = cut_at_points(_session_chunks(dataset, conversation, session), written, points)
        written += sum(len(chunk) for chunk in chunks)
        for chunk in chunks:
            seq = len(adds) + 1
            request_id = add_request_id(run, dataset_id, conversation.conversation_id, seq)
            adds.append(
                AddChunk(
                    request_id=request_id,
                    user_id=user_id,
                    session_id=session_id,
                    conversation_id=conversation.conversation_id,
                    seq=seq,
                    request=AddRequest(
                        request_id=request_id,
                        messages=chunk,
                        user_id=user_id,
                        session_id=session_id,
                    ),
                )
            )
    return adds


def plan_adds(dataset: Dataset, run: str) -> list[AddChunk]:
    """All Add requests of a dataset for one run, conversation by conversation, in send order."""
    points = dataset.asked_points()
    return [
        add
        for conversation in dataset.conversations
        for add in _conversation_adds(
            dataset, conversation, run, points.get(conversation.conversation_id, ())
        )
    ]
