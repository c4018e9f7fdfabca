"""The efficiency figures' rules (aml_evaluation.efficiency, efficiency-v1): the latency
histogram against exact order statistics, its merge and its bound on memory, how attempts are
counted per work item, and how cells add up (pure logic, no I/O)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from aml_contract.api.results import MeasuredUnder
from aml_evaluation.efficiency import (
    EFFICIENCY_METHOD,
    LATENCY_RESOLUTION,
    AnswerUse,
    CallAttempt,
    CallTally,
    EfficiencyTally,
    JudgeUse,
    LatencyHistogram,
    WordCounts,
    retrieved_size,
)
from aml_evaluation.wordcount import count_words


def nearest_rank(values: list[float], percent: int) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(percent * len(ordered) / 100)) - 1]


def histogram_of(values: list[float]) -> LatencyHistogram:
    histogram = LatencyHistogram()
    for value in values:
        histogram.add(value)
    return histogram


@pytest.mark.parametrize(
    "values",
    [
        [float(n) for n in range(1, 1001)],
        [random.Random(7).uniform(50.0, 250.0) for _ in range(30)],
        [random.Random(8).lognormvariate(4.0, 1.2) for _ in range(5000)],
        [0.0, 0.004, 0.5, 3.0, 3.0, 3.0, 12_000.0],
    ],
    ids=["1..1000 ms", "uniform 30", "lognormal 5000", "zeros and ties"],
)
def test_each_percentile_is_within_the_resolution_above_the_exact_one(values: list[float]) -> None:
    histogram = histogram_of(values)
    for percent in (50, 95, 99):
        exact = nearest_rank(values, percent)
        found = histogram.percentile(percent)
        assert found is not None
        # Never below the order statistic, at most 2% above it (or the lowest bucket's bound).
        assert exact <= found <= max(exact * (1 + LATENCY_RESOLUTION), 0.01) + 1e-9
    stats = histogram.stats()
    assert stats.count == len(values) and stats.max_ms == round(max(values), 3)
    assert stats.resolution == LATENCY_RESOLUTION


def test_a_percentile_never_exceeds_the_exact_maximum() -> None:
    histogram = histogram_of([123.4])
    assert histogram.percentile(50) == histogram.percentile(99) == 123.4
    # 95% of 20 samples is the 19th, not the 20th.
    twenty = histogram_of([1.0] * 19 + [1000.0])
    assert twenty.percentile(95) == pytest.approx(1.0, rel=LATENCY_RESOLUTION)
    assert twenty.percentile(99) == 1000.0


def test_an_empty_histogram_has_no_percentiles() -> None:
    stats = LatencyHistogram().stats()
    assert (stats.count, stats.p50_ms, stats.p95_ms, stats.p99_ms, stats.max_ms) == (
        0, None, None, None, None
    )  # fmt: skip


def test_merged_histograms_equal_one_fed_every_sample() -> None:
    rng = random.Random(3)
    left = [rng.expovariate(1 / 80) for _ in range(700)]
    right = [rng.expovariate(1 / 300) for _ in range(300)]
    merged = histogram_of(left)
    merged.merge(histogram_of(right))
    assert merged == histogram_of(left + right)
    with pytest.raises(ValueError, match="resolution"):
        merged.merge(LatencyHistogram(resolution=0.05))


def test_memory_is_bounded_whatever_the_count_and_spread() -> None:
    rng = random.Random(11)
    histogram = LatencyHistogram()
    for _ in range(200_000):
        histogram.add(10 ** rng.uniform(-4, 12))
    assert histogram.count == 200_000
    assert len(histogram.buckets) <= 1201
    assert histogram.max_ms is not None and histogram.percentile(100) == histogram.max_ms


# -- attempts ---------------------------------------------------------------------------------


def attempt(n: int, latency: float, status: int | None = 200, **fields: Any) -> CallAttempt:
    outcome = "ok" if status in (200, 202) else "retry"
    return CallAttempt.model_validate(
        {"operation": "search", "attempt": n, "latency_ms": latency, "status": status,
         "outcome": outcome, **fields}
    )  # fmt: skip


def test_first_attempts_are_items_served_at_once_and_retried_items_are_apart() -> None:
    tally = CallTally()
    tally.add_item([attempt(1, 10.0, validation="valid")])
    tally.add_item([attempt(1, 20.0)])
    tally.add_item([attempt(1, 500.0, 503), attempt(2, 30.0)])
    tally.add_item([attempt(1, 2.0, 429), attempt(2, 40.0)])
    timeout = attempt(1, 1000.0, None, error_class="DeadlineExceeded")
    tally.add_item([timeout, attempt(2, 50.0)])
    stats = tally.stats()
    assert stats is not None
    assert (stats.items, stats.attempts) == (5, 8)
    assert stats.first_attempts.count == 2 and stats.first_attempts.max_ms == 20.0
    assert stats.retried.count == 6 and stats.retried.max_ms == 1000.0
    assert (stats.timeouts, stats.rate_limited, stats.errors) == (1, 1, 1)


def test_a_failed_single_attempt_is_counted_but_has_no_latency_figure() -> None:
    tally = CallTally()
    violated = attempt(1, 15.0, validation="search response: 3 items exceed top_k=2")
    violated = violated.model_copy(update={"outcome": "final"})
    tally.add_item([violated])
    tally.add_item([attempt(1, 5.0, None, error_class="ConnectError").model_copy(
        update={"outcome": "final"})])  # fmt: skip
    stats = tally.stats()
    assert stats is not None and stats.items == 2
    assert stats.first_attempts.count == stats.retried.count == 0
    assert (stats.timeouts, stats.rate_limited, stats.errors) == (0, 0, 2)


def test_an_adds_latency_is_its_add_attempts_and_its_polls_are_attempts() -> None:
    tally = CallTally()
    accepted = CallAttempt(operation="add", attempt=1, latency_ms=8.0, status=202, outcome="ok")
    pending = CallAttempt(
        operation="add_status", attempt=1, latency_ms=3.0, status=202, outcome="retry"
    )
    done = CallAttempt(
        operation="add_status", attempt=2, latency_ms=4.0, status=200, outcome="ok",
        validation="valid",
    )  # fmt: skip
    health = CallAttempt(operation="health", attempt=1, latency_ms=1.0, status=200, outcome="ok")
    tally.add_item([accepted, pending, done, health])
    stats = tally.stats()
    assert stats is not None and (stats.items, stats.attempts) == (1, 3)
    assert stats.first_attempts.count == 1 and stats.first_attempts.max_ms == 8.0
    assert (stats.timeouts, stats.rate_limited, stats.errors) == (0, 0, 0)
    # Health alone is no item.
    assert CallTally().stats() is None
    alone = CallTally()
    alone.add_item([health])
    assert alone.stats() is None


# -- retrieved context and cells ---------------------------------------------------------------


def test_the_retrieved_size_counts_words_and_bytes_of_the_text_only() -> None:
    candidates = [
        {"content": "Ana works at the bakery."},
        {"content": [{"type": "text", "text": "café"},
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                     {"type": "text", "text": "on Fridays"}]},
        {"content": "well-known 3.14 facts"},
    ]  # fmt: skip
    size = retrieved_size(candidates, used=1)
    assert size.retrieved_tokens == 5 + 3 + 3
    assert size.retrieved_bytes == len("Ana works at the bakery.") + len("café on Fridays") + 1 + 21
    assert size.used_tokens == 5


def test_remembered_word_counts_are_the_counters_and_stay_bounded() -> None:
    counted: list[str] = []

    def counting(text: str) -> int:
        counted.append(text)
        return count_words(text)

    counts = WordCounts(kept=2, longest=20)
    texts = ["Ana works at the bakery.", "well-known 3.14", "it's", "well-known 3.14"]
    sizes = [retrieved_size([{"content": t}], used=1, count=counts) for t in texts]
    assert [s.retrieved_tokens for s in sizes] == [count_words(t) for t in texts]
    # The same answers whoever counts; a text within the limit is counted once while kept.
    for text in [*texts, "it's", "one two"]:
        assert counts(text) == count_words(text)
    assert len(counts._counts) == 2  # bounded: the oldest are forgotten
    assert "Ana works at the bakery." not in counts._counts  # longer than `longest`: not kept
    assert retrieved_size([{"content": "x y"}], used=1, count=counting).retrieved_tokens == 2
    assert counted == ["x y"]


UNDER = MeasuredUnder(search_top_k={"d1": 10}, max_concurrency=4, max_rps=5.0, deployment="eu")


def test_cells_add_up_categories_into_datasets_and_datasets_into_the_job() -> None:
    tally = EfficiencyTally()
    for n, (dataset, category) in enumerate([("d1", "a"), ("d1", "a"), ("d1", "b"), ("d2", "x")]):
        tally.calls(dataset, category, [attempt(1, 10.0 * (n + 1))])
        tally.answer(
            dataset,
            category,
            AnswerUse(candidates_returned=10, candidates_used=10 - 2 * (n % 2),
                      retrieved_tokens=100 * (n + 1), retrieved_bytes=600, used_tokens=50,
                      tokens_in=400, tokens_out=10),
        )  # fmt: skip
        tally.judge(dataset, category, JudgeUse(judge_tokens_in=200, judge_tokens_out=4))
    tally.calls("d1", None, [CallAttempt(operation="add", attempt=1, latency_ms=70.0,
                                         status=200, outcome="ok")])  # fmt: skip
    # An answer from before the figures were recorded: counted, its missing figures not.
    tally.answer("d2", "x", AnswerUse(candidates_returned=3, candidates_used=3))

    figures = tally.efficiency(UNDER)
    assert figures.method == EFFICIENCY_METHOD and figures.measured_under == UNDER
    overall = figures.overall
    assert overall.search is not None and overall.search.items == 4
    assert overall.add is not None and overall.add.items == 1
    assert overall.context is not None and overall.context.questions == 5
    assert overall.context.truncated_questions == 2
    assert overall.context.retrieved_tokens_mean == 250.0
    assert overall.context.candidates_returned_mean == pytest.approx(43 / 5)
    assert overall.llm is not None and overall.llm.questions == 5
    assert (overall.llm.answer_tokens_in_mean, overall.llm.judge_tokens_out_mean) == (400.0, 4.0)

    d1 = figures.datasets["d1"]
    assert d1.overall.add is not None and d1.overall.search is not None
    assert d1.overall.search.items == 3
    assert sorted(d1.categories) == ["a", "b"]
    # Adds belong to no category.
    assert all(cell.add is None for cell in d1.categories.values())
    a = d1.categories["a"].search
    assert a is not None and a.first_attempts.count == 2 and a.first_attempts.max_ms == 20.0
    assert figures.datasets["d2"].overall.add is None


def test_a_job_without_calls_has_empty_figures() -> None:
    figures = EfficiencyTally().efficiency(UNDER)
    assert figures.datasets == {}
    assert figures.overall.model_dump() == {"add": None, "search": None, "context": None,
                                            "llm": None}  # fmt: skip
