"""What the public web pages show, computed from public leaderboard entries only (pure: no
I/O). The templates in `templates/` lay it out; `static/` sorts tables and draws the charts."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args
from urllib.parse import quote, urlencode

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.results import LatencyStats, MeasuredUnder, Metrics
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
EN_DASH = "\u2013"
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
    # A mark after the text, shown but not read (a tie, another deployment; a note under the
    # table explains it), and the words it stands for, read but not shown.
    mark: str = ""
    mark_text: str = ""
    # A smaller second line under the text (the headline's 95% interval), and the words that
    # introduce it to screen readers.
    detail: str = ""
    detail_label: str = ""


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
    # Lower is better (latency, tokens): the first selection sorts ascending.
    ascending_first: bool = False


@dataclass(frozen=True)
class Note:
    """A line under a table saying what a mark in it means (`mark` empty: what a detail line
    is); `key` completes its element id."""

    key: str
    mark: str
    text: str


@dataclass
class Table:
    caption: str
    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    # The column the rows arrive sorted by, and how.
    sorted_by: int | None = None
    sorted_direction: Literal["ascending", "descending"] = "descending"
    notes: list[Note] = field(default_factory=list)


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


def interval_text(metrics: Metrics | None) -> str:
    """The headline's 95% interval in the headline's own units, its ends joined by an en dash
    (58.9 to 63.4 percent, or 0.501 to 0.545 for a mean token F1); "" where the results carry
    none."""
    interval = metrics.headline_ci if metrics is not None else None
    if metrics is None or interval is None or headline(metrics) is None:
        return ""
    if metrics.headline == "f1_mean":
        return f"{interval.low:.3f}{EN_DASH}{interval.high:.3f}"
    return f"{interval.low * 100:.1f}{EN_DASH}{interval.high * 100:.1f}"


INTERVAL_LABEL = "95% interval "


def _metric(metrics: Metrics | None, interval: bool = False) -> Cell:
    """The headline of a cell: a percentage, or "F1 0.523" where the cell was scored without a
    judge (token F1 is no share of correct answers, so it is never shown as one); with
    `interval`, its 95% interval as a second line where the results carry one."""
    value = headline(metrics) if metrics is not None else None
    detail = interval_text(metrics) if interval else ""
    label = INTERVAL_LABEL if detail else ""
    if value is not None and metrics is not None and metrics.headline == "f1_mean":
        return Cell(f"F1 {value:.3f}", f"{value:.6f}", detail=detail, detail_label=label)
    value_text = "" if value is None else f"{value:.6f}"
    return Cell(percent(value), value_text, detail=detail, detail_label=label)


def _option_accuracy(metrics: Metrics | None) -> Cell:
    value = metrics.option_accuracy if metrics is not None else None
    return Cell(percent(value), "" if value is None else f"{value:.6f}")


# The evidence figures a board shows beside a dataset's headline (aml_evaluation.evidence).
EVIDENCE_K = "10"


def evidence_datasets(entries: Iterable[LeaderboardEntry]) -> set[str]:
    """The datasets on which some entry's results say how much of its questions' evidence the
    Searches returned: their Recall@10 and Joint@10 get columns of their own."""
    return {
        dataset_id
        for entry in entries
        for dataset_id, results in entry.datasets.items()
        if results.overall.evidence is not None
    }


def _evidence(metrics: Metrics | None, kind: Literal["recall", "joint"]) -> Cell:
    figures = metrics.evidence if metrics is not None else None
    value = getattr(figures, kind).get(EVIDENCE_K) if figures is not None else None
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


# -- cost and certainty (what each entry's results cost, how sure its Overall is) -------------

TIE_MARK = "="
OTHER_DEPLOYMENT_MARK = "‡"
OTHER_DEPLOYMENT_TEXT = " (measured from another deployment)"
# Beside the figures they qualify: what answering cost, and what it was measured under.
COST_COLUMNS = (
    Column("Search p50 (ms)", ascending_first=True),
    Column("Search p95 (ms)", ascending_first=True),
    Column("Retrieved tokens", ascending_first=True),
    Column("Measured under", "text"),
)


def search_latency(entry: LeaderboardEntry) -> LatencyStats | None:
    """The Search latency a board shows: the attempts that succeeded at their question's first
    try, the participant's own service time (retried calls are reported apart)."""
    efficiency = entry.efficiency
    search = efficiency.overall.search if efficiency is not None else None
    return search.first_attempts if search is not None else None


