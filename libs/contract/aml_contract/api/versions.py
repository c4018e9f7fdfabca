"""A system version's endpoints, Memory System Key and limits (R-3.1, R-3.2, R-4.12): the admin's
registration shortcut and the version as its team sees it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, SecretStr, model_validator
from pydantic_core import PydanticCustomError

from aml_contract.api.vocabulary import AuthMethod, Board, Track

# A Memory System Key as the participant issued it: any real key is far shorter.
MemorySystemKey = Annotated[SecretStr, Field(max_length=4096)]

# More requests than this in one run is no limit at all (and stays far inside int64).
MAX_REQUESTS_PER_RUN = 1_000_000_000


class Capacity(BaseModel):
    """What the participant allows AML to send (R-4.12)."""

    model_config = ConfigDict(extra="forbid")
    max_concurrency: Annotated[int, Field(ge=1, le=1024)] = 4
    max_rps: Annotated[float, Field(gt=0, le=10_000)] = 10.0


class VersionRegistration(BaseModel):
    """A system version bound to a team directly: the admin shortcut beside the access-request
    workflow (demos and tests use it)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "team": "acme-memory",
                    "system_name": "acme-recall",
                    "version_label": "1.0",
                    "track": "textual",
                    "board": "industrial",
                    "add_url": "https://memory.example.com/add",
                    "search_url": "https://memory.example.com/search",
                    "health_url": "https://memory.example.com/health",
                    "auth_method": "bearer",
                    "memory_system_key": "msk-REPLACE-ME",
                    "capacity": {"max_concurrency": 4, "max_rps": 10.0},
                }
            ]
        },
    )
    team: Annotated[str, Field(min_length=1, max_length=200)]
    system_name: Annotated[str, Field(min_length=1, max_length=200)]
    version_label: Annotated[str, Field(min_length=1, max_length=100)]
    track: Track = "textual"
    board: Board = "industrial"
    add_url: HttpUrl
    search_url: HttpUrl
    health_url: HttpUrl
    auth_method: AuthMethod = "bearer"
    memory_system_key: MemorySystemKey | None = None
    capacity: Capacity = Capacity()

    @model_validator(mode="after")
    def _key(self) -> VersionRegistration:
        check_memory_system_key(self.auth_method, self.memory_system_key)
        return self


def check_memory_system_key(auth_method: AuthMethod, key: SecretStr | None) -> None:
    """A key exactly when the auth method sends one (R-3.1, R-4.2)."""
    if auth_method != "none" and (key is None or not key.get_secret_value().strip()):
        raise PydanticCustomError(
            "memory_system_key_missing",
            "memory_system_key is required unless auth_method is `none`",
        )
    if auth_method == "none" and key is not None:
        # A key that is never sent should not be stored either.
        raise PydanticCustomError(
            "memory_system_key_unused",
            "auth_method `none` sends no key: leave memory_system_key out",
        )


class VersionRegistered(BaseModel):
    version_id: str
    team_id: str
    leaderboard_api_key: str | None = Field(
        default=None, description="Shown exactly once, when a new team key is issued."
    )


class RunLimits(BaseModel):
    """Limits the participant sets on one run, beside its capacity (R-3.1)."""

    model_config = ConfigDict(extra="forbid")
    max_run_hours: Annotated[float, Field(gt=0, le=24 * 30)] | None = Field(
        default=None, description="Longest a run may keep calling the system; None: no limit."
    )
    max_requests_per_run: Annotated[int, Field(ge=1, le=MAX_REQUESTS_PER_RUN)] | None = None


class VersionProfile(BaseModel):
    """What names a participant version and where it is reached: the part of a version its
    team sees (`VersionView`), an access request holds (`AccessRequestView`) and the version
    document stores (`aml_runtime.documents.VersionFields`) alike."""

    system_name: str
    version_label: str
    tracks: list[Track]
    board: Board
    add_url: str
    search_url: str
    health_url: str
    auth_method: AuthMethod


class VersionView(VersionProfile):
    """A version bound to the calling key (R-3.2), as its team sees it. The Memory System Key
    is never shown, only whether one is stored."""

    version_id: str
    has_memory_system_key: bool
    capacity: Capacity
    created_at: datetime
