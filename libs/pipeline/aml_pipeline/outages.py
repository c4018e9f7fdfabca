"""Outages, not failures (SPEC R-4.13): a participant, or the answer/judge model, that stops
answering pauses its lane instead of failing the work queued for it.

**Whose outage.** An outage belongs to a capacity key (`aml_pipeline.capacity`): a participant
version, or `llm`, the deployment's one LLM budget (one pause for every answerer and scorer
replica). It is declared by a call whose failures say the other side is down
(`participant_down`, `aml_pipeline.llm.llm_down`): a participant call once its retry table's
attempts are spent on such failures, an LLM call at once (its client already retried).

**The pause**, one document per key in `lane_pauses`, shared by every replica:
- *paused*: no stage worker takes work for the key (`StageWorker` skips its lanes); the calls in
  flight wait, holding their admission and their message (heartbeats keep it), and retry
  byte-identical afterwards. One process at a time probes (a claim on `probe_at`), at growing
  intervals (`PROBE_FIRST_SECONDS` doubling up to `PROBE_MAX_SECONDS`): a participant's Health
  URL, the LLM endpoint's model list.
- *resumed*: the probe answered. Workers admit again; each waiting call is sent again (a down
  failure pauses again at once, any other failure takes the retry table anew).
- *closed*: the first call that succeeds removes the document and writes the outage to
  `outages` (its start, end and last failure). A call that fails as down while the outage is
  open pauses it again at once, keeping its start: an endpoint whose Health answers while its
  Add does not still runs out its window.
- *expired*: open longer than its window (`AML_PARTICIPANT_OUTAGE_SECONDS`,
  `AML_LLM_OUTAGE_SECONDS`, stored with the pause): the waiting calls fail (`OutageExpired`,
  with the outage's start and end in the reason), the lane is no longer paused, and for one
  more window every call that finds the key down fails at once (`declare` raises
  `OutageExpired`) instead of waiting a window of its own: the questions queued behind an LLM that
  stayed down fail together, not one batch per window. The first success, or the end of that
  window (`close_abandoned`), closes it.
- *abandoned*: a pause no call waits for any more (its workers died) is closed by the
  scheduler's reconciliation (`close_abandoned`) a grace period after its window, so no lane
  stays paused for good.

Every process keeps a view of the open pauses (`Outages.is_paused`, read on every call and
admission without a database operation): its own declarations, an announcement on core NATS
(`aml.lanes.outage`) by whichever replica changed a pause, and a re-read by the stage worker's
periodic refresh for an announcement that was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field

from aml_contract import subjects
from aml_runtime.service import Runtime
from aml_runtime.stores import Stores
from aml_runtime.stores.outages import OutageStore

log = structlog.get_logger()

LaneKind = Literal["participant", "llm"]

# The first probe after a pause, and the longest interval between two probes.
PROBE_FIRST_SECONDS = 2.0
PROBE_MAX_SECONDS = 15.0
# A process waiting out a pause re-reads it at least this often (a lost announcement, a probe by
# another replica).
REREAD_SECONDS = 5.0
# A pause open this long past its window with no call left to expire it (its workers died) is
# closed by the reconciliation: the calls that wait expire it themselves at the window.
ABANDONED_GRACE_SECONDS = 60.0

Announce = Callable[[str], Awaitable[None]]
Probe = Callable[[], Awaitable[bool]]


class LanePause(BaseModel):
    """An open outage of one capacity key (`lane_pauses`). Times are epoch seconds."""

    model_config = ConfigDict(populate_by_name=True)

    key: str = Field(alias="_id")
    kind: LaneKind
    paused: bool
    since: float
    # The last failure that declared or renewed the pause (a class name or an HTTP status).
    reason: str
    window: float
    probe_at: float
    interval: float
    probes: int = 0
    resumed_at: float | None = None
    # When the outage outlived its window (then `paused` is false, and a call finding the key
    # down fails at once).
    expired_at: float | None = None

    def expired(self, moment: float) -> bool:
        return self.expired_at is not None or moment - self.since >= self.window

    def describe(self) -> str:
        """What the job page shows while the pause lasts."""
        return f"paused: {unreachable(self.kind)} since {stamp(self.since)}"


class OutageExpired(Exception):
    """The outage outlasted its window: the waiting call fails with `reason`."""

    def __init__(self, pause: LanePause, until: float) -> None:
        self.pause = pause
        self.until = until
        setting = window_setting(pause.kind)
        self.reason = (
            f"{unreachable(pause.kind)} from {stamp(pause.since)} to {stamp(until)} "
            f"({until - pause.since:.0f} s, longer than {setting} = {pause.window:g} s); "
            f"last failure: {pause.reason}"
        )
        super().__init__(self.reason)


def unreachable(kind: LaneKind) -> str:
    return "participant unreachable" if kind == "participant" else "answer model unreachable"


def stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def next_interval(interval: float) -> float:
    return min(PROBE_MAX_SECONDS, interval * 2)


def window_setting(kind: LaneKind) -> str:
    return "AML_PARTICIPANT_OUTAGE_SECONDS" if kind == "participant" else "AML_LLM_OUTAGE_SECONDS"


@dataclass
class Outages:
    """One process's handle on the outages of the keys it calls (see the module's docstring)."""

    stores: Stores
    # Tells every replica that a key's pause changed (core NATS; None: this process alone).
    announce: Announce | None = None
    clock: Callable[[], float] = time.time
    _view: dict[str, LanePause] = field(default_factory=dict)
    # Per key: set (and replaced) whenever this process learns the pause changed.
    _changed: dict[str, asyncio.Event] = field(default_factory=dict)
    # Per key: one waiter at a time reads and probes for the others.
    _tending: dict[str, asyncio.Lock] = field(default_factory=dict)
    # Told of every change (the stage worker wakes the key's lanes).
    listeners: list[Callable[[str], None]] = field(default_factory=list)

    # -- the view (no I/O) ---------------------------------------------------------------------

    def is_paused(self, key: str) -> bool:
        pause = self._view.get(key)
        return pause is not None and pause.paused

    def is_open(self, key: str) -> bool:
        return key in self._view

    def _learn(self, key: str, pause: LanePause | None) -> None:
        before = self._view.get(key)
        if pause is None:
            self._view.pop(key, None)
        else:
            self._view[key] = pause
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()
        was = None if before is None else before.paused
        now = None if pause is None else pause.paused
        if was != now:
            for listener in self.listeners:
                listener(key)

    # -- reading ---------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Re-read every open pause (the stage worker's periodic refresh)."""
        found = {
            doc["_id"]: LanePause.model_validate(doc) async for doc in self.stores.outages.pauses()
        }
        for key in set(self._view) | set(found):
            self._learn(key, found.get(key))

    async def reload(self, key: str) -> LanePause | None:
        doc = await self.stores.outages.pause(key)
        pause = None if doc is None else LanePause.model_validate(doc)
        self._learn(key, pause)
        return pause

    # -- declaring and ending --------------------------------------------------------------------

    async def declare(
        self, key: str, kind: LaneKind, since: float, reason: str, window: float
    ) -> LanePause:
        """Pause `key` (a call's failures say it is down since `since`). An open outage keeps
        its start; a resumed one is paused again, and probed next after its grown interval; an
        expired one raises `OutageExpired` (the call fails at once)."""
        known = self._view.get(key)
        if known is not None and known.expired_at is not None:
            raise OutageExpired(known, self.clock())
        if known is not None and known.paused:
            # Paused already, as this process knows: every call in flight that finds the key
            # down lands here, and the pause needs saying once.
            return known
        moment = self.clock()
        fresh = LanePause(
            key=key, kind=kind, paused=True, since=min(since, moment), reason=reason,
            window=window, probe_at=moment + PROBE_FIRST_SECONDS, interval=PROBE_FIRST_SECONDS,
        )  # fmt: skip
        if await self.stores.outages.open_pause(fresh.model_dump(by_alias=True)):
            pause = fresh
            log.warning("outage.declared", key=key, kind=kind, reason=reason)
        else:
            open_doc = await self.stores.outages.pause(key)
            if open_doc is None:
                return await self.declare(key, kind, since, reason, window)
            known = LanePause.model_validate(open_doc)
            if known.expired_at is not None:
                self._learn(key, known)
                raise OutageExpired(known, moment)
            probe_at = None
            if not known.paused:
                # Its probe answered but the calls still fail: probed again, later.
                probe_at = moment + known.interval
                log.warning("outage.paused_again", key=key, kind=kind, reason=reason)
            doc = await self.stores.outages.pause_again(key, reason, probe_at)
            if doc is None:
                return await self.declare(key, kind, since, reason, window)
            pause = LanePause.model_validate(doc)
        self._learn(key, pause)
        await self._announce(key)
        return pause

    async def succeeded(self, key: str) -> None:
        """A call of `key` succeeded: an open outage is over. Costs nothing when none is open."""
        if key not in self._view:
            return
        await self._close(key)

    async def expire(self, pause: LanePause, moment: float) -> str:
        """Mark `pause` as outliving its window at `moment` (once, whoever gets there first);
        returns the reason its waiting work fails with, naming the outage's start and end."""
        doc = await self.stores.outages.expire(pause.key, pause.since, moment)
        if doc is not None:
            expired = LanePause.model_validate(doc)
            await _record(self.stores.outages, expired, moment, "expired")
            log.warning("outage.expired", key=pause.key, kind=pause.kind,
                        seconds=round(moment - pause.since, 1))  # fmt: skip
            self._learn(pause.key, expired)
            await self._announce(pause.key)
        else:
            await self.reload(pause.key)
        return OutageExpired(pause, moment).reason

    async def _close(self, key: str) -> None:
        doc = await self.stores.outages.close(key)
        if doc is not None:
            pause = LanePause.model_validate(doc)
            until = self.clock()
            if pause.expired_at is None:
                # An expired outage was recorded when it expired.
                await _record(self.stores.outages, pause, until, "ended")
            log.info("outage.ended", key=key, kind=pause.kind,
                        seconds=round(until - pause.since, 1))  # fmt: skip
            await self._announce(key)
        self._learn(key, None)

    async def _announce(self, key: str) -> None:
        if self.announce is not None:
            with contextlib.suppress(Exception):
                await self.announce(key)

    # -- waiting ---------------------------------------------------------------------------------

    async def wait(self, key: str, probe: Probe) -> None:
        """Return once `key` is not paused (at once if it is not); raise `OutageExpired` when
        the pause outlives its window. One waiter of this process at a time reads the pause and,
        when due and claimed across replicas, probes; the others wait for what it learns."""
        while (pause := self._view.get(key)) is not None and pause.paused:
            moment = self.clock()
            if pause.expired(moment):
                await self.expire(pause, moment)
                raise OutageExpired(pause, moment)
            lock = self._tending.setdefault(key, asyncio.Lock())
            if lock.locked():
                event = self._changed.setdefault(key, asyncio.Event())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=2 * REREAD_SECONDS)
                continue
            async with lock:
                await self._tend(pause, probe)
        current = self._view.get(key)
        if current is not None and current.expired_at is not None:
            # Expired by another waiter (of this process or another): the same end.
            raise OutageExpired(current, current.expired_at)

    async def _tend(self, pause: LanePause, probe: Probe) -> None:
        moment = self.clock()
        due = min(pause.probe_at, pause.since + pause.window)
        if due > moment:
            event = self._changed.setdefault(pause.key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=min(due - moment, REREAD_SECONDS))
            await self.reload(pause.key)
            return
        if pause.expired(moment):
            return  # the caller's loop expires it
        interval = next_interval(pause.interval)
        claimed = await self.stores.outages.claim_probe(
            pause.key, pause.since, pause.probe_at, moment + interval, interval
        )
        if claimed is None:
            await self.reload(pause.key)  # another replica probes, or it changed
            return
        self._learn(pause.key, LanePause.model_validate(claimed))
        try:
            answered = await probe()
        except Exception:
            log.exception("outage.probe_failed", key=pause.key)
            answered = False
        if not answered:
            return
        resumed = await self.stores.outages.resume(pause.key, pause.since, self.clock())
        log.info("outage.resumed", key=pause.key, kind=pause.kind)
        self._learn(pause.key, None if resumed is None else LanePause.model_validate(resumed))
        await self._announce(pause.key)