def retrieved_tokens(entry: LeaderboardEntry) -> float | None:
    """Mean tokens of every candidate Search returned, per question."""
    efficiency = entry.efficiency
    context = efficiency.overall.context if efficiency is not None else None
    return context.retrieved_tokens_mean if context is not None else None


def milliseconds(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:,.0f}"


def measured_under(conditions: MeasuredUnder) -> str:
    """What an entry's figures were measured under, in one line: the platform deployment,
    Search top_k (per dataset where they differ) and the version's declared capacity."""
    top_k = sorted(set(conditions.search_top_k.values()))
    parts = [conditions.deployment]
    if len(top_k) == 1:
        parts.append(f"top_k {top_k[0]}")
    elif top_k:
        parts.append(
            "top_k " + ", ".join(f"{d} {k}" for d, k in sorted(conditions.search_top_k.items()))
        )
    concurrency = conditions.max_concurrency
    parts.append("concurrency not declared" if concurrency is None else f"{concurrency} at once")
    rate = conditions.max_rps
    parts.append("rate not declared" if rate is None else f"{rate:g} req/s")
    return " · ".join(parts)


def majority_deployment(entries: Sequence[LeaderboardEntry]) -> str | None:
    """The platform deployment most of the entries with figures were measured from (on a tie,
    the best-ranked entry's of those); None where no entry has figures."""
    labels = [e.efficiency.measured_under.deployment for e in entries if e.efficiency]
    if not labels:
        return None
    counts = Counter(labels)
    most = max(counts.values())
    return next(label for label in labels if counts[label] == most)


def other_deployment(entry: LeaderboardEntry, majority: str | None) -> bool:
    """Whether the entry's figures were measured from another deployment than the majority's:
    its latency crossed another network and does not compare with theirs."""
    efficiency = entry.efficiency
    return efficiency is not None and efficiency.measured_under.deployment != majority


def _measured(text: str, value: str, other: bool) -> Cell:
    """A cost cell, marked where it was measured from another deployment than most."""
    if not other:
        return Cell(text, value)
    return Cell(text, value, mark=OTHER_DEPLOYMENT_MARK, mark_text=OTHER_DEPLOYMENT_TEXT)


def cost_cells(entry: LeaderboardEntry, other: bool) -> list[Cell]:
    """The COST_COLUMNS of an entry: dashes where its results carry no figures."""
    latency = search_latency(entry)
    cells = []
    for percentile in (latency.p50_ms, latency.p95_ms) if latency else (None, None):
        if percentile is None:
            cells.append(Cell(DASH))
        else:
            cells.append(_measured(milliseconds(percentile), f"{percentile:.3f}", other))
    tokens = retrieved_tokens(entry)
    cells.append(Cell(DASH) if tokens is None else Cell(f"{tokens:,.0f}", f"{tokens:.3f}"))
    if entry.efficiency is None:
        cells.append(Cell(DASH))
    else:
        text = measured_under(entry.efficiency.measured_under)
        cells.append(_measured(text, text, other))
    return cells


def _rank(rank: int, entry: LeaderboardEntry) -> Cell:
    """The entry's place; marked where it is tied with the entry ranked just above."""
    if entry.tied_with_above and rank > 1:
        return Cell(str(rank), str(rank), mark=TIE_MARK, mark_text=f", tied with rank {rank - 1}")
    return Cell(str(rank), str(rank))


