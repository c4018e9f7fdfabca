"""The web pages (R-5.3): the public board and a system's history, rendered on the server from
public entries only, and a team's private job page, which holds no job data itself: its script
asks for the Leaderboard API Key and reads `/v1/jobs/{id}` with it."""

from __future__ import annotations

from typing import Annotated, Any, cast

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.templating import Jinja2Templates

from aml_contract.api.vocabulary import STAGES
from aml_gateway import pages, publication
from aml_gateway.deps import ServicesDep

router = APIRouter(include_in_schema=False, default_response_class=HTMLResponse)

templates = Jinja2Templates(
    env=Environment(
        loader=PackageLoader("aml_gateway", "templates"),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
)


def _render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    response = templates.TemplateResponse(
        request, name, context, status_code=status_code, headers=pages.SECURITY_HEADERS
    )
    return cast(HTMLResponse, response)


def _not_found(request: Request, message: str) -> HTMLResponse:
    return _render(request, "not_found.html", {"title": "Not found", "message": message}, 404)


@router.get("/")
@router.get("/leaderboard")
async def leaderboard_page(
    request: Request,
    svc: ServicesDep,
    track: Annotated[str | None, Query(max_length=20)] = None,
    board: Annotated[str | None, Query(max_length=20)] = None,
) -> HTMLResponse:
    # What the URL names is shown, even empty; what it leaves out opens on entries.
    if (track is not None and track not in pages.TRACKS) or (
        board is not None and board not in pages.BOARDS
    ):
        return _not_found(request, "There is no such track or board.")
    counts = await publication.board_counts(svc.stores)
    chosen_track, chosen_board = pages.choose_board(counts, track, board)
    entries = await publication.board_entries(svc.stores, chosen_track, chosen_board, svc.ties)
    title = f"{pages.TRACK_NAMES[chosen_track]} track, {pages.BOARD_NAMES[chosen_board]} board"
    charts = pages.category_charts(entries)
    return _render(
        request,
        "leaderboard.html",
        {
            "title": title,
            "track": chosen_track,
            "charts_heading": pages.charts_heading(chosen_track),
            "track_tabs": pages.track_tabs(chosen_track, chosen_board, counts),
            "board_tabs": pages.board_tabs(chosen_track, chosen_board, counts),
            "table": pages.board_table(entries, f"{title}: entries by Overall"),
            "charts": charts,
            "chart_data": pages.chart_data(charts),
            "latency_chart": pages.latency_chart(entries),
        },
    )


@router.get("/systems/{system_name:path}")
async def system_page(
    request: Request,
    svc: ServicesDep,
    system_name: Annotated[str, Path(min_length=1, max_length=200)],
) -> HTMLResponse:
    entries = await publication.system_entries(svc.stores, system_name)
    if not entries:
        return _not_found(request, "No system of that name has a published entry.")
    histories = pages.system_histories(entries)
    return _render(
        request,
        "system.html",
        {
            "title": system_name,
            "histories": histories,
            "chart_data": pages.chart_data(history.chart for history in histories),
        },
    )


@router.get("/jobs/{job_id}")
async def job_page(request: Request, job_id: str) -> HTMLResponse:
    # Nothing about the job is rendered here (not even its id): the page is the same for
    # every job and for none, and shows data only to the key that owns the job.
    return _render(request, "job.html", {"title": "Your job", "stages": STAGES})
