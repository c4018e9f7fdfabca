"""The public leaderboard (R-2.4, R-5.3, R-7.4): no login; approved, not disqualified entries
only, and only their public fields."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from aml_contract.api.leaderboard import Leaderboard, SystemHistory
from aml_contract.api.vocabulary import Board, Track
from aml_gateway import publication
from aml_gateway.deps import GuardedRoute, ServicesDep
from aml_gateway.errors import error_responses
from aml_gateway.refusals import NotFound

router = APIRouter(route_class=GuardedRoute, prefix="/v1/leaderboard", tags=["leaderboard"])


@router.get("")
async def get_leaderboard(
    svc: ServicesDep, track: Track = "textual", board: Board | None = None
) -> Leaderboard:
    """One track's board (all boards when `board` is left out), best Overall first, with the
    per-dataset and per-category metrics of every entry and whether it is distinguishable
    from the entry above it (`tied_with_above`)."""
    entries = await publication.board_entries(svc.stores, track, board, svc.ties)
    return Leaderboard(track=track, board=board, entries=entries)


@router.get("/systems/{system_name:path}", responses=error_responses(404))
async def get_system(
    system_name: Annotated[str, Path(min_length=1, max_length=200)], svc: ServicesDep
) -> SystemHistory:
    """One system's public entries across its versions, oldest publication first. A system
    with none answers 404, whether it exists privately or not."""
    entries = await publication.system_entries(svc.stores, system_name)
    if not entries:
        raise NotFound("no published entry for this system")
    return SystemHistory(system_name=system_name, entries=entries)
