"""Participants submit jobs and read their progress, results and audit trail (R-3.3 - R-3.7,
R-7.3)."""

from __future__ import annotations

import uuid
from typing import Annotated

from bson import ObjectId
from bson.errors import InvalidId
from fastapi import APIRouter, Path, Query
from pymongo.errors import DuplicateKeyError

from aml_contract import subjects
from aml_contract.api.attempts import AttemptPage
from aml_contract.api.audit import AuditPage, AuditRecord, AuditStage, SearchAudit
from aml_contract.api.jobs import JobStatus, JobSubmission, QuotaExceeded
from aml_contract.api.results import JobResults
from aml_contract.api.vocabulary import Track
from aml_contract.messages import JobSubmitted, message_id
from aml_evaluation.registry import registered
from aml_gateway.attempts import PAGE_LIMIT, attempts_page
from aml_gateway.deps import GuardedRoute, ServicesDep, TeamDep
from aml_gateway.errors import error_responses
from aml_gateway.progress import job_status
from aml_gateway.refusals import Conflict, Invalid, NotFound, echoed
from aml_gateway.routes.datasets import smoke_ids
from aml_gateway.services import Services
from aml_gateway.submissions import (
    PriorRun,
    Submission,
    check_dataset_tracks,
    check_submission,
)
from aml_runtime.broker import publish
from aml_runtime.db import Document, read_time
from aml_runtime.documents import JobDocument

router = APIRouter(
    route_class=GuardedRoute, prefix="/v1/jobs", tags=["jobs"], responses=error_responses(429)
)

_ERRORS = error_responses(401, 404, 409)
# Two submissions of one team racing for the same sequence number: the loser re-reads the
# team's jobs and is judged again, so quotas hold under concurrency. More rounds than this
# only under a flood, which is answered 409.
_SUBMISSION_ROUNDS = 5


async def _own_job(svc: ServicesDep, team: Document, job_id: str) -> Document:
    job = await svc.stores.jobs.team_job(job_id, team["_id"])
    if job is None:
        # Another team's job answers exactly like a missing one: existence is not revealed.
        raise NotFound(f"job {echoed(job_id)} not found")
    return job


def _datasets(body: JobSubmission, svc: Services) -> list[str]:
    """The job's datasets; a refusal names the ids that would be accepted (`valid_datasets`,
    and in the reason), as `GET /v1/datasets` lists them."""
    settings = svc.settings
    if body.mode == "full":
        if body.datasets is not None and body.datasets != settings.full_suite:
            suite = list(settings.full_suite)
            raise Invalid(
                f"full runs use the fixed suite ({', '.join(suite)}); leave `datasets` out",
                valid_datasets=suite,
            )
        return list(settings.full_suite)
    datasets = body.datasets or list(settings.smoke_suite)
    valid = smoke_ids(settings)
    unknown = sorted(set(datasets) - set(valid))
    if unknown:
        raise Invalid(
            f"unknown dataset(s): {', '.join(map(echoed, unknown))}; a smoke run may name "
            f"{', '.join(valid)} (GET /v1/datasets)",
            valid_datasets=valid,
        )
    return datasets


def _dataset_tracks(datasets: list[str], svc: Services) -> dict[str, Track]:
    """The track of each dataset, from its manifest. A configured id without a readable
    manifest is left out: `GET /v1/datasets` does not list it and the scheduler fails the job
    with the reason, as before."""
    tracks: dict[str, Track] = {}
    for dataset_id in datasets:
        try:
            tracks[dataset_id] = registered(dataset_id, svc.settings.datasets_root).manifest.track
        except (KeyError, OSError, ValueError):
            continue
    return tracks


