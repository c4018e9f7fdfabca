"""What the public pages show (`aml_gateway.pages`, pure): the board a page opens on, the tabs'
entry counts and links, the board's column order and the categories kept out of Overall."""

from __future__ import annotations

from datetime import UTC, datetime

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.results import DatasetResults, EvidenceFigures, Metrics
from aml_contract.api.vocabulary import Board, Track
from aml_gateway import pages

NONE: dict[tuple[Track, Board], int] = {}
SOME: dict[tuple[Track, Board], int] = {("coding", "industrial"): 2, ("multimodal", "academic"): 1}


def test_an_unnamed_board_opens_where_there_are_entries() -> None:
    assert pages.choose_board(NONE, None, None) == ("textual", "academic")
    assert pages.choose_board(SOME, None, None) == ("multimodal", "academic")
    assert pages.choose_board({**SOME, ("textual", "industrial"): 1}, None, None) == (
        "textual",
        "industrial",
    )
    # Half named: that half is kept, the other one chosen.
    assert pages.choose_board(SOME, "coding", None) == ("coding", "industrial")
    assert pages.choose_board(SOME, None, "industrial") == ("coding", "industrial")
    assert pages.choose_board(SOME, "textual", None) == ("textual", "academic")
    # Fully named: respected, even empty.
    assert pages.choose_board(SOME, "textual", "industrial") == ("textual", "industrial")


def test_tabs_count_their_entries() -> None:
    counts = {**SOME, ("coding", "academic"): 3}
    tracks = pages.track_tabs("coding", "industrial", counts)
    assert [(t.label, t.count, t.current) for t in tracks] == [
        ("Textual", 0, False),
        ("Multimodal", 1, False),
        ("Coding", 5, True),
    ]
    # A track tab keeps the board unless it is empty there and another is not.
    assert [t.href for t in tracks] == [
        "/leaderboard?track=textual&board=industrial",
        "/leaderboard?track=multimodal&board=academic",
        "/leaderboard?track=coding&board=industrial",
    ]
    boards = pages.board_tabs("coding", "industrial", counts)
    assert [(t.label, t.count, t.current, t.href) for t in boards] == [
        ("Academic", 3, False, "/leaderboard?track=coding&board=academic"),
        ("Industrial", 2, True, "/leaderboard?track=coding&board=industrial"),
    ]


def _metrics(correct: int, questions: int = 10) -> Metrics:
    return Metrics(
        questions=questions,
        scored=questions,
        failed=0,
        accuracy=correct / questions,
        judge_correct=correct,
        judge_accuracy=correct / questions,
        f1_mean=0.5,
        bleu1_mean=0.4,
    )


def _entry(name: str, excluded: list[str]) -> LeaderboardEntry:
    categories = {c: _metrics(5) for c in ("adversarial", "multi-hop", "single-hop")}
    dataset = DatasetResults(
        dataset_id="locomo",
        overall=_metrics(10, 20),
        categories=categories,
        excluded_from_overall=excluded,
    )
    return LeaderboardEntry(
        entry_id=f"lb-{name}",
        system_name=name,
        version_label="1.0",
        team_name="team",
        board="academic",
        track="textual",
        overall=_metrics(10, 20),
        datasets={"locomo": dataset},
        spec_hash="s",
        code_hash="c",
        dataset_bundle_hash="d",
        answer_model="m",
        published_at=datetime(2027, 1, 1, tzinfo=UTC),
    )


def test_board_columns_overall_first_and_excluded_categories_marked_last() -> None:
    entries = [_entry("a", ["adversarial"]), _entry("b", [])]
    table = pages.board_table(entries, "caption")
    labels = [c.label for c in table.columns]
    # The headline right after the entry's names, where a phone screen still shows it.
    assert labels[:5] == ["Rank", "System", "Version", "Overall", "Overall F1"]
    assert table.sorted_by == labels.index("Overall")
    assert table.rows[0][labels.index("Overall")].text == "50.0%"
    categories = [c for c in table.columns if c.label.startswith("locomo: ")]
    assert [(c.label, c.excluded) for c in categories] == [
        ("locomo: multi-hop", False),
        ("locomo: single-hop", False),
        ("locomo: adversarial", True),
    ]
    (chart,) = pages.category_charts(entries)
    assert chart.labels == ["multi-hop", "single-hop", "adversarial (not in Overall)"]
    # Nothing excluded: nothing marked, the results' own order.
    plain = pages.board_table([_entry("b", [])], "caption")
    assert [c.label for c in plain.columns if c.excluded] == []
    assert pages.dataset_columns([_entry("b", [])]) == [
        ("locomo", ["adversarial", "multi-hop", "single-hop"])
    ]


def _scored(dataset_id: str, overall: Metrics, categories: dict[str, Metrics]) -> LeaderboardEntry:
    entry = _entry(dataset_id, [])
    dataset = DatasetResults(
        dataset_id=dataset_id, overall=overall, categories=categories, excluded_from_overall=[]
    )
    return entry.model_copy(update={"overall": overall, "datasets": {dataset_id: dataset}})


def test_multiple_choice_datasets_get_an_option_accuracy_column() -> None:
    choice = _metrics(6).model_copy(update={"option_questions": 10, "option_accuracy": 0.6})
    entries = [_scored("personamem", choice, {"recall_user_shared_facts": choice})]
    table = pages.board_table(entries, "caption")
    labels = [c.label for c in table.columns]
    assert "personamem: option accuracy" in labels
    assert table.rows[0][labels.index("personamem: option accuracy")].text == "60.0%"
    # A dataset without multiple choice has no such column.
    plain = pages.board_table([_entry("b", [])], "caption")
    assert not [c.label for c in plain.columns if "option accuracy" in c.label]


def test_datasets_with_evidence_get_recall_and_joint_columns() -> None:
    figures = EvidenceFigures(
        questions=10, recall={"1": 0.3, "5": 0.6, "10": 0.75}, joint={"1": 0.2, "5": 0.4, "10": 0.5}
    )
    found = _metrics(6).model_copy(update={"evidence": figures})
    entries = [_scored("atm", found, {"number": found}), _entry("b", [])]
    table = pages.board_table(entries, "caption")
    labels = [c.label for c in table.columns]
    row = table.rows[0]
    assert row[labels.index("atm: Recall@10")].text == "75.0%"
    assert row[labels.index("atm: Joint@10")].text == "50.0%"
    # The entry without the dataset shows dashes; the note says what the figures are.
    assert {table.rows[1][labels.index(f"atm: {k}@10")].text for k in ("Recall", "Joint")} == {
        pages.DASH
    }
    assert "evidence" in [note.key for note in table.notes]
    # Results without evidence figures get no such columns.
    plain = pages.board_table([_entry("b", [])], "caption")
    assert not [c.label for c in plain.columns if "Recall@" in c.label]


def test_a_dataset_scored_by_f1_alone_shows_f1_as_its_headline() -> None:
    f1_only = Metrics(
        questions=4,
        scored=4,
        failed=0,
        judge_correct=0,
        judge_accuracy=None,
        f1_mean=0.4321,
        headline="f1_mean",
    )
    entries = [_scored("mem-gallery", f1_only, {"recall": f1_only})]
    table = pages.board_table(entries, "caption")
    labels = [c.label for c in table.columns]
    row = table.rows[0]
    assert row[labels.index("Overall")].text == "F1 0.432"
    assert row[labels.index("mem-gallery: recall")].text == "F1 0.432"
    # Sorted by the number itself, like every other headline.
    assert row[labels.index("Overall")].value == "0.432100"
