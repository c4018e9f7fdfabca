"""The coding track on the public board and the job page (R-2.4, R-2.5; `aml_gateway.ranking`,
`aml_gateway.pages`, `aml_gateway.attempts`, all pure): a coding board ranks by the share of
resolved attempts and shows it as a percentage Overall, per memory condition (relevant, then
noisy) and per task type, with resolved counts and attempts where other boards show F1 and
questions; its page explains the metric; a job's attempts say how each one ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.vocabulary import Track
from aml_contract.messages import QuestionStage
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_gateway import pages
from aml_gateway.attempts import coding_attempt
from aml_gateway.ranking import headline, ranked
from aml_gateway.routes.pages import templates

DATASET = "synthetic-coding"
T0 = datetime(2027, 1, 1, tzinfo=UTC)


def outcomes(resolved: dict[str, int], tasks: int = 8, failed: int = 0) -> list[QuestionOutcome]:
    """`resolved[condition]` of `tasks` attempts resolved per condition (the first half of the
    tasks debug, the rest development), and `failed` more noisy attempts the platform failed."""
    found = [
        QuestionOutcome(
            dataset_id=DATASET,
            category_name=condition,
            scored=True,
            resolved=index < resolved[condition],
            task_type="debug" if index < tasks // 2 else "development",
        )
        for condition in ("noisy", "relevant")
        for index in range(tasks)
    ]
    found += [
        QuestionOutcome(
            dataset_id=DATASET,
            category_name="noisy",
            scored=False,
            failure_kind="platform_error",
            task_type="debug",
        )
        for _ in range(failed)
    ]
    return found


def entry(name: str, resolved: dict[str, int], days: int = 0, failed: int = 0) -> LeaderboardEntry:
    results = aggregate("j", "completed", outcomes(resolved, failed=failed), excluded={})
    return LeaderboardEntry(
        entry_id=f"lb-{name}",
        system_name=name,
        version_label="1.0",
        team_name="team",
        board="industrial",
        track="coding",
        overall=results.overall,
        datasets=results.datasets,
        spec_hash="s",
        code_hash="c",
        dataset_bundle_hash="d",
        answer_model="m",
        published_at=T0 + timedelta(days=days),
    )


# 10 of 16 (62.5%), 9 of 16 (56.25%; published first), 9 of 16 again (later), none verified.
BEST = entry("best", {"relevant": 7, "noisy": 3}, days=2)
EARLY = entry("early", {"relevant": 6, "noisy": 3}, days=0)
LATE = entry("late", {"relevant": 5, "noisy": 4}, days=1)
NONE = entry("none", {"relevant": 0, "noisy": 0}).model_copy(
    update={"overall": aggregate("j", "completed", outcomes({}, tasks=0, failed=2), {}).overall}
)


def test_a_coding_board_ranks_by_the_resolved_share() -> None:
    assert BEST.overall.headline == "resolved_rate"
    assert headline(BEST.overall) == 0.625
    assert headline(BEST.datasets[DATASET].categories["relevant"]) == 7 / 8
    # A judge or F1 figure never enters: a coding cell has none.
    assert BEST.overall.accuracy is None and BEST.overall.f1_mean is None
    assert headline(NONE.overall) is None
    order = ranked([NONE, LATE, EARLY, BEST])
    # Ties go to the earlier publication; an entry with no verified attempt last.
    assert [e.system_name for e in order] == ["best", "early", "late", "none"]


def test_the_coding_board_shows_resolved_shares_per_condition_and_task_type() -> None:
    table = pages.board_table(ranked([LATE, BEST]), "caption")
    labels = [c.label for c in table.columns]
    assert labels[:5] == ["Rank", "System", "Version", "Overall", "Resolved"]
    assert "Overall F1" not in labels and "Questions" not in labels
    assert table.sorted_by == labels.index("Overall")
    # The conditions in the datasets' order (relevant, then noisy), then the task types.
    assert [label for label in labels if label.startswith(f"{DATASET}")] == [
        DATASET,
        f"{DATASET}: relevant",
        f"{DATASET}: noisy",
        f"{DATASET}: debug tasks",
        f"{DATASET}: development tasks",
    ]
    best = {label: cell for label, cell in zip(labels, table.rows[0], strict=True)}
    assert best["System"].text == "best"
    assert best["Overall"].text == "62.5%"
    assert best["Overall"].value == "0.625000"
    assert best["Resolved"].text == "10 of 16"
    assert best[f"{DATASET}: relevant"].text == "87.5%"
    assert best[f"{DATASET}: noisy"].text == "37.5%"
    # The first four tasks of each condition are debug ones: 4 + 3 of 8 resolved.
    assert best[f"{DATASET}: debug tasks"].text == "87.5%"
    assert best[f"{DATASET}: development tasks"].text == "37.5%"
    assert best["Attempts"].text == "16"


def test_a_coding_entry_without_a_verified_attempt_shows_dashes() -> None:
    table = pages.board_table([NONE], "caption")
    labels = [c.label for c in table.columns]
    row = dict(zip(labels, table.rows[0], strict=True))
    assert (row["Overall"].text, row["Overall"].value) == (pages.DASH, "")
    assert row["Resolved"].text == pages.DASH
    assert row["Attempts"].text == "2"


def test_the_coding_charts_compare_the_conditions() -> None:
    (chart,) = pages.category_charts(ranked([LATE, BEST]))
    assert chart.title == f"{DATASET}: resolved share per memory condition"
    assert chart.labels == ["relevant", "noisy"]
    assert chart.axis == "Resolved (%)"
    assert chart.series[0] == {"label": "best 1.0", "values": [87.5, 37.5]}
    assert pages.chart_data([chart])[0]["axis"] == "Resolved (%)"
    assert pages.charts_heading("coding") == "Resolved per memory condition"
    assert pages.charts_heading("textual") == "Accuracy per category"


def test_a_systems_coding_history_shows_resolved_counts() -> None:
    (history,) = pages.system_histories([EARLY, LATE])
    labels = [c.label for c in history.table.columns]
    assert labels == [
        "Version",
        "Board",
        "Team",
        "Overall",
        "Resolved",
        DATASET,
        "Attempts",
        "Published",
    ]
    assert [row[3].text for row in history.table.rows] == ["56.2%", "56.2%"]
    assert history.chart.axis == "Resolved (%)"
    assert "resolved share" in history.chart.description


def _page(track: Track, entries: list[LeaderboardEntry]) -> str:
    """The board page as the route renders it (without a request: the template needs none)."""
    table = pages.board_table(entries, "caption")
    charts = pages.category_charts(entries)
    context: dict[str, Any] = {
        "title": "Board",
        "track": track,
        "charts_heading": pages.charts_heading(track),
        "track_tabs": [],
        "board_tabs": [],
        "table": table,
        "charts": charts,
        "chart_data": pages.chart_data(charts),
        "latency_chart": pages.latency_chart(entries),
    }
    return templates.env.get_template("leaderboard.html").render(context)


def test_the_coding_page_explains_its_metric() -> None:
    html = _page("coding", ranked([BEST, LATE]))
    assert 'id="board-metric"' in html
    words = " ".join(html.split())
    assert "share of tasks the fixed coding agent resolved with the memories it retrieved" in words
    assert "<strong>relevant</strong>" in words and "<strong>noisy</strong>" in words
    assert "Resolved per memory condition" in html
    assert "share of questions answered correctly" not in words
    assert ">62.5%<" in html and ">10 of 16<" in html
    # Empty, the board still says what it would rank by.
    empty = _page("coding", [])
    assert 'id="board-metric"' in empty and "No entry has been published" in empty


@pytest.mark.parametrize("track", ["textual", "multimodal"])
def test_other_boards_keep_their_legend(track: Track) -> None:
    html = _page(track, [])
    assert 'id="board-metric"' not in html


# --- a job's attempts -------------------------------------------------------------------------

ITEM = f"j1/{DATASET}/t1:noisy"
QUESTION = {
    "_id": ITEM,
    "dataset_id": DATASET,
    "question_id": "t1:noisy",
    "category_name": "noisy",
    "coding_task": "t1",
    "task_type": "debug",
}
DONE_ANSWER = {"_id": ITEM, "state": "done", "end_reason": "submitted", "steps": 12}


def attempt(**records: dict[str, Any]) -> dict[str, Any]:
    """The attempt of QUESTION with these records by stage (`search=`, `answer=`, `score=`)."""
    by_stage = {cast(QuestionStage, stage): {ITEM: r} for stage, r in records.items()}
    return coding_attempt(QUESTION, by_stage).model_dump(exclude_none=True)


NAMES = {
    "item_id": ITEM,
    "dataset_id": DATASET,
    "task": "t1",
    "condition": "noisy",
    "task_type": "debug",
}


def test_an_attempt_says_how_it_ended() -> None:
    search = {"_id": ITEM, "state": "done"}
    verdict = {"state": "done", "resolved": False, "reason": "1 of 2 FAIL_TO_PASS tests fail"}
    assert attempt(search=search, answer=DONE_ANSWER, score=verdict) == NAMES | {
        "outcome": "unresolved",
        "end_reason": "submitted",
        "steps": 12,
        "resolved": False,
        "reason": "1 of 2 FAIL_TO_PASS tests fail",
    }
    resolved = attempt(search=search, answer=DONE_ANSWER, score=verdict | {"resolved": True})
    assert (resolved["outcome"], resolved["resolved"]) == ("resolved", True)
    # Why no patch reached the tests is the answer's to say.
    rejected = attempt(
        answer=DONE_ANSWER | {"patch_rejected": "the patch is 5,000,000 bytes"},
        score={"state": "done", "resolved": False, "reason": "no patch to verify"},
    )
    assert rejected["reason"] == "no patch to verify: the patch is 5,000,000 bytes"
    # At a limit: unresolved, with the agent's end.
    limit = attempt(answer=DONE_ANSWER | {"end_reason": "step_limit", "steps": 250}, score=verdict)
    assert (limit["end_reason"], limit["steps"], limit["outcome"]) == (
        "step_limit",
        250,
        "unresolved",
    )


def test_a_failed_attempt_is_never_unresolved() -> None:
    outage = {"state": "failed", "failure_kind": "participant_outage", "failure": "HTTP 503"}
    assert attempt(search=outage) == NAMES | {
        "outcome": "failed",
        "failed_at": "search",
        "failure_kind": "participant_outage",
        "reason": "HTTP 503",
    }
    sandbox = {"state": "failed", "failure_kind": "platform_error", "failure": "sandbox fault"}
    failed = attempt(search={"state": "done"}, answer=DONE_ANSWER, score=sandbox)
    assert (failed["outcome"], failed["failed_at"], failed["end_reason"]) == (
        "failed",
        "score",
        "submitted",
    )
    assert "resolved" not in failed
    # Nothing final yet: pending.
    assert attempt(search={"state": "done"}) == NAMES | {"outcome": "pending"}
    assert attempt() == NAMES | {"outcome": "pending"}
