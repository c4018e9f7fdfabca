from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from aml_gateway.submissions import QuotaPolicy
from aml_runtime.settings import ParticipantCallSettings

# Long enough that guessing is hopeless (`secrets.token_urlsafe(24)` gives 32 characters).
MIN_ADMIN_TOKEN_LENGTH = 24


class GatewaySettings(ParticipantCallSettings):
    # Admin endpoints are closed unless the operator configures a token.
    admin_token: SecretStr = SecretStr("")
    # Production refuses to start with a missing or weak admin token (`startup_problem`).
    environment: Literal["development", "production"] = "development"
    # Where the HTTP API and pages listen.
    host: str = "127.0.0.1"
    # The HTTP port of the API, the pages and /health, /ready.
    port: int = 8000
    # Submission quotas per key and season (README, "Gateway API"), e.g.
    # AML_QUOTAS='{"seasons": [{"name": "2027-S1", "starts_at": "2027-01-01T00:00:00Z", ...}]}'
    quotas: QuotaPolicy = QuotaPolicy()
    # The fixed suite of full runs.
    full_suite: list[str] = Field(default=["locomo_refined"], min_length=1)
    # The datasets of a smoke run that names none (the public sample, R-3.4).
    smoke_suite: list[str] = Field(default=["synthetic"], min_length=1)
    # What a smoke run may name instead of the sample.
    smoke_datasets: list[str] = Field(default=["synthetic", "locomo", "locomo_refined"])
    # Where the gateway reads the benchmark files to count the questions `GET /v1/datasets`
    # lists (the scheduler's AML_DATASETS_ROOT); without them the counts are null.
    datasets_root: Path = Path("../shared/datasets")

    def startup_problem(self) -> str | None:
        """Why this configuration must not serve, or None when it may."""
        token = self.admin_token.get_secret_value().strip()
        if self.environment == "production" and len(token) < MIN_ADMIN_TOKEN_LENGTH:
            return (
                "AML_ADMIN_TOKEN must be set to at least "
                f"{MIN_ADMIN_TOKEN_LENGTH} characters when AML_ENVIRONMENT=production "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')"
            )
        return None
