"""Job state transitions and look-ups that several services share. Every transition is a guarded
update (it names the state it leaves), so concurrent or repeated callers change a job once."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from aml_contract import subjects
from aml_contract.api.versions import Capacity as DeclaredCapacity
from aml_contract.api.versions import RunLimits
from aml_contract.api.vocabulary import Stage
from aml_contract.messages import JobFinished, message_id
from aml_pipeline.capacity import Capacity
from aml_pipeline.participants import Endpoint
from aml_pipeline.progress import count_error
from aml_runtime import codehash
from aml_runtime.broker import Bus, publish
from aml_runtime.clock import micros, now
from aml_runtime.db import Document
from aml_runtime.documents import ACTIVE_JOB_STATES, FailureKind
from aml_runtime.secrets import SecretBox
from aml_runtime.stores import Stores


async def record_error(
    stores: Stores,
    job_id: str,
    stage: Stage,
    kind: FailureKind,
    item: str | None,
    reason: str,
) -> None:
    """One error-summary entry per failed item (keyed, so a redelivery records it once), counted
    on the job by the insert that created it (`aml_pipeline.progress`: insert first, then count;
    the scheduler's repair recounts one whose writer died in between)."""
    moment = now()
    if not await stores.jobs.record_error(job_id, stage, kind, item, reason, moment):
        return
    await count_error(stores, job_id, micros(moment))


async def fail_job(
    stores: Stores,
    bus: Bus,
    job_id: str,
    stage: Stage,
    kind: FailureKind,
    reason: str,
) -> None:
    """Stop a job at once (R-4.9): its queued work is purged from the broker, so none of it
    reaches the participant, and workers skip anything already fetched.

    `kind` says whose failure it was; a job failed by the platform itself (`platform_error`)
    does not consume the team's quota."""
    version_id = await stores.jobs.fail(job_id, stage, kind, reason, now())
    if version_id is not None:
        await purge_job_work(bus, version_id, job_id)
        await publish_finished(bus, job_id, "failed")


async def purge_job_work(bus: Bus, version_id: str, job_id: str) -> None:
    await bus.purge(subjects.WORK_STREAM, subjects.job_work_filter(version_id, job_id))


async def publish_finished(bus: Bus, job_id: str, state: str) -> None:
    message = JobFinished(job_id=job_id, state="completed" if state == "completed" else "failed")
    await publish(bus, subjects.JOB_FINISHED, message, message_id("finished", job_id))


async def job_is_active(stores: Stores, job_id: str) -> bool:
    state = await stores.jobs.state_of(job_id)
    return state is not None and state in ACTIVE_JOB_STATES


def run_overdue(version: Document, started_at: datetime | None, moment: datetime) -> str | None:
    """Why a run has outlived its declared `max_run_hours` (R-3.1), or None."""
    hours = run_limits(version).max_run_hours
    if hours is None or started_at is None:
        return None
    if moment - started_at < timedelta(hours=hours):
        return None
    return f"the run exceeded its declared limit of {hours:g} hours"


async def load_endpoint(
    stores: Stores, box: SecretBox, version_id: str, job_id: str | None = None
) -> Endpoint:
    """How to call a version; with `job_id`, its requests count against the run's limit."""
    accounts = stores.accounts
    version = await accounts.version(version_id)
    if version is None:
        raise LookupError(f"version {version_id} is not registered")
    secret = None
    if version.get("secret_ref"):
        sealed = await accounts.sealed_key(version["secret_ref"])
        if sealed is None:
            raise LookupError(f"secret of version {version_id} is missing")
        secret = box.open(sealed)
    return Endpoint(
        add_url=version["add_url"],
        search_url=version["search_url"],
        health_url=version["health_url"],
        add_status_url_template=version.get("add_status_url_template"),
        auth_method=version["auth_method"],
        secret=secret,
        capacity=version_capacity(version),
        run_key=job_id,
        max_requests=run_limits(version).max_requests_per_run,
    )


@dataclass
class Endpoints:
    """`load_endpoint` with a short memory per process: an item's call needs its version's
    endpoint, and reading the version and its sealed key for every item was two database reads
    per question. A changed version (URL, key, capacity) is seen within `ttl` seconds."""

    stores: Stores
    box: SecretBox
    ttl: float = 5.0
    _known: dict[str, tuple[float, Endpoint]] = field(default_factory=dict)

    async def get(self, version_id: str, job_id: str) -> Endpoint:
        now_s = time.monotonic()
        known = self._known.get(version_id)
        if known is None or now_s - known[0] > self.ttl:
            known = (now_s, await load_endpoint(self.stores, self.box, version_id))
            self._known[version_id] = known
        return known[1].model_copy(update={"run_key": job_id})


def version_capacity(version: Document) -> Capacity:
    """A participant version's declared capacity (R-4.12), keyed by the version."""
    declared = DeclaredCapacity.model_validate(version.get("capacity") or {})
    return Capacity(
        key=str(version["_id"]),
        max_concurrency=declared.max_concurrency,
        max_rps=declared.max_rps,
    )


def run_limits(version: Document) -> RunLimits:
    """A version's declared run limits (R-3.1); none declared, none apply. Read from a version
    document or a projection of it."""
    return RunLimits.model_validate(version.get("run_limits") or {})


# How long a stage reuses a job's state it read (see `JobStates`).
_JOB_READ_SECONDS = 1.0
_JOB_READS_KEPT = 256
# How long a job announced as finished is remembered as such (its work is purged by then).
_FINISHED_KEPT_SECONDS = 3600.0


@dataclass
class JobStates:
    """A stage process's view of its jobs' state (and `top_k`), so that an item checks its job
    is still active without a read of its own.

    It also records this process's build on every active job it is asked about, once per job
    (`JobStore.record_code_hash`), before the item that asked is worked on: a job whose items
    two builds processed (a rolling upgrade that replaced workers mid-job) says so, and the
    publication gate refuses it."""

    stores: Stores
    broker: NatsBroker
    # This process's build (`aml_runtime.codehash`).
    code_hash: str = field(default_factory=codehash.code_hash)
    _jobs: dict[str, tuple[float, Document | None]] = field(default_factory=dict, init=False)
    _finished_watch: Subscription | None = field(default=None, init=False)
    # Jobs this process has recorded its build on; bounded like `_jobs` (a job forgotten is
    # recorded again: the same write, a no-op).
    _recorded: set[str] = field(default_factory=set, init=False)

    async def get(self, job_id: str) -> Document | None:
        """The job's state (and `top_k`), read at most once per `_JOB_READ_SECONDS`. A failed
        job's work is purged from the broker and the failure is announced on
        `aml.jobs.finished`, which every replica of every stage hears: a job announced finished
        is skipped from then on, without a read. What is left is the announcement's way over
        the broker (milliseconds, like the moment between a read and the call it allows); a
        lost announcement is covered by the next read, within a second."""
        if self._finished_watch is None:
            # Before the read: an announcement made after it is heard.
            self._finished_watch = await self.broker.connection.subscribe(
                subjects.JOB_FINISHED, cb=self._finished
            )
        moment = time.monotonic()
        cached = self._jobs.get(job_id)
        if cached is not None and cached[0] > moment:
            return cached[1]
        job = await self.stores.jobs.stage_view(job_id)
        if job is not None and job["state"] in ACTIVE_JOB_STATES:
            await self._record_build(job_id)
        self._keep(job_id, moment + _JOB_READ_SECONDS, job)
        return job

    async def _record_build(self, job_id: str) -> None:
        if job_id in self._recorded:
            return
        # A failed write raises: the item is retried, and nothing is processed unrecorded.
        await self.stores.jobs.record_code_hash(job_id, self.code_hash)
        if len(self._recorded) >= _JOB_READS_KEPT:
            self._recorded.clear()
        self._recorded.add(job_id)

    async def _finished(self, msg: Msg) -> None:
        try:
            finished = JobFinished.model_validate_json(msg.data)
        except ValidationError:
            return
        self._keep(
            finished.job_id, time.monotonic() + _FINISHED_KEPT_SECONDS, {"state": finished.state}
        )

    def _keep(self, job_id: str, until: float, job: Document | None) -> None:
        if len(self._jobs) >= _JOB_READS_KEPT:
            moment = time.monotonic()
            kept = [(k, v) for k, v in self._jobs.items() if v[0] > moment]
            # Bounded also when many jobs finished within the hour: a forgotten one is read.
            self._jobs = dict(kept[-_JOB_READS_KEPT // 2 :])
        self._jobs[job_id] = (until, job)

    def ended(self, job_id: str, state: str) -> None:
        """This process ended the job (`fail_job`): its next item knows without waiting for
        the announcement to come back."""
        self._keep(job_id, time.monotonic() + _FINISHED_KEPT_SECONDS, {"state": state})

    async def is_active(self, job_id: str) -> bool:
        job = await self.get(job_id)
        return job is not None and job["state"] in ACTIVE_JOB_STATES