def board_notes(entries: Sequence[LeaderboardEntry], majority: str | None) -> list[Note]:
    """What the board's marks and second lines mean, for those it shows."""
    notes = []
    if any(interval_text(entry.overall) for entry in entries):
        notes.append(
            Note(
                "intervals",
                "",
                "The smaller figures under each Overall are its 95% confidence interval: a "
                "seeded bootstrap over the questions (method and seed in the evaluation spec).",
            )
        )
    if any(entry.tied_with_above for entry in entries[1:]):
        notes.append(
            Note(
                "ties",
                TIE_MARK,
                "Tied with the entry ranked just above: a paired bootstrap over the questions "
                "both answered does not tell their Overall apart at 95% confidence, so their "
                "order may be chance.",
            )
        )
    if any(other_deployment(entry, majority) for entry in entries):
        notes.append(
            Note(
                "deployments",
                OTHER_DEPLOYMENT_MARK,
                "Measured from another platform deployment than most entries on this board "
                f"({majority}): its latency crossed another network and does not compare "
                "with theirs.",
            )
        )
    return notes


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
        *COST_COLUMNS,
        Column("Team", "text"),
        Column("Board", "text"),
        Column("Declared models", "text"),
    ]
    majority = majority_deployment(entries)
    choices = multiple_choice_datasets(entries)
    evidence = evidence_datasets(entries)
    for dataset_id, categories in datasets:
        columns.append(Column(dataset_id))
        if dataset_id in choices:
            columns.append(Column(f"{dataset_id}: option accuracy"))
        if dataset_id in evidence:
            columns.append(Column(f"{dataset_id}: Recall@{EVIDENCE_K}"))
            columns.append(Column(f"{dataset_id}: Joint@{EVIDENCE_K}"))
        columns.extend(
            Column(f"{dataset_id}: {category}", excluded=category in excluded[dataset_id])
            for category in categories
        )
        columns.extend(Column(f"{dataset_id}: {t} tasks") for t in task_types.get(dataset_id, []))
    columns += [Column("Attempts" if coding else "Questions"), Column("Published")]
    table = Table(caption, columns, sorted_by=3, sorted_direction="descending")
    for rank, entry in enumerate(entries, start=1):
        row = [
            _rank(rank, entry),
            Cell(entry.system_name, entry.system_name, system_href(entry.system_name), True),
            Cell(entry.version_label, entry.version_label),
            _metric(entry.overall, interval=True),
            _second(entry.overall, coding),
            *cost_cells(entry, other_deployment(entry, majority)),
            Cell(entry.team_name, entry.team_name),
            Cell(BOARD_NAMES[entry.board], entry.board),
            Cell(_models(entry), _models(entry)),
        ]
        for dataset_id, categories in datasets:
            results = entry.datasets.get(dataset_id)
            row.append(_metric(results.overall if results else None))
            if dataset_id in choices:
                row.append(_option_accuracy(results.overall if results else None))
            if dataset_id in evidence:
                row.append(_evidence(results.overall if results else None, "recall"))
                row.append(_evidence(results.overall if results else None, "joint"))
            row.extend(
                _metric(results.categories.get(category) if results else None)
                for category in categories
            )
            split = (results.task_types if results else None) or {}
            row.extend(_metric(split.get(t)) for t in task_types.get(dataset_id, []))
        row += [_count(entry.overall), _published(entry.published_at)]
        table.rows.append(row)
    table.notes = board_notes(entries, majority)
    if evidence:
        table.notes.append(
            Note(
                "evidence",
                "",
                f"Recall@{EVIDENCE_K}: the share of a question's evidence among the first "
                f"{EVIDENCE_K} memories its Search returned, as the platform recognises what it "
                f"wrote; Joint@{EVIDENCE_K}: that share, counted only where the answer scored "
                "(ATM-Bench's Recall@k and Joint@k). A system that rewrites its memories is "
                "seen to return less of the written evidence than it may hold.",
            )
        )
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


# The latency chart's drawing, in the SVG's own units (it scales to the page's width: at a
# phone's 390 px, to about 0.9, its 13-unit text to about 12 px).
SCATTER_WIDTH = 400
SCATTER_HEIGHT = 300


@dataclass(frozen=True)
class Box:
    left: float
    top: float
    right: float
    bottom: float


# Room for the value labels and the axis titles around the plot.
SCATTER_PLOT = Box(left=58, top=14, right=376, bottom=242)


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass(frozen=True)
class Point:
    """One entry on the latency chart: its place, its 95% interval as a vertical line (where
    its results carry one), its rank drawn beside it and its accessible name; a link to the
    system's history."""

    x: float
    y: float
    low: float | None
    high: float | None
    label: str
    name: str
    href: str
    other_deployment: bool


@dataclass
class ScatterChart:
    """A chart drawn on the server as SVG (no script): `points` on `plot`, with the ticks of
    each axis; `left_out` names the entries it cannot place, and why."""

    id: str
    title: str
    description: str
    x_axis: str
    y_axis: str
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    points: list[Point]
    left_out: list[str]
    width: int = SCATTER_WIDTH
    height: int = SCATTER_HEIGHT
    plot: Box = SCATTER_PLOT


