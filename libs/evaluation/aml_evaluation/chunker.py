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

**Add requests.** Per conversation, chunks are numbered ``seq`` = 1, 2, ... across its sessions
in session order; ids come from the contract helpers. The request body is serialised once by
``aml_contract.participant.encode`` and those bytes are what every retry re-sends (R-4.10).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pydantic import BaseModel, ConfigDict

from aml_contract.participant import (
    AddRequest,
    Message,
    TextPart,
    add_request_id,
    memory_session_id,
    memory_user_id,
)
from aml_evaluation.datasets import Conversation, Dataset, Session, Turn
from aml_evaluation.wordcount import count_words

CHUNKER_VERSION: Final = "chunk-v1"
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


def turn_content(turn: Turn) -> str:
    content = f"{turn.speaker}: {turn.text}"
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


def _conversation_adds(dataset_id: str, conversation: Conversation, run: str) -> list[AddChunk]:
    user_id = memory_user_id(run, dataset_id, conversation.conversation_id)
    adds: list[AddChunk] = []
    for session in conversation.sessions:
        session_id = memory_session_id(run, conversation.conversation_id, session.session_key)
        messages = conversation_messages(
            session, conversation.speakers, speakers_are_roles=conversation.speakers_are_roles
        )
        for chunk in chunk_messages(messages):
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
    return [
        add
        for conversation in dataset.conversations
        for add in _conversation_adds(dataset.dataset_id, conversation, run)
    ]
