"""What the public web pages show, computed from public leaderboard entries only (pure: no
I/O). The templates in `templates/` lay it out; `static/` sorts tables and draws the charts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args
from urllib.parse import quote, urlencode

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.results import Metrics
from aml_contract.api.vocabulary import Board, Track
from aml_evaluation.coding.bundle import CONDITIONS
from aml_gateway.ranking import headline

TRACKS: tuple[Track, ...] = get_args(Track)
BOARDS: tuple[Board, ...] = get_args(Board)
TRACK_NAMES: dict[Track, str] = {
    "textual": "Textual",
    "multimodal": "Multimodal",
    "coding": "Coding",
}
BOARD_NAMES: dict[Board, str] = {"academic": "Academic", "industrial": "Industrial"}
# How many entries a category chart compares (the table has them all).
CHART_ENTRIES = 8
DASH = "—"
# How a category kept out of Overall is named where a mark cannot be (chart labels).
NOT_IN_OVERALL = "not in Overall"
# The track whose headline is the share of resolved attempts: its boards show resolved
# counts and attempts where the others show F1 and questions.
CODING: Track = "coding"

# Served with every page: no script, style or connection from anywhere but the gateway itself,
# no framing, no referrer (a job page's URL names the job).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


def percent(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.1f}%"


def board_href(track: str, board: str) -> str:
    return "/leaderboard?" + urlencode({"track": track, "board": board})


def system_href(system_name: str) -> str:
    return "/systems/" + quote(system_name, safe="")


@dataclass(frozen=True)
class Cell:
    text: str
    # What the table sorts by: a number, an ISO time or the text; "" sorts last.
    value: str = ""
    href: str | None = None
    # The row's header cell (the system or version name).
    row_header: bool = False


@dataclass(frozen=True)
class Column:
    label: str
    kind: Literal["number", "text"] = "number"
    # Rank and the like are shown, not sorted.
    sortable: bool = True
    # Short labels that may wrap at phone width rather than push Overall out of view.
    narrow: bool = False
    # A category reported apart, counted in no overall (LoCoMo's adversarial one).
    excluded: bool = False


@dataclass
class Table:
    caption: str
    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    # The column the rows arrive sorted by, and how.
    sorted_by: int | None = None
    sorted_direction: Literal["ascending", "descending"] = "descending"


@dataclass(frozen=True)
class Tab:
    label: str
    href: str
    current: bool
    # Public entries behind the tab (a track tab: on every board of the track).
    count: int = 0


@dataclass(frozen=True)
class Chart:
    """One chart for static/charts.js; the same numbers are in a table on the page."""

    id: str
    type: Literal["bar", "line"]
    title: str
    description: str
    labels: list[str]
    series: list[dict[str, Any]]
    # The value axis's title: what the percentages are a share of.
    axis: str = "Accuracy (%)"


def _metric(metrics: Metrics | None) -> Cell:
    """The headline of a cell: a percentage, or "F1 0.523" where the cell was scored without a
    judge (token F1 is no share of correct answers, so it is never shown as one)."""
    value = headline(metrics) if metrics is not None else None
    if value is not None and metrics is not None and metrics.headline == "f1_mean":
        return Cell(f"F1 {value:.3f}", f"{value:.6f}")
    return Cell(percent(value), "" if value is None else f"{value:.6f}")


def _option_accuracy(metrics: Metrics | None) -> Cell:
    value = metrics.option_accuracy if metrics is not None else None
    return Cell(percent(value), "" if value is None else f"{value:.6f}")


def multiple_choice_datasets(entries: Iterable[LeaderboardEntry]) -> set[str]:
    """The datasets on which some entry answered multiple-choice questions: their option
    accuracy gets a column of its own."""
    return {
        dataset_id
        for entry in entries
        for dataset_id, results in entry.datasets.items()
        if results.overall.option_questions
    }


def _f1(metrics: Metrics) -> Cell:
    value = metrics.f1_mean
    return Cell(DASH if value is None else f"{value:.3f}", "" if value is None else f"{value:.6f}")


def _resolved(metrics: Metrics) -> Cell:
    """A coding cell's resolved attempts out of its verified ones ("9 of 16")."""
    if metrics.attempts is None or metrics.resolved is None:
        return Cell(DASH)
    return Cell(f"{metrics.resolved} of {metrics.attempts}", str(metrics.resolved))


def _second(metrics: Metrics, coding: bool) -> Cell:
    """The figure beside Overall: the resolved count on a coding board, else the mean F1."""
    return _resolved(metrics) if coding else _f1(metrics)


def _count(metrics: Metrics) -> Cell:
    return Cell(str(metrics.questions), str(metrics.questions))


def is_coding(entries: Iterable[LeaderboardEntry]) -> bool:
    """Whether these are the coding track's entries (a board, or a history, is one track's)."""
    return any(entry.track == CODING for entry in entries)


def _published(at: datetime) -> Cell:
    return Cell(at.strftime("%Y-%m-%d"), at.isoformat())


