"""The participant contract (SPEC R-4.4 - R-4.8): what AML sends to a memory system and what it
accepts back. Request models are strict about what AML may send (nothing beyond the contract);
response models accept extra fields, which the contract says are ignored."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
)

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]

# What AML reads back from a participant (R-4.9; docs/participants.md, "Size limits"). An answer
# is read as a stream and reading stops past its operation's limit (after decompression): a
# larger answer is a contract violation, never truncated. Health's body is not used at all.
MAX_RESPONSE_BYTES: dict[str, int] = {
    "health": 64 * 1024,
    "add": 256 * 1024,
    "add_status": 256 * 1024,
    "search": 4 * 1024 * 1024,
}
# Arrays and objects nested deeper than this are a contract violation (every answer).
MAX_JSON_DEPTH = 64
# A Search's items are kept on the question's document (16 MiB at most in MongoDB, with its
# other fields): an answer within its 4 MiB reading limit fits unless its extra fields swell
# when stored (long arrays of small numbers).
MAX_STORED_SEARCH_ITEMS_BYTES = 8 * 1024 * 1024
# A 202's task_id is put into the Add-status URL: bounded, and printable characters only.
MAX_TASK_ID_LENGTH = 256


def _printable_task_id(value: str) -> str:
    if not value.isprintable():
        raise ValueError("task_id must hold printable characters only (no control characters)")
    return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: NonEmptyStr


class ImageUrlPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImageUrlPart, Field(discriminator="type")]
# Text and code content is a string; multimodal content may be an ordered array of parts.
Content = NonEmptyStr | Annotated[list[ContentPart], Field(min_length=1)]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: NonEmptyStr
    content: Content
    timestamp: StrictInt | None = Field(default=None, description="Unix time in milliseconds")


class AddRequest(BaseModel):
    """R-4.4. Never carries metadata, app_id, agent_id or async_mode."""

    model_config = ConfigDict(extra="forbid")
    request_id: NonEmptyStr
    messages: Annotated[list[Message], Field(min_length=1)]
    user_id: NonEmptyStr
    session_id: NonEmptyStr


class AddResponse(BaseModel):
    """R-4.6, the synchronous form: HTTP 200 once the memory is persisted and searchable."""

    model_config = ConfigDict(extra="allow")
    # Strict: only JSON `true` is success; 1 or "true" are contract errors, never repaired.
    success: StrictBool
    request_id: str
    user_id: str
    session_id: str


class AddAccepted(BaseModel):
    """R-4.6, the asynchronous form: HTTP 202, allowed only with a bound Add-status URL."""

    model_config = ConfigDict(extra="allow")
    task_id: Annotated[
        str,
        StringConstraints(min_length=1, max_length=MAX_TASK_ID_LENGTH),
        AfterValidator(_printable_task_id),
    ]


class SearchRequest(BaseModel):
    """R-4.7. Never carries filters, rerank or keyword_search."""

    model_config = ConfigDict(extra="forbid")
    query: Content
    user_id: NonEmptyStr
    top_k: Annotated[int, Field(ge=1)]
    options: list[str] | None = Field(default=None, description="multiple choice only")


class SearchItem(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: NonEmptyStr
    content: Content
    score: StrictFloat | StrictInt | None = None
    created_at: str | StrictInt | StrictFloat | None = None


class SearchResponse(BaseModel):
    """R-4.8: `data` ordered by relevance. Other top-level fields are ignored."""

    model_config = ConfigDict(extra="allow")
    data: list[SearchItem]


def add_request_id(run: str, dataset: str, conversation: str, chunk: int) -> str:
    return user_chunk_id(memory_user_id(run, dataset, conversation), chunk)


def user_chunk_id(user_id: str, chunk: int) -> str:
    """The request_id of a memory user's `chunk`-th Add: the platform finds a user's next Add by
    its id, without a query over the job's Adds."""
    return f"{user_id}:chunk-{chunk}"


def memory_user_id(run: str, dataset: str, conversation: str) -> str:
    return f"eval:{run}:{dataset}:{conversation}"


def memory_session_id(run: str, sample: str, session: str) -> str:
    return f"eval:{run}:{sample}:{session}"


def encode(body: AddRequest | SearchRequest) -> bytes:
    """The exact bytes AML sends for a request: built once, stored, and re-sent unchanged on every
    retry (R-4.10). Compact UTF-8 JSON with sorted keys and without unset optional fields, so the
    bytes do not depend on the field order of these models."""
    payload = body.model_dump(mode="json", exclude_none=True)
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")
