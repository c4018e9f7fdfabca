"""Nothing hangs, by construction: a running job whose progress counters have not moved for too
long is failed, with a reason naming the stage it is stuck in and whose failure it is.

**The rule.** A job has *moved* when its plan was written (`started_at`) and whenever an item's
terminal outcome was counted (`progress.last_us`, `aml_pipeline.progress`). It is *stalled* when
it has not moved for

    limit = max(AML_JOB_STALL_SECONDS,
                STALL_PERIODS * the version's declared period (1 / max_rps),
                2 * AML_PARTICIPANT_TIMEOUT_SECONDS)

so neither a participant that declared a slow rate (`max_rps` 0.001 is one call per 1000 s; an Add
may need a few calls with its status polls: ten periods is 10,000 s) nor one slow call that is
still inside its timeout (and its retry) can trip it. Whatever the participant declared, a job
that nothing moves is failed within that bound after its last movement, so a test can check
that a job never hangs.

A job whose participant or LLM is paused by an outage (`aml_pipeline.outages`) is not stalled
while the pause lasts, and has moved when the outage ended: the outage has its own window, and
failing the job here would end the run the pause exists to save.

A job still *queued* (not planned) that long after it was created is failed too, as the
platform's: planning is immediate, so it keeps failing to plan.

**The stage** is read from the counters against the totals: the first of add (chunks not all
final), search (questions not all searched), answer (searched questions not all answered),
score (answered questions not all scored); all final yet still running is the platform's own
completion (`aggregate`). A streaming dataset's user whose next Add waits for the searches of
questions asked before it is held by those searches, not by its Adds: a job stuck at add with
such searches not final is stuck at search (`searches_holding_adds`).

**The cause.** Answering, scoring and completion are the platform's (the LLM is the platform's
budget). For add and search: the newest error-summary entry since the job last moved (its kind:
`platform_error` is the platform's, any other the participant's), else the newest participant
call since then (a failed or unfinished call: the participant's; a successful one that finished
nothing: the platform's), else, with no call sent at all, the platform's (its work was not
dispatched). A participant-caused stall fails the job as `job_stalled`; a platform-caused one as
`platform_error`, which does not charge the team's quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from aml_contract.api.vocabulary import Stage
from aml_pipeline.jobs import version_capacity
from aml_pipeline.llm import LLM_CAPACITY_KEY
from aml_pipeline.outages import last_outage_end, open_pauses
from aml_pipeline.progress import LAST_US, waiting_stage
from aml_runtime.clock import micros
from aml_runtime.db import Document, read_time
from aml_runtime.documents import FailureKind
from aml_runtime.stores import Stores

# A stall is never shorter than this many of the version's declared request periods.
STALL_PERIODS = 10
# ... nor than this many participant call timeouts (one slow call and its retry).
STALL_TIMEOUTS = 2

Cause = Literal["participant", "platform"]


@dataclass(frozen=True)
class Stall:
    stage: Stage
    cause: Cause
    idle_seconds: float
    limit_seconds: float
    detail: str

    @property
    def kind(self) -> FailureKind:
        if self.cause == "participant":
            return FailureKind.JOB_STALLED
        return FailureKind.PLATFORM_ERROR

    @property
    def reason(self) -> str:
        return (
            f"no progress for {self.idle_seconds:.0f}s (limit {self.limit_seconds:.0f}s) in stage "
            f"{self.stage}; cause: {self.cause} ({self.detail})"
        )


def stall_limit_seconds(
    stall_seconds: float, participant_timeout_seconds: float, version: Document
) -> float:
    # How long one request holds a rate slot: a second, or 1 / max_rps below one per second.
    period = version_capacity(version).rate_period
    return max(stall_seconds, STALL_PERIODS * period, STALL_TIMEOUTS * participant_timeout_seconds)


def last_moved_us(job: Document) -> int | None:
    """When the job last moved (µs): its plan or its latest counted outcome."""
    started = read_time(job.get("started_at"))
    marks = [micros(started)] if started is not None else []
    progress = job.get("progress")
    last = progress.get(LAST_US.split(".", 1)[1]) if isinstance(progress, dict) else None
    if isinstance(last, int) and not isinstance(last, bool):
        marks.append(last)
    return max(marks) if marks else None


_FIGURES = {
    "add": "{final} of {expected} Add requests final",
    "search": "{final} of {expected} questions searched",
    "answer": "{final} of {expected} answered",
    "score": "{final} of {expected} scored",
    "aggregate": "all {expected} questions final, job not completed",
}


def stuck_stage(job: Document) -> tuple[Stage, str]:
    """The stage a running job waits on (`aml_pipeline.progress.waiting_stage`, the rule the
    status shows too), and its figures."""
    waiting = waiting_stage(job)
    return waiting.stage, _FIGURES[waiting.stage].format(**waiting._asdict())


async def diagnose(
    stores: Stores, job: Document, moment: datetime, limit_seconds: float
) -> Stall | None:
    """The job's stall, or None while it moves."""
    if job.get("state") == "queued" and not job.get("planned"):
        # Planning is immediate (missing dataset files fail the job at once, a participant
        # whose Health does not answer pauses it as an outage): a job still queued this long
        # keeps failing to plan for the platform's reasons.
        created = read_time(job.get("created_at"))
        if created is None:
            return None
        since = await _idle_since(stores, job, micros(created), moment, limit_seconds)
        if since is None:
            return None
        idle = (micros(moment) - since) / 1e6
        why = "the job could not be planned (see the scheduler's reconcile.failed log entries)"
        return Stall("add", "platform", idle, limit_seconds, why)
    if job.get("state") != "running" or not job.get("planned"):
        return None
    moved = last_moved_us(job)
    if moved is None:
        return None
    moved = await _idle_since(stores, job, moved, moment, limit_seconds)
    if moved is None:
        return None
    idle = (micros(moment) - moved) / 1e6
    stage, figures = stuck_stage(job)
    if stage == "add" and (held := await searches_holding_adds(stores, str(job["_id"]))):
        stage, figures = "search", f"{figures}, held back by {held} searches not final"
    if stage not in ("add", "search"):
        llm = "the platform's LLM stage" if stage != "aggregate" else "the platform's completion"
        return Stall(stage, "platform", idle, limit_seconds, f"{figures}; {llm}")
    cause, why = await _participant_or_platform(stores, str(job["_id"]), stage, moved)
    return Stall(stage, cause, idle, limit_seconds, f"{figures}; {why}")


