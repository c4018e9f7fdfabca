"""Participants submit jobs and read their progress and results (R-3.4 - R-3.7)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, HTTPException
from pymongo.errors import DuplicateKeyError

from aml_contract import subjects
from aml_contract.api import JobResults, JobStatus, JobSubmission
from aml_contract.messages import JobSubmitted, message_id
from aml_gateway.deps import ServicesDep, TeamDep
from aml_gateway.progress import job_status
from aml_runtime.broker import publish
from aml_runtime.db import Document
from aml_runtime.jobs import now

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# The suite each mode runs when the submission names no datasets.
DEFAULT_DATASETS = {"smoke": ["synthetic"], "full": ["locomo_refined"]}
KNOWN_DATASETS = {"synthetic", "locomo", "locomo_refined"}


async def _own_job(svc: ServicesDep, team: Document, job_id: str) -> Document:
    job = await svc.db.jobs.find_one({"_id": job_id, "team_id": team["_id"]})
    if job is None:
        # Another team's job answers exactly like a missing one: existence is not revealed.
        raise HTTPException(404, {"reason": f"job {job_id} not found"})
    return job


@router.post("", status_code=201)
async def submit_job(body: JobSubmission, svc: ServicesDep, team: TeamDep) -> JobStatus:
    version = await svc.db.versions.find_one({"_id": body.version_id, "team_id": team["_id"]})
    if version is None:
        raise HTTPException(404, {"reason": f"version {body.version_id} not found"})
    if version["auth_method"] == "none" and body.mode != "smoke":
        raise HTTPException(422, {"reason": "auth method `none` is allowed only for smoke runs"})
    datasets = body.datasets or DEFAULT_DATASETS[body.mode]
    unknown = sorted(set(datasets) - KNOWN_DATASETS)
    if unknown:
        raise HTTPException(422, {"reason": f"unknown dataset(s): {', '.join(unknown)}"})
    job_id = f"j{uuid.uuid4().hex[:12]}"
    job = {
        "_id": job_id,
        "team_id": team["_id"],
        "version_id": body.version_id,
        "mode": body.mode,
        "track": body.track,
        "run_label": body.run_label,
        "run_label_key": f"{team['_id']}/{body.run_label}",
        "datasets": datasets,
        "state": "queued",
        "planned": False,
        "created_at": now(),
    }
    try:
        await svc.db.jobs.insert_one(job)
    except DuplicateKeyError:
        raise HTTPException(409, {"reason": f"run label {body.run_label!r} is taken"}) from None
    await publish(
        svc.broker,
        subjects.JOB_SUBMITTED,
        JobSubmitted(job_id=job_id),
        message_id("submitted", job_id),
    )
    return await job_status(svc.db, job)


@router.get("")
async def list_jobs(svc: ServicesDep, team: TeamDep) -> list[JobStatus]:
    jobs = svc.db.jobs.find({"team_id": team["_id"]}).sort("created_at", -1).limit(100)
    return [await job_status(svc.db, job) async for job in jobs]


@router.get("/{job_id}")
async def get_job(job_id: str, svc: ServicesDep, team: TeamDep) -> JobStatus:
    return await job_status(svc.db, await _own_job(svc, team, job_id))


@router.get("/{job_id}/results")
async def get_results(job_id: str, svc: ServicesDep, team: TeamDep) -> JobResults:
    job = await _own_job(svc, team, job_id)
    if "results" not in job:
        raise HTTPException(409, {"reason": f"job {job_id} has no results yet ({job['state']})"})
    return JobResults.model_validate(job["results"])
