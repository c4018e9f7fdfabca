"""A job's progress as counters on its job document, exact and O(1) per event.

**The rule.** An item's terminal outcome at a stage (an Add chunk, a question's search, answer or
score: `done` or `failed`) is recorded as one *final record* in `item_finals`, `_id`
`<stage>/<item_id>`. A question that reaches its terminal state — scored (any score record), or
failed in search or answer — also gets `question/<item_id>`. The writer whose insert succeeds,
and only that one (the others get a DuplicateKeyError), counts it with one `$inc` on the job:
`progress.<stage>.done|failed`, `progress.questions_final` (questions, not records: a question
is counted once even if a race gave it two terminal records), and, from `record_error`,
`progress.errors`. Readers (the scheduler's completion, the gateway's status, the publisher's
gate) read the job document only; absent counters are 0 (the plan does not write them).

**Why it is exact.**
- *Insert first, then increment.* The unique `_id` lets one insert succeed across redeliveries,
  concurrent deliveries and replicas, so no record is ever counted twice by its writers.
- *The crash window.* A writer that dies between its insert and its `$inc` leaves a record no
  counter includes; a writer that dies between the stage document and its final record leaves a
  stage document without a record (a redelivery finds the stage document and only re-announces
  it). Both make the counters *lower* than the truth, never higher: an increment never happens
  without its record, so a job can be late to complete but never complete early.
- *The repair* (`repair_counters`, run by the scheduler's reconciliation only, off the hot
  paths) first backfills the missing records from the job's stage documents (through the same
  unique inserts), then recounts every counter from the job's records and `$set`s them. Two
  guards keep it exact while writers run concurrently:
  - the `$set` matches only if `progress.events` (bumped by every `$inc`) is what it was before
    the records were read, so an increment that lands in between makes the repair write
    nothing (it tries again);
  - the `$set` also raises the watermark `progress.counted_to` to the newest record time it
    counted (`at_us`, microseconds), and every writer's `$inc` matches only while
    `counted_to < at_us` of its own record: a record the repair counted is not incremented
    again by a writer that was merely slow. Each record is thus counted by exactly one of the
    repair and its writer; one written at or under the watermark but after the repair's read
    (clock skew between replicas, the same microsecond) by neither, until the next repair —
    again lower, never higher.
- *When it runs.* Reading a job's records costs O(the job's items), so the scheduler repairs a
  running job only once its counters have not moved for a while (`repair_due`: no increment and
  no repair within `stale_after`), which is when a lost increment shows (the job stalls), and
  once when the job completes, so the figures stored for the gate and the status are exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Literal

import structlog
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aml_contract.messages import Outcome
from aml_runtime.db import Document, read_time
from aml_runtime.metrics import ITEMS

log = structlog.get_logger()

ItemStage = Literal["add", "search", "answer", "score"]
ITEM_STAGES: tuple[ItemStage, ...] = ("add", "search", "answer", "score")
# Where each stage keeps its per-item documents (the truth the repair backfills from).
STAGE_COLLECTIONS: dict[ItemStage, str] = {
    "add": "add_chunks",
    "search": "searches",
    "answer": "answers",
    "score": "scores",
}
OUTCOMES: tuple[Outcome, ...] = ("done", "failed")
FINALS = "item_finals"
# The `stage` of the per-question record that counts a question once it is terminal.
QUESTION = "question"

QUESTIONS_FINAL = "progress.questions_final"
ERRORS = "progress.errors"
# Bumped by every increment: the repair's guard against a concurrent increment.
EVENTS = "progress.events"
# Time (µs) of the latest counted record, and of the latest repair: when counters last moved.
LAST_US = "progress.last_us"
REPAIRED_US = "progress.repaired_us"
# Every record with `at_us` at or under this is in the counters through a repair's recount.
COUNTED_TO = "progress.counted_to"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def counter_field(stage: ItemStage, outcome: Outcome) -> str:
    return f"progress.{stage}.{outcome}"


COUNTERS: tuple[str, ...] = (
    *(counter_field(stage, outcome) for stage in ITEM_STAGES for outcome in OUTCOMES),
    QUESTIONS_FINAL,
    ERRORS,
)


# -- rules (no I/O) -----------------------------------------------------------------------------


def micros(moment: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch (exact, no float rounding)."""
    return (moment - _EPOCH) // _MICROSECOND