async def _prior_runs(svc: Services, team_id: str) -> tuple[list[PriorRun], int]:
    """The team's jobs as the rules see them, and the highest submission number so far."""
    store = svc.stores.jobs
    jobs = await store.team_jobs(team_id)
    completed_smokes = [j.id for j in jobs if j.mode == "smoke" and j.state == "completed"]
    # A smoke passed when no item failed because of the participant: one query for all of them
    # (items the platform itself failed are not held against the participant; they make the
    # smoke void instead, `PriorRun.qualifies`).
    flawed = await store.flawed_by_participant(completed_smokes)
    runs = [
        PriorRun(
            job_id=job.id,
            version_id=job.version_id,
            mode=job.mode,
            track=job.track,
            run_label=job.run_label,
            state=job.state,
            created_at=job.created_at,
            finished_at=job.finished_at,
            failure_kind=job.failure_kind,
            platform_failures=job.platform_failures or 0,
            mixed_code=job.mixed_code is not None,
            passed=job.id in completed_smokes and job.id not in flawed,
        )
        for job in jobs
    ]
    last_seq = max((job.submission_seq for job in jobs), default=0)
    return runs, last_seq


@router.post(
    "",
    status_code=201,
    responses={**_ERRORS, 429: {"model": QuotaExceeded, "description": "Quota used up."}},
)
async def submit_job(body: JobSubmission, svc: ServicesDep, team: TeamDep) -> JobStatus:
    """Start a smoke or full run of one of the team's versions on one track.

    The checks, in order: the version is the team's (404) and declares the track (422); auth
    `none` only for smoke (R-3.3); a full run has every checklist item ticked (422); the
    datasets are known and all of the job's track (422, R-2.1); then the rules of
    `aml_gateway.submissions` (Run Label, running job, season, passed smoke, quotas)."""
    team_id = team["_id"]
    version = await svc.stores.accounts.team_version(body.version_id, team_id)
    if version is None:
        raise NotFound(f"version {echoed(body.version_id)} not found")
    if body.track not in version.tracks:
        raise Invalid(f"version {echoed(body.version_id)} is not registered for track {body.track}")
    if version.auth_method == "none" and body.mode != "smoke":
        raise Invalid("auth method `none` is allowed only for smoke runs")
    if body.mode == "full":
        unticked = body.checklist.unticked() if body.checklist else ["checklist"]
        if unticked:
            raise Invalid(f"a full run needs every checklist item: {', '.join(unticked)}")
    datasets = _datasets(body, svc)
    mixed = check_dataset_tracks(body.track, _dataset_tracks(datasets, svc))
    if mixed is not None:
        raise mixed
    submission = Submission(
        mode=body.mode, version_id=body.version_id, track=body.track, run_label=body.run_label
    )
    for _ in range(_SUBMISSION_ROUNDS):
        prior, last_seq = await _prior_runs(svc, team_id)
        created_at = svc.clock()
        refusal = check_submission(submission, prior, created_at, svc.settings.quotas)
        if refusal is not None:
            raise refusal
        seq = last_seq + 1
        job = JobDocument(
            id=f"j{uuid.uuid4().hex[:12]}",
            team_id=team_id,
            version_id=body.version_id,
            mode=body.mode,
            track=body.track,
            run_label=body.run_label,
            run_label_key=f"{team_id}/{body.run_label}",
            # Unique: of two submissions judged against the same jobs, one is inserted.
            submission_seq=seq,
            submission_key=f"{team_id}/{seq}",
            datasets=datasets,
            state="queued",
            planned=False,
            created_at=created_at,
        )
        try:
            document = await svc.stores.jobs.create(job)
        except DuplicateKeyError:
            continue
        await publish(
            svc.bus,
            subjects.JOB_SUBMITTED,
            JobSubmitted(job_id=job.id),
            message_id("submitted", job.id),
        )
        return await job_status(svc.stores, document)
    raise Conflict("too many submissions at once; try again")


@router.get("", responses=error_responses(401))
async def list_jobs(svc: ServicesDep, team: TeamDep) -> list[JobStatus]:
    jobs = svc.stores.jobs.latest_of_team(team["_id"])
    return [await job_status(svc.stores, job) async for job in jobs]


@router.get("/{job_id}", responses=error_responses(401, 404))
async def get_job(job_id: str, svc: ServicesDep, team: TeamDep) -> JobStatus:
    return await job_status(svc.stores, await _own_job(svc, team, job_id))


