"""The one skeleton of every stage worker (adder, searcher, answerer, scorer): admission before
dequeue.

Work is queued per *lane*: one durable consumer per participant version for the stages that
call participants (add, search), one for each LLM stage (answer, score), and one for the coding
attempts the scorer verifies (`verify`: sandboxes, no LLM, under a bound of its process's own,
`sandbox_lanes`). A worker fetches a lane's next message only after it holds that lane's
capacity — a concurrency slot and a rate slot (`aml_pipeline.capacity`) — and fetches exactly
one message per admission, with a `no_wait` pull that the broker answers at once. So:
- no worker ever holds a message while it waits for capacity: a message is either in the broker
  or being worked on, and nothing sits un-acknowledged past `ack_wait` (long calls send progress
  heartbeats, `run_delivery`);
- one version's limits never delay another version's work: a lane without capacity is skipped,
  not waited on, and is looked at again when its earliest rate slot frees or when any replica
  frees one of its concurrency slots (`aml.capacity.freed`, core NATS);
- a lane whose key is paused by an outage (`aml_pipeline.outages`) is skipped too, and looked at
  again when a replica announces the pause lifted (`aml.lanes.outage`, core NATS) or at the next
  refresh.

Which lanes have work is learnt from the stream itself: every publish to the work stream also
reaches this worker's core NATS subscription ("doorbell"), and the stream's per-subject counts
are re-read every `REFRESH_SECONDS` (for redeliveries after `ack_wait`, and for work queued while
it was down).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

import structlog
from faststream import FastStream
from faststream.nats import NatsBroker
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel, ValidationError

from aml_contract import subjects
from aml_contract.messages import QuestionWork
from aml_pipeline.capacity import (
    REQUEST_LEAVING,
    Admission,
    Capacity,
    CapacityLimiter,
    Pool,
    Refused,
    Share,
)
from aml_pipeline.jobs import version_capacity
from aml_pipeline.llm import llm_capacity
from aml_pipeline.outages import Outages
from aml_runtime.broker import FetchedDelivery, GiveUp, WorkPull, run_delivery
from aml_runtime.db import Document
from aml_runtime.service import Hook, Runtime, serve
from aml_runtime.settings import CommonSettings, LLMSettings
from aml_runtime.stores import Stores
from aml_runtime.telemetry import continue_trace, stage_span

log = structlog.get_logger()

# New work rings the doorbell and a NACKed item's lane is looked at when its delay ends, so the
# re-read only finds what nothing announced: an item redelivered after `ack_wait` (its worker
# died), work queued while this worker was down. Each re-read wakes an otherwise idle process,
# and a wake-up costs 0.1 ms of CPU on a small virtual machine.
REFRESH_SECONDS = 5.0
_CAPACITY_CACHE_SECONDS = 5.0
_IDLE_LANE_SECONDS = 600.0
# Items one admission serves in a row at most (`StageWorker._process`): enough to save most
# admissions of a busy lane, few enough that replicas and stages sharing a key take turns.
REUSE_LIMIT = 8
# The same for an LLM stage's lane. The answer and score stages share the deployment's budget,
# and with the LLM busy both usually have work waiting: every slot given back is raced for by
# both (one wins, the other's database operation is refused) and announced to every worker. Who
# of the two gets a slot changes no result and no participant's load, so a run is longer:
# LoCoMo-10 solo, 0.92 -> 0.20 capacity operations per answer or score (32 items are ~16 s of
# calls at 0.5 s each).
LLM_REUSE_LIMIT = 32
# How long an admission waits for its next item's rate slot before it gives its concurrency slot
# back (`Admission.next_rate_slot`): a declared 10/s frees a slot every 0.1 s on average.
RATE_PATIENCE_SECONDS = 0.25
_YIELD_SECONDS = (0.01, 0.03)
# A stage refused a key's slots says so at most this often (`Lanes.shares_with`); the other
# stage keeps to its share until it has not heard it for `WANTED_SECONDS`.
WANTED_SAY_SECONDS = 0.2
WANTED_SECONDS = 0.6
# Keys remembered at most, as wanted or as said to be wanted (one entry per version).
_WANTED_KEPT = 10_000
# Why a run of items under one admission ended.
_Ended = Literal["idle", "rate", "served_in_full"]
_UNKNOWN_VERSION = {"max_concurrency": 1, "max_rps": 1.0}

Work = TypeVar("Work", bound=BaseModel)


@dataclass(frozen=True)
class StageCall:
    """What a stage's computation needs of the delivery it runs in: which delivery it is (for
    the audit trail) and the capacity its calls leave under (none for a direct caller)."""

    delivered: int
    admission: Admission | None = None
    # The item's job as the stage read it (state, version_id, top_k), read once per item.
    job: Document | None = None

    def pass_turn(self) -> None:
        """`Admission.pass_turn`: the call is over and validated; what follows concerns no
        other call (nothing for a direct caller)."""
        if self.admission is not None:
            self.admission.pass_turn()

    @contextlib.contextmanager
    def hold_early_fetch(self) -> Iterator[None]:
        """Within the block, a request leaving does not get the admission's next item fetched
        (`REQUEST_LEAVING`, `StageWorker._process`); it is fetched when this item ends. For a
        call that holds its slot for minutes (a coding attempt): the next item would wait out
        all of it holding its message, which a free slot elsewhere could serve."""
        early_fetch = REQUEST_LEAVING.set(None)
        try:
            yield
        finally:
            REQUEST_LEAVING.reset(early_fetch)


@dataclass(frozen=True)
class WorkItem:
    """One fetched work message with the capacity it was admitted under."""

    delivery: FetchedDelivery
    admission: Admission

    @property
    def delivered(self) -> int:
        return self.delivery.delivered

    def call(self, job: Document | None = None) -> StageCall:
        return StageCall(self.delivered, self.admission, job)

    async def run(
        self,
        settings: CommonSettings,
        span: str,
        ids: Mapping[str, str],
        attempt: Callable[[], Awaitable[None]],
        give_up: GiveUp,
    ) -> None:
        """Work on the item under the delivery policy (`run_delivery`: `attempt` retried with
        growing delays, `give_up` on the last delivery or a final failure), in the stage's span
        inside the trace the message carried: the one wrapper every stage's handler uses."""
        with stage_span(span, delivery=self.delivered, **ids):
            await run_delivery(self.delivery, settings, attempt, give_up)


