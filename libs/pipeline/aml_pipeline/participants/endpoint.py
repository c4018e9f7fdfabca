"""Where and how a participant is called: its URLs and credentials, and the limits it declared
for every replica calling it together."""

from __future__ import annotations

from pydantic import BaseModel, SecretStr

from aml_contract.api.vocabulary import AuthMethod
from aml_pipeline.capacity import Capacity


class Endpoint(BaseModel):
    add_url: str
    search_url: str
    health_url: str
    add_status_url_template: str | None = None
    auth_method: AuthMethod
    secret: SecretStr | None = None
    # Declared capacity, shared by every replica calling this participant.
    capacity: Capacity | None = None
    # Declared run limit: at most this many requests per run, counted per `run_key`
    # (the job) across every replica.
    run_key: str | None = None
    max_requests: int | None = None


def auth_headers(method: AuthMethod, secret: SecretStr | None) -> dict[str, str]:
    if method == "none" or secret is None:
        return {}
    key = secret.get_secret_value()
    if method == "token":
        return {"Authorization": f"Token {key}"}
    if method == "bearer":
        return {"Authorization": f"Bearer {key}"}
    return {"X-Api-Key": key}
