"""Each user's chain of Adds: which Add goes out next, and how many users write at once.

A user's Adds are confirmed strictly in order (the next is released only once the previous is
confirmed), so at any moment its chunks are a run of `done` ones followed by the rest. The next
Add is therefore found by its id (`user_chunk_id`) — one lookup after a confirmation, a galloping
search from a remembered position otherwise — never by a query over the job's Adds, whose cost
would grow with the job (nx-27017 serves such a filter by reading every chunk of the job).

Users do not all start at once: a job writes a window of users a little wider than the
participant's declared concurrency, those with the most questions per Add first (a history
long enough to bound the job first of all, `start_order`), and starts the next user when one is
written in full. Conversations are then written early and one after another, so their
questions flow into Search and the LLM while the others are still being written, instead of all
conversations finishing together at the end of the Add phase.

The scheduler releases a user's first Add and every Add something gates (searches held before
it, the window); the adder hands on the next Add of a chain itself, right after it confirmed
one, when nothing gates it (`goes_on_by_itself`), so a user's next Add does not wait for a round
trip through the scheduler. Both publish it under the same message id (`release_add`), so the
broker keeps one, whoever publishes first."""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aml_contract.messages import AddWork
from aml_pipeline.capacity import Capacity
from aml_runtime.broker import Bus, publish_work
from aml_runtime.telemetry import item_trace

Chunk = TypeVar("Chunk", bound=Mapping[str, Any])

# What one user's chain of Adds is assumed to take per link at most (the participant's answer
# and the platform's hand-on to the next Add), to size the window under a declared rate.
USER_LINK_SECONDS = 0.3


def add_order(
    chunk_users: Iterable[str], question_users: Iterable[str] = (), window: int = 1
) -> list[str]:
    """A job's users in the order their Adds start (`start_order`), from each Add's user and
    each question's user."""
    return start_order(Counter(chunk_users), Counter(question_users), window)


def start_order(adds: Mapping[str, int], asked: Mapping[str, int], window: int) -> list[str]:
    """A job's users in the order their Adds start, from each user's number of Adds and of
    questions (`window`: users written at once, `active_window`).

    Most questions per Add first: a written conversation's questions keep Search and the LLM
    busy while the next ones are written, and one with many questions per Add buys the most of
    that time per Add (LoCoMo-10: conv-26's 28 Adds bring 199 questions, conv-44's 46 bring
    158). But a user whose chain alone is as long as the other users' Adds shared by the window
    (`Adds * window >= the others' Adds`) would end after them all if it started last, and so
    bound the job: such users start first, most Adds first (a job of a few users, or one long
    history among short ones). Ties: more Adds first, then by id."""
    total = sum(adds.values())

    def place(user: str) -> tuple[int, float, int, str]:
        count = adds[user]
        if count * window >= total - count:
            return 0, 0.0, -count, user
        return 1, -asked.get(user, 0) / count, -count, user

    return sorted(adds, key=place)


