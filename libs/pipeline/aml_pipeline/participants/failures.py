"""How a call to a participant fails: the failure kinds that are the participant's, and how
its own text may be quoted in a reason (bounded, so an answer cannot flood a log or a page)."""

from __future__ import annotations

from typing import Literal

from aml_runtime.documents import FailureKind

# The kinds a call to the participant fails with (all of them the participant's).
Failure = Literal[
    FailureKind.CONTRACT_ERROR,
    FailureKind.AUTHENTICATION_ERROR,
    FailureKind.ACCESS_DENIED,
    FailureKind.WRONG_URL,
    FailureKind.PARTICIPANT_OUTAGE,
    FailureKind.RUN_LIMIT_REACHED,
]


# Participant text quoted in a reason is cut to this many characters.
REASON_QUOTE_MAX = 200


class CallFailed(Exception):
    def __init__(self, kind: Failure, reason: str, ends_job: bool = False) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        # The participant was down longer than its outage window: every job waiting on it ends.
        self.ends_job = ends_job


def short(text: str, limit: int = REASON_QUOTE_MAX) -> str:
    """Participant text as it may be quoted in a reason: bounded, control characters escaped."""
    cut = text[:limit]
    cut = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in cut)
    return cut + ("…" if len(text) > limit else "")