class Stage(Protocol[Work]):
    """One stage as the skeleton runs it (adder, searcher, answerer, scorer): the work message
    it reads, what it does with one item, and what it still holds when its worker stops. What it
    hands on is its own business (the adder announces the Add and may release the user's next
    one; the question stages hand the question on by their `StageShape`): the skeleton only
    admits, fetches, parses and settles, and never asks which stage it runs."""

    @property
    def work(self) -> type[Work]: ...

    async def handle(self, work: Work, item: WorkItem) -> None:
        """Work on one item, under `item.run` (the one delivery wrapper)."""

    async def close(self) -> None:
        """Settle what is still pending in this process (counts not yet written)."""


@dataclass(frozen=True)
class Lanes:
    """How a stage's work is divided: per participant version, or one lane for all."""

    stage: subjects.WorkStage
    durable: str
    per_version: bool
    # The capacity a lane is admitted under (the version's declared one, or the LLM budget).
    capacity_of: Callable[[str], Awaitable[Capacity]]
    # Items one admission serves in a row at most.
    reuse_limit: int = REUSE_LIMIT
    # The other stage calling the same keys, and this stage's share of a key's slots while
    # both wait for them (`Capacity.slot_range`): each stage refused a slot says so
    # (`aml.capacity.wanted`), and the other keeps to its share for a moment. The adder takes
    # the first eighth and the searcher the rest, so at a participant whose capacity is in
    # demand a written conversation is searched, and its questions reach the LLM, while other
    # conversations are still being written. A key that is not short of slots is not split.
    shares_with: subjects.WorkStage | None = None
    share: Share = "all"

    def lane_of(self, subject: str) -> str | None:
        parts = subject.split(".")
        if len(parts) != 5 or parts[2] != self.stage:
            return None
        return parts[3] if self.per_version else "all"

    def consumer(self, lane: str) -> str:
        return f"{self.durable}-{lane}" if self.per_version else self.durable

    def filter_subject(self, lane: str) -> str:
        prefix = subjects.WORK_PREFIX[self.stage]
        return f"{prefix}.{lane}.*" if self.per_version else f"{prefix}.*.*"


