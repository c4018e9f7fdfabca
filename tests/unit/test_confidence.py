"""How sure a score is (aml_evaluation.confidence): the seeded percentile bootstrap against
scipy.stats.bootstrap on the same data and seed, its edge cases, the paired comparison behind
the board's ties, and the intervals aggregate() reports beside every headline figure (the
results fingerprint unchanged by them)."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy import stats

from aml_evaluation.aggregate import (
    QuestionOutcome,
    aggregate,
    headline_values,
    results_fingerprint,
)
from aml_evaluation.confidence import (
    CONFIDENCE,
    ConfidenceMethod,
    bootstrap_means,
    difference_interval,
    headline_interval,
    paired_differences,
    percentile_interval,
    tied,
)

# scipy interpolates between the two order statistics as (1 - g) * y[j] + g * y[j + 1], numpy
# (which confidence.py uses) as y[j] + (y[j + 1] - y[j]) * g: the same quantile, rounded
# differently. The resamples themselves are compared bit for bit; the interval's ends may
# differ by a few units in the last place of a float, far below this.
ROUNDING = 1e-12
OTHER = ConfidenceMethod(level=0.9, resamples=1_003, seed=7, batch=17)


def _reference(
    data: tuple[np.ndarray[Any, Any], ...],
    statistic: Callable[..., Any],
    method: ConfidenceMethod,
    paired: bool = False,
) -> Any:
    return stats.bootstrap(
        data,
        statistic,
        paired=paired,
        vectorized=True,
        n_resamples=method.resamples,
        batch=method.batch,
        confidence_level=method.level,
        method="percentile",
        rng=np.random.default_rng(method.seed),
    )


def _binary(n: int, share: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [float(rng.random() < share) for _ in range(n)]


def _continuous(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.choice([0.0, 1.0, rng.random()]) for _ in range(n)]


@pytest.mark.parametrize("method", [CONFIDENCE, OTHER], ids=["spec", "other"])
@pytest.mark.parametrize(
    "values",
    [_binary(2, 0.5, 1), _binary(300, 0.62, 2), _continuous(257, 3), [0.5] * 9 + [1.0]],
    ids=["two", "verdicts", "f1", "skewed"],
)
def test_the_interval_is_scipys_percentile_bootstrap_on_the_same_seed(
    values: list[float], method: ConfidenceMethod
) -> None:
    """Same draws (the values sorted, `batch` resamples per call, a fresh default_rng(seed)):
    the bootstrap distribution equals scipy's exactly, so the interval does too, up to the
    quantile's rounding."""
    ordered = np.sort(np.asarray(values))
    reference = _reference((ordered,), np.mean, method)
    means = bootstrap_means(values, method)
    assert means is not None
    assert np.array_equal(means, reference.bootstrap_distribution)
    interval = percentile_interval(values, method)
    assert interval == pytest.approx(tuple(reference.confidence_interval), abs=ROUNDING, rel=0)


@pytest.mark.parametrize("method", [CONFIDENCE, OTHER], ids=["spec", "other"])
@pytest.mark.parametrize("kind", ["verdicts", "f1"])
def test_the_difference_is_scipys_paired_bootstrap_on_the_same_seed(
    method: ConfidenceMethod, kind: str
) -> None:
    """Two results over the questions both answered, paired by question key in key order: the
    same indices resample both (scipy's `paired=True`)."""
    n = 400

    def make(seed: int) -> list[float]:
        return _binary(n, 0.6, seed) if kind == "verdicts" else _continuous(n, seed)

    above = {f"locomo/conv-{i % 7}:q{i:04d}": v for i, v in enumerate(make(11))}
    below = {f"locomo/conv-{i % 7}:q{i:04d}": v for i, v in enumerate(make(12))}
    below["locomo/only-below"] = 1.0  # answered by one of them only: left out
    keys = sorted(above)
    upper = np.asarray([above[k] for k in keys])
    lower = np.asarray([below[k] for k in keys])

    def difference(x: Any, y: Any, axis: int = -1) -> Any:
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    reference = _reference((upper, lower), difference, method, paired=True)
    differences = paired_differences(above, below, method)
    assert differences is not None
    assert np.array_equal(differences, reference.bootstrap_distribution)
    interval = difference_interval(above, below, method)
    assert interval == pytest.approx(tuple(reference.confidence_interval), abs=ROUNDING, rel=0)


