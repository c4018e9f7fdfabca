"""A job's progress as counters on its job document, exact and O(1) per event.

**The rule.** Each stage keeps one document per item (`add_chunks`, `searches`, `answers`,
`scores`; `STAGE_COLLECTIONS`). The write that makes it terminal (`done` or `failed`) succeeds
once across redeliveries, concurrent deliveries and replicas: the insert of a question stage's
document (its `_id` is the item id) or the adder's update guarded by `state: pending`. That
writer, and only that one, counts the outcome with one `$inc` on the job (`count_final`):
`progress.<stage>.done|failed`, plus `progress.questions_final` when the outcome ends its
question (scored, or failed in search or answer; a question has exactly one such document,
since a stage hands a question on only when done), and, from `record_error`, `progress.errors`.
The terminal write stamps the document with `at_us` (its time in microseconds). Readers (the
scheduler's completion, the gateway's status, the publisher's gate) read the job document only;
absent counters are 0 (the plan does not write them).

**Why it is exact.**
- *Write first, then increment.* The unique write lets one writer win, so no outcome is ever
  counted twice by its writers; a redelivery that finds the document counts nothing.
- *The crash window.* A writer that dies between its write and its `$inc` leaves a document
  no counter includes. That makes the counters *lower* than the truth, never higher: an
  increment never happens without its document, so a job can be late to complete but never
  complete early.
- *The repair* (`repair_counters`, run by the scheduler's reconciliation only, off the hot
  paths) recounts every counter from the job's stage documents and `$set`s them. Two guards
  keep it exact while writers run concurrently:
  - the `$set` matches only if `progress.events` (bumped by every `$inc`) is what it was before
    the documents were read, so an increment that lands in between makes the repair write
    nothing (it tries again);
  - the `$set` also raises the watermark `progress.counted_to` to the newest `at_us` it
    counted, and every writer's `$inc` matches only while `counted_to < at_us` of its own
    document: a document the repair counted is not incremented again by a writer that was
    merely slow. Each document is thus counted by exactly one of the repair and its writer;
    one written at or under the watermark but after the repair's read (clock skew between
    replicas, the same microsecond) by neither, until the next repair — again lower, never
    higher.
- *When it runs.* Reading a job's documents costs O(the job's items), so the scheduler repairs
  a running job only once its counters have not moved for a while (`repair_due`: no increment
  and no repair within `stale_after`), which is when a lost increment shows (the job stalls),
  and once when the job completes unless its counters are already exact (`counters_exact`:
  every stage at the most its totals allow, which counters never above the truth can only be
  when exact), so the figures stored for the gate and the status are exact.

**Counted in batches** (`OutcomeCounter`, the adder and the three question stages). A question
stage counts about seven outcomes a second on LoCoMo-10, the adder up to a hundred on a
generated job, each a find-and-modify on the same job document. A stage process sums its
outcomes of a job over up to `COUNT_WINDOW_SECONDS` and applies them in one `$inc`, guarded by
the oldest `at_us` of the batch (a repair that counted any of them makes the batch fall back to
one guarded increment per outcome, so each is still counted once). This widens the crash window
above from milliseconds to the window, with the same repair; a counter shown by the status lags
by at most the window. The batch that may make every question final is not held: the first
outcome a process counts of a job, and any batch that with the counters last seen would reach
the job's questions, go at once, so a job completes without waiting out the window. The writer
of the stage document stays the only one that counts it.

**Why no separate record per outcome.** An earlier design inserted a second, unique "final
record" per outcome next to the stage document; the stage document's own unique write carries
the same guarantee for one database operation less per item and stage (four per question).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, NamedTuple

import structlog

from aml_contract.messages import Outcome
from aml_runtime.clock import MICROSECOND as _MICROSECOND
from aml_runtime.clock import micros, now_us
from aml_runtime.db import Document, read_time
from aml_runtime.documents import ITEM_STAGES as ITEM_STAGES  # re-exported: counters are per stage
from aml_runtime.documents import ItemStage as ItemStage
from aml_runtime.metrics import ITEMS
from aml_runtime.stores import Stores
from aml_runtime.stores.jobs import COUNTED_TO as COUNTED_TO  # re-exported: the counters' rule
from aml_runtime.stores.jobs import EVENTS as EVENTS
from aml_runtime.stores.jobs import LAST_US as LAST_US
from aml_runtime.stores.jobs import REPAIRED_US as REPAIRED_US
from aml_runtime.stores.jobs import counting_filters as counting_filters

log = structlog.get_logger()

OUTCOMES: tuple[Outcome, ...] = ("done", "failed")

QUESTIONS_FINAL = "progress.questions_final"
ERRORS = "progress.errors"
# The bookkeeping beside the counters (`EVENTS`, `LAST_US`, `REPAIRED_US`, `COUNTED_TO`) and the
# guard of every increment (`counting_filters`) are the job store's (aml_runtime.stores.jobs).


def counter_field(stage: ItemStage, outcome: Outcome) -> str:
    return f"progress.{stage}.{outcome}"


COUNTERS: tuple[str, ...] = (
    *(counter_field(stage, outcome) for stage in ITEM_STAGES for outcome in OUTCOMES),
    QUESTIONS_FINAL,
    ERRORS,
)


# -- rules (no I/O) -----------------------------------------------------------------------------


def outcome_of(state: object) -> Outcome | None:
    """The terminal outcome of a stored stage state; None while the item is not finished."""
    if state == "done":
        return "done"
    if state == "failed":
        return "failed"
    return None


def ends_question(stage: ItemStage, outcome: Outcome) -> bool:
    """A question is over once scored (whatever the score says) or failed before it."""
    return stage == "score" or (stage in ("search", "answer") and outcome == "failed")


def increments(stage: ItemStage, outcome: Outcome) -> dict[str, int]:
    """The counters one item's terminal outcome at a stage bumps."""
    inc = {counter_field(stage, outcome): 1}
    if ends_question(stage, outcome):
        inc[QUESTIONS_FINAL] = 1
    return inc