def outcome_of(state: object) -> Outcome | None:
    """The terminal outcome of a stored stage state; None while the item is not finished."""
    if state == "done":
        return "done"
    if state == "failed":
        return "failed"
    return None


def final_id(stage: str, item_id: str) -> str:
    return f"{stage}/{item_id}"


def ends_question(stage: ItemStage, outcome: Outcome) -> bool:
    """A question is over once scored (whatever the score record says) or failed before it."""
    return stage == "score" or (stage in ("search", "answer") and outcome == "failed")


def records_of(stage: ItemStage, item_id: str, outcome: Outcome) -> list[tuple[str, str, str]]:
    """The final records an outcome implies, each as (`_id`, its `stage`, the counter it bumps)."""
    records: list[tuple[str, str, str]] = [
        (final_id(stage, item_id), stage, counter_field(stage, outcome))
    ]
    if ends_question(stage, outcome):
        records.append((final_id(QUESTION, item_id), QUESTION, QUESTIONS_FINAL))
    return records


def tally(finals: Iterable[Document], errors: int) -> dict[str, int]:
    """Every counter recomputed from a job's final records and its error-summary size."""
    counts = dict.fromkeys(COUNTERS, 0)
    for final in finals:
        stage, outcome = final.get("stage"), outcome_of(final.get("outcome"))
        if stage == QUESTION:
            counts[QUESTIONS_FINAL] += 1
        elif stage in ITEM_STAGES and outcome is not None:
            counts[f"progress.{stage}.{outcome}"] += 1
    counts[ERRORS] = errors
    return counts


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


def counting_filters(job_id: str, at_us: int) -> tuple[Document, Document]:
    """The job while no repair has counted records as recent as `at_us`: no watermark yet, or
    one below it. Two plain filters tried in turn, not one `$or`: nx-27017 applies a top-level
    `$or` of a *write* filter without the filter's other conditions (it would update another
    job). The watermark is never removed once written, so when the first filter does not match
    the second alone decides, atomically."""
    return (
        {"_id": job_id, COUNTED_TO: {"$exists": False}},
        {"_id": job_id, COUNTED_TO: {"$lt": at_us}},
    )


# -- I/O ----------------------------------------------------------------------------------------


def _now_us() -> int:
    return micros(datetime.now(UTC))


async def record_final(
    db: AsyncDatabase[Document], job_id: str, stage: ItemStage, item_id: str, state: object
) -> bool:
    """Record an item's terminal outcome at `stage` from its *stored* state (a state that is not
    terminal records nothing) and count it if this call was the first; True when it counted."""
    outcome = outcome_of(state)
    if outcome is None:
        return False
    at_us = _now_us()
    inc: dict[str, int] = {}
    for record_id, kind, field in records_of(stage, item_id, outcome):
        record = {
            "_id": record_id,
            "job_id": job_id,
            "stage": kind,
            "item_id": item_id,
            "outcome": outcome,
            "at_us": at_us,
        }
        try:
            await db[FINALS].insert_one(record)
        except DuplicateKeyError:
            continue  # recorded (and counted, or left for the repair) by an earlier writer
        inc[field] = 1
        ITEMS.labels(kind, outcome).inc()
    if not inc:
        return False
    await _count(db, job_id, inc, at_us)
    return True


async def count_error(db: AsyncDatabase[Document], job_id: str, at_us: int) -> None:
    """Count an error-summary entry whose insert (with this `at_us`) just succeeded."""
    await _count(db, job_id, {ERRORS: 1}, at_us)