def _models(entry: LeaderboardEntry) -> str:
    declared = entry.declared_models
    if declared is None:
        return DASH
    parts = [declared.embedding_model or "", *declared.llms, declared.reranker or ""]
    return ", ".join(part for part in parts if part) or DASH


def _condition_rank(category: str) -> int:
    """A coding dataset's memory conditions in the order its categories number them (relevant,
    then noisy); any other category after them."""
    return CONDITIONS.index(category) if category in CONDITIONS else len(CONDITIONS)


def dataset_columns(entries: Sequence[LeaderboardEntry]) -> list[tuple[str, list[str]]]:
    """Each dataset with its categories, in the order the entries first name them (a coding
    dataset's conditions: relevant, then noisy), those kept out of Overall last."""
    found: dict[str, list[str]] = {}
    excluded = excluded_categories(entries)
    coding = is_coding(entries)
    for entry in entries:
        for dataset_id, results in entry.datasets.items():
            categories = found.setdefault(dataset_id, [])
            categories.extend(c for c in results.categories if c not in categories)
    return [
        (
            dataset_id,
            sorted(
                categories,
                key=lambda c: (
                    c in excluded.get(dataset_id, set()),
                    _condition_rank(c) if coding else 0,
                ),
            ),
        )
        for dataset_id, categories in found.items()
    ]


def task_type_columns(entries: Iterable[LeaderboardEntry]) -> dict[str, list[str]]:
    """Per coding dataset, the task types its results are split by (`task_types`), sorted."""
    found: dict[str, set[str]] = {}
    for entry in entries:
        for dataset_id, results in entry.datasets.items():
            if results.task_types:
                found.setdefault(dataset_id, set()).update(results.task_types)
    return {dataset_id: sorted(types) for dataset_id, types in found.items()}


def excluded_categories(entries: Iterable[LeaderboardEntry]) -> dict[str, set[str]]:
    """Per dataset, the categories an entry's results keep out of Overall."""
    excluded: dict[str, set[str]] = {}
    for entry in entries:
        for dataset_id, results in entry.datasets.items():
            excluded.setdefault(dataset_id, set()).update(results.excluded_from_overall)
    return excluded


def board_table(entries: Sequence[LeaderboardEntry], caption: str) -> Table:
    """The board's entries, ranked. On the coding track Overall and every dataset, condition
    and task type cell is the share of resolved attempts; "Resolved" and "Attempts" stand where
    the other tracks show the mean F1 and the questions."""
    coding = is_coding(entries)
    datasets = dataset_columns(entries)
    excluded = excluded_categories(entries)
    task_types = task_type_columns(entries)
    # The headline right after the name, so that it is in view at phone width too.
    columns = [
        Column("Rank", sortable=False),
        Column("System", "text"),
        Column("Version", "text", narrow=True),
        Column("Overall"),
        Column("Resolved" if coding else "Overall F1"),
        Column("Team", "text"),
        Column("Board", "text"),
        Column("Declared models", "text"),
    ]
    choices = multiple_choice_datasets(entries)
    for dataset_id, categories in datasets:
        columns.append(Column(dataset_id))
        if dataset_id in choices:
            columns.append(Column(f"{dataset_id}: option accuracy"))
        columns.extend(
            Column(f"{dataset_id}: {category}", excluded=category in excluded[dataset_id])
            for category in categories
        )
        columns.extend(Column(f"{dataset_id}: {t} tasks") for t in task_types.get(dataset_id, []))
    columns += [Column("Attempts" if coding else "Questions"), Column("Published")]
    table = Table(caption, columns, sorted_by=3, sorted_direction="descending")
    for rank, entry in enumerate(entries, start=1):
        row = [
            Cell(str(rank), str(rank)),
            Cell(entry.system_name, entry.system_name, system_href(entry.system_name), True),
            Cell(entry.version_label, entry.version_label),
            _metric(entry.overall),
            _second(entry.overall, coding),
            Cell(entry.team_name, entry.team_name),
            Cell(BOARD_NAMES[entry.board], entry.board),
            Cell(_models(entry), _models(entry)),
        ]
        for dataset_id, categories in datasets:
            results = entry.datasets.get(dataset_id)
            row.append(_metric(results.overall if results else None))
            if dataset_id in choices:
                row.append(_option_accuracy(results.overall if results else None))
            row.extend(
                _metric(results.categories.get(category) if results else None)
                for category in categories
            )
            split = (results.task_types if results else None) or {}
            row.extend(_metric(split.get(t)) for t in task_types.get(dataset_id, []))
        row += [_count(entry.overall), _published(entry.published_at)]
        table.rows.append(row)
    return table


def _chart_value(metrics: Metrics | None) -> float | None:
    value = headline(metrics) if metrics is not None else None
    return None if value is None else round(value * 100, 1)