def tally(documents: Iterable[tuple[ItemStage, Document]], errors: int) -> dict[str, int]:
    """Every counter recomputed from a job's stage documents and its error-summary size."""
    counts = dict.fromkeys(COUNTERS, 0)
    for stage, document in documents:
        outcome = outcome_of(document.get("state"))
        if outcome is not None:
            for field, step in increments(stage, outcome).items():
                counts[field] += step
    counts[ERRORS] = errors
    return counts


def all_questions_final(job: Document, adding: int = 0) -> bool:
    """Whether every planned question of the job has reached its terminal state (with `adding`
    more questions counted than the document says)."""
    totals = job.get("totals")
    planned = totals.get("questions") if isinstance(totals, dict) else None
    return isinstance(planned, int) and _read(job, QUESTIONS_FINAL) + adding >= planned


def _read(job: Document, field: str) -> int:
    """A counter of a job document by its dotted path; absent (or not a number) is 0."""
    value: object = job
    for key in field.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def counters_of(job: Document) -> dict[str, int]:
    return {field: _read(job, field) for field in COUNTERS}


def stage_counts(job: Document, stage: ItemStage) -> tuple[int, int]:
    """(done, failed) items of a stage, from the job document alone."""
    return _read(job, counter_field(stage, "done")), _read(job, counter_field(stage, "failed"))


class Waiting(NamedTuple):
    """The earliest stage a job still waits on, with how many of the items it waits for are
    final and how many it waits for."""

    stage: Literal["add", "search", "answer", "score", "aggregate"]
    final: int
    expected: int


def waiting_stage(job: Document) -> Waiting:
    """From the job document's totals and counters alone: every Add final; then every question
    searched (failed counts as final); then an answer for every question searched, and a score
    for every question answered (a question failed earlier is final there and waits for
    nothing later); then the aggregation. A job not planned yet waits on its Adds. One rule for
    the status the API shows and the stall the scheduler reports."""
    totals = job.get("totals") or {}
    chunks, questions = int(totals.get("add", 0)), int(totals.get("questions", 0))
    add_done, add_failed = stage_counts(job, "add")
    if not totals or add_done + add_failed < chunks:
        return Waiting("add", add_done + add_failed, chunks)
    search_done, search_failed = stage_counts(job, "search")
    if search_done + search_failed < questions:
        return Waiting("search", search_done + search_failed, questions)
    answer_done, answer_failed = stage_counts(job, "answer")
    if answer_done + answer_failed < search_done:
        return Waiting("answer", answer_done + answer_failed, search_done)
    score_done, score_failed = stage_counts(job, "score")
    if score_done + score_failed < answer_done:
        return Waiting("score", score_done + score_failed, answer_done)
    return Waiting("aggregate", questions, questions)


def questions_final(job: Document) -> int:
    return _read(job, QUESTIONS_FINAL)


def error_count(job: Document) -> int:
    return _read(job, ERRORS)


def repair_due(job: Document, moment: datetime, stale_after: timedelta) -> bool:
    """Whether a running job's counters have been still (no increment, no repair, not just
    started) for `stale_after`: only then can a lost increment be what holds the job back, and
    an idle job is re-read once per `stale_after` rather than every reconciliation."""
    started = read_time(job.get("started_at"))
    marks = [_read(job, LAST_US), _read(job, REPAIRED_US), micros(started) if started else 0]
    return micros(moment) - max(marks) >= stale_after // _MICROSECOND