def test_the_draws_are_the_ones_the_method_names() -> None:
    """`bootstrap-percentile-v1` means these draws: a numpy whose Generator drew otherwise
    would change every interval under the same name, so it fails here first. int32 indices
    (what confidence.py draws) are the same numbers as scipy's int64 ones."""
    rng = np.random.default_rng(CONFIDENCE.seed)
    assert rng.integers(0, 10, (2, 8), dtype=np.int32).tolist() == [
        [8, 1, 0, 6, 3, 4, 0, 3],
        [6, 3, 8, 7, 7, 9, 7, 1],
    ]
    wide = np.random.default_rng(CONFIDENCE.seed).integers(0, 10_007, (3, 10_007))
    narrow = np.random.default_rng(CONFIDENCE.seed).integers(0, 10_007, (3, 10_007), np.int32)
    assert np.array_equal(wide, narrow)


def test_the_spec_parameters() -> None:
    assert CONFIDENCE.model_dump() == {
        "method": "bootstrap-percentile-v1",
        "level": 0.95,
        "resamples": 10_000,
        "seed": 2026,
        "batch": 100,
    }
    with pytest.raises(ValueError):
        ConfidenceMethod(level=1.0)


def test_edge_cases() -> None:
    assert percentile_interval([1.0] * 40) == (1.0, 1.0)
    assert percentile_interval([0.0] * 40) == (0.0, 0.0)
    assert percentile_interval([0.3]) == (0.3, 0.3)
    assert percentile_interval([]) is None
    assert bootstrap_means([]) is None
    assert headline_interval([], None) is None
    assert headline_interval([1.0, 0.0], None) is None
    one = headline_interval([0.25], 0.25)
    assert one is not None and (one.low, one.high) == (0.25, 0.25)


def test_the_interval_depends_on_the_values_not_their_order() -> None:
    values = _continuous(120, 5)
    shuffled = list(values)
    random.Random(9).shuffle(shuffled)
    assert percentile_interval(values) == percentile_interval(shuffled)


def test_a_headline_interval_holds_its_figure_and_narrows_with_more_questions() -> None:
    small = _binary(50, 0.7, 21)
    large = _binary(2_000, 0.7, 22)
    widths = []
    for values in (small, large):
        figure = sum(values) / len(values)
        interval = headline_interval(values, figure)
        assert interval is not None
        assert 0.0 <= interval.low <= figure <= interval.high <= 1.0
        widths.append(interval.high - interval.low)
    # About 1.96 * 2 * sqrt(p (1 - p) / n): 0.25 at 50 questions, 0.04 at 2,000.
    assert widths[0] == pytest.approx(0.25, abs=0.04)
    assert widths[1] == pytest.approx(0.04, abs=0.006)


def test_memory_is_bounded_by_a_batch_not_by_every_resample() -> None:
    """10,000 questions: every resample at once would be 10,000 x 10,000 indices (400 MB as
    int32); a batch of 100 is 4 MB of indices and 1 MB of their comparison."""
    values = _continuous(10_000, 8)
    tracemalloc.start()
    try:
        assert percentile_interval(values) is not None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000, peak


# -- ties: the paired comparison -------------------------------------------------------------


def _entry(correct: set[int], n: int = 1_540) -> dict[str, float]:
    return {f"locomo/q{i:04d}": float(i in correct) for i in range(n)}


