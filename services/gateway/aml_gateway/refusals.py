"""What the gateway's rules answer when they turn a request down, named for what it means.

The rule modules (`access_requests`, `registry`, `publication`, `submissions`) raise or return
these and know nothing of HTTP; `aml_gateway.errors` gives each kind its status, body and
headers, once for every route.

A reason quotes an id or other text from the request only through `echoed`, so that a path or
body of any length never comes back whole.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aml_pipeline.participants import short

# Enough of an echoed id to tell which one was meant (AML's own ids are far shorter).
ECHO_MAX = 80


def echoed(text: str, limit: int = ECHO_MAX) -> str:
    """Text from the request as a reason may quote it: at most `limit` characters with "…"
    when cut, control characters escaped (the participant side's `short`, with the gateway's
    bound)."""
    return short(text, limit)


class Refused(Exception):
    """A request turned down. `reason` is shown to the caller; `details` are further public
    fields of the answer (e.g. the dataset ids that would have been accepted)."""

    def __init__(self, reason: str, **details: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.details = details


class NotFound(Refused):
    """What was asked for does not exist, or is not the caller's to see (the two answer
    alike, so existence is not revealed)."""


class Conflict(Refused):
    """The current state forbids it: already decided, a name another team holds, a job still
    running."""


class Invalid(Refused):
    """Understood, but against a rule: an unsafe URL, a full run without a passed smoke."""


class QuotaExceeded(Refused):
    """Allowed again at `next_allowed_at` (None: no time can be given), judged at `judged_at`,
    so the wait is exact whenever the answer is written."""

    def __init__(
        self,
        reason: str,
        next_allowed_at: datetime | None = None,
        judged_at: datetime | None = None,
    ) -> None:
        super().__init__(reason)
        self.next_allowed_at = next_allowed_at
        self.judged_at = judged_at