def category_charts(entries: Sequence[LeaderboardEntry]) -> list[Chart]:
    """Per dataset, each category's accuracy (a coding dataset: each memory condition's
    resolved share) for the best entries of the board."""
    shown = entries[:CHART_ENTRIES]
    excluded = excluded_categories(shown)
    coding = is_coding(shown)
    charts = []
    for index, (dataset_id, categories) in enumerate(dataset_columns(shown)):
        series = []
        for entry in shown:
            results = entry.datasets.get(dataset_id)
            values = [
                _chart_value(results.categories.get(c) if results else None) for c in categories
            ]
            series.append({"label": f"{entry.system_name} {entry.version_label}", "values": values})
        what = "resolved share per memory condition" if coding else "accuracy per category"
        charts.append(
            Chart(
                id=f"chart-categories-{index}",
                type="bar",
                title=f"{dataset_id}: {what}",
                description=(
                    f"Bar chart of the {what} on {dataset_id} for the {len(shown)} best "
                    "entries; the table above has every number."
                ),
                labels=[
                    f"{c} ({NOT_IN_OVERALL})" if c in excluded[dataset_id] else c
                    for c in categories
                ],
                series=series,
                axis=_axis(coding),
            )
        )
    return charts


def _axis(coding: bool) -> str:
    return "Resolved (%)" if coding else "Accuracy (%)"


def charts_heading(track: Track) -> str:
    """The heading of a board's charts."""
    return "Resolved per memory condition" if track == CODING else "Accuracy per category"


@dataclass(frozen=True)
class TrackHistory:
    track: Track
    title: str
    table: Table
    chart: Chart


def system_histories(entries: Sequence[LeaderboardEntry]) -> list[TrackHistory]:
    """Per track (scores are never compared across tracks), the versions in publication
    order: a table and a line chart of Overall over time, one line per board."""
    histories = []
    for track in TRACKS:
        mine = [entry for entry in entries if entry.track == track]
        if not mine:
            continue
        title = f"{TRACK_NAMES[track]} track"
        coding = track == CODING
        datasets = dataset_columns(mine)
        columns = [
            Column("Version", "text"),
            Column("Board", "text"),
            Column("Team", "text"),
            Column("Overall"),
            Column("Resolved" if coding else "Overall F1"),
            *(Column(dataset_id) for dataset_id, _ in datasets),
            Column("Attempts" if coding else "Questions"),
            Column("Published"),
        ]
        table = Table(
            f"{title}: published versions, oldest first",
            columns,
            sorted_by=len(columns) - 1,
            sorted_direction="ascending",
        )
        for entry in mine:
            row = [
                Cell(entry.version_label, entry.version_label, row_header=True),
                Cell(BOARD_NAMES[entry.board], entry.board),
                Cell(entry.team_name, entry.team_name),
                _metric(entry.overall),
                _second(entry.overall, coding),
            ]
            for dataset_id, _ in datasets:
                results = entry.datasets.get(dataset_id)
                row.append(_metric(results.overall if results else None))
            row += [_count(entry.overall), _published(entry.published_at)]
            table.rows.append(row)
        labels = [
            f"{entry.version_label} ({entry.published_at.strftime('%Y-%m-%d')})" for entry in mine
        ]
        series = [
            {
                "label": BOARD_NAMES[board],
                "values": [
                    _chart_value(entry.overall) if entry.board == board else None for entry in mine
                ],
            }
            for board in BOARDS
            if any(entry.board == board for entry in mine)
        ]
        chart = Chart(
            id=f"chart-history-{track}",
            type="line",
            title=f"{title}: Overall over time",
            description=(
                f"Line chart of the Overall {'resolved share' if coding else 'accuracy'} of "
                f"each published version on the {track} track, oldest first; the table above "
                "has every number."
            ),
            labels=labels,
            series=series,
            axis=_axis(coding),
        )
        histories.append(TrackHistory(track, title, table, chart))
    return histories


def chart_data(charts: Iterable[Chart]) -> list[dict[str, Any]]:
    return [
        {
            "id": chart.id,
            "type": chart.type,
            "title": chart.title,
            "labels": chart.labels,
            "series": chart.series,
            "axis": chart.axis,
        }
        for chart in charts
    ]


Counts = Mapping[tuple[Track, Board], int]


def choose_board(counts: Counts, track: Track | None, board: Board | None) -> tuple[Track, Board]:
    """The board a page opens on: what the URL names; for what it leaves out, the first track
    and board (in tab order) that has entries, else the first one."""
    tracks = [track] if track is not None else list(TRACKS)
    boards = [board] if board is not None else list(BOARDS)
    for t in tracks:
        for b in boards:
            if counts.get((t, b), 0):
                return t, b
    return tracks[0], boards[0]


def track_tabs(track: Track, board: Board, counts: Counts) -> list[Tab]:
    """A track tab keeps the board chosen, unless that board is empty on the track and another
    one is not."""
    tabs = []
    for t in TRACKS:
        total = sum(counts.get((t, b), 0) for b in BOARDS)
        keep = counts.get((t, board), 0) or not total
        target = board if keep else choose_board(counts, t, None)[1]
        tabs.append(Tab(TRACK_NAMES[t], board_href(t, target), t == track, total))
    return tabs


def board_tabs(track: Track, board: Board, counts: Counts) -> list[Tab]:
    return [
        Tab(BOARD_NAMES[b], board_href(track, b), b == board, counts.get((track, b), 0))
        for b in BOARDS
    ]
