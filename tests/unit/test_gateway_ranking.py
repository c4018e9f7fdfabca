"""How a board orders its entries (`aml_gateway.ranking`, pure): best Overall first, judge
accuracy when there is no accuracy, unscored entries last, ties by publication then id."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.results import Metrics
from aml_gateway.ranking import headline, rank_key, ranked

T0 = datetime(2027, 1, 1, tzinfo=UTC)


def _metrics(accuracy: float | None, judge_accuracy: float | None = None) -> Metrics:
    return Metrics(
        questions=10,
        scored=10,
        failed=0,
        accuracy=accuracy,
        judge_correct=0,
        judge_accuracy=judge_accuracy,
        f1_mean=None,
        bleu1_mean=None,
    )


def _entry(
    entry_id: str,
    accuracy: float | None,
    published_at: datetime = T0,
    judge_accuracy: float | None = None,
) -> LeaderboardEntry:
    return LeaderboardEntry(
        entry_id=entry_id,
        system_name=entry_id,
        version_label="1.0",
        team_name="team",
        board="academic",
        track="textual",
        overall=_metrics(accuracy, judge_accuracy),
        datasets={},
        spec_hash="s",
        code_hash="c",
        dataset_bundle_hash="d",
        answer_model="m",
        published_at=published_at,
    )


def test_the_headline_is_accuracy_else_the_judges() -> None:
    assert headline(_metrics(0.5, 0.9)) == 0.5
    assert headline(_metrics(None, 0.9)) == 0.9
    assert headline(_metrics(0.0, 0.9)) == 0.0
    assert headline(_metrics(None)) is None


def test_best_first_unscored_last() -> None:
    entries = [
        _entry("unscored", None),
        _entry("low", 0.2),
        _entry("judged", None, judge_accuracy=0.6),
        _entry("high", 0.8),
        _entry("zero", 0.0),
    ]
    assert [e.entry_id for e in ranked(entries)] == ["high", "judged", "low", "zero", "unscored"]


def test_ties_go_to_the_earlier_publication_then_the_entry_id() -> None:
    later = _entry("a-later", 0.5, T0 + timedelta(days=1))
    earlier = _entry("z-earlier", 0.5, T0)
    same_time = _entry("b-same", 0.5, T0)
    assert [e.entry_id for e in ranked([later, earlier, same_time])] == [
        "b-same",
        "z-earlier",
        "a-later",
    ]
    # A total order: the input order never matters.
    assert ranked([same_time, earlier, later]) == ranked([later, same_time, earlier])
    assert rank_key(earlier) < rank_key(later)


def test_a_cell_scored_by_f1_alone_has_f1_as_its_headline() -> None:
    f1_only = _metrics(None).model_copy(update={"f1_mean": 0.3, "headline": "f1_mean"})
    assert headline(f1_only) == 0.3
    # A judged or multiple-choice cell keeps accuracy, whatever its F1.
    judged = _metrics(0.5, 0.5).model_copy(update={"f1_mean": 0.9})
    assert headline(judged) == 0.5 and headline(_metrics(None)) is None
    # An F1 cell without a mean (nothing scored) has no headline either: ranked last.
    assert headline(_metrics(None).model_copy(update={"headline": "f1_mean"})) is None