# -- I/O ----------------------------------------------------------------------------------------


async def count_final(
    stores: Stores, job_id: str, stage: ItemStage, outcome: Outcome, at_us: int
) -> bool:
    """Count the terminal outcome whose unique write (stamped `at_us`) just succeeded. True when,
    with this outcome, every question of the job is final: the caller announces it, so the
    scheduler looks at the job once rather than once per question."""
    ITEMS.labels(stage, outcome).inc()
    inc = increments(stage, outcome)
    before = await _count(stores, job_id, inc, at_us)
    adding = inc.get(QUESTIONS_FINAL, 0)
    return before is not None and adding > 0 and all_questions_final(before, adding)


# How long a question stage sums a job's outcomes before it applies them (`OutcomeCounter`).
COUNT_WINDOW_SECONDS = 1.0
# How often `counters_exact` reads the job again while another stage's batch is in its window.
_EXACT_POLL_SECONDS = 0.1
# Jobs whose counters one process remembers (the oldest is forgotten: it is then read again).
_JOBS_SEEN = 1024


class Counted(NamedTuple):
    """One terminal outcome whose unique write just succeeded, waiting to be counted."""

    job_id: str
    item_id: str
    stage: ItemStage
    outcome: Outcome
    at_us: int


@dataclass
class OutcomeCounter:
    """Counts a stage process's terminal outcomes on their jobs in batches (see the module's
    docstring). `all_final` is called with the outcome whose batch made every question of its
    job final (the caller announces it, as with `count_final`; the adder's outcomes end no
    question)."""

    stores: Stores
    all_final: Callable[[Counted], Awaitable[None]] | None = None
    window: float = COUNT_WINDOW_SECONDS
    _pending: dict[str, list[Counted]] = field(default_factory=dict, init=False)
    _timers: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False)
    # Per job: (questions final as last seen after one of this process's increments, planned).
    _seen: dict[str, tuple[int, int]] = field(default_factory=dict, init=False)
    _applying: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def count(self, counted: Counted) -> None:
        ITEMS.labels(counted.stage, counted.outcome).inc()
        batch = self._pending.setdefault(counted.job_id, [])
        batch.append(counted)
        if self._may_complete(counted.job_id, batch):
            self._apply_now(counted.job_id)
        elif counted.job_id not in self._timers:
            timer = asyncio.create_task(self._apply_later(counted.job_id))
            self._timers[counted.job_id] = timer
            self._applying.add(timer)
            timer.add_done_callback(self._applying.discard)

    def _may_complete(self, job_id: str, batch: list[Counted]) -> bool:
        seen = self._seen.get(job_id)
        if seen is None:
            return True  # the job's counters are unknown here: learn them
        final, planned = seen
        adding = sum(increments(c.stage, c.outcome).get(QUESTIONS_FINAL, 0) for c in batch)
        return adding > 0 and final + adding >= planned

    async def _apply_later(self, job_id: str) -> None:
        await asyncio.sleep(self.window)
        self._timers.pop(job_id, None)
        await self._apply(job_id, self._pending.pop(job_id, []))

    def _apply_now(self, job_id: str) -> None:
        timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()
        task = asyncio.create_task(self._apply(job_id, self._pending.pop(job_id, [])))
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)

    async def drain(self) -> None:
        """Apply everything pending now (a stopping process, a test that reads the counters),
        and wait for what is being applied."""
        for job_id in list(self._pending):
            self._apply_now(job_id)
        if self._applying:
            await asyncio.wait(set(self._applying))

    async def _apply(self, job_id: str, batch: list[Counted]) -> None:
        if not batch:
            return
        try:
            await self._increment(job_id, batch)
        except Exception:
            # Lower, never higher: the repair counts what a failed increment left out.
            log.exception("progress.count_failed", job_id=job_id, outcomes=len(batch))

    async def _increment(self, job_id: str, batch: list[Counted]) -> None:
        total: dict[str, int] = {}
        for counted in batch:
            for name, step in increments(counted.stage, counted.outcome).items():
                total[name] = total.get(name, 0) + step
        before = await _count(self.stores, job_id, total, min(c.at_us for c in batch))
        if before is not None:
            await self._counted(job_id, before, total.get(QUESTIONS_FINAL, 0), batch)
            return
        # A repair counted some of them (or the job is gone): each on its own stamp.
        for counted in batch:
            inc = increments(counted.stage, counted.outcome)
            one = await _count(self.stores, job_id, inc, counted.at_us)
            if one is not None:
                await self._counted(job_id, one, inc.get(QUESTIONS_FINAL, 0), [counted])

    async def _counted(
        self, job_id: str, before: Document, adding: int, batch: list[Counted]
    ) -> None:
        totals = before.get("totals")
        planned = totals.get("questions") if isinstance(totals, dict) else None
        if isinstance(planned, int):
            final = questions_final(before) + adding
            seen = self._seen.get(job_id, (0, planned))[0]
            self._seen[job_id] = (max(seen, final), planned)
            if len(self._seen) > _JOBS_SEEN:
                self._seen.pop(next(iter(self._seen)))
        if adding > 0 and all_questions_final(before, adding) and self.all_final is not None:
            ending = [c for c in batch if ends_question(c.stage, c.outcome)]
            try:
                await self.all_final(ending[-1])
            except Exception:
                # The scheduler's reconciliation looks at every running job as well.
                log.exception("progress.announce_failed", job_id=job_id)