def test_near_equal_entries_are_tied_and_clearly_different_ones_are_not() -> None:
    # 1,078 of 1,540 (70.0%) against 1,086 (70.5%), sharing 1,040 correct answers: a
    # half-point gap the questions cannot tell apart.
    base = set(range(1_040))
    first = _entry(base | set(range(1_100, 1_138)))
    second = _entry(base | set(range(1_200, 1_246)))
    assert tied(second, first) is True
    low, high = difference_interval(second, first) or (0.0, 0.0)
    assert low < 0.0 < high
    # 1,232 of 1,540 (80%) against 70.0%: distinguishable.
    better = _entry(base | set(range(1_100, 1_292)))
    assert tied(better, first) is False
    assert (difference_interval(better, first) or (0.0, 0.0))[0] > 0.0
    # The same answers: the difference is 0 in every resample.
    assert tied(first, dict(first)) is True
    assert difference_interval(first, dict(first)) == (0.0, 0.0)


def test_no_question_in_common_gives_no_tie() -> None:
    assert tied({"a/q1": 1.0}, {"b/q1": 0.0}) is None
    assert paired_differences({}, {"b/q1": 0.0}) is None


def test_only_the_questions_both_answered_are_compared() -> None:
    first = _entry(set(range(600)), n=1_000)
    second = _entry(set(range(550)), n=1_000)
    extra = {**second, **{f"other/q{i}": 1.0 for i in range(500)}}
    assert difference_interval(first, extra) == difference_interval(first, second)


# -- the intervals in the results --------------------------------------------------------------


def _outcome(dataset: str, category: str, question: str, **fields: Any) -> QuestionOutcome:
    return QuestionOutcome(
        dataset_id=dataset, category_name=category, scored=True, question_id=question, **fields
    )


def _mixed_job() -> list[QuestionOutcome]:
    """Judged questions (one judge failure), multiple choice, an excluded category, a streaming
    dataset's points and a dataset scored by F1 alone."""
    rng = random.Random(4)
    outcomes = []
    for i in range(60):
        label = "CORRECT" if rng.random() < 0.6 else "WRONG"
        outcomes.append(
            _outcome(
                "locomo",
                ["single-hop", "temporal"][i % 2],
                f"c:q{i}",
                judge_label=label,
                judge_labels=[label],
                f1=rng.random(),
            )
        )
    outcomes.append(_outcome("locomo", "single-hop", "c:q99", judge_labels=[None]))
    for i in range(10):
        outcomes.append(
            _outcome(
                "locomo",
                "adversarial",
                f"c:a{i}",
                judge_label="WRONG",
                judge_labels=["WRONG"],
                f1=0.0,
            )
        )
    for i in range(30):
        outcomes.append(
            _outcome(
                "persona",
                "recall",
                f"p:q{i // 3}",
                multiple_choice=True,
                choice_correct=rng.random() < 0.5,
                point_index=i % 3 + 1,
            )
        )
    for i in range(25):
        outcomes.append(_outcome("gallery", "visual", f"g:q{i}", f1=rng.random()))
    return outcomes


def _cells(results: dict[str, Any]) -> list[dict[str, Any]]:
    cells = [results["overall"]]
    for dataset in results["datasets"].values():
        cells.append(dataset["overall"])
        cells.extend(dataset["categories"].values())
        cells.extend((dataset.get("points") or {}).values())
        cells.extend((dataset.get("task_types") or {}).values())
    return cells


def test_every_headline_figure_has_an_interval_that_holds_it() -> None:
    excluded = {"locomo": ["adversarial"]}
    results = aggregate("j", "completed", _mixed_job(), excluded).model_dump(mode="json")
    cells = _cells(results)
    headlines = {cell["headline"] for cell in cells}
    assert headlines == {"accuracy", "f1_mean"}
    assert any(results["datasets"]["persona"].get("points") or {})
    for cell in cells:
        figure = cell[cell["headline"]]
        assert figure is not None
        interval = cell["headline_ci"]
        assert 0.0 <= interval["low"] <= figure <= interval["high"] <= 1.0, cell
    # Every answer wrong: every resample is 0.
    adversarial = results["datasets"]["locomo"]["categories"]["adversarial"]["headline_ci"]
    assert adversarial == {"low": 0.0, "high": 0.0}
    assert results["overall"]["headline_ci"]["low"] < results["overall"]["headline_ci"]["high"]


