"""Admin review of publication (R-3.8) and disqualification (R-3.9): the publisher's gate
queues a finished full run as `pending_review`; an admin approves it (a public leaderboard
entry is created) or rejects it, and may later disqualify an entry (kept, no longer public)."""

from __future__ import annotations

from fastapi import APIRouter

from aml_contract.api.publication import (
    Disqualification,
    PublicationRecord,
    ReviewRejection,
    ReviewState,
    ReviewView,
)
from aml_gateway import publication
from aml_gateway.deps import AdminDep, GuardedRoute, ServicesDep
from aml_gateway.errors import error_responses

# Every admin route answers 403 to anyone without the admin token.
router = APIRouter(
    route_class=GuardedRoute,
    prefix="/v1/admin",
    tags=["admin"],
    responses=error_responses(403, 429),
)


@router.get("/reviews")
async def list_reviews(
    svc: ServicesDep, _: AdminDep, state: ReviewState = "pending_review"
) -> list[ReviewView]:
    """Gated jobs in one review state, oldest first: by default those waiting for a decision,
    each with its gate checks, system, version, team and Overall."""
    return await publication.list_reviews(svc.stores, state)


@router.post("/reviews/{job_id}/approve", responses=error_responses(404, 409))
async def approve_publication(job_id: str, svc: ServicesDep, _: AdminDep) -> PublicationRecord:
    """Publish a job pending review: creates its leaderboard submission record. A job in any
    other review state (or not gated) answers 409; of concurrent approvals exactly one wins."""
    return await publication.approve(svc, job_id)


@router.post("/reviews/{job_id}/reject", responses=error_responses(404, 409))
async def reject_publication(
    job_id: str, body: ReviewRejection, svc: ServicesDep, _: AdminDep
) -> ReviewView:
    """Refuse to publish a job pending review; the reason is shown to its team."""
    return await publication.reject(svc, job_id, body.reason)


@router.get("/leaderboard")
async def list_leaderboard_records(svc: ServicesDep, _: AdminDep) -> list[PublicationRecord]:
    """Every leaderboard submission record, disqualified ones included, newest first."""
    return await publication.list_records(svc.stores.leaderboard)


@router.post("/leaderboard/{entry_id}/disqualify", responses=error_responses(404, 409))
async def disqualify_entry(
    entry_id: str, body: Disqualification, svc: ServicesDep, _: AdminDep
) -> PublicationRecord:
    """Remove an entry from every public answer; the record, the reason and the time stay."""
    return await publication.disqualify(svc, entry_id, body.reason)
