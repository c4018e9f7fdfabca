"""A job's progress and status as the API shows it (R-3.6), read from the job document alone:
the per-stage counters `aml_pipeline.progress` keeps exact (each item's terminal stage document
counted by its one writer), plus the job's first errors through the (job_id, at) index and
its version by id (system, label, board), so a poll reads a bounded number of documents
whatever the database holds."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from aml_contract.api.jobs import JobError, JobPause, JobStatus, StageProgress
from aml_contract.api.publication import PublicationGate
from aml_contract.api.vocabulary import Stage
from aml_gateway.submissions import charged
from aml_pipeline.llm import LLM_CAPACITY_KEY
from aml_pipeline.outages import LanePause, open_pauses
from aml_pipeline.progress import ITEM_STAGES, stage_counts, waiting_stage
from aml_runtime.db import Document, read_time
from aml_runtime.documents import ACTIVE_JOB_STATES, FailureKind, JobDocument, code_hashes_of
from aml_runtime.stores import Stores


def current_stage(job: Document) -> Stage | None:
    """The stage the job waits on (`aml_pipeline.progress.waiting_stage`: the rule the
    scheduler's stall diagnosis uses too); none once the job ended."""
    if job["state"] in ("completed", "failed"):
        return None
    return waiting_stage(job).stage


def stage_progress(job: Document) -> dict[Stage, StageProgress]:
    """Every stage's progress from the job document alone (planned totals, kept counters; a
    job not planned yet, or with nothing counted yet, has none: 0)."""
    totals = job.get("totals") or {}
    stages: dict[Stage, StageProgress] = {}
    for stage in ITEM_STAGES:
        total = totals.get("add" if stage == "add" else "questions", 0)
        done, failed = stage_counts(job, stage)
        stages[stage] = StageProgress(total=total, done=done, failed=failed)
    stages["aggregate"] = StageProgress(
        total=1, done=int(job["state"] == "completed"), failed=int(job["state"] == "failed")
    )
    return stages


async def job_status(stores: Stores, job: Document) -> JobStatus:
    """Bounded: the job document, its version by id and at most 100 errors."""
    job_id = job["_id"]
    # Bounded: the (job_id, at) index (aml_runtime.documents) serves the filter, order and limit.
    errors = [
        JobError(stage=e["stage"], kind=e["kind"], item=e.get("item"), reason=e["reason"])
        async for e in stores.jobs.first_errors(job_id)
    ]
    version = await stores.accounts.version_profile(job.get("version_id"))
    pauses: list[LanePause] = []
    if job.get("state") in ACTIVE_JOB_STATES:
        # Two keys by id: the job's participant version and the deployment's LLM.
        pauses = await open_pauses(stores, [str(job.get("version_id")), LLM_CAPACITY_KEY])
    return status_of(job, version, errors, datetime.now(UTC), pauses)


def job_pause(pause: LanePause) -> JobPause:
    return JobPause(
        kind=pause.kind,
        since=datetime.fromtimestamp(pause.since, UTC),
        reason=pause.reason,
        window_seconds=pause.window,
        message=pause.describe(),
    )


def status_of(
    job: Document,
    version: Document | None,
    errors: list[JobError],
    now: datetime,
    pauses: Sequence[LanePause] = (),
) -> JobStatus:
    """The status from what `job_status` read (pure)."""
    stored = JobDocument.model_validate(job)
    stages = stage_progress(job)
    errors = list(errors)
    if stored.state == "failed" and not errors:
        errors.append(
            JobError(
                stage=stored.failed_stage or "add",
                kind=FailureKind.JOB_FAILED,
                item=None,
                reason=stored.failure or "the job failed",
            )
        )
    started, finished = stored.started_at, stored.finished_at
    end = finished or now
    version = version or {}
    gate = stored_gate(job)
    publishable, not_publishable = publication_outlook(stored, gate)
    return JobStatus(
        job_id=stored.id,
        state=stored.state,
        stage=current_stage(job),
        mode=stored.mode,
        track=stored.track,
        version_id=stored.version_id,
        run_label=stored.run_label,
        datasets=stored.datasets,
        created_at=stored.created_at,
        started_at=started,
        finished_at=finished,
        elapsed_seconds=round((end - started).total_seconds(), 3) if started else 0.0,
        duration_seconds=(
            round((finished - started).total_seconds(), 3) if started and finished else None
        ),
        stages=stages,
        errors=errors,
        state_summary=state_summary(stored),
        platform_failures=stored.platform_failures or 0,
        publishable=publishable,
        not_publishable_reason=not_publishable,
        charged=charged(
            stored.state,
            stored.failure_kind,
            stored.platform_failures or 0,
            stored.mixed_code is not None,
        ),
        spec=stored.spec,
        spec_hash=stored.spec_hash,
        dataset_bundle_hash=stored.dataset_bundle_hash,
        dataset_bundles=stored.dataset_bundles,
        code_hash=stored.code_hash,
        code_hashes=code_hashes_of(job),
        answer_model=stored.spec.get("answer_model"),
        system_name=version.get("system_name"),
        version_label=version.get("version_label"),
        board=version.get("board"),
        review_state=stored.review_state,
        gate=gate,
        review_reason=stored.review_reason,
        # Only what stops work now: a resumed or expired outage is not shown as a pause.
        paused=[job_pause(pause) for pause in pauses if pause.paused],
    )


NOT_CHARGED = "this run is not charged to your quota"


def _platform_reason(job: JobDocument) -> str:
    return job.platform_failure_reason or (
        f"{job.platform_failures} items failed by the platform (platform_error)"
    )


def publication_outlook(
    job: JobDocument, gate: PublicationGate | None
) -> tuple[bool | None, str | None]:
    """Whether the job can be published (R-3.8) and, when not, why. A run the platform spoiled
    says so first: the gate would fail it too, but only as one failed check among others."""
    if job.state == "completed" and job.platform_failures:
        return False, f"{_platform_reason(job)}: not publishable; {NOT_CHARGED}"
    if job.state == "completed" and (mixed := job.mixed_code) is not None:
        return False, f"{mixed}: not publishable; {NOT_CHARGED}"
    if job.state == "failed":
        void = not charged(job.state, job.failure_kind, 0)
        return False, f"the job failed: {job.failure or 'no reason recorded'}" + (
            f"; {NOT_CHARGED}" if void else ""
        )
    if gate is None:
        return None, None
    if gate.passed:
        return True, None
    failing = "; ".join(f"{c.name}: {c.reason}" for c in gate.checks if not c.passed)
    return False, f"the publication gate failed: {failing or 'no checks recorded'}"


def state_summary(job: JobDocument) -> str:
    """The state as a team reads it: a plain `completed` only for a run that the platform did
    not spoil, and a failure said to be the platform's when it was (neither is charged)."""
    if job.state == "completed" and job.platform_failures:
        return f"completed — not publishable: {_platform_reason(job)}; not charged"
    if job.state == "completed" and job.mixed_code is not None:
        return "completed — not publishable: processed by two builds (mixed code); not charged"
    if job.state == "failed" and not charged(job.state, job.failure_kind, 0):
        return "failed — by the platform (platform_error); not charged"
    return job.state


def stored_gate(job: Document) -> PublicationGate | None:
    """The publisher's gate outcome on a job, if the gate ran (R-3.8)."""
    gate = job.get("gate")
    if not isinstance(gate, dict):
        return None
    at = read_time(gate.get("at")) or read_time(job.get("finished_at")) or datetime.now(UTC)
    return PublicationGate.model_validate(
        {"checks": gate.get("checks") or [], "passed": bool(gate.get("passed")), "at": at}
    )