def test_a_cell_without_a_headline_figure_has_no_interval() -> None:
    failed = QuestionOutcome(dataset_id="d", category_name="c", scored=False)
    results = aggregate("j", "completed", [failed], {})
    assert results.overall.accuracy is None and results.overall.headline_ci is None
    assert "headline_ci" not in results.model_dump(mode="json")["overall"]


def test_a_coding_jobs_resolved_rate_has_its_interval() -> None:
    attempts = [
        _outcome("coding", "relevant", f"t{i}:relevant", resolved=i < 5, task_type="debug")
        for i in range(8)
    ]
    results = aggregate("j", "completed", attempts, {})
    assert results.overall.headline == "resolved_rate"
    interval = results.overall.headline_ci
    assert interval is not None
    assert (interval.low, interval.high) == percentile_interval([1.0] * 5 + [0.0] * 3)


def _without_intervals(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_intervals(v) for k, v in value.items() if k != "headline_ci"}
    return value


def test_the_intervals_leave_the_results_fingerprint_unchanged() -> None:
    """The same numbers have the fingerprint they had before intervals were reported, so a
    published result stays a duplicate of itself (R-3.8)."""
    datasets = aggregate("j", "completed", _mixed_job(), {}).model_dump(mode="json")["datasets"]
    before = _without_intervals(datasets)
    assert before != datasets
    assert results_fingerprint(datasets) == results_fingerprint(before)
    # Another interval for the same numbers (another seed) is still the same result...
    moved = _without_intervals(datasets)
    moved["locomo"]["overall"]["headline_ci"] = {"low": 0.0, "high": 1.0}
    assert results_fingerprint(moved) == results_fingerprint(datasets)
    # ... while a category that happens to be named like the interval still counts.
    named = _without_intervals(datasets)
    named["locomo"]["categories"]["headline_ci"] = named["locomo"]["categories"]["temporal"]
    assert results_fingerprint(named) != results_fingerprint(before)


@pytest.mark.parametrize("which", ["accuracy", "f1_mean", "resolved_rate"])
def test_the_kept_values_are_what_overall_is_the_mean_of(which: str) -> None:
    """`headline_values`: what the board's ties compare, the questions counted in Overall,
    keyed across jobs (a streaming item by its point)."""
    if which == "accuracy":
        outcomes = [o for o in _mixed_job() if o.dataset_id != "gallery"]
        excluded = {"locomo": ["adversarial"]}
    elif which == "f1_mean":
        outcomes = [o for o in _mixed_job() if o.dataset_id == "gallery"]
        excluded = {}
    else:
        outcomes = [
            _outcome("coding", "noisy", f"t{i}:noisy", resolved=i % 3 == 0) for i in range(9)
        ]
        outcomes.append(
            QuestionOutcome(
                dataset_id="coding",
                category_name="noisy",
                scored=False,
                failure_kind="platform_error",
                question_id="t9:noisy",
            )
        )
        excluded = {}
    results = aggregate("j", "completed", outcomes, excluded)
    headline = results.overall.headline
    assert headline == which
    values = headline_values(outcomes, excluded, headline)
    figure = getattr(results.overall, headline)
    assert sum(values.values()) / len(values) == pytest.approx(figure, abs=1e-15)
    if which == "accuracy":
        # Judge failure and excluded category out; each point of a streaming question apart.
        assert len(values) == 60 + 30
        assert "locomo/c:q99" not in values and "locomo/c:a0" not in values
        assert {"persona/p:q0@1", "persona/p:q0@2", "persona/p:q0@3"} <= values.keys()
    if which == "resolved_rate":
        assert len(values) == 9