async def _idle_since(
    stores: Stores, job: Document, moved: int, moment: datetime, limit: float
) -> int | None:
    """When the job last moved (µs), counting the end of its participant's or the LLM's latest
    outage as movement, if it has been still for `limit` seconds since; None while it has not,
    or while either is paused (the outage has its own window). Reads only for a job that looks
    stalled: its two keys' pauses and latest outages."""
    if micros(moment) - moved < limit * 1e6:
        return None
    keys = [str(job.get("version_id")), LLM_CAPACITY_KEY]
    if any(pause.paused for pause in await open_pauses(stores, keys)):
        return None
    ends = [end for key in keys if (end := await last_outage_end(stores, key)) is not None]
    if ends:
        moved = max(moved, round(max(ends) * 1e6))
    return moved if micros(moment) - moved >= limit * 1e6 else None


async def searches_holding_adds(stores: Stores, job_id: str) -> int:
    """How many searches the users' next Adds wait for (streaming datasets: an Add goes out
    only once the searches of the questions asked right before it are final). Once per stalled
    job: it reads the job's pending Adds."""
    first: dict[str, Document] = {}
    async for chunk in stores.plans.pending_chunks(job_id):
        earliest = first.get(chunk["user_id"])
        if earliest is None or chunk["seq"] < earliest["seq"]:
            first[chunk["user_id"]] = chunk
    held = [item for chunk in first.values() for item in chunk.get("searched_before") or ()]
    if not held:
        return 0
    return len(held) - await stores.records.searches_final(held)


async def _participant_or_platform(
    stores: Stores, job_id: str, stage: Stage, since_us: int
) -> tuple[Cause, str]:
    # Once per stalled job (it is failed right after): a sort over the job's entries is fine.
    error = await stores.jobs.latest_error_since(job_id, since_us)
    if error is not None:
        cause: Cause = (
            "platform" if error.get("kind") == FailureKind.PLATFORM_ERROR else "participant"
        )
        return cause, f"last error {error.get('kind')}: {error.get('reason')}"
    call = await stores.audit.latest_call(job_id, stage)
    started = read_time(call.get("started_at")) if call is not None else None
    if call is None or started is None or micros(started) < since_us:
        return "platform", "no participant call was sent since the job last moved"
    what = f"last call {call.get('operation')} attempt {call.get('attempt')}"
    if call.get("outcome") != "ok":
        status = call.get("status") or call.get("error_class")
        return "participant", f"{what} failed: {status}"
    if call.get("operation") == "add_status":
        return "participant", f"{what}: the participant's Add task is not finished"
    return "platform", f"{what} succeeded but nothing was recorded since"
