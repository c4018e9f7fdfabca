"""The platform's clock in one place: aware UTC datetimes for documents, and the exact integer
microseconds (`at_us`) that stage documents are stamped with and progress watermarks compare."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def now() -> datetime:
    return datetime.now(UTC)


def micros(moment: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch (exact, no float rounding)."""
    return (moment - _EPOCH) // MICROSECOND


def now_us() -> int:
    """The `at_us` a terminal write stamps on its stage document."""
    return micros(now())