def active_window(capacity: Capacity) -> int:
    """Users of one job written at once: the declared concurrency and a quarter more (at least
    one), so that a user between two of its Adds (its confirmation travelling to the scheduler
    and its next Add back) does not leave a slot idle. Under a declared rate, no more than that
    rate needs to keep it busy, each user sending an Add every `USER_LINK_SECONDS` (and one
    more): the rate shared by fewer users writes each of them sooner, and their questions reach
    Search and the LLM sooner (LoCoMo-10 at 4 at once and 10/s: 4 users, not 5; its Adds take
    0.3 s and the hand-on about 0.1 s, so 3 users kept it at 7 Adds a second, 4 at 8)."""
    window = capacity.max_concurrency + max(1, capacity.max_concurrency // 4)
    if capacity.max_rps is None:
        return window
    return min(window, math.ceil(capacity.max_rps * USER_LINK_SECONDS) + 1)


async def first_not_done(
    lookup: Callable[[int], Awaitable[Chunk | None]], start: int
) -> tuple[int, Chunk | None]:
    """The first chunk at or after `start` whose `state` is not done, as (seq, chunk); chunk
    is None when the chain ends before it (every chunk is done). `start` must not be past that chunk
    (every chunk before `start` is done). Galloping then bisecting: O(log distance) lookups, one
    when `start` is the answer."""
    done_until = start - 1  # every seq <= done_until is done
    step, probe = 1, start
    while True:
        chunk = await lookup(probe)
        if chunk is None or chunk["state"] != "done":
            break
        done_until, probe, step = probe, probe + step, step * 2
    found: tuple[int, Chunk | None] = (probe, chunk)
    low, high = done_until, probe
    while high - low > 1:
        middle = (low + high) // 2
        chunk = await lookup(middle)
        if chunk is not None and chunk["state"] == "done":
            low = middle
        else:
            high, found = middle, (middle, chunk)
    return found


def bounded_put(memory: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """Remember `key` in a per-process cache that forgets everything at `limit` (forgetting
    costs a database read later, nothing else)."""
    if key not in memory and len(memory) >= limit:
        memory.clear()
    memory[key] = value


@dataclass
class HandedOn:
    """The chunks this process handed on (`release_add`), as it read them while their
    predecessor's request was out, kept for the Add that sends each: so the next Add of a chain
    leaves without a read of its chunk between the confirmation and the request.

    Safe because nothing but its own Add changes a pending chunk, and that Add's message is the
    only one for the chunk (every publish of it is de-duplicated by its id within the broker's
    window, hours) — so a chunk whose message is delivered for the first time is as it was
    read. A later delivery (its first one's worker may have sent it and died) reads the chunk
    again, and so does any replica that did not hand it on. Kept for `keep_seconds` at most,
    and at most `limit` chunks (bodies of whole sessions; the oldest go first)."""

    keep_seconds: float = 60.0
    limit: int = 256
    clock: Callable[[], float] = time.monotonic
    _kept: OrderedDict[str, tuple[float, Mapping[str, Any]]] = field(
        default_factory=OrderedDict, init=False
    )

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, chunk: Mapping[str, Any]) -> None:
        moment = self.clock()
        while self._kept:
            oldest = next(iter(self._kept.values()))[0]
            if len(self._kept) < self.limit and moment - oldest <= self.keep_seconds:
                break
            self._kept.popitem(last=False)
        self._kept[str(chunk["_id"])] = (moment, chunk)

    def take(self, chunk_id: str, delivered: int) -> Mapping[str, Any] | None:
        """The chunk as it was handed on, for the first delivery of its message only (None:
        read it)."""
        kept = self._kept.pop(chunk_id, None)
        if kept is None or delivered != 1 or self.clock() - kept[0] > self.keep_seconds:
            return None
        return kept[1]


def goes_on_by_itself(successor: Mapping[str, Any] | None) -> bool:
    """Whether the adder that confirmed an Add releases the user's next one itself: it exists,
    is not sent yet and no question is asked right before it (those Adds wait for their
    searches, which the scheduler releases first)."""
    return (
        successor is not None
        and successor.get("state") == "pending"
        and not successor.get("searched_before")
    )


async def release_add(bus: Bus, job_id: str, version_id: str, user_id: str, chunk_id: str) -> None:
    """Publish an Add chunk's work, de-duplicated by its id (the broker keeps one copy whoever
    publishes it, within its duplicate window), in the trace of its item."""
    work = AddWork(job_id=job_id, version_id=version_id, request_id=chunk_id)
    # An Add chunk's item id is its request_id: the span carries both names.
    ids = {"job_id": job_id, "item_id": chunk_id, "request_id": chunk_id}
    with item_trace("aml.release", chunk_id, stage="add", user_id=user_id, **ids):
        await publish_work(bus, "add", work, chunk_id)
