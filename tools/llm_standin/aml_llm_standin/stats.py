"""What the stand-in saw, for `GET /stats`: calls, concurrency and rate, from arrival times; and
for `GET /stats/intervals`, when each served request held its slot, so that a benchmark can
tell how busy the model was over any window it chooses afterwards (a window only known once the
run is over, such as "from the first written conversation to the job's end").

Everything runs on the server's one event loop, so plain counters need no lock."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel, Field

from .coding import SCRIPTED_MODEL


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most arrivals in any half-open window [t, t + window) of `times` (any order).

    Half-open: a sender keeping exactly n per second (arrivals 1/n apart) shows n, not n + 1."""
    ordered = sorted(times)
    best = start = 0
    for end, arrival in enumerate(ordered):
        while arrival - ordered[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


class StatsReport(BaseModel):
    model: str = Field(
        default=SCRIPTED_MODEL,
        description="what answers: fixed scripts, no language model (for a demo to say so)",
    )
    latency_s: float
    capacity: int
    calls: int = Field(description="chat completion requests, rejected ones included")
    served: int = Field(description="answered 200 after the latency")
    rejected_429: int = Field(description="answered 429 at once: over the declared capacity")
    invalid: int = Field(description="answered 400 (not a chat completion request); not calls")
    by_kind: dict[str, int] = Field(
        description="served calls per prompt kind: answer, judge, coding (an agent's step)"
    )
    max_concurrency: int = Field(
        description="most requests in flight at an arrival, that one included (what was sent)"
    )
    max_active: int = Field(description="most requests served at once (at most the capacity)")
    max_in_1s: int = Field(description="most arrivals in any 1 s window [t, t+1)")


class BusyIntervals(BaseModel):
    clock: str = Field(default="time.monotonic", description="the clock of the times below")
    intervals: list[tuple[float, float]] = Field(
        description="(start, end) of every served request that ended since the last reset, in "
        "the order they ended: from its admission to its answer (429s hold no slot, no interval)"
    )


class CallStats:
    def __init__(self, latency_s: float, capacity: int) -> None:
        self.latency_s = latency_s
        self.capacity = capacity
        self.in_flight = 0
        self.active = 0
        self.reset()

    def reset(self) -> None:
        """Forget everything seen so far (between a benchmark's scenarios). Requests still in
        flight stay counted as in flight, so the next peaks remain true."""
        self._arrivals: list[float] = []
        self._served: Counter[str] = Counter()
        self._rejected = 0
        self._invalid = 0
        self._max_concurrency = 0
        self._max_active = 0
        self._intervals: list[tuple[float, float]] = []

    def arrive(self) -> bool:
        """Count an arrival; True when it may be served (a slot is free), False for a 429."""
        self._arrivals.append(time.monotonic())
        self.in_flight += 1
        self._max_concurrency = max(self._max_concurrency, self.in_flight)
        if self.active >= self.capacity:
            self._rejected += 1
            return False
        self.active += 1
        self._max_active = max(self._max_active, self.active)
        return True

    def leave(self, admitted: bool, started: float | None = None) -> None:
        """A request is done; an admitted one with its admission time (`time.monotonic()`)
        is recorded as a busy interval until now."""
        self.in_flight -= 1
        if admitted:
            self.active -= 1
            if started is not None:
                self._intervals.append((started, time.monotonic()))

    def served(self, kind: str) -> None:
        self._served[kind] += 1

    def invalid(self) -> None:
        self._invalid += 1

    def report(self) -> StatsReport:
        return StatsReport(
            latency_s=self.latency_s,
            capacity=self.capacity,
            calls=len(self._arrivals),
            served=sum(self._served.values()),
            rejected_429=self._rejected,
            invalid=self._invalid,
            by_kind=dict(self._served),
            max_concurrency=self._max_concurrency,
            max_active=self._max_active,
            max_in_1s=max_in_window(self._arrivals),
        )

    def intervals(self) -> BusyIntervals:
        return BusyIntervals(intervals=list(self._intervals))