@router.get("/{job_id}/results", responses=_ERRORS)
async def get_results(job_id: str, svc: ServicesDep, team: TeamDep) -> JobResults:
    job = await _own_job(svc, team, job_id)
    if "results" not in job:
        raise Conflict(f"job {echoed(job_id)} has no results yet ({job['state']})")
    return JobResults.model_validate(job["results"] | {"track": job["track"]})


@router.get("/{job_id}/attempts", responses=_ERRORS)
async def get_attempts(
    job_id: str,
    svc: ServicesDep,
    team: TeamDep,
    cursor: Annotated[
        str | None, Query(max_length=400, description="`next_cursor` of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT)] = 50,
) -> AttemptPage:
    """A coding job's attempts (R-2.5), one per task and memory condition, task by task: how
    the agent's attempt ended (end reason, steps), the verdict and its reason, or the stage and
    reason of a failure; pending until the attempt is final. A job of another track has none
    (409)."""
    job = await _own_job(svc, team, job_id)
    if job["track"] != "coding":
        raise Conflict(f"job {echoed(job_id)} is of the {job['track']} track: it has no attempts")
    return await attempts_page(svc.stores, job_id, cursor, limit)


@router.get("/{job_id}/audit", responses=_ERRORS)
async def get_audit(
    job_id: str,
    svc: ServicesDep,
    team: TeamDep,
    stage: AuditStage | None = None,
    item_id: Annotated[
        str | None,
        Query(
            max_length=400,
            description="Only the attempts for this work item: an Add's request_id or a "
            "question's id.",
        ),
    ] = None,
    request_id: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Only the attempts of the Add with this contract request_id (the "
            "filter's name before `item_id`, kept for clients that use it).",
        ),
    ] = None,
    cursor: Annotated[str | None, Query(max_length=24)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """Every HTTP attempt made to the participant for this job, oldest first (R-7.3)."""
    await _own_job(svc, team, job_id)
    after = None
    if cursor is not None:
        try:
            after = ObjectId(cursor)
        except InvalidId:
            raise Invalid("cursor is not one this API returned") from None
    found = await svc.stores.audit.calls_page(
        job_id, stage=stage, item_id=item_id, add_request_id=request_id, after=after, limit=limit
    )
    records = [_audit_record(call) for call in found[:limit]]
    more = len(found) > limit
    return AuditPage(records=records, next_cursor=records[-1].record_id if more else None)


def _audit_record(call: Document) -> AuditRecord:
    item_id = call.get("item_id", call.get("request_id"))
    return AuditRecord(
        record_id=str(call["_id"]),
        stage=call["stage"],
        item_id=item_id,
        # Only an Add has a contract request_id: its item id (the stored record holds no other).
        request_id=item_id if call["operation"] in ("add", "add_status") else None,
        delivery=call["delivery"],
        operation=call["operation"],
        attempt=call["attempt"],
        started_at=read_time(call["started_at"]),
        latency_ms=call["latency_ms"],
        queued_ms=call.get("queued_ms") or 0.0,
        status=call.get("status"),
        error_class=call.get("error_class"),
        outcome=call["outcome"],
        validation=call.get("validation"),
        response_bytes=call.get("response_bytes"),
    )


@router.get("/{job_id}/audit/searches/{item_id:path}", responses=_ERRORS)
async def get_search_audit(
    job_id: str,
    item_id: Annotated[str, Path(min_length=1, max_length=400)],
    svc: ServicesDep,
    team: TeamDep,
) -> SearchAudit:
    """The candidates one Search returned, in the participant's order (R-7.3). `item_id` is
    the question's item id, `<job_id>/<dataset_id>/<question_id>` as the audit records name
    it: its slashes go into the path as they are (or %2F-encoded)."""
    await _own_job(svc, team, job_id)
    search = await svc.stores.records.search_of(job_id, item_id)
    if search is None:
        raise NotFound(f"no search {echoed(item_id)} in job {echoed(job_id)}")
    return SearchAudit(
        item_id=item_id,
        state=search.state,
        candidates=search.candidates,
        isolation_violations=search.leaks,
        failure=search.failure,
    )