@dataclass
class _Lane:
    name: str
    pull: WorkPull
    capacity: Capacity
    capacity_read_at: float
    # Monotonic time before which it is not tried again (no capacity until then).
    not_before: float = 0.0
    # The pool that refused the last admission.
    waits_for: Pool | None = None
    last_work: float = 0.0
    # Rung by the doorbell: an admission standing by for the lane's next item (its current
    # item's request is out or done, `StageWorker._process`) fetches then.
    rang: asyncio.Event = field(default_factory=asyncio.Event)
    # Admissions of this process standing by: the loop makes no new admission for the lane
    # meanwhile (one of them takes the new item without a database operation).
    standing_by: int = 0


@dataclass
class StageWorker(Generic[Work]):
    lanes: Lanes
    stage: Stage[Work]
    limiter: CapacityLimiter
    settings: CommonSettings
    # Items in progress in this process at most: a safety bound, not the capacity rule.
    max_in_flight: int
    # The process's view of the outages of the keys it calls (None: lanes are never paused).
    outages: Outages | None = None
    _nc: Client | None = None
    _known: dict[str, _Lane] = field(default_factory=dict)
    _ready: dict[str, None] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _subs: list[Subscription] = field(default_factory=list)
    _loop: asyncio.Task[None] | None = None
    _stopping: bool = False
    # Per key, until when the `shares_with` stage is known to want its slots (monotonic).
    _wanted: dict[str, float] = field(default_factory=dict)
    # Per key, when this stage last said it wanted its slots (monotonic).
    _said_wanted: dict[str, float] = field(default_factory=dict)

    async def start(self, broker: NatsBroker) -> None:
        self._nc = broker.connection
        prefix = subjects.WORK_PREFIX[self.lanes.stage]
        self._subs.append(await self._nc.subscribe(f"{prefix}.>", cb=self._doorbell))
        self._subs.append(await self._nc.subscribe(subjects.CAPACITY_FREED, cb=self._freed))
        if self.lanes.shares_with is not None:
            self._subs.append(await self._nc.subscribe(subjects.CAPACITY_WANTED, cb=self._other))
        if self.outages is not None:
            self.outages.listeners.append(self._outage_changed)
            self._subs.append(await self._nc.subscribe(subjects.LANE_OUTAGE, cb=self._outage))
        self._loop = asyncio.create_task(self._run())

    async def stop(self, grace: float = 10.0) -> None:
        self._stopping = True
        if self._loop is not None:
            self._loop.cancel()
            # Bounded: a database call that ignores cancellation must not hold a shutdown.
            await asyncio.wait({self._loop}, timeout=grace)
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._tasks:
            # Work in progress finishes if it can; what cannot is redelivered after ack_wait.
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for task in pending:
                task.cancel()

    # -- signals -----------------------------------------------------------------------------

    async def _doorbell(self, msg: Msg) -> None:
        lane = self.lanes.lane_of(msg.subject)
        if lane is not None:
            self._mark_ready(lane)

    def _mark_ready(self, lane: str) -> None:
        self._ready[lane] = None
        known = self._known.get(lane)
        if known is not None:
            known.rang.set()
        self._wake.set()

    async def _freed(self, msg: Msg) -> None:
        self._capacity_freed(msg.data.decode())

    def _capacity_freed(self, key: str) -> None:
        # Only lanes waiting for a concurrency slot: a rate slot's time is known, and trying a
        # rate-bound lane early costs a database round trip for nothing. Every worker hears
        # every announcement: one that concerns none of its lanes does not wake its loop.
        waiting = [
            lane
            for lane in self._known.values()
            if lane.capacity.key == key and lane.waits_for == "concurrency"
        ]
        for lane in waiting:
            lane.not_before = 0.0
        if waiting:
            self._wake.set()

    async def _other(self, msg: Msg) -> None:
        stage, _, key = msg.data.decode().partition(" ")
        if stage == self.lanes.shares_with:
            self._wanted[key] = time.monotonic() + WANTED_SECONDS
            if len(self._wanted) > _WANTED_KEPT:
                now = time.monotonic()
                self._wanted = {k: until for k, until in self._wanted.items() if until > now}

    async def _say_still_wanted(self) -> bool:
        """Say it again for the lanes with work that wait for a concurrency slot (a lane whose
        process holds its share in full asks again only seconds later) or for a rate slot free
        soon; True if there are any. A lane waiting long for a rate slot (a hostile rate) says
        so when it is refused again, and wakes nothing meanwhile."""
        if self.lanes.shares_with is None:
            return False
        soon = time.monotonic() + WANTED_SECONDS
        waiting = {lane.capacity.key for lane in self._known.values()
                   if lane.name in self._ready and (lane.waits_for == "concurrency" or
                   (lane.waits_for == "rate" and lane.not_before < soon))}  # fmt: skip
        for key in waiting:
            await self._say_wanted(key)
        return bool(waiting)

    def _first_says_due(self, now: float) -> list[float]:
        """When the lanes waiting for a rate slot further off than `WANTED_SECONDS` begin to
        say again that they want it (`_say_still_wanted` then repeats it until they are served).
        The sharing stage keeps to its share only `WANTED_SECONDS` after each word, so a lane
        that said so only when refused, a rate period before its slot frees, would find the
        other stage taking that slot as it frees: at 10/s with 0.3 s Adds, the adder got one
        Add through every two or three periods instead of every one."""
        if self.lanes.shares_with is None:
            return []
        first_say = WANTED_SECONDS - WANTED_SAY_SECONDS / 2
        return [
            lane.not_before - first_say
            for lane in self._known.values()
            if lane.name in self._ready
            and lane.waits_for == "rate"
            and lane.not_before - first_say > now
        ]

    async def _say_wanted(self, key: str) -> None:
        """Tell the stage sharing `key` that this one was refused its slots while it had work
        (at most every `WANTED_SAY_SECONDS` per key)."""
        if self.lanes.shares_with is None or self._nc is None:
            return
        now = time.monotonic()
        if now - self._said_wanted.get(key, -math.inf) < WANTED_SAY_SECONDS:
            return
        self._said_wanted[key] = now
        if len(self._said_wanted) > _WANTED_KEPT:
            self._said_wanted = {key: now}
        with contextlib.suppress(Exception):
            await self._nc.publish(subjects.CAPACITY_WANTED, f"{self.lanes.stage} {key}".encode())

    async def _outage(self, msg: Msg) -> None:
        if self.outages is not None:
            with contextlib.suppress(Exception):
                await self.outages.reload(msg.data.decode())

    def _outage_changed(self, key: str) -> None:
        # Paused or lifted: either way its lanes are looked at again now (a paused one is
        # skipped, and not tried again before its pause is re-read).
        for lane in self._known.values():
            if lane.capacity.key == key:
                lane.not_before = 0.0
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        next_refresh = 0.0
        while True:
            try:
                self._wake.clear()
                now = time.monotonic()
                if now >= next_refresh:
                    await self._refresh()
                    next_refresh = now + REFRESH_SECONDS
                started = await self._admit_round()
                if started:
                    continue
                waits = [lane.not_before for lane in self._known.values() if lane.name in
                         self._ready and lane.not_before > now]  # fmt: skip
                if await self._say_still_wanted():
                    waits.append(now + WANTED_SAY_SECONDS)
                waits.extend(self._first_says_due(now))
                until = min([next_refresh, *waits]) - time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=max(until, 0.005))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stage_worker.loop_failed", stage=self.lanes.stage)
                await asyncio.sleep(1.0)

    async def _admit_round(self) -> bool:
        """Try every lane with work once, in a fresh random order (no lane is always first)."""
        started = False
        lanes = list(self._ready)
        random.shuffle(lanes)
        for name in lanes:
            if len(self._tasks) >= self.max_in_flight:
                break
            try:
                started |= await self._serve(name)
            except Exception:
                # One lane's trouble (its consumer cannot be made, say) must not stop the others.
                log.exception("stage_worker.lane_failed", stage=self.lanes.stage, lane=name)
                self._ready.pop(name, None)
        return started

    async def _serve(self, name: str) -> bool:
        lane = await self._lane(name)
        if lane.not_before > time.monotonic() or lane.standing_by:
            return False
        if self.outages is not None and self.outages.is_paused(lane.capacity.key):
            # No work is taken for a key that is down; its pause lifting wakes the lane.
            lane.not_before, lane.waits_for = time.monotonic() + REFRESH_SECONDS, None
            return False
        capacity = self._capacity_now(lane)
        admission = await self.limiter.try_admit(capacity)
        if isinstance(admission, Refused):
            await self._say_wanted(capacity.key)
            wait = await self.limiter.wait_hint(capacity, admission.pool)
            lane.not_before = time.monotonic() + wait
            lane.waits_for = admission.pool
            return False
        lane.waits_for = None
        wait = admission.rate_wait()
        if wait > 0:
            # Its rate slot was reserved ahead: the message is fetched when the slot is free
            # (not held meanwhile), and the lane is not tried again before then.
            lane.not_before = time.monotonic() + wait
            self._start(self._serve_when_free(name, lane, admission))
            return True
        msg = await self._fetch(lane)
        if msg is None:
            await admission.release(notify=False)
            self._ready.pop(name, None)
            return False
        lane.last_work = time.monotonic()
        self._start(self._process(name, msg, admission))
        return True

    async def _serve_when_free(self, name: str, lane: _Lane, admission: Admission) -> None:
        try:
            await admission.until_rate_slot_free()
            msg = None if self._stopping else await self._fetch(lane)
        except BaseException:
            await admission.release()
            raise
        if msg is None:
            # Held for a moment longer than a slot found empty at once: the other replicas
            # may be waiting for it.
            await admission.release()
            self._ready.pop(name, None)
            return
        lane.last_work = time.monotonic()
        await self._process(name, msg, admission)

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()

    async def _process(self, lane: str, msg: Msg, admission: Admission) -> None:
        """Work items of one lane under one concurrency slot, up to the lanes' `reuse_limit`,
        so a busy lane does not give its slot back only to take it again; then the slot is
        released for the others.

        The next item is fetched (with, under a rate limit, a rate slot free at once) as soon as
        the current one's request leaves, and gets ready (its reads, its audit record) while
        that request is in flight; its own request leaves the moment the current one's answer
        is in (`Admission.request` lets one through at a time). So a saturated participant
        waits for no database round trip between two requests. At most two items of a slot are
        in progress at once; one that sends no request (already done, its job failed) lets the
        next be fetched when it ends."""
        limit = self.lanes.reuse_limit
        # Each item in progress, with its request-leaving signal.
        running: dict[asyncio.Task[FetchedDelivery], asyncio.Event] = {}
        last: FetchedDelivery | None = None
        ended: _Ended = "idle"
        served = 0
        following: Msg | _Ended | None = msg
        try:
            while True:
                if isinstance(following, Msg):
                    task, leaving = self._item_task(lane, following, admission)
                    running[task] = leaving
                    served, following = served + 1, None
                if served >= limit:
                    ended = "served_in_full"
                elif (
                    following is None
                    and len(running) < 2
                    and all(leaving.is_set() for leaving in running.values())
                ):
                    known = self._known.get(lane)
                    if known is not None:
                        known.rang.clear()  # a ring from now on is for a later message
                    following = await self._next_under(lane, admission)
                    if isinstance(following, Msg):
                        continue
                    ended = following
                if not running:
                    break
                # Nothing to fetch now: stand by for the doorbell while the items finish.
                standby = self._known.get(lane) if following == "idle" else None
                if standby is not None:
                    standby.standing_by += 1
                try:
                    finished = await _first_of(running, standby.rang if standby else None)
                finally:
                    if standby is not None:
                        standby.standing_by -= 1
                        self._wake.set()  # the loop may admit for the lane again
                for task in finished:
                    running.pop(task)
                    if last is not None:
                        await last.send_held_ack()
                    last = task.result()
                if following == "idle":
                    following = None  # work may have come meanwhile: look again
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            raise
        finally:
            if running:
                # Never abandoned mid-call: an item's request is out at the participant.
                await asyncio.wait(running)
            try:
                await admission.release()
            finally:
                # After the release's announcement: two publishes in a row leave in one write.
                if last is not None:
                    await last.send_held_ack()
            self._capacity_freed(admission.capacity.key)
        known = self._known.get(lane)
        if known is None:
            return
        if ended == "served_in_full":
            # The replicas and the other stage sharing the key were told of the freed slot;
            # this lane waits a moment so that they, not it, take it first (its own
            # announcement, which reaches it too, does not cut the wait short: it waits for
            # no pool).
            known.not_before = time.monotonic() + random.uniform(*_YIELD_SECONDS)
            known.waits_for = None
        elif ended == "rate":
            # As a refused admission would: not tried again before a rate slot frees.
            wait = await self.limiter.wait_hint(admission.capacity, "rate")
            known.not_before, known.waits_for = time.monotonic() + wait, "rate"

    def _item_task(
        self, lane: str, msg: Msg, admission: Admission
    ) -> tuple[asyncio.Task[FetchedDelivery], asyncio.Event]:
        """The item's own task, and the event its first request's leaving sets
        (`REQUEST_LEAVING`)."""
        leaving = asyncio.Event()
        context = contextvars.copy_context()
        context.run(REQUEST_LEAVING.set, leaving.set)
        task = asyncio.create_task(self._process_one(lane, msg, admission), context=context)
        return task, leaving

    async def _process_one(self, lane: str, msg: Msg, admission: Admission) -> FetchedDelivery:
        def again_after(delay: float) -> None:
            # A NACKed message comes back after its delay: look at its lane then, not at the
            # next refresh.
            asyncio.get_running_loop().call_later(delay, self._mark_ready, lane)

        delivery = FetchedDelivery(msg, on_nack=again_after, hold_ack=True)
        try:
            try:
                work = self.stage.work.model_validate_json(msg.data)
            except ValidationError as exc:
                # Not ours to understand; retrying cannot help. Logged without its content.
                log.error("stage_worker.bad_message", subject=msg.subject, errors=exc.error_count())
                await delivery.ack()
                return delivery
            with continue_trace(msg.headers):
                await self.stage.handle(work, WorkItem(delivery, admission))
        except Exception:
            log.exception("stage_worker.item_failed", subject=msg.subject)
        return delivery

    async def _next_under(self, name: str, admission: Admission) -> Msg | _Ended:
        """The lane's next message under `admission`'s concurrency slot, or why not: nothing
        waiting (or the worker is stopping, or the lane's capacity was re-read since), or no
        rate slot free now."""
        lane = self._known.get(name)
        if lane is None or name not in self._ready or self._stopping:
            return "idle"
        if self._capacity_now(lane) != admission.capacity:
            # Admitted again under what is declared now, or under the share it may take now.
            return "idle"
        if not await admission.next_rate_slot(RATE_PATIENCE_SECONDS):
            await self._say_wanted(admission.capacity.key)
            return "rate"
        if self._stopping:
            return "idle"  # it stopped while the admission waited for the rate slot
        following = await self._fetch(lane)
        if following is None:
            self._ready.pop(name, None)
            return "idle"
        lane.last_work = time.monotonic()
        return following

    def _capacity_now(self, lane: _Lane) -> Capacity:
        """What the lane may be admitted under now: its capacity, or its share of it while the
        stage it shares the key with wants its slots too."""
        if self._wanted.get(lane.capacity.key, 0.0) > time.monotonic():
            return lane.capacity.shared(self.lanes.share)
        return lane.capacity

    # -- lanes, consumers, fetches -----------------------------------------------------------

    async def _refresh(self) -> None:
        assert self._nc is not None
        js = self._nc.jetstream()
        prefix = subjects.WORK_PREFIX[self.lanes.stage]
        if self.outages is not None:
            # Catches an announcement that was lost; a handful of documents at most.
            await self.outages.refresh()
        info = await js.stream_info(subjects.WORK_STREAM, subjects_filter=f"{prefix}.*.*")
        for subject, count in (info.state.subjects or {}).items():
            lane = self.lanes.lane_of(subject)
            if lane is not None and count > 0:
                self._ready[lane] = None
        # Versions come and go over months: a lane idle for long gives up its inbox (it is
        # made again when its work comes back).
        now = time.monotonic()
        for name, idle in list(self._known.items()):
            if name not in self._ready and now - idle.last_work > _IDLE_LANE_SECONDS:
                del self._known[name]
                await idle.pull.close()

    async def _lane(self, name: str) -> _Lane:
        lane = self._known.get(name)
        now = time.monotonic()
        if lane is None:
            assert self._nc is not None
            pull = await WorkPull.open(
                self._nc,
                subjects.WORK_STREAM,
                self.lanes.consumer(name),
                self.lanes.filter_subject(name),
                self.settings.ack_wait_seconds,
            )
            capacity = await self.lanes.capacity_of(name)
            lane = self._known[name] = _Lane(name, pull, capacity, now, last_work=now)
        elif now - lane.capacity_read_at > _CAPACITY_CACHE_SECONDS:
            lane.capacity, lane.capacity_read_at = await self.lanes.capacity_of(name), now
        return lane

    async def _fetch(self, lane: _Lane) -> Msg | None:
        """The lane's next message, or None at once when it has none."""
        return await lane.pull.next()


