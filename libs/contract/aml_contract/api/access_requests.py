"""Evaluation Access Requests (R-3.1, R-3.2): what a requester sends, what the admins decide, and
what each side reads back."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from aml_contract.api.versions import (
    Capacity,
    MemorySystemKey,
    RunLimits,
    VersionProfile,
    check_memory_system_key,
)
from aml_contract.api.vocabulary import AuthMethod, Board, Label, LongText, ReasonBody, Text, Track

AccessKind = Literal["new_key", "add_version"]
AccessState = Literal["pending", "approved", "rejected"]

# A new_key request's Leaderboard API Key on its way to the requester: `held` (sealed, from
# approval until the first read with the request token), then `delivered` (no copy kept).
KeyDelivery = Literal["held", "delivered"]

# The academic board holds the models fixed so that only the memory method differs.
ACADEMIC_EMBEDDING_MODEL = "text-embedding-v4"
ACADEMIC_LLM = "gpt-4o-mini"

# Deliberately loose: one `@`, no spaces, a dotted domain. Whether the address works is only
# known by writing to it; a stricter pattern would refuse valid international addresses.
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s.]+")


class Contact(BaseModel):
    """Who to reach about a request. The name and email are never public; the organisation
    becomes the new team's name (`new_key`), which the public leaderboard shows beside every
    entry as its team."""

    model_config = ConfigDict(extra="forbid")
    name: Text = Field(description="Never public.")
    email: Annotated[str, StringConstraints(strip_whitespace=True, max_length=254)] = Field(
        description="Never public."
    )
    organisation: Text = Field(
        description="Public: a new_key request's team is named after it on the leaderboard."
    )

    @field_validator("email")
    @classmethod
    def _email(cls, value: str) -> str:
        if not _EMAIL.fullmatch(value):
            raise PydanticCustomError("email", "value is not a valid email address")
        return value


class SourceDisclosure(BaseModel):
    """Where an academic method comes from (R-3.1, R-3.9): kept to detect copied code."""

    model_config = ConfigDict(extra="forbid")
    original_authors: Annotated[list[Text], Field(min_length=1, max_length=100)]
    papers: Annotated[list[LongText], Field(max_length=100)] = Field(
        default_factory=list, description="Citations or links of the method's papers."
    )
    changes: LongText = Field(description="What was changed from the original method.")


class DeclaredModels(BaseModel):
    """The models inside the memory system, shown on the leaderboard (R-2.2)."""

    model_config = ConfigDict(extra="forbid")
    embedding_model: Text | None = Field(
        default=None, description="None when the system embeds nothing (e.g. BM25)."
    )
    llms: Annotated[list[Text], Field(max_length=50)] = Field(default_factory=list)
    reranker: Text | None = Field(default=None, description="Free on every board.")


class AccessRequest(BaseModel):
    """An Evaluation Access Request: a new Leaderboard API Key with its first version, or one
    more version for the key that sends the request (R-3.1)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "kind": "new_key",
                    "contact": {
                        "name": "Ada Lovelace",
                        "email": "ada@example.org",
                        "organisation": "Example University",
                    },
                    "system_name": "recall-graph",
                    "version_label": "1.0",
                    "tracks": ["textual"],
                    "board": "academic",
                    "add_url": "https://memory.example.org/add",
                    "search_url": "https://memory.example.org/search",
                    "health_url": "https://memory.example.org/health",
                    "add_status_url_template": "https://memory.example.org/tasks/{task_id}",
                    "auth_method": "bearer",
                    "memory_system_key": "msk-REPLACE-ME",
                    "capacity": {"max_concurrency": 4, "max_rps": 10.0},
                    "run_limits": {"max_run_hours": 48},
                    "repository_url": "https://github.com/example/recall-graph",
                    "source_disclosure": {
                        "original_authors": ["A. Author", "B. Author"],
                        "papers": ["https://arxiv.org/abs/0000.00000"],
                        "changes": "Replaced the summariser prompt; added time decay.",
                    },
                    "declared_models": {
                        "embedding_model": ACADEMIC_EMBEDDING_MODEL,
                        "llms": [ACADEMIC_LLM],
                        "reranker": "bge-reranker-v2-m3",
                    },
                },
                {
                    "kind": "add_version",
                    "contact": {
                        "name": "Grace Hopper",
                        "email": "grace@example.com",
                        "organisation": "Example Corp",
                    },
                    "system_name": "example-memory",
                    "version_label": "2.1",
                    "tracks": ["textual", "coding"],
                    "board": "industrial",
                    "add_url": "https://api.example.com/memory/add",
                    "search_url": "https://api.example.com/memory/search",
                    "health_url": "https://api.example.com/memory/health",
                    "auth_method": "x-api-key",
                    "memory_system_key": "msk-REPLACE-ME",
                },
            ]
        },
    )
    kind: AccessKind = Field(
        description="`add_version` must be sent with the team's Leaderboard API Key (Bearer)."
    )
    contact: Contact
    system_name: Text
    version_label: Label
    tracks: Annotated[list[Track], Field(min_length=1, max_length=3)]
    board: Board
    add_url: HttpUrl
    search_url: HttpUrl
    health_url: HttpUrl
    add_status_url_template: Annotated[str, StringConstraints(max_length=2000)] | None = Field(
        default=None, description="Polled after an Add answered 202; must contain `{task_id}`."
    )
    auth_method: AuthMethod
    memory_system_key: MemorySystemKey | None = Field(
        default=None, description="Required unless auth_method is `none`; never shown again."
    )
    capacity: Capacity = Capacity()
    run_limits: RunLimits = RunLimits()
    repository_url: HttpUrl | None = Field(default=None, description="Required on academic.")
    source_disclosure: SourceDisclosure | None = Field(
        default=None, description="Required on academic."
    )
    declared_models: DeclaredModels | None = Field(
        default=None, description="Required on academic, where the models are fixed (R-2.2)."
    )

    @field_validator("tracks")
    @classmethod
    def _distinct_tracks(cls, tracks: list[Track]) -> list[Track]:
        if len(set(tracks)) != len(tracks):
            raise PydanticCustomError("duplicate_track", "each track may be listed once")
        return tracks

    @field_validator("add_status_url_template")
    @classmethod
    def _task_placeholder(cls, template: str | None) -> str | None:
        if template is not None and "{task_id}" not in template:
            # Without the placeholder every task would poll the same URL.
            raise PydanticCustomError(
                "task_id_placeholder",
                "the template must contain the {placeholder} placeholder",
                {"placeholder": "{task_id}"},
            )
        return template

    @model_validator(mode="after")
    def _consistent(self) -> AccessRequest:
        check_memory_system_key(self.auth_method, self.memory_system_key)
        if self.board == "academic":
            self._check_academic()
        return self

    def _check_academic(self) -> None:
        missing = [
            name
            for name in ("repository_url", "source_disclosure", "declared_models")
            if getattr(self, name) is None
        ]
        if missing:
            raise PydanticCustomError(
                "academic_disclosure",
                "the academic board requires {missing}",
                {"missing": ", ".join(missing)},
            )
        models = self.declared_models
        assert models is not None  # checked just above
        if models.embedding_model not in (None, ACADEMIC_EMBEDDING_MODEL):
            raise PydanticCustomError(
                "academic_models",
                "the academic board requires the embedding model {required}",
                {"required": ACADEMIC_EMBEDDING_MODEL},
            )
        if any(llm != ACADEMIC_LLM for llm in models.llms):
            raise PydanticCustomError(
                "academic_models",
                "the academic board requires every LLM to be {required}",
                {"required": ACADEMIC_LLM},
            )


