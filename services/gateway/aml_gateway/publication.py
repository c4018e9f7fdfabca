"""Admin review of gated jobs and the public leaderboard (R-3.8, R-3.9, R-5.3, R-7.4).

The publisher gates every finished job and leaves `review_state` on it: `pending_review` when
the gate passed, `gate_failed` otherwise. An admin then approves or rejects a pending job.

Approval is one guarded update of the job (`pending_review` → `approved`, naming the entry to
be created), then the insert of the leaderboard entry, whose `job_id` is unique: of two
concurrent approvals one update wins and the other is a `Conflict`, and no job ever has two
entries. Should the insert fail, the approval is undone; should the process die between the two
writes, `repair_entries` (run at start-up) creates the missing entry.

Public answers are built field by field from `LeaderboardEntry`, so nothing else stored on an
entry (job, team and version ids, the results fingerprint) or on a team (key hash, contact)
can reach them; and an entry is shown only while its job is approved and it is not
disqualified.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import datetime

import structlog
from pymongo.errors import DuplicateKeyError

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.publication import PublicationRecord, ReviewState, ReviewView
from aml_contract.api.vocabulary import Board, Track
from aml_evaluation.aggregate import results_fingerprint
from aml_gateway.progress import stored_gate
from aml_gateway.ranking import ranked
from aml_gateway.refusals import Conflict, NotFound, echoed
from aml_gateway.services import Services
from aml_gateway.ties import Ties, mark_ties
from aml_runtime.db import Document, read_time
from aml_runtime.documents import code_hashes_of, mixed_code
from aml_runtime.stores import Stores
from aml_runtime.stores.leaderboard import LeaderboardStore

log = structlog.get_logger()

LIST_LIMIT = 500
PUBLIC_FIELDS = tuple(LeaderboardEntry.model_fields)
# What an entry copies from its job; a job without them cannot be published.
_JOB_HASHES = ("spec_hash", "code_hash", "dataset_bundle_hash")


async def _job(stores: Stores, job_id: str) -> Document:
    job = await stores.jobs.document(job_id)
    if job is None:
        raise NotFound(f"job {echoed(job_id)} not found")
    return job


async def _owners(stores: Stores, job: Document) -> tuple[Document, Document]:
    accounts = stores.accounts
    version = await accounts.version(job["version_id"])
    team = await accounts.team(job["team_id"])
    if version is None or team is None:
        raise Conflict(f"job {job['_id']}: its version or team no longer exists")
    return version, team


def review_view(job: Document, version: Document | None, team: Document | None) -> ReviewView:
    results = job.get("results") or {}
    evaluation_spec = job.get("spec") or {}
    return ReviewView.model_validate(
        {
            "job_id": job["_id"],
            "review_state": job["review_state"],
            "gate": stored_gate(job),
            "mode": job["mode"],
            "track": job["track"],
            "run_label": job["run_label"],
            "version_id": job["version_id"],
            "system_name": version.get("system_name") if version else None,
            "version_label": version.get("version_label") if version else None,
            "board": version.get("board") if version else None,
            "team_id": job["team_id"],
            "team_name": team.get("name") if team else None,
            "finished_at": read_time(job.get("finished_at")),
            "overall": results.get("overall"),
            "answer_model": evaluation_spec.get("answer_model"),
            **{name: job.get(name) for name in _JOB_HASHES},
            "reviewed_at": read_time(job.get("reviewed_at")),
            "reason": job.get("review_reason"),
            "entry_id": job.get("entry_id"),
        }
    )


async def _view(stores: Stores, job: Document) -> ReviewView:
    accounts = stores.accounts
    version = await accounts.version(job["version_id"])
    team = await accounts.team(job["team_id"])
    return review_view(job, version, team)


async def list_reviews(stores: Stores, state: ReviewState) -> list[ReviewView]:
    jobs = stores.jobs.in_review(state, LIST_LIMIT)
    return [await _view(stores, job) async for job in jobs]


def entry_document(
    job: Document, version: Document, team: Document, entry_id: str, published_at: datetime
) -> Document:
    """The leaderboard submission record of an approved job: the public fields, plus what binds
    it to its job (never shown publicly)."""
    results = job.get("results")
    answer_model = (job.get("spec") or {}).get("answer_model")
    missing = [name for name in _JOB_HASHES if not job.get(name)]
    if not answer_model:
        missing.append("answer_model")
    if not isinstance(results, Mapping) or "datasets" not in results:
        missing.append("results")
    if missing:
        raise Conflict(f"job {job['_id']} cannot be published: no {', '.join(missing)}")
    # The gate refused such a job already; checked again at the last write before the board.
    mixed = mixed_code(job.get("code_hash"), code_hashes_of(job))
    if mixed is not None:
        raise Conflict(f"job {job['_id']} cannot be published: {mixed}")
    assert isinstance(results, Mapping)
    declaration = version.get("declaration") or {}
    document: Document = {
        "_id": entry_id,
        "entry_id": entry_id,
        "system_name": version["system_name"],
        "version_label": version["version_label"],
        "team_name": team["name"],
        "board": version["board"],
        "track": job["track"],
        "overall": results["overall"],
        "datasets": results["datasets"],
        # What the results cost and were measured under, beside them (absent on results
        # computed before it was reported: the entry then has none either).
        **({"efficiency": results["efficiency"]} if results.get("efficiency") else {}),
        **{name: job[name] for name in _JOB_HASHES},
        "answer_model": answer_model,
        "published_at": published_at,
        "declared_models": declaration.get("declared_models"),
        "repository_url": declaration.get("repository_url"),
        "job_id": job["_id"],
        "version_id": job["version_id"],
        "team_id": job["team_id"],
        "results_fingerprint": results_fingerprint(results["datasets"]),
        # Written explicitly: nx-27017 matches no missing field with `$ne`.
        "disqualified": False,
        "disqualified_reason": None,
        "disqualified_at": None,
    }
    # Refused here, before the job's review state moves, rather than after.
    PublicationRecord.model_validate(document)
    return document


def record(document: Document) -> PublicationRecord:
    return PublicationRecord.model_validate(
        {
            **document,
            # nx-27017 reads a boolean written by `$set` back as 0/1.
            "disqualified": bool(document.get("disqualified")),
            "published_at": read_time(document["published_at"]),
            "disqualified_at": read_time(document.get("disqualified_at")),
        }
    )


def public_entry(document: Document) -> LeaderboardEntry:
    """Only the public fields, named one by one (R-7.4)."""
    fields = {name: document.get(name) for name in PUBLIC_FIELDS}
    fields["published_at"] = read_time(document["published_at"])
    return LeaderboardEntry.model_validate(fields)


async def approve(svc: Services, job_id: str) -> PublicationRecord:
    stores = svc.stores
    job = await _job(stores, job_id)
    state = job.get("review_state")
    if state != "pending_review":
        raise Conflict(
            f"job {echoed(job_id)} is {state or 'not gated'}: only a job pending review can be "
            "approved"
        )
    gate = stored_gate(job)
    if gate is None or not gate.passed:
        raise Conflict(f"job {echoed(job_id)} has no passed publication gate")
    version, team = await _owners(stores, job)
    published_at = svc.clock()
    entry_id = f"lb-{uuid.uuid4().hex[:12]}"
    document = entry_document(job, version, team, entry_id, published_at)
    jobs = stores.jobs
    if not await jobs.approve(job_id, entry_id, published_at):
        raise Conflict(f"job {echoed(job_id)} was already reviewed")
    try:
        await stores.leaderboard.publish_entry(document)
    except DuplicateKeyError:
        # An entry for this job exists already (an approval undone after its insert had in
        # fact landed): that one stands, and the job names it.
        existing = await stores.leaderboard.entry_of_job(job_id)
        if existing is None:
            raise
        await jobs.name_entry(job_id, existing["_id"])
        return record(existing)
    except Exception:
        # No entry: the job goes back to waiting, so the approval can simply be repeated.
        await jobs.undo_approval(job_id, entry_id)
        raise
    log.info("publication_approved", job_id=job_id, entry_id=entry_id)
    return record(document)


async def reject(svc: Services, job_id: str, reason: str) -> ReviewView:
    stores = svc.stores
    job = await _job(stores, job_id)
    state = job.get("review_state")
    if state != "pending_review":
        raise Conflict(
            f"job {echoed(job_id)} is {state or 'not gated'}: only a job pending review can be "
            "rejected"
        )
    if not await stores.jobs.reject(job_id, reason, svc.clock()):
        raise Conflict(f"job {echoed(job_id)} was already reviewed")
    log.info("publication_rejected", job_id=job_id)
    return await _view(stores, await _job(stores, job_id))


async def list_records(leaderboard: LeaderboardStore) -> list[PublicationRecord]:
    return [record(document) async for document in leaderboard.latest_entries(LIST_LIMIT)]


async def disqualify(svc: Services, entry_id: str, reason: str) -> PublicationRecord:
    leaderboard = svc.stores.leaderboard
    entry = await leaderboard.entry(entry_id)
    if entry is None:
        raise NotFound(f"leaderboard entry {echoed(entry_id)} not found")
    if entry.get("disqualified"):
        raise Conflict(f"leaderboard entry {echoed(entry_id)} is already disqualified")
    if not await leaderboard.disqualify_entry(entry_id, reason, svc.clock()):
        raise Conflict(f"leaderboard entry {echoed(entry_id)} is already disqualified")
    # The team sees it on its job too; the record keeps the approval it had.
    await svc.stores.jobs.disqualify(entry["job_id"], reason)
    log.info("leaderboard_entry_disqualified", entry_id=entry_id, job_id=entry.get("job_id"))
    found = await leaderboard.entry(entry_id)
    assert found is not None
    return record(found)


async def _shown(stores: Stores, query: Document) -> list[Document]:
    documents = await stores.leaderboard.standing_entries(query, LIST_LIMIT)
    # Belt and braces: an entry is public only while its job is approved.
    approved = await stores.jobs.approved_among(d["job_id"] for d in documents)
    return [d for d in documents if d["job_id"] in approved]


async def _public(stores: Stores, query: Document) -> list[LeaderboardEntry]:
    return [public_entry(d) for d in await _shown(stores, query)]


async def board_entries(
    stores: Stores, track: Track, board: Board | None, ties: Ties | None = None
) -> list[LeaderboardEntry]:
    """The board's entries in rank order; with `ties` (the process's, `Services.ties`), each
    says whether it is distinguishable from the one above it (`tied_with_above`)."""
    query: Document = {"track": track}
    if board is not None:
        query["board"] = board
    documents = await _shown(stores, query)
    entries = ranked(public_entry(d) for d in documents)
    if ties is None:
        return entries
    return await mark_ties(stores, ties, entries, {d["entry_id"]: d["job_id"] for d in documents})


async def board_counts(stores: Stores) -> dict[tuple[Track, Board], int]:
    """How many public entries each (track, board) has: what the page's tabs show. The same
    rule as `_public`, on the few fields it needs."""
    documents = await stores.leaderboard.standing_placements()
    approved = await stores.jobs.approved_among(d["job_id"] for d in documents)
    counts: dict[tuple[Track, Board], int] = {}
    for document in documents:
        if document["job_id"] in approved:
            key = (document["track"], document["board"])
            counts[key] = counts.get(key, 0) + 1
    return counts


async def system_entries(stores: Stores, system_name: str) -> list[LeaderboardEntry]:
    entries = await _public(stores, {"system_name": system_name})
    return sorted(entries, key=lambda entry: (entry.published_at, entry.entry_id))


async def repair_entries(stores: Stores, clock: Callable[[], datetime]) -> int:
    """Create the entry of every approved job that has none (the process died between the
    approval and the insert). Returns how many were created."""
    created = 0
    leaderboard = stores.leaderboard
    async for job in stores.jobs.approved():
        if not job.get("entry_id") or await leaderboard.entry_of_job(job["_id"]):
            continue
        try:
            version, team = await _owners(stores, job)
            published_at = read_time(job.get("reviewed_at")) or clock()
            document = entry_document(job, version, team, job["entry_id"], published_at)
            await leaderboard.publish_entry(document)
        except (Conflict, DuplicateKeyError) as exc:
            log.warning("leaderboard_repair_skipped", job_id=job["_id"], error=repr(exc))
            continue
        created += 1
        log.info("leaderboard_entry_repaired", job_id=job["_id"], entry_id=job["entry_id"])
    return created
