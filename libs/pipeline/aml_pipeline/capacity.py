"""Declared capacity, held across every replica of every service: a participant's (SPEC R-4.12)
and the LLM's (one budget for the whole deployment).

Both limits are slots in MongoDB, each with the time it is free again, taken with one atomic
find-and-update, so no replica needs to know of the others:
- concurrency: `max_concurrency` slots. A work item is *admitted* only with one of them, before
  its message is fetched, and holds it until it is finished (a lease renewed while it runs, so a
  crashed holder frees it when the lease ends);
- rate: `floor(max_rps)` slots (at least one). A slot is locked when it is taken and stamped with
  the moment the request left (written with the item's release): it is free again one period (a
  second; `1 / max_rps` below one per second) plus a margin after the moment the request's
  headers started going out (httpcore's trace event), never after the moment the slot was
  taken. So no window of a period holds more departures than declared, and the margin covers
  the way from the socket to the receiver's clock.

`try_admit` never waits: a worker that gets no admission leaves the version's work in the broker
and serves other versions; nothing is fetched, and nothing sits un-acknowledged, while it waits.
It says which pool refused, so the worker waits for that pool only: a rate slot's free time is
exact, and a freed concurrency slot (announced by replicas) matters only to a lane waiting for
one. It may grant a rate slot that frees within the limiter's patience (a fraction of a second),
reserved ahead: the worker fetches the message when the slot is free. And it refuses without a
database operation what the process itself can see is taken: every concurrency slot of the key
held by its own admissions, or the key's next rate slot waited for by one of them.

A capacity may instead be counted by its process alone (`Capacity.scope` "process"): concurrency
only, for work bound by the process's own resources rather than by a declaration shared by the
replicas (the scorer's sandboxed test runs, `aml_pipeline.stage_worker.sandbox_lanes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from aml_runtime.settings import RATE_MARGIN_SECONDS
from aml_runtime.stores import Stores
from aml_runtime.stores.capacity import SlotRange

LEASE_SECONDS = 30.0
# A rate slot taken but not yet stamped stays locked this long at most (a holder that crashed
# between taking it and sending); the stamp replaces it within milliseconds otherwise.
RATE_LOCK_SECONDS = 30.0
_RETRY_SECONDS = (0.01, 0.05)
_MAX_WAIT_SECONDS = 1.0
# How often a lane waiting for a concurrency slot of a key its own process holds polls.
_HOLDER_POLL_SECONDS = (2.0, 4.0)
_TURN_WAIT_SECONDS = (0.1, 0.3)

Notify = Callable[[str], Awaitable[None]]

# Called when a request of the work item this task serves leaves under its admission: the stage
# worker then fetches the admission's next item, which gets ready while this request is in
# flight (`aml_pipeline.stage_worker`, `StageWorker._process`).
REQUEST_LEAVING: ContextVar[Callable[[], None] | None] = ContextVar("request_leaving", default=None)

# The turn a task's context was lent (`Admission.lend_turn`): the admission and the task that
# holds its turn and lent it.
_LENT_TURN: ContextVar[tuple[Admission, asyncio.Task[object]] | None] = ContextVar(
    "lent_turn", default=None
)


Pool = Literal["rate", "concurrency"]
Share = Literal["all", "first", "rest"]
Scope = Literal["deployment", "process"]


class Capacity(BaseModel):
    """What one capacity key (a participant version, or the LLM) accepts."""

    model_config = ConfigDict(frozen=True)

    key: str
    max_concurrency: int = Field(ge=1)
    # None: no rate limit (the LLM when its provider sets none).
    max_rps: float | None = Field(default=None, gt=0)
    # Which of the key's slots an admission may take: all of them, or, while two stages
    # sharing the key both want them (`aml_pipeline.stage_worker.Lanes.shares_with`), the
    # first eighth of each pool, at least one slot (`first`: the stage that gives way), or
    # the rest (`rest`).
    share: Share = "all"
    # Where its slots are counted: in MongoDB for every replica (`deployment`), or in the
    # admitting process alone (`process`: a bound on the process's own resources, such as its
    # sandboxes' CPU, which no other replica shares; no rate, no lease, no announcement).
    scope: Scope = "deployment"

    @model_validator(mode="after")
    def _process_slots_have_no_rate(self) -> Capacity:
        if self.scope == "process" and self.max_rps is not None:
            raise ValueError("a capacity counted in one process has no rate slots")
        return self

    @property
    def rate_slots(self) -> int:
        """Whole requests per window: a fractional rate is rounded down, so that no 1-second
        window ever holds more requests than declared (2.5/s allows 2 in any second)."""
        return max(1, math.floor(self.max_rps)) if self.max_rps else 0

    def shared(self, share: Share) -> Capacity:
        return self.model_copy(update={"share": share})

    def slot_range(self, pool: Pool) -> tuple[int, int]:
        """The indexes [low, high) of the pool's slots this capacity may take. A pool of one
        slot is not split: both stages take it in turn."""
        size = self.rate_slots if pool == "rate" else self.max_concurrency
        if self.share == "all" or size < 2:
            return 0, size
        first = max(1, size // 8)
        return (0, first) if self.share == "first" else (first, size)

    @property
    def rate_period(self) -> float:
        """How long one rate slot is used by one request (before the margin): a second, or
        longer for rates below one per second (0.001/s: 1,000 s)."""
        return max(1.0, self.rate_slots / self.max_rps) if self.max_rps else 0.0


@dataclass(frozen=True)
class Refused:
    """No admission: which of the two pools had no free slot."""

    pool: Pool


@dataclass
class Departure:
    """When a request left, as httpcore's trace reports it: the moment its headers started going
    out, or, for a request that had to open its connection, the moment its answer arrived. The
    receiver's clock sees a new connection's first request late by however long its accept
    took, which the sender cannot see and the margin need not cover; it has seen the request,
    though, by the time it answers."""

    # The rate stamp (wall clock).
    at: float | None = None
    opened_connection: bool = False
    # When the request's headers started going out, whatever the connection (wall clock and
    # monotonic): where the participant's time begins for the audit.
    sent_at: float | None = None
    sent_monotonic: float | None = None

    async def trace(self, event: str, info: dict[str, object]) -> None:
        if event == "connection.connect_tcp.started":
            self.opened_connection = True
            return
        moment = time.time()
        if self.sent_at is None and event.endswith("send_request_headers.started"):
            self.sent_at, self.sent_monotonic = moment, time.monotonic()
            self.at = moment
        elif self.opened_connection and event.endswith("receive_response_headers.complete"):
            self.at = moment


@dataclass
class Admission:
    """One work item's hold on a key's capacity: a concurrency slot for the item's whole
    processing, and rate slots for its requests (the first one taken with the admission)."""

    limiter: CapacityLimiter
    capacity: Capacity
    holder: str
    concurrency_slot: str
    rate_slot: str | None
    admitted_at: float
    # When `rate_slot` was free before this admission reserved it (it gives it back so).
    rate_slot_free_at: float = 0.0
    _renew: asyncio.Task[None] | None = None
    _released: bool = field(default=False)
    # Rate slots used and their departures, not yet written (see `request`).
    _stamps: list[tuple[str, float]] = field(default_factory=list)
    # One call in flight under the concurrency slot: two items served in a row overlap (the
    # next one gets ready while the current one's request is out), their calls never do.
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    _turn_holder: asyncio.Task[object] | None = None

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """The slot's turn for one call, with its retries, back-offs and outage waits, and
        what must happen before the next call may leave (a job failed by this one). Turns are
        taken in the order they are asked for; the holder may take it again (its requests)."""
        task = asyncio.current_task()
        if task is not None and self._turn_holder is task:
            yield
            return
        lent = _LENT_TURN.get()
        if lent is not None and lent[0] is self and self._turn_holder is lent[1]:
            # A call the holder makes through a task of its own, while it still holds the turn.
            yield
            return
        await self._turn.acquire()
        self._turn_holder = task
        try:
            yield
        finally:
            if self._turn_holder is task:  # not passed on early (`pass_turn`)
                self._turn_holder = None
                self._turn.release()

    def pass_turn(self) -> None:
        """End the current task's turn before its block ends: its call is over and nothing it
        still does (writing its audit record, storing its outcome) can concern the next call,
        which leaves now instead of after those round trips. A task that does not hold the
        turn passes nothing."""
        task = asyncio.current_task()
        if task is not None and self._turn_holder is task:
            self._turn_holder = None
            self._turn.release()

    @contextlib.contextmanager
    def lend_turn(self) -> Iterator[None]:
        """Within the block, tasks created in the current context (and copies of it) take part
        in the turn the current task holds: their requests leave under it, one after another,
        instead of waiting for the holder to finish. For a holder whose calls are made by tasks
        of its own: the coding agent's model calls, each handed from the agent's thread to the
        loop as a new task (`aml_pipeline.coding_agent.LoopBridge`). Only while the lender
        still holds the turn: a task outliving it waits for the turn as any other would."""
        task = asyncio.current_task()
        if task is None or self._turn_holder is not task:
            raise RuntimeError("only the task holding an admission's turn can lend it")
        token = _LENT_TURN.set((self, task))
        try:
            yield
        finally:
            _LENT_TURN.reset(token)

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[Departure]:
        """Hold the slot's turn (unless the caller holds it for its whole call) and a rate slot
        for one request, and stamp the rate slot with the request's departure.

        The first request uses the rate slot taken with the admission or reserved for the next
        item; later ones (retries, status polls, an item whose slot a retry used) wait for one.
        The caller passes `Departure.trace` as httpx's `trace` extension. The stamp is written
        with the release (one database round trip for both), or before the next request waits
        for a slot: the slot stays locked meanwhile, and its free time is the departure's
        whenever it is written."""
        async with self.turn(), self._rate_slot() as departure:
            leaving = REQUEST_LEAVING.get()
            if leaving is not None:
                leaving()
            yield departure

    @contextlib.asynccontextmanager
    async def _rate_slot(self) -> AsyncIterator[Departure]:
        departure = Departure()
        slot, free_at = self.rate_slot, self.rate_slot_free_at
        self.rate_slot, self.rate_slot_free_at = None, 0.0
        if slot is None and self.capacity.max_rps:
            await self._write_stamps()
            slot = await self.limiter.wait_rate_slot(self.capacity, self.holder)
        elif slot is not None:
            # Reserved ahead: the request never leaves before the slot is free.
            await self.limiter.wait_until_free(self.capacity, free_at)
        try:
            yield departure
        finally:
            if slot is not None:
                self._stamps.append((slot, departure.at if departure.at else time.time()))

    def rate_wait(self) -> float:
        """Seconds until the rate slot this admission holds is free (0 if it is now, or if it
        holds none)."""
        if self.rate_slot is None:
            return 0.0
        return max(0.0, self.rate_slot_free_at - time.time())

    async def until_rate_slot_free(self) -> None:
        """Wait until the rate slot this admission holds is free (at once if it is)."""
        if self.rate_slot is not None:
            await self.limiter.wait_until_free(self.capacity, self.rate_slot_free_at)

    async def next_rate_slot(self, patience: float = 0.0) -> bool:
        """A rate slot for the next item under this admission (always with no rate limit): the
        first of the key's slots to be free, if it is free now or within `patience` seconds,
        reserved in one database operation and waited for while this admission keeps its
        concurrency slot. A rate-bound participant's next slot is usually a fraction of a second
        away; reserving it costs one operation, where giving the admission back and being
        admitted again costs four and an announcement to every worker. Stamps not yet written
        are written first once their slots could free within the patience (an unwritten stamp
        locks its slot), or once half a period old (other replicas' waits read them)."""
        if not self.capacity.max_rps or self.rate_slot is not None:
            return True
        oldest = min((at for _, at in self._stamps), default=None)
        period = self.capacity.rate_period
        if oldest is not None and time.time() - oldest >= min(period / 2, period - patience):
            await self._write_stamps()
        reserved = await self.limiter.reserve_rate_slot(self.capacity, self.holder, patience)
        if reserved is None:
            await self._write_stamps()
            return False
        # Held before the wait: an admission released during it gives the slot back as it was.
        self.rate_slot, self.rate_slot_free_at = reserved
        await self.limiter.wait_until_free(self.capacity, reserved[1])
        return True

    async def _write_stamps(self) -> None:
        stamps, self._stamps = self._stamps, []
        if stamps:
            await self.limiter.settle(self.capacity, self.holder, stamps)

    async def release(self, notify: bool = True) -> None:
        """Free the concurrency slot (and a rate slot that was never used), and stamp the rate
        slots used, in one database round trip. `notify`: tell the other replicas, which may be
        waiting for it (not worth it for an admission that found no work and held its slot for
        a moment only)."""
        if self._released:
            return
        self._released = True
        self.limiter.let_go(self.capacity.key)
        if self._renew is not None:
            self._renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renew
        stamps, self._stamps = self._stamps, []
        unused = None if self.rate_slot is None else (self.rate_slot, self.rate_slot_free_at)
        await self.limiter.settle(
            self.capacity, self.holder, stamps, self.concurrency_slot, unused, notify
        )
        self.rate_slot, self.rate_slot_free_at = None, 0.0


@contextlib.asynccontextmanager
async def turn(admission: Admission | None) -> AsyncIterator[None]:
    """`Admission.turn`, or nothing for a caller without an admission."""
    if admission is None:
        yield
        return
    async with admission.turn():
        yield


@contextlib.contextmanager
def lend_turn(admission: Admission | None) -> Iterator[None]:
    """`Admission.lend_turn`, or nothing for a caller without an admission."""
    if admission is None:
        yield
        return
    with admission.lend_turn():
        yield


class CapacityLimiter:
    def __init__(
        self,
        stores: Stores,
        lease_seconds: float = LEASE_SECONDS,
        rate_margin_seconds: float = RATE_MARGIN_SECONDS,
        notify: Notify | None = None,
        rate_patience_seconds: float = 0.0,
    ) -> None:
        self._slots = stores.slots
        self._accounts = stores.accounts
        self._lease = lease_seconds
        self._margin = rate_margin_seconds
        self._notify = notify
        # How far ahead an admission may reserve its rate slot (see `try_admit`).
        self._patience = rate_patience_seconds
        # Pools whose slot documents this process has already created (sizes included, so a
        # version that raises its declared capacity gets its new slots).
        self._ensured: set[tuple[str, int]] = set()
        # Per key, how many items of this process wait for a rate slot they reserved.
        self._rate_waiters: dict[str, int] = {}
        # Per key, the admissions of this process not yet released: with all of a key's
        # concurrency slots held here, asking the database could only hear "no".
        self._held: dict[str, int] = {}

    async def try_admit(self, capacity: Capacity) -> Admission | Refused:
        """A rate slot (with a rate limit) and a concurrency slot of `capacity`, or at once the
        pool that refused. The rate slot is tried first: a rate-bound participant refuses there,
        at the cost of one database operation and nothing to give back. The rate slot may be
        one that frees within the limiter's patience, reserved ahead (`Admission.rate_wait`
        says how long until it is free; no request under it leaves earlier): a rate-bound key's
        slots are reserved ahead by the items served in a row (`Admission.next_rate_slot`), and
        an admission that asked only for a slot free now would lose to them, once per slot."""
        holder = uuid.uuid4().hex
        rate: str | None = None
        rate_free_at = 0.0
        low, high = capacity.slot_range("concurrency")
        if self._held.get(capacity.key, 0) >= high - low:
            # Only a release here can free one, and it wakes the waiting lane
            # (`StageWorker._capacity_freed`): asking the database could only hear "no".
            return Refused("concurrency")
        if capacity.scope == "process":
            # The count above is the whole rule: the slots are this limiter's own.
            admission = Admission(self, capacity, holder, "", None, time.time())
            self._held[capacity.key] = self._held.get(capacity.key, 0) + 1
            return admission
        if self._rate_waiters.get(capacity.key):
            # An item of this process waits for the key's next rate slot: it is rate-bound now.
            return Refused("rate")
        if capacity.max_rps:
            reserved = await self.reserve_rate_slot(capacity, holder, self._patience)
            if reserved is None:
                return Refused("rate")
            rate, rate_free_at = reserved
        concurrency = await self._try_take(capacity, "concurrency", self._lease, holder)
        if concurrency is None:
            if rate is not None:
                # Never used: free again when it was free before (its last departure's period).
                await self._slots.give_back(rate, holder, max(time.time(), rate_free_at))
            return Refused("concurrency")
        admission = Admission(self, capacity, holder, concurrency, rate, time.time(), rate_free_at)
        admission._renew = asyncio.create_task(self._renew_lease(concurrency, holder))
        self._held[capacity.key] = self._held.get(capacity.key, 0) + 1
        return admission

    def let_go(self, key: str) -> None:
        """An admission of `key` is released (or is being)."""
        held = self._held.pop(key, 0) - 1
        if held > 0:
            self._held[key] = held

    async def admit(self, capacity: Capacity) -> Admission:
        """Wait for an admission (for callers outside a stage worker: tests, one-off calls)."""
        while True:
            admission = await self.try_admit(capacity)
            if isinstance(admission, Admission):
                return admission
            await asyncio.sleep(await self.wait_hint(capacity, admission.pool))

    async def wait_hint(self, capacity: Capacity, pool: Pool) -> float:
        """How long before the refusing `pool` of `capacity` may admit again. A stamped rate
        slot's time is known exactly (a version declaring one request per 1,000 s is looked at
        again in 1,000 s); a concurrency slot frees when a call returns (replicas announce it),
        so that wait is a short poll."""
        if pool == "concurrency":
            # A held slot frees when its call returns (every replica announces it on
            # `aml.capacity.freed`, which wakes the waiting lanes at once) or when its lease
            # lapses after a crash: a database read here would only say "not yet". The poll
            # bound covers a lost announcement (or a slot freed unannounced, held a moment by
            # an admission that found no work); the jitter keeps replicas from polling in step.
            # While this process holds some of the key, its own next release wakes the lane,
            # so the poll is only a safety net and need not be frequent.
            if self._held.get(capacity.key):
                return random.uniform(*_HOLDER_POLL_SECONDS)
            return random.uniform(_MAX_WAIT_SECONDS / 2, _MAX_WAIT_SECONDS)
        if pool == "rate" and self._rate_waiters.get(capacity.key):
            # An item of this process takes the next slot, and likely the ones after it under
            # the same admission: look again in a moment, without asking the database.
            return random.uniform(*_TURN_WAIT_SECONDS)
        return await self._read_wait(capacity, pool)

    async def _read_wait(self, capacity: Capacity, pool: Pool) -> float:
        now = time.time()
        first = await self._slots.first_to_free(_slots_of(capacity, pool))
        poll = random.uniform(*_RETRY_SECONDS)
        if first is None or float(first["free_at"]) <= now:
            return poll
        wait = float(first["free_at"]) - now
        exact = pool == "rate" and first.get("stamped", True)
        return max(poll, wait if exact else min(wait, _MAX_WAIT_SECONDS))

    async def reserve_rate_slot(
        self, capacity: Capacity, holder: str, patience: float
    ) -> tuple[str, float] | None:
        """The key's rate slot that is free first, if it is free within `patience` seconds:
        taken (locked for `holder`) now, in one operation, with the moment it is free. The
        caller sends no earlier than that moment (`wait_until_free`), so a slot reserved ahead
        of its time never lets a request leave early; slots taken and not yet stamped are
        locked far ahead and never reserved."""
        await self._ensure(capacity, "rate")
        now = time.time()
        return await self._slots.reserve_rate_slot(
            _slots_of(capacity, "rate"), holder, now + patience, now + RATE_LOCK_SECONDS
        )

    async def wait_until_free(self, capacity: Capacity, free_at: float) -> None:
        """Sleep until a reserved rate slot is free; meanwhile this process's admissions of the
        key are refused without asking the database (`try_admit`)."""
        wait = free_at - time.time()
        if wait <= 0:
            return
        key = capacity.key
        self._rate_waiters[key] = self._rate_waiters.get(key, 0) + 1
        try:
            await asyncio.sleep(wait)
        finally:
            self._rate_waiters[key] -= 1
            if not self._rate_waiters[key]:
                del self._rate_waiters[key]

    async def wait_rate_slot(self, capacity: Capacity, holder: str) -> str:
        while True:
            slot = await self._try_take(capacity, "rate", RATE_LOCK_SECONDS, holder)
            if slot is not None:
                return slot
            await asyncio.sleep(await self.wait_hint(capacity, "rate"))

    async def settle(
        self,
        capacity: Capacity,
        holder: str,
        stamps: list[tuple[str, float]],
        concurrency_slot: str | None = None,
        unused_rate_slot: tuple[str, float] | None = None,
        notify: bool = False,
    ) -> None:
        """In one round trip: each used rate slot is next usable one period (plus the margin)
        after its request left (a request that never reached the socket is stamped when it
        gave up, which errs on the safe side); a rate slot never used is free at once (its last
        departure is at least a period old: it was free when taken), or when it was free
        before it was reserved; the concurrency slot is free."""
        if capacity.scope == "process":
            # Counted in `_held` alone (`let_go`); the stage worker wakes its own waiting lane.
            return
        now = time.time()
        frees = [(slot, departed + capacity.rate_period + self._margin)
                 for slot, departed in stamps]  # fmt: skip
        if unused_rate_slot is not None:
            slot, was_free_at = unused_rate_slot
            frees.append((slot, max(now, was_free_at)))
        if concurrency_slot is not None:
            frees.append((concurrency_slot, 0.0))
        if frees:
            await self._slots.free_slots(holder, frees)
        if concurrency_slot is not None and notify and self._notify is not None:
            with contextlib.suppress(Exception):
                await self._notify(capacity.key)

    async def spend(self, run_key: str) -> int:
        """Count one request of a run; returns how many the run has made, this one included."""
        return await self._accounts.count_run_request(run_key)

    # -- slots -------------------------------------------------------------------------------

    async def _try_take(
        self, capacity: Capacity, pool: Pool, hold_for: float, holder: str
    ) -> str | None:
        await self._ensure(capacity, pool)
        now = time.time()
        return await self._slots.take_slot(_slots_of(capacity, pool), holder, now, now + hold_for)

    async def _ensure(self, capacity: Capacity, kind: Pool) -> None:
        pool = _pool_name(capacity, kind)
        size = capacity.rate_slots if kind == "rate" else capacity.max_concurrency
        if (pool, size) in self._ensured:
            return
        await self._slots.ensure_pool(pool, size)
        self._ensured.add((pool, size))

    async def _renew_lease(self, slot_id: str, holder: str) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            await self._slots.renew_lease(slot_id, holder, time.time() + self._lease)


def _pool_name(capacity: Capacity, pool: Pool) -> str:
    return f"{capacity.key}/{'r' if pool == 'rate' else 'c'}"


def _slots_of(capacity: Capacity, pool: Pool) -> SlotRange:
    """The pool's slots `capacity` may take."""
    low, high = capacity.slot_range(pool)
    return SlotRange(_pool_name(capacity, pool), low, high)
