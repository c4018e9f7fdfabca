"""R-4.10's retry table: which answers are retried and which are final, which say the
participant is down rather than this request wrong (R-4.13), and how long to wait in between."""

from __future__ import annotations

import email.utils
import random
from datetime import UTC, datetime

import httpx
from pydantic import BaseModel, Field

from aml_pipeline.participants.failures import Failure
from aml_runtime.documents import FailureKind

ADD_RETRYABLE = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 524})
SEARCH_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
# Answers no retry heals: the request, its credentials or its URL is wrong.
FINAL_STATUSES: dict[int, tuple[Failure, str]] = {
    400: (
        FailureKind.CONTRACT_ERROR,
        "the participant rejected the request as malformed (HTTP 400)",
    ),
    422: (FailureKind.CONTRACT_ERROR, "the participant rejected the request as invalid (HTTP 422)"),
    401: (FailureKind.AUTHENTICATION_ERROR, "the participant rejected the credentials (HTTP 401)"),
    403: (FailureKind.ACCESS_DENIED, "the participant denied access (HTTP 403)"),
    404: (FailureKind.WRONG_URL, "the endpoint URL does not exist (HTTP 404)"),
}


# Answers that say the participant (or what stands in front of it) is down or overloaded, not
# that this request is wrong: its lane pauses instead of failing the work. 500 is left
# out: a server that is up but fails one request (a query it cannot handle) must not stop the
# run; its item fails after the retry table's attempts, as before.
DOWN_STATUSES = frozenset({429, 502, 503, 504, 524})


def participant_down(status: int | None, error: Exception | None) -> bool:
    """Whether a failed attempt says the participant is unreachable: no connection, a reset
    or a timeout (any transport error), or one of `DOWN_STATUSES`."""
    if error is not None:
        return isinstance(error, httpx.TransportError)
    return status in DOWN_STATUSES


class RetryPolicy(BaseModel):
    max_attempts: int = 5
    backoff_base_seconds: float = 3.0
    backoff_max_seconds: float = 30.0
    # The share of each back-off's ceiling that is always waited ("equal jitter"): with full
    # jitter five attempts could all fall within a second or two of a participant's restart.
    # With the defaults, five attempts span 22.5 to 45 s.
    backoff_floor_share: float = Field(default=0.5, ge=0, le=1)
    # A participant's Retry-After is honoured up to this long: past it, a worker would sit idle
    # for the participant's say-so, and the bounded attempts end the call sooner anyway.
    retry_after_max_seconds: float = 600.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter above a floor (`backoff_floor_share` of the
        ceiling); a server's Retry-After wins when it is longer."""
        ceiling = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** (attempt - 1))
        backoff = random.uniform(ceiling * self.backoff_floor_share, ceiling)
        if retry_after is None:
            return backoff
        return max(backoff, min(retry_after, self.retry_after_max_seconds))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as delta-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # The asctime and "-0000" forms carry no zone; HTTP dates are always GMT.
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
