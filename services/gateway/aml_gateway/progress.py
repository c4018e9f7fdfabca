"""A job's progress and status as the API shows it (R-3.6), read from the job document alone:
the per-stage counters `aml_runtime.progress` keeps exact (each item's terminal stage document
counted by its one writer), plus the job's first errors through the (job_id, at) index and
its version by id (system, label, board), so a poll reads a bounded number of documents
whatever the database holds."""

from __future__ import annotations

from datetime import UTC, datetime

from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.api.jobs import JobError, JobStatus, StageProgress
from aml_contract.api.publication import PublicationGate
from aml_contract.api.vocabulary import STAGES, Stage
from aml_runtime.db import Document, read_time
from aml_runtime.progress import ITEM_STAGES, stage_counts


def current_stage(state: str, stages: dict[Stage, StageProgress]) -> Stage | None:
    if state in ("completed", "failed"):
        return None
    for stage in STAGES:
        progress = stages[stage]
        if progress.total == 0 or progress.done + progress.failed < progress.total:
            return stage
    return "aggregate"


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


# What the status shows of the job's version: one read by primary key.
_VERSION_FIELDS = {"system_name": 1, "version_label": 1, "board": 1}


async def job_status(db: AsyncDatabase[Document], job: Document) -> JobStatus:
    """Bounded: the job document, its version by id and at most 100 errors."""
    job_id = job["_id"]
    # Bounded: the (job_id, at) index (aml_runtime.db) serves the filter, the order and the limit.
    errors = [
        JobError(stage=e["stage"], kind=e["kind"], item=e.get("item"), reason=e["reason"])
        async for e in db.job_errors.find({"job_id": job_id}).sort("at", 1).limit(100)
    ]
    version = await db.versions.find_one({"_id": job.get("version_id")}, _VERSION_FIELDS)
    return status_of(job, version, errors, datetime.now(UTC))


def status_of(
    job: Document, version: Document | None, errors: list[JobError], now: datetime
) -> JobStatus:
    """The status from what `job_status` read (pure)."""
    stages = stage_progress(job)
    errors = list(errors)
    if job["state"] == "failed" and not errors:
        errors.append(
            JobError(
                stage=job.get("failed_stage", "add"),
                kind="job_failed",
                item=None,
                reason=job.get("failure", "the job failed"),
            )
        )
    started = read_time(job.get("started_at"))
    finished = read_time(job.get("finished_at"))
    end = finished or now
    spec = job.get("spec") or {}
    version = version or {}
    return JobStatus(
        job_id=job["_id"],
        state=job["state"],
        stage=current_stage(job["state"], stages),
        mode=job["mode"],
        track=job["track"],
        version_id=job["version_id"],
        run_label=job["run_label"],
        datasets=job["datasets"],
        created_at=read_time(job["created_at"]),
        started_at=started,
        finished_at=finished,
        elapsed_seconds=round((end - started).total_seconds(), 3) if started else 0.0,
        duration_seconds=(
            round((finished - started).total_seconds(), 3) if started and finished else None
        ),
        stages=stages,
        errors=errors,
        spec=spec,
        spec_hash=job.get("spec_hash"),
        dataset_bundle_hash=job.get("dataset_bundle_hash"),
        dataset_bundles=job.get("dataset_bundles", {}),
        code_hash=job.get("code_hash"),
        answer_model=spec.get("answer_model"),
        system_name=version.get("system_name"),
        version_label=version.get("version_label"),
        board=version.get("board"),
        review_state=job.get("review_state"),
        gate=stored_gate(job),
        review_reason=job.get("review_reason"),
    )


def stored_gate(job: Document) -> PublicationGate | None:
    """The publisher's gate outcome on a job, if the gate ran (R-3.8)."""
    gate = job.get("gate")
    if not isinstance(gate, dict):
        return None
    at = read_time(gate.get("at")) or read_time(job.get("finished_at")) or datetime.now(UTC)
    return PublicationGate.model_validate(
        {"checks": gate.get("checks") or [], "passed": bool(gate.get("passed")), "at": at}
    )