async def record_outage(
    stores: Stores, pause: LanePause, until: float, how: Literal["ended", "expired"]
) -> None:
    """The outage's history entry (`outages`): what an auditor and the stall watchdog read."""
    await _record(stores.outages, pause, until, how)


async def _record(
    store: OutageStore, pause: LanePause, until: float, how: Literal["ended", "expired"]
) -> None:
    await store.record(pause.key, pause.kind, pause.since, until, pause.reason, pause.probes, how)


async def open_pauses(stores: Stores, keys: list[str]) -> list[LanePause]:
    """The open outages of `keys` (what a job's status shows)."""
    found = stores.outages.pauses_of(keys)
    return [LanePause.model_validate(doc) async for doc in found]


async def last_outage_end(stores: Stores, key: str) -> float | None:
    """When the latest closed outage of `key` ended (epoch seconds), if any."""
    return await stores.outages.last_end(key)


async def close_abandoned(stores: Stores, moment: float) -> list[str]:
    """Close every pause open longer than its window plus `ABANDONED_GRACE_SECONDS` (no call
    waits for it any more: a waiting call expires its pause at the window), and every expired
    outage a window after it expired (a later call finding the key down waits a window of its
    own again). Run by the scheduler's reconciliation."""
    closed = []
    store = stores.outages
    async for doc in store.pauses():
        pause = LanePause.model_validate(doc)
        if pause.expired_at is not None:
            if moment - pause.expired_at < pause.window:
                continue
        elif moment - pause.since < pause.window + ABANDONED_GRACE_SECONDS:
            continue
        gone = await store.close_if_since(pause.key, pause.since)
        if gone is not None:
            if pause.expired_at is None:
                await _record(store, pause, moment, "expired")
            closed.append(pause.key)
    return closed


def lane_outages(runtime: Runtime) -> Outages:
    """The outages of a service process: a change it makes is announced to every replica."""

    async def announce(key: str) -> None:
        await runtime.broker.connection.publish(subjects.LANE_OUTAGE, key.encode())

    return Outages(runtime.stores, announce)
