"""The board's ties in the gateway (`aml_gateway.ties`) over in-memory stores: each entry against
the one just above it, nothing for the first or where no values were kept or the headlines
differ, and a board shown again computes nothing (kept by its entry ids, within bounds)."""

from __future__ import annotations

from datetime import UTC, datetime

from fake_stores import MemoryStores, memory_stores

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.results import Headline, Metrics
from aml_gateway.ties import Ties, compare, mark_ties
from aml_runtime.stores.leaderboard import HeadlineOutcomes

T0 = datetime(2027, 1, 1, tzinfo=UTC)
N = 200


def _entry(entry_id: str, accuracy: float) -> LeaderboardEntry:
    overall = Metrics(questions=N, scored=N, failed=0, accuracy=accuracy, judge_correct=0,
                      judge_accuracy=accuracy, f1_mean=None)  # fmt: skip
    return LeaderboardEntry(
        entry_id=entry_id, system_name=entry_id, version_label="1.0", team_name="t",
        board="industrial", track="textual", overall=overall, datasets={}, spec_hash="s",
        code_hash="c", dataset_bundle_hash="d", answer_model="m", published_at=T0,
    )  # fmt: skip


def _values(correct: int) -> dict[str, float]:
    return {f"locomo/q{i:03d}": float(i < correct) for i in range(N)}


async def _keep(stores: MemoryStores, job_id: str, correct: int, headline: Headline) -> None:
    outcomes = HeadlineOutcomes(job_id=job_id, headline=headline, values=_values(correct))
    await stores.leaderboard.keep_headline_outcomes(outcomes)


class CountedReads:
    """The fake store's reads of kept values, counted."""

    def __init__(self, stores: MemoryStores) -> None:
        self.reads: list[str] = []
        read = stores.leaderboard.headline_outcomes_of

        async def counted(job_id: str) -> HeadlineOutcomes | None:
            self.reads.append(job_id)
            return await read(job_id)

        stores.leaderboard.headline_outcomes_of = counted  # type: ignore[method-assign]


async def test_each_entry_is_compared_with_the_one_above_once() -> None:
    stores = memory_stores()
    # 150, 148 and 100 of 200 correct, the same questions first: a tie, then a clear gap.
    await _keep(stores, "job-a", 150, "accuracy")
    await _keep(stores, "job-b", 148, "accuracy")
    await _keep(stores, "job-c", 100, "accuracy")
    entries = [_entry("a", 0.75), _entry("b", 0.74), _entry("c", 0.5), _entry("d", 0.4)]
    jobs = {"a": "job-a", "b": "job-b", "c": "job-c", "d": "job-d"}  # job-d kept nothing
    counted = CountedReads(stores)
    ties = Ties()

    marked = await mark_ties(stores.typed(), ties, entries, jobs)
    assert [(e.entry_id, e.tied_with_above) for e in marked] == [
        ("a", None), ("b", True), ("c", False), ("d", None),
    ]  # fmt: skip
    # Each run's values read once, though "b" and "c" each take part in two pairs.
    assert counted.reads == ["job-a", "job-b", "job-c", "job-d"]
    # Only the tie is new; the rest of each entry is as it was.
    assert marked[1].model_copy(update={"tied_with_above": None}) == entries[1]

    # Shown again: nothing is read or computed.
    again = await mark_ties(stores.typed(), ties, entries, jobs)
    assert again == marked and len(counted.reads) == 4

    # A new entry at the bottom: only the pair it makes is computed.
    await _keep(stores, "job-e", 99, "accuracy")
    grown = [*entries[:3], _entry("e", 0.495)]
    marked = await mark_ties(stores.typed(), ties, grown, {**jobs, "e": "job-e"})
    assert [e.tied_with_above for e in marked] == [None, True, False, True]
    assert counted.reads[4:] == ["job-c", "job-e"]


async def test_no_comparison_across_headlines_or_without_values() -> None:
    accuracy = HeadlineOutcomes(job_id="x", headline="accuracy", values=_values(10))
    f1 = HeadlineOutcomes(job_id="y", headline="f1_mean", values=_values(10))
    assert compare(accuracy, f1, Ties().method) is None
    assert compare(accuracy, None, Ties().method) is None
    assert compare(accuracy, accuracy, Ties().method) is True
    assert await mark_ties(memory_stores().typed(), Ties(), [], {}) == []


def test_the_kept_boards_and_pairs_are_bounded() -> None:
    ties = Ties(boards_kept=2, pairs_kept=2)
    for n in range(4):
        ties.keep_board((f"e{n}",), (None,))
        ties.keep_pair((f"e{n}", "z"), True)
    assert ties.board(("e0",)) is None and ties.board(("e3",)) == (None,)
    assert ties.pair(("e1", "z")) == (False, None)
    assert ties.pair(("e3", "z")) == (True, True)
    # The one shown last is kept longest.
    ties.board(("e2",))
    ties.keep_board(("e4",), (None,))
    assert ties.board(("e2",)) == (None,) and ties.board(("e3",)) is None
