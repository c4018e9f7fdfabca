"""Cost and certainty on the public board (`aml_gateway.pages`, pure): Search latency and
retrieved tokens as sortable columns, what they were measured under and which entries were
measured from another deployment, the headline's 95% interval, ties with the entry ranked just
above, and the chart of Overall against Search p95 latency; entries published before these
figures existed show dashes and are left off the chart, named."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.results import (
    CallStats,
    ContextStats,
    DatasetResults,
    Efficiency,
    Interval,
    JobEfficiency,
    LatencyStats,
    MeasuredUnder,
    Metrics,
)
from aml_gateway import pages
from aml_gateway.routes.pages import templates

T0 = datetime(2027, 1, 1, tzinfo=UTC)
# What joins an interval's ends.
TO = pages.EN_DASH


def latency(p50: float | None, p95: float | None, count: int = 40) -> LatencyStats:
    return LatencyStats(
        count=count, p50_ms=p50, p95_ms=p95, p99_ms=p95, max_ms=p95, resolution=0.02
    )


def efficiency(
    p50: float | None,
    p95: float | None,
    tokens: float | None = 812.4,
    deployment: str = "eu-west",
    top_k: dict[str, int] | None = None,
    concurrency: int | None = 8,
    rps: float | None = 10.0,
) -> JobEfficiency:
    search = CallStats(
        items=40,
        attempts=42,
        first_attempts=latency(p50, p95),
        # Retried calls are slower: never what the board shows.
        retried=latency(5000.0, 9000.0, count=4),
        timeouts=1,
        rate_limited=1,
        errors=0,
    )
    context = ContextStats(
        questions=40,
        candidates_returned_mean=10.0,
        retrieved_tokens_mean=tokens,
        retrieved_bytes_mean=None if tokens is None else tokens * 5,
        candidates_used_mean=8.0,
        used_tokens_mean=None if tokens is None else tokens / 2,
        truncated_questions=3,
    )
    return JobEfficiency(
        method="efficiency-v1",
        measured_under=MeasuredUnder(
            search_top_k=top_k if top_k is not None else {"locomo": 100},
            max_concurrency=concurrency,
            max_rps=rps,
            deployment=deployment,
        ),
        overall=Efficiency(search=search, context=context),
        datasets={},
    )


def metrics(correct: int, questions: int = 40, ci: tuple[float, float] | None = None) -> Metrics:
    return Metrics(
        questions=questions,
        scored=questions,
        failed=0,
        accuracy=correct / questions,
        judge_correct=correct,
        judge_accuracy=correct / questions,
        f1_mean=0.5,
        headline_ci=None if ci is None else Interval(low=ci[0], high=ci[1]),
    )


def entry(
    name: str,
    correct: int,
    *,
    ci: tuple[float, float] | None = None,
    cost: JobEfficiency | None = None,
    tied: bool | None = None,
    day: int = 0,
) -> LeaderboardEntry:
    overall = metrics(correct, ci=ci)
    dataset = DatasetResults(
        dataset_id="locomo", overall=overall, categories={}, excluded_from_overall=[]
    )
    return LeaderboardEntry(
        entry_id=f"lb-{name}",
        system_name=name,
        version_label="1.0",
        team_name="team",
        board="academic",
        track="textual",
        overall=overall,
        datasets={"locomo": dataset},
        spec_hash="s",
        code_hash="c",
        dataset_bundle_hash="d",
        answer_model="m",
        published_at=T0 + timedelta(days=day),
        efficiency=cost,
        tied_with_above=tied,
    )


def row_of(table: pages.Table, index: int) -> dict[str, pages.Cell]:
    return {c.label: cell for c, cell in zip(table.columns, table.rows[index], strict=True)}


COST = ["Search p50 (ms)", "Search p95 (ms)", "Retrieved tokens", "Measured under"]


def test_older_entries_show_dashes_and_nothing_else_changes() -> None:
    """Results without efficiency, intervals or ties: the new columns are dashes that sort
    last, Overall is its figure alone, no rank is marked and no note is added."""
    table = pages.board_table([entry("a", 30), entry("b", 20)], "caption")
    labels = [c.label for c in table.columns]
    assert labels[:9] == ["Rank", "System", "Version", "Overall", "Overall F1", *COST]
    row = row_of(table, 1)
    for label in COST:
        assert (row[label].text, row[label].value) == (pages.DASH, "")
    assert (row["Overall"].text, row["Overall"].detail, row["Overall"].detail_label) == (
        "50.0%",
        "",
        "",
    )
    assert (row["Rank"].text, row["Rank"].mark, row["Rank"].mark_text) == ("2", "", "")
    assert table.notes == []
    chart = pages.latency_chart([entry("a", 30), entry("b", 20)])
    assert chart.points == []
    assert chart.left_out == ["a 1.0 (no latency figures)", "b 1.0 (no latency figures)"]


def test_latency_and_tokens_are_numeric_columns_where_lower_sorts_first() -> None:
    entries = [
        entry("a", 30, cost=efficiency(120.4, 1340.6, tokens=2410.2)),
        entry("b", 28, cost=efficiency(4.25, 9.5, tokens=None)),
        entry("c", 20),
    ]
    table = pages.board_table(entries, "caption")
    columns = {c.label: c for c in table.columns}
    for label in COST[:3]:
        assert columns[label].kind == "number" and columns[label].ascending_first
        assert columns[label].sortable
    assert (
        columns["Measured under"].kind == "text" and not columns["Measured under"].ascending_first
    )
    assert not columns["Overall"].ascending_first
    a, b = row_of(table, 0), row_of(table, 1)
    # The successful first attempts (the participant's own service time), never the retried.
    assert (a["Search p50 (ms)"].text, a["Search p50 (ms)"].value) == ("120", "120.400")
    assert (a["Search p95 (ms)"].text, a["Search p95 (ms)"].value) == ("1,341", "1340.600")
    assert (a["Retrieved tokens"].text, a["Retrieved tokens"].value) == ("2,410", "2410.200")
    # Below 10 ms, a decimal; a figure the results lack is a dash that sorts last.
    assert (b["Search p50 (ms)"].text, b["Search p95 (ms)"].text) == ("4.2", "9.5")
    assert (b["Retrieved tokens"].text, b["Retrieved tokens"].value) == (pages.DASH, "")
    assert a["Measured under"].text == "eu-west · top_k 100 · 8 at once · 10 req/s"
    assert pages.search_latency(entries[0]) == latency(120.4, 1340.6)
    assert pages.search_latency(entries[2]) is None


def test_measured_under_names_every_condition() -> None:
    many = efficiency(1, 2, top_k={"locomo": 100, "longmemeval": 50}, concurrency=None, rps=None)
    assert pages.measured_under(many.measured_under) == (
        "eu-west · top_k locomo 100, longmemeval 50 · concurrency not declared · rate not declared"
    )
    same = efficiency(1, 2, top_k={"b": 20, "a": 20}, rps=2.5, deployment="us-east-1")
    assert (
        pages.measured_under(same.measured_under) == "us-east-1 · top_k 20 · 8 at once · 2.5 req/s"
    )


def test_entries_measured_from_another_deployment_are_flagged() -> None:
    entries = [
        entry("a", 30, cost=efficiency(100, 300, deployment="us-east")),
        entry("b", 29, cost=efficiency(100, 300)),
        entry("c", 28, cost=efficiency(100, 300)),
        entry("d", 20),
    ]
    assert pages.majority_deployment(entries) == "eu-west"
    table = pages.board_table(entries, "caption")
    flagged = row_of(table, 0)
    for label in ("Search p50 (ms)", "Search p95 (ms)", "Measured under"):
        assert flagged[label].mark == pages.OTHER_DEPLOYMENT_MARK
        assert flagged[label].mark_text == " (measured from another deployment)"
    # Tokens do not cross the network: never flagged.
    assert flagged["Retrieved tokens"].mark == ""
    for index in (1, 2, 3):
        assert {cell.mark for cell in table.rows[index]} == {""}
    (note,) = table.notes
    assert (note.key, note.mark) == ("deployments", pages.OTHER_DEPLOYMENT_MARK)
    assert "(eu-west)" in note.text and "does not compare" in note.text
    # No majority: the best-ranked entry's deployment counts as the board's.
    assert pages.majority_deployment(entries[:2]) == "us-east"
    assert pages.majority_deployment([entries[3]]) is None
    assert not pages.other_deployment(entries[3], "eu-west")


def test_the_headline_shows_its_interval() -> None:
    entries = [entry("a", 30, ci=(0.589, 0.634)), entry("b", 20)]
    table = pages.board_table(entries, "caption")
    overall = row_of(table, 0)["Overall"]
    assert (overall.text, overall.value) == ("75.0%", "0.750000")
    assert (overall.detail, overall.detail_label) == (f"58.9{TO}63.4", "95% interval ")
    assert row_of(table, 1)["Overall"].detail == ""
    # Only Overall carries it: a dataset's column stays one figure.
    assert row_of(table, 0)["locomo"].detail == ""
    (note,) = table.notes
    assert note.key == "intervals" and "95% confidence interval" in note.text
    # A cell scored by token F1 alone: its interval in F1's own units.
    f1 = Metrics(
        questions=4,
        scored=4,
        failed=0,
        judge_correct=0,
        judge_accuracy=None,
        f1_mean=0.4321,
        headline="f1_mean",
        headline_ci=Interval(low=0.40123, high=0.46),
    )
    assert pages.interval_text(f1) == f"0.401{TO}0.460"
    # No headline figure: no interval either.
    assert pages.interval_text(f1.model_copy(update={"f1_mean": None})) == ""
    # A system's history shows it too.
    (history,) = pages.system_histories(entries)
    assert [row[3].detail for row in history.table.rows] == [f"58.9{TO}63.4", ""]


def test_ties_with_the_entry_above_are_marked_and_explained() -> None:
    entries = [
        entry("a", 30, tied=True),  # the first entry has no one above it
        entry("b", 29, tied=True),
        entry("c", 20, tied=False),
        entry("d", 19, tied=None),
    ]
    table = pages.board_table(entries, "caption")
    ranks = [row[0] for row in table.rows]
    assert [(r.text, r.mark, r.mark_text) for r in ranks] == [
        ("1", "", ""),
        ("2", "=", ", tied with rank 1"),
        ("3", "", ""),
        ("4", "", ""),
    ]
    (note,) = table.notes
    assert note.key == "ties" and note.mark == "="
    assert "paired bootstrap over the questions both answered" in note.text
    assert "95%" in note.text
    # Ranks still sort as numbers.
    assert [r.value for r in ranks] == ["1", "2", "3", "4"]
    # Only the first entry "tied": nothing to explain.
    assert pages.board_table(entries[:1], "caption").notes == []


def test_nice_ticks() -> None:
    assert pages.nice_ticks(0, 1340.6, 4) == [0, 500, 1000, 1500]
    assert pages.nice_ticks(0, 9.5, 4) == [0, 2.5, 5, 7.5, 10]
    assert pages.nice_ticks(0.589, 0.86, 4) == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert pages.nice_ticks(0.75, 0.75, 4) == [0.6, 0.8]
    assert pages.nice_ticks(0, 0, 4) == [0, 0.25]


def board() -> list[LeaderboardEntry]:
    return [
        entry("recall", 30, ci=(0.62, 0.86), cost=efficiency(120, 340)),
        entry("zettel", 29, ci=(0.58, 0.84), cost=efficiency(40, 95), tied=True),
        entry("lantern", 25, ci=(0.46, 0.78), cost=efficiency(300, 900, deployment="us-east")),
        entry("bm25", 12),
        entry("unscored", 0, cost=efficiency(10, 20)).model_copy(
            update={
                "overall": metrics(0).model_copy(update={"accuracy": None, "judge_accuracy": None})
            }
        ),
    ]


def test_the_latency_chart_places_each_entry_by_overall_and_p95() -> None:
    chart = pages.latency_chart(board())
    plot = chart.plot
    assert chart.title == "Overall against Search p95 latency"
    assert (chart.x_axis, chart.y_axis) == ("Search p95 latency (ms)", "Overall accuracy (%)")
    # One point per entry with both figures, labelled by rank; the others named, with why.
    assert [p.label for p in chart.points] == ["1", "2", "3"]
    assert chart.left_out == ["bm25 1.0 (no latency figures)", "unscored 1.0 (no Overall)"]
    assert [t.label for t in chart.x_ticks] == ["0", "250", "500", "750", "1,000"]
    assert [t.label for t in chart.y_ticks] == ["40%", "50%", "60%", "70%", "80%", "90%"]
    # The axes span the plot: 0 ms at its left, the top tick at its top.
    assert (chart.x_ticks[0].at, chart.x_ticks[-1].at) == (plot.left, plot.right)
    assert (chart.y_ticks[0].at, chart.y_ticks[-1].at) == (plot.bottom, plot.top)
    recall, zettel, lantern = chart.points
    # Faster is further left; better is higher (SVG's y grows downwards).
    assert zettel.x < recall.x < lantern.x
    assert recall.y < zettel.y < lantern.y
    assert recall.x == pytest.approx(plot.left + 340 / 1000 * (plot.right - plot.left), abs=0.1)
    span = plot.bottom - plot.top
    assert recall.y == pytest.approx(plot.bottom - (0.75 - 0.4) / 0.5 * span, abs=0.1)
    # Its interval as a vertical line through it.
    assert recall.high is not None and recall.low is not None
    assert recall.high < recall.y < recall.low
    assert recall.name == (
        f"Rank 1: recall 1.0, Overall 75.0% (95% interval 62.0{TO}86.0), Search p95 340 ms"
    )
    assert lantern.other_deployment and lantern.name.endswith(
        "Search p95 900 ms, measured from another deployment"
    )
    assert not recall.other_deployment
    assert recall.href == "/systems/recall"
    for point in chart.points:
        assert plot.left <= point.x <= plot.right and plot.top <= point.y <= plot.bottom


def test_the_latency_chart_without_intervals_and_on_other_tracks() -> None:
    (only,) = pages.latency_chart([entry("a", 30, cost=efficiency(10, 20))]).points
    assert (only.low, only.high) == (None, None)
    assert "95% interval" not in only.name
    coding = entry("c", 30, cost=efficiency(10, 20)).model_copy(update={"track": "coding"})
    assert pages.latency_chart([coding]).y_axis == "Overall resolved (%)"
    f1 = Metrics(
        questions=4,
        scored=4,
        failed=0,
        judge_correct=0,
        judge_accuracy=None,
        f1_mean=0.43,
        headline="f1_mean",
    )
    chart = pages.latency_chart(
        [entry("f", 1, cost=efficiency(10, 20)).model_copy(update={"overall": f1})]
    )
    assert chart.y_axis == "Overall (mean token F1)"
    assert chart.y_ticks[0].label == "0.4" and "%" not in "".join(t.label for t in chart.y_ticks)
    assert chart.points[0].name.startswith("Rank 1: f 1.0, Overall F1 0.430")


def render(entries: list[LeaderboardEntry]) -> str:
    """The board page as the route renders it (the template needs no request)."""
    table = pages.board_table(entries, "caption")
    charts = pages.category_charts(entries)
    context: dict[str, Any] = {
        "title": "Board",
        "track": "textual",
        "charts_heading": pages.charts_heading("textual"),
        "track_tabs": [],
        "board_tabs": [],
        "table": table,
        "charts": charts,
        "chart_data": pages.chart_data(charts),
        "latency_chart": pages.latency_chart(entries),
    }
    return templates.env.get_template("leaderboard.html").render(context)


def test_the_board_page_draws_the_chart_as_svg_and_explains_the_figures() -> None:
    html = render(board())
    words = " ".join(html.split())
    # Drawn on the server: an SVG with one focusable, named link per point; no inline style
    # (the page's Content-Security-Policy would refuse it).
    assert html.count('<a class="point') == 3
    assert html.count('<a class="point other"') == 1
    assert f'aria-label="Rank 1: recall 1.0, Overall 75.0% (95% interval 62.0{TO}86.0),' in html
    assert re.search(r"<svg[^>]*role=\"group\"[^>]*aria-labelledby=\"chart-latency-title\"", html)
    assert "style=" not in html and "<style" not in html
    assert "Not plotted: bm25 1.0 (no latency figures); unscored 1.0 (no Overall)." in words
    # The intervals, the tie and the other deployment, with the notes that explain them.
    assert '<span class="cell-detail"><span class="visually-hidden">95% interval </span>' in html
    assert (
        '2<span class="table-mark" aria-hidden="true">=</span>'
        '<span class="visually-hidden">, tied with rank 1</span>'
    ) in html
    for key in ("intervals", "ties", "deployments"):
        assert f'id="board-{key}"' in html
    # Lower-is-better columns sort ascending first.
    assert html.count('data-first="ascending"') == 3
    # How to read: latency as seen from the platform, network included; what it compares.
    assert "as seen from the platform: the network between the platform's deployment" in words
    assert "compare only between entries measured under the same conditions" in words


def test_a_board_without_figures_says_so_instead_of_a_chart() -> None:
    html = render([entry("a", 30), entry("b", 20)])
    assert "<svg" not in html
    assert "No entry on this board has latency figures yet." in html
    assert ">75.0%<" in html and "cell-detail" not in html and "table-mark" not in html