async def count_error(stores: Stores, job_id: str, at_us: int) -> None:
    """Count an error-summary entry whose insert (with this `at_us`) just succeeded."""
    await _count(stores, job_id, {ERRORS: 1}, at_us)


async def _count(stores: Stores, job_id: str, inc: dict[str, int], at_us: int) -> Document | None:
    """Apply the increment; the job's totals and counters as they were just before it (the
    pre-image of the same atomic update: adding the increment gives the state after it, without
    a second read), or None when the repair had already counted it (or the job is gone)."""
    return await stores.jobs.count(job_id, inc, at_us)


async def counters_exact(
    stores: Stores, job_id: str, patience: float = COUNT_WINDOW_SECONDS + 0.5
) -> bool:
    """Whether the job's stored counters are exact, seen from the job document and its error
    entries alone, without the recount's read of every stage document. Counters are never above
    the truth, and the truth never above the totals: once every stage's counters are at the
    most the totals allow (`waiting_stage` says only the aggregation is left) and the error
    counter equals the entries, each counter is exact. At a job's completion another stage's
    last batch may still be in its window: the document is read again for up to `patience`
    seconds (a window and a little more) before the answer is no."""
    deadline = asyncio.get_running_loop().time() + patience
    while True:
        job = await stores.jobs.progress_of(job_id)
        if job is None:
            return False
        if waiting_stage(job).stage == "aggregate" and error_count(job) == len(
            await stores.jobs.error_stamps(job_id)
        ):
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(_EXACT_POLL_SECONDS)


async def repair_counters(
    stores: Stores, job_id: str, attempts: int = 3, *, at_completion: bool = False
) -> bool:
    """Recount the job's counters from its stage documents (see the module's docstring for why
    this is exact under concurrent writers). True when a counter changed. O(the job's items):
    reconciliation only.

    `at_completion`: the scheduler's recount once every question is final. The other stages'
    batches are then usually still in their window, so a change is expected and logged at info
    (`progress.recounted`); a change found by the repair of a stalled job means an increment
    was lost, an anomaly worth a warning (`progress.repaired`)."""
    for _ in range(attempts):
        changed = await _recount(stores, job_id, at_completion)
        if changed is not None:
            return changed
    # Increments kept landing during the recount: the job is moving, a later repair will do.
    log.info("progress.repair_deferred", job_id=job_id)
    return False


async def _recount(stores: Stores, job_id: str, at_completion: bool) -> bool | None:
    """One guarded recount: True/False (changed or not), None when an increment interfered."""
    jobs = stores.jobs
    job = await jobs.progress_of(job_id)
    if job is None:
        return False
    events = _read(job, EVENTS)
    # The Adds' chunks (`aml_runtime.stores.plans`), then the question stages' documents.
    documents: list[tuple[ItemStage, Document]] = [
        ("add", chunk) async for chunk in stores.plans.chunk_states(job_id)
    ]
    documents += [stamp async for stamp in stores.records.stamps(job_id)]
    errors = await jobs.error_stamps(job_id)
    counted = tally(documents, len(errors))
    repaired_us = now_us()
    before = counters_of(job)
    if counted == before:
        await jobs.stamp_repaired(job_id, repaired_us)
        return False
    stamps = [_read(doc, "at_us") for doc in (*(doc for _, doc in documents), *errors)]
    watermark = max([_read(job, COUNTED_TO), *stamps])
    if not await jobs.store_recount(job_id, events, counted, watermark, repaired_us):
        return None
    changes = {field: (before[field], counted[field]) for field in COUNTERS}
    changed = {field: change for field, change in changes.items() if change[0] != change[1]}
    if at_completion:
        log.info("progress.recounted", job_id=job_id, changed=changed)
    else:
        log.warning("progress.repaired", job_id=job_id, changed=changed)
    return True