async def _count(db: AsyncDatabase[Document], job_id: str, inc: dict[str, int], at_us: int) -> None:
    update = {"$inc": {**inc, EVENTS: 1}, "$set": {LAST_US: at_us}}
    for only_if in counting_filters(job_id, at_us):
        if (await db.jobs.update_one(only_if, update)).matched_count:
            return


async def repair_counters(db: AsyncDatabase[Document], job_id: str, attempts: int = 3) -> bool:
    """Backfill the job's missing final records from its stage documents, then recount its
    counters from its records (see the module's docstring for why this is exact under
    concurrent writers). True when a counter changed. O(the job's items): reconciliation only."""
    await _backfill(db, job_id)
    for _ in range(attempts):
        changed = await _recount(db, job_id)
        if changed is not None:
            return changed
    # Increments kept landing during the recount: the job is moving, a later repair will do.
    log.info("progress.repair_deferred", job_id=job_id)
    return False


async def _backfill(db: AsyncDatabase[Document], job_id: str) -> int:
    """The final records missing after a writer died: after its stage document (the redelivery
    only re-announces it), or between a stage's record and its question's record."""
    fields = {"stage": 1, "item_id": 1, "outcome": 1}
    finals = await db[FINALS].find({"job_id": job_id}, fields).to_list()
    recorded = {doc["_id"] for doc in finals}
    outcomes: list[tuple[ItemStage, str, object]] = [
        (doc["stage"], doc["item_id"], doc.get("outcome"))
        for doc in finals
        if doc.get("stage") in ITEM_STAGES and "item_id" in doc
    ]
    for stage, collection in STAGE_COLLECTIONS.items():
        docs = await db[collection].find({"job_id": job_id}, {"state": 1}).to_list()
        outcomes += [(stage, doc["_id"], doc.get("state")) for doc in docs]
    added = 0
    for stage, item_id, state in outcomes:
        outcome = outcome_of(state)
        if outcome is None:
            continue
        if all(rid in recorded for rid, _, _ in records_of(stage, item_id, outcome)):
            continue
        if await record_final(db, job_id, stage, item_id, outcome):
            added += 1
        recorded.update(rid for rid, _, _ in records_of(stage, item_id, outcome))
    if added:
        log.warning("progress.records_backfilled", job_id=job_id, records=added)
    return added


async def _recount(db: AsyncDatabase[Document], job_id: str) -> bool | None:
    """One guarded recount: True/False (changed or not), None when an increment interfered."""
    job = await db.jobs.find_one({"_id": job_id}, {"progress": 1})
    if job is None:
        return False
    events = _read(job, EVENTS)
    fields = {"stage": 1, "outcome": 1, "at_us": 1}
    records = await db[FINALS].find({"job_id": job_id}, fields).to_list()
    errors = await db.job_errors.find({"job_id": job_id}, {"at_us": 1}).to_list()
    counted = tally(records, len(errors))
    stamp = {REPAIRED_US: _now_us()}
    before = counters_of(job)
    if counted == before:
        await db.jobs.update_one({"_id": job_id}, {"$set": stamp})
        return False
    watermark = max([_read(job, COUNTED_TO)] + [_read(doc, "at_us") for doc in (*records, *errors)])
    unchanged: Document = {EVENTS: events} if events else {EVENTS: {"$exists": False}}
    updated = await db.jobs.update_one(
        {"_id": job_id, **unchanged},
        {"$set": {**counted, COUNTED_TO: watermark, **stamp}, "$inc": {EVENTS: 1}},
    )
    if not updated.matched_count:
        return None
    changes = {field: (before[field], counted[field]) for field in COUNTERS}
    log.warning(
        "progress.repaired",
        job_id=job_id,
        changed={field: change for field, change in changes.items() if change[0] != change[1]},
    )
    return True
