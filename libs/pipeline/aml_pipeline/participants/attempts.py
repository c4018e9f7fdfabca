"""What one HTTP exchange with a participant leaves in the audit trail (R-7.3), and the clock
that measures it: the participant is charged for its own time only, never for AML's queueing."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel

from aml_pipeline.capacity import Departure
from aml_pipeline.participants.reading import BodyRejected

Operation = Literal["add", "add_status", "search", "health"]


class Attempt(BaseModel):
    """One HTTP exchange, as the audit trail keeps it (R-7.3)."""

    operation: Operation
    attempt: int
    # When the request's headers started going out (when it was handed to the HTTP client, if
    # it never got that far).
    started_at: datetime
    # The participant's time only: request sent -> response received (or the error).
    latency_ms: float
    # The platform's own time before the request left: its wait for the participant's capacity
    # and, on a fresh connection, the connect (R-7.3 keeps it apart so a participant is never
    # charged for AML's queueing).
    queued_ms: float = 0.0
    status: int | None
    error_class: str | None
    outcome: Literal["ok", "retry", "final"]
    # Body bytes read (after decompression; reading stops past the operation's limit); None when
    # the body was not read.
    response_bytes: int | None = None
    # The contract violation found while reading the answer (too large, undecodable): set only
    # on such an attempt, which is final.
    validation: str | None = None


Observer = Callable[[Attempt], Awaitable[None]]


class Timing:
    """When an attempt began waiting for capacity, and when its request was sent: the moment
    its headers started going out (`Departure`), or, for a request that never got that far (no
    connection), the moment it was handed to the HTTP client."""

    def __init__(self) -> None:
        self.queued_from = time.monotonic()
        self.started = datetime.now(UTC)
        self.t0: float | None = None
        self._departure: Departure | None = None

    def sent(self, departure: Departure) -> None:
        self.started, self.t0 = datetime.now(UTC), time.monotonic()
        self._departure = departure

    def _left(self) -> None:
        departure = self._departure
        if departure is not None and departure.sent_at is not None:
            self.started = datetime.fromtimestamp(departure.sent_at, UTC)
            self.t0 = departure.sent_monotonic

    def attempt(
        self,
        operation: Operation,
        attempt: int,
        status: int | None,
        error: Exception | None,
        outcome: Literal["ok", "retry", "final"],
        size: int | None = None,
    ) -> Attempt:
        end = time.monotonic()
        self._left()
        sent = self.t0 if self.t0 is not None else end
        return Attempt(
            operation=operation,
            attempt=attempt,
            started_at=self.started,
            latency_ms=round((end - sent) * 1000, 3),
            queued_ms=round((sent - self.queued_from) * 1000, 3),
            status=status,
            error_class=type(error).__name__ if error else None,
            outcome=outcome,
            response_bytes=size,
        )

    def rejected(self, operation: Operation, attempt: int, error: BodyRejected) -> Attempt:
        """An answer whose body broke a reading limit: final, with the violation recorded."""
        record = self.attempt(operation, attempt, error.status, None, "final", error.size)
        return record.model_copy(
            update={"error_class": error.error_class, "validation": error.reason}
        )