class AccessRejection(ReasonBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"reason": "The Health URL did not answer; please resubmit."}]
        },
    )


class HealthCheck(BaseModel):
    ok: bool = Field(description="Whether the Health URL answered 2xx (R-4.3).")
    checked_at: datetime


class AccessRequestView(VersionProfile):
    """An access request as the submitter and the admins see it; the Memory System Key is
    never part of it (R-5.1)."""

    id: str
    kind: AccessKind
    state: AccessState
    team_id: str | None = Field(
        description="The team the version is bound to: the sender's for add_version, the new "
        "team once a new_key request is approved."
    )
    contact: Contact
    add_status_url_template: str | None
    has_memory_system_key: bool
    capacity: Capacity
    run_limits: RunLimits
    repository_url: str | None
    source_disclosure: SourceDisclosure | None
    declared_models: DeclaredModels | None
    health_check: HealthCheck
    warnings: list[str] = Field(description="Accepted but discouraged, e.g. plain http URLs.")
    created_at: datetime
    decided_at: datetime | None
    reason: str | None = Field(description="Why the request was rejected.")
    version_id: str | None = Field(description="The version created on approval.")
    key_delivery: KeyDelivery | None = Field(
        default=None,
        description="new_key requests sent with a request token, once approved: `held` until "
        "the requester's first read with the token returns the key, then `delivered`.",
    )


class AccessRequestCreated(AccessRequestView):
    """The answer to a submitted access request: the request, and for `new_key` the request
    token that reads it (there is no Leaderboard API Key yet)."""

    request_token: str | None = Field(
        default=None,
        description="new_key only: shown exactly once, stored hashed. Send it as a Bearer "
        "token to `GET /v1/access-requests/{id}` to follow the request; the first read after "
        "approval returns the new Leaderboard API Key.",
    )


class AccessRequestStatus(AccessRequestView):
    """An access request as its requester reads it (request token or team key)."""

    leaderboard_api_key: str | None = Field(
        default=None,
        description="The new team's key: only in the first read with the request token after "
        "approval (key_delivery then becomes `delivered`); never again.",
    )


class AccessApproved(BaseModel):
    request_id: str
    version_id: str
    team_id: str
    leaderboard_api_key: str | None = Field(
        default=None,
        description="Only when a new_key request is approved; shown once to the approving "
        "admin, stored hashed. The requester receives it too, once, through its request token.",
    )