def nice_ticks(low: float, high: float, steps: int) -> list[float]:
    """Round values, 1, 2, 2.5 or 5 times a power of ten apart, from `low` or below to `high`
    or above, about `steps` steps in all."""
    span = high - low if high > low else (abs(high) or 1.0)
    raw = span / steps
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw * (1 - 1e-9))
    start = math.floor(low / step + 1e-9)
    stop = max(math.ceil(high / step - 1e-9), start + 1)
    return [round(index * step, 10) for index in range(start, stop + 1)]


def _scale(value: float, ticks: list[float], start: float, end: float) -> float:
    return round(start + (value - ticks[0]) / (ticks[-1] - ticks[0]) * (end - start), 1)


def latency_chart(entries: Sequence[LeaderboardEntry]) -> ScatterChart:
    """Overall against Search p95 latency, one point per entry (a system version) of the
    board, with its 95% interval where known; entries without a p95 or an Overall left out,
    named. Up and to the left is better."""
    majority = majority_deployment(entries)
    placed: list[tuple[int, LeaderboardEntry, float, float]] = []
    left_out = []
    for rank, entry in enumerate(entries, start=1):
        latency = search_latency(entry)
        p95 = latency.p95_ms if latency is not None else None
        value = headline(entry.overall)
        name = f"{entry.system_name} {entry.version_label}"
        if p95 is None:
            left_out.append(f"{name} (no latency figures)")
        elif value is None:
            left_out.append(f"{name} (no Overall)")
        else:
            placed.append((rank, entry, p95, value))
    f1 = bool(placed) and all(e.overall.headline == "f1_mean" for _, e, _, _ in placed)
    coding = is_coding(entries)
    lows = [_low_high(e.overall, v)[0] for _, e, _, v in placed]
    highs = [_low_high(e.overall, v)[1] for _, e, _, v in placed]
    x_values = nice_ticks(0.0, max((p95 for _, _, p95, _ in placed), default=1.0), 4)
    y_values = nice_ticks(min(lows, default=0.0), max(highs, default=1.0), 4)
    plot = SCATTER_PLOT
    points = []
    for rank, entry, p95, value in placed:
        low, high = _low_high(entry.overall, value)
        interval = interval_text(entry.overall)
        other = other_deployment(entry, majority)
        described = [
            f"Rank {rank}: {entry.system_name} {entry.version_label}",
            f"Overall {_metric(entry.overall).text}"
            + (f" ({INTERVAL_LABEL}{interval})" if interval else ""),
            f"Search p95 {milliseconds(p95)} ms"
            + (", measured from another deployment" if other else ""),
        ]
        points.append(
            Point(
                x=_scale(p95, x_values, plot.left, plot.right),
                y=_scale(value, y_values, plot.bottom, plot.top),
                low=_scale(low, y_values, plot.bottom, plot.top) if interval else None,
                high=_scale(high, y_values, plot.bottom, plot.top) if interval else None,
                label=str(rank),
                name=", ".join(described),
                href=system_href(entry.system_name),
                other_deployment=other,
            )
        )
    y_axis = "Overall resolved (%)" if coding else "Overall accuracy (%)"
    if f1:
        y_axis = "Overall (mean token F1)"
    y_label = _plain if f1 else _percent_tick
    return ScatterChart(
        id="chart-latency",
        title="Overall against Search p95 latency",
        description=(
            "Each entry of the board is a point: its Overall upwards, with its 95% interval "
            "as a vertical line where known, against the 95th percentile of its Search latency "
            "in milliseconds, as seen from the platform, across. Up and to the left is better. "
            "Each point is labelled with the entry's rank and links to the system's page; "
            "hollow points were measured from another platform deployment. The table above "
            "has every figure."
        ),
        x_axis="Search p95 latency (ms)",
        y_axis=y_axis,
        x_ticks=[Tick(_scale(v, x_values, plot.left, plot.right), _plain(v)) for v in x_values],
        y_ticks=[Tick(_scale(v, y_values, plot.bottom, plot.top), y_label(v)) for v in y_values],
        points=points,
        left_out=left_out,
    )


def _plain(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


def _percent_tick(share: float) -> str:
    return f"{round(share * 100, 6):g}%"


def _low_high(metrics: Metrics, value: float) -> tuple[float, float]:
    interval = metrics.headline_ci
    return (value, value) if interval is None else (interval.low, interval.high)


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
                _metric(entry.overall, interval=True),
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