async def _first_of(
    running: dict[asyncio.Task[FetchedDelivery], asyncio.Event], rang: asyncio.Event | None
) -> set[asyncio.Task[FetchedDelivery]]:
    """Wait until an item finishes or its first request leaves (or, with `rang`, the lane's
    doorbell rings); the finished ones."""
    waiting = [leaving for leaving in running.values() if not leaving.is_set()]
    if rang is not None:
        waiting.append(rang)
    signals = [asyncio.ensure_future(signal.wait()) for signal in waiting]
    try:
        await asyncio.wait([*running, *signals], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for signal in signals:
            signal.cancel()
    return {task for task in running if task.done()}


# -- wiring shared by the four workers -------------------------------------------------------


# A participant version's Adds and Searches share its declared capacity; while both wait for its
# slots, Adds take an eighth of it (one slot at least) and Searches the rest
# (`Lanes.shares_with`).
_PARTICIPANT_SHARES: dict[subjects.WorkStage, tuple[subjects.WorkStage, Share]] = {
    "add": ("search", "first"),
    "search": ("add", "rest"),
}


def participant_lanes(stage: subjects.WorkStage, durable: str, stores: Stores) -> Lanes:
    """One lane per participant version, admitted under the version's declared capacity (its
    share of it while the other participant stage wants the version's slots too)."""
    accounts = stores.accounts

    async def capacity_of(lane: str) -> Capacity:
        version = await accounts.capacity_of(lane)
        # A lane whose version is gone still drains, one at a time: its items fail at once
        # (the endpoint cannot be loaded) and end their job.
        return version_capacity(version or {"_id": lane, "capacity": _UNKNOWN_VERSION})

    shares_with: subjects.WorkStage | None = None
    share: Share = "all"
    if stage in _PARTICIPANT_SHARES:
        shares_with, share = _PARTICIPANT_SHARES[stage]
    return Lanes(
        stage,
        durable,
        per_version=True,
        capacity_of=capacity_of,
        shares_with=shares_with,
        share=share,
    )


def llm_lanes(stage: subjects.WorkStage, durable: str, settings: LLMSettings) -> Lanes:
    """One lane for every job, admitted under the deployment's LLM budget."""
    budget = llm_capacity(settings)

    async def capacity_of(lane: str) -> Capacity:
        return budget

    return Lanes(
        stage, durable, per_version=False, capacity_of=capacity_of, reuse_limit=LLM_REUSE_LIMIT
    )


def llm_stage_worker(
    runtime: Runtime,
    settings: LLMSettings,
    stage: subjects.WorkStage,
    durable: str,
    handler: Stage[QuestionWork],
    outages: Outages | None = None,
) -> StageWorker[QuestionWork]:
    """The worker of an LLM stage (answer, score): one lane, admitted under the deployment's
    LLM budget, which also bounds what one process needs in flight."""
    return StageWorker(
        llm_lanes(stage, durable, settings),
        handler,
        capacity_limiter(runtime, settings),
        settings,
        max_in_flight=settings.llm_concurrency,
        outages=outages,
    )


# The verify lane's capacity key, counted by each process alone (`Capacity.scope`).
SANDBOX_KEY = "sandbox"


def sandbox_lanes(stage: subjects.WorkStage, durable: str, concurrency: int) -> Lanes:
    """One lane for every job, admitted under this process's own bound on the sandboxes it runs
    at once: a test run calls no LLM, so it takes none of the LLM budget's slots, and the CPU it
    spends is its process's, which no other replica shares."""
    capacity = Capacity(key=SANDBOX_KEY, max_concurrency=concurrency, scope="process")

    async def capacity_of(lane: str) -> Capacity:
        return capacity

    return Lanes(stage, durable, per_version=False, capacity_of=capacity_of)


def sandbox_stage_worker(
    runtime: Runtime,
    settings: CommonSettings,
    stage: subjects.WorkStage,
    durable: str,
    handler: Stage[QuestionWork],
    concurrency: int,
) -> StageWorker[QuestionWork]:
    """The worker of a lane whose items run in sandboxes and call no LLM (the scorer's verify
    lane): at most `concurrency` items of it at once in this process."""
    return StageWorker(
        sandbox_lanes(stage, durable, concurrency),
        handler,
        capacity_limiter(runtime, settings),
        settings,
        max_in_flight=concurrency,
    )


def capacity_limiter(runtime: Runtime, settings: CommonSettings) -> CapacityLimiter:
    """The limiter of a worker process: it tells every replica when it frees a slot."""

    async def freed(key: str) -> None:
        await runtime.broker.connection.publish(subjects.CAPACITY_FREED, key.encode())

    return CapacityLimiter(
        runtime.stores,
        rate_margin_seconds=settings.rate_margin_seconds,
        notify=freed,
        rate_patience_seconds=RATE_PATIENCE_SECONDS,
    )


def serve_stage(runtime: Runtime, worker: StageWorker[Any], *on_stop: Hook) -> FastStream:
    """Serve `worker`; when it stops (its items finished), close its stage (what it still holds,
    its pending counts), then run `on_stop` in order (the clients the stage used)."""
    return serve_stages(runtime, [worker], *on_stop)


def serve_stages(
    runtime: Runtime, workers: Sequence[StageWorker[Any]], *on_stop: Hook
) -> FastStream:
    """`serve_stage` for a stage served by several workers, one per kind of lane (the scorer's
    LLM lane and its verify lane): each stage is closed once, after every worker stopped."""

    async def start() -> None:
        for worker in workers:
            await worker.start(runtime.broker)

    async def stop() -> None:
        await asyncio.gather(*(worker.stop() for worker in workers))
        stages = {id(worker.stage): worker.stage for worker in workers}
        for stage in stages.values():
            await stage.close()
        for hook in on_stop:
            await hook()

    return serve(runtime, on_start=start, on_stop=stop)
