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
    smoke_datasets: list[str] = Field(
        default=[
            "synthetic",
            "locomo",
            "locomo_refined",
            "synthetic_multimodal",
            "synthetic_atm",
            "synthetic-coding",
        ]
    )
    # Where the gateway reads the operator's dataset manifests (`manifests/`, written by
    # `aml dataset add`) and the benchmark files to count the questions `GET /v1/datasets`
    # lists (the scheduler's AML_DATASETS_ROOT); without counts in the manifest or the files
    # the counts are null.
    datasets_root: Path = Path("../shared/datasets")
    # At start, NATS and MongoDB must answer within this long, else the gateway exits naming
    # the URL it tried.
    start_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    # Larger request bodies are refused with 413 before they are read (by Content-Length, and
    # by counting a streamed body as it arrives).
    max_request_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # Access requests one client address may send at once (each stores documents and calls
    # the participant's Health URL); beyond it 429 with Retry-After.
    access_request_burst: int = Field(default=10, ge=1, le=100_000)
    # How fast a client address earns access requests back after its burst, per hour.
    access_requests_per_hour: float = Field(default=20.0, gt=0, le=1_000_000)
    # Failed authentications (401, 403) one client address may cause at once; beyond it every
    # authenticated call from the address answers 429 with Retry-After until one is earned back.
    auth_failure_burst: int = Field(default=30, ge=1, le=100_000)
    # How fast a client address earns failed authentications back, per minute.
    auth_failures_per_minute: float = Field(default=30.0, gt=0, le=1_000_000)
    # The limits above are kept in MongoDB and hold for every gateway replica together; the
    # collection stays bounded by itself (a bucket is deleted once full again). This bounds what
    # each process remembers beside them (addresses known to be blocked, and the per-process
    # buckets access requests fall back to while MongoDB does not answer), IPv6 by /64; beyond
    # it the address seen least recently is forgotten, so memory stays bounded under a flood.
    rate_limit_addresses: int = Field(default=10_000, ge=1, le=10_000_000)

    def startup_problem(self) -> str | None:
        """Why this configuration must not serve, or None when it may."""
        token = self.admin_token.get_secret_value().strip()
        if self.environment == "production" and len(token) < MIN_ADMIN_TOKEN_LENGTH:
            return (
                "AML_ADMIN_TOKEN must be set to at least "
                f"{MIN_ADMIN_TOKEN_LENGTH} characters when AML_ENVIRONMENT=production "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')"
            )
        if self.environment == "production" and self.allow_loopback_targets:
            # Participant URLs on loopback or private addresses would reach the platform's own
            # network: for local stacks and tests only.
            return "AML_ALLOW_LOOPBACK_TARGETS must not be true when AML_ENVIRONMENT=production"
        return None
