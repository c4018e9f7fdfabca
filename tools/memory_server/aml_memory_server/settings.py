"""Configuration of the reference memory server."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

# The auth methods a participant may declare (SPEC ).
AuthMethod = Literal["token", "bearer", "x-api-key", "none"]
AUTH_METHODS: tuple[AuthMethod, ...] = ("token", "bearer", "x-api-key", "none")


class MemoryServerSettings(BaseModel):
    """`key` is a SecretStr so that a repr or a log line of the settings never shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    db_path: Path
    auth_method: AuthMethod = "token"
    key: SecretStr | None = None

    @model_validator(mode="after")
    def _key_matches_method(self) -> Self:
        if self.auth_method != "none" and not (self.key and self.key.get_secret_value()):
            raise ValueError(f"auth method {self.auth_method!r} needs a non-empty key")
        return self
