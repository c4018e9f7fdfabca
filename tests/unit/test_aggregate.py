"""Aggregation of question outcomes (SPEC R-6.3): counts, exclusions, failures, micro-averages."""

from __future__ import annotations

import pytest

from aml_contract.api.results import Metrics
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_evaluation.confidence import headline_interval


def _q(
    category: str,
    label: str | None = "CORRECT",
    f1: float | None = None,
    *,
    dataset: str = "locomo",
    scored: bool = True,
) -> QuestionOutcome:
    return QuestionOutcome(
        dataset_id=dataset,
        category_name=category,
        scored=scored,
        judge_label=label,
        # A judge that ran and could not be read records its run's label as None.
        judge_labels=[None] if scored and label is None else [],
        f1=f1,
    )


def _metrics(
    questions: int, scored: int, failed: int, correct: int, f1: float | None = None
) -> Metrics:
    """Open questions judged once; unscored ones without a kind count as `failed`; the
    accuracy's interval over their verdicts (tests/unit/test_confidence.py tests it)."""
    verdicts = [1.0] * correct + [0.0] * (scored - correct)
    return Metrics(
        questions=questions,
        scored=scored,
        failed=failed,
        failures={"failed": failed} if failed else {},
        accuracy=correct / scored if scored else None,
        judge_correct=correct,
        judge_accuracy=correct / scored if scored else None,
        f1_mean=f1,
        headline_ci=headline_interval(verdicts, correct / scored) if scored else None,
    )


def test_counts_per_category_dataset_and_overall() -> None:
    outcomes = [
        _q("single-hop", "CORRECT", 1.0),
        _q("single-hop", "WRONG", 0.0),
        _q("single-hop", "CORRECT", 0.5),
        _q("temporal", "WRONG", 0.25),
    ]
    results = aggregate("job-1", "completed", outcomes, excluded={})
    assert results.job_id == "job-1"
    assert results.state == "completed"
    locomo = results.datasets["locomo"]
    assert locomo.dataset_id == "locomo"
    assert locomo.categories["single-hop"] == _metrics(3, 3, 0, 2, 0.5)
    assert locomo.categories["temporal"] == _metrics(1, 1, 0, 0, 0.25)
    assert locomo.overall == _metrics(4, 4, 0, 2, 1.75 / 4)
    assert results.overall == locomo.overall
    assert locomo.excluded_from_overall == []
    assert list(locomo.categories) == ["single-hop", "temporal"]


def test_excluded_category_reported_but_not_in_dataset_or_overall() -> None:
    outcomes = [
        _q("single-hop", "CORRECT", 1.0),
        _q("adversarial", "WRONG", 0.0),
        _q("adversarial", "WRONG", 0.0),
        _q("multi-hop", "WRONG", 0.0),
    ]
    results = aggregate("j", "completed", outcomes, excluded={"locomo": ["adversarial"]})
    locomo = results.datasets["locomo"]
    assert locomo.categories["adversarial"] == _metrics(2, 2, 0, 0, 0.0)
    assert locomo.overall == _metrics(2, 2, 0, 1, 0.5)
    assert results.overall == _metrics(2, 2, 0, 1, 0.5)
    assert locomo.excluded_from_overall == ["adversarial"]


def test_exclusion_is_per_dataset() -> None:
    outcomes = [
        _q("adversarial", "WRONG", dataset="locomo"),
        _q("adversarial", "CORRECT", dataset="other"),
    ]
    results = aggregate("j", "completed", outcomes, excluded={"locomo": ["adversarial"]})
    assert results.datasets["locomo"].overall.questions == 0
    assert results.datasets["other"].overall.questions == 1
    assert results.datasets["other"].excluded_from_overall == []
    assert results.overall == _metrics(1, 1, 0, 1)


def test_dataset_with_only_excluded_questions_has_empty_overall() -> None:
    results = aggregate(
        "j", "completed", [_q("adversarial", "CORRECT")], excluded={"locomo": ["adversarial"]}
    )
    assert results.datasets["locomo"].overall == _metrics(0, 0, 0, 0)
    assert results.datasets["locomo"].categories["adversarial"].questions == 1


def test_failures_are_counted_apart_not_as_wrong() -> None:
    outcomes = [
        _q("single-hop", "CORRECT", 1.0),
        _q("single-hop", "WRONG", 0.0),
        # Participant outage / contract error: never scored.
        _q("single-hop", None, None, scored=False),
        # Even with a stale label or f1, an unscored question is a failure.
        _q("single-hop", "WRONG", 0.9, scored=False),
        # Judge reply that could not be parsed.
        _q("single-hop", None, 0.7),
    ]
    metrics = aggregate("j", "running", outcomes, excluded={}).datasets["locomo"].overall
    assert metrics.questions == 5
    assert metrics.scored == 2
    assert metrics.failed == 3
    assert metrics.judge_correct == 1
    assert metrics.judge_accuracy == 0.5
    # f1 only over the scored questions.
    assert metrics.f1_mean == 0.5


def test_accuracy_none_when_nothing_scored() -> None:
    outcomes = [_q("temporal", None, scored=False), _q("temporal", None)]
    results = aggregate("j", "failed", outcomes, excluded={})
    for metrics in (results.overall, results.datasets["locomo"].overall):
        assert metrics.questions == 2
        assert metrics.scored == 0
        assert metrics.failed == 2
        assert metrics.judge_accuracy is None
        assert metrics.f1_mean is None


def test_no_outcomes_at_all() -> None:
    results = aggregate("j", "queued", [], excluded={"locomo": ["adversarial"]})
    assert results.datasets == {}
    assert results.overall == _metrics(0, 0, 0, 0)


def test_f1_mean_ignores_missing_f1() -> None:
    outcomes = [_q("c", "CORRECT", 0.2), _q("c", "CORRECT", None), _q("c", "WRONG", 0.6)]
    metrics = aggregate("j", "completed", outcomes, excluded={}).overall
    assert metrics.f1_mean == pytest.approx(0.4)
    assert metrics.judge_accuracy == 1.0 * 2 / 3


def test_two_datasets_micro_average() -> None:
    # Dataset a: 1/1 correct; dataset b: 1/4 correct. Macro would be 0.625, micro is 2/5.
    outcomes = [
        _q("x", "CORRECT", 1.0, dataset="a"),
        _q("y", "CORRECT", 1.0, dataset="b"),
        _q("y", "WRONG", 0.0, dataset="b"),
        _q("y", "WRONG", 0.0, dataset="b"),
        _q("z", "WRONG", 0.0, dataset="b"),
        _q("z", None, scored=False, dataset="b"),
    ]
    results = aggregate("j", "completed", outcomes, excluded={})
    assert sorted(results.datasets) == ["a", "b"]
    assert results.datasets["a"].overall == _metrics(1, 1, 0, 1, 1.0)
    assert results.datasets["b"].overall == _metrics(5, 4, 1, 1, 0.25)
    assert results.overall == _metrics(6, 5, 1, 2, 0.4)
    assert results.overall.judge_accuracy == pytest.approx(0.4)


def test_same_category_name_in_two_datasets_is_kept_apart() -> None:
    outcomes = [_q("temporal", "CORRECT", dataset="a"), _q("temporal", "WRONG", dataset="b")]
    results = aggregate("j", "completed", outcomes, excluded={})
    assert results.datasets["a"].categories["temporal"].judge_correct == 1
    assert results.datasets["b"].categories["temporal"].judge_correct == 0


def test_failures_are_counted_by_kind() -> None:
    outcomes = [
        QuestionOutcome(dataset_id="d", category_name="c", scored=False,
                        failure_kind="participant_outage"),
        QuestionOutcome(dataset_id="d", category_name="c", scored=False,
                        failure_kind="contract_error"),
        QuestionOutcome(dataset_id="d", category_name="c", scored=True, judge_labels=[None]),
        QuestionOutcome(dataset_id="d", category_name="c", scored=True, judge_label="WRONG",
                        judge_labels=["WRONG"], f1=0.0),
    ]  # fmt: skip
    metrics = aggregate("j", "completed", outcomes, excluded={}).overall
    assert metrics.failures == {
        "contract_error": 1,
        "judge_failure": 1,
        "participant_outage": 1,
    }
    assert (metrics.failed, metrics.scored, metrics.judge_correct) == (3, 1, 0)
    assert metrics.accuracy == 0.0  # one wrong answer; the failures are not wrong answers


def test_judge_runs_mean_and_spread() -> None:
    # Three runs over three questions. Run 1: 2/3 correct; run 2: 1/3; run 3: 2/2 (it could
    # not judge the third question). Majority labels: CORRECT, WRONG, CORRECT.
    runs = [
        ("CORRECT", ["CORRECT", "WRONG", "CORRECT"]),
        ("WRONG", ["WRONG", "WRONG", "CORRECT"]),
        ("CORRECT", ["CORRECT", "CORRECT", None]),
    ]
    outcomes = [
        QuestionOutcome(dataset_id="d", category_name="c", scored=True, judge_label=label,
                        judge_labels=labels)
        for label, labels in runs
    ]  # fmt: skip
    metrics = aggregate("j", "completed", outcomes, excluded={}).overall
    assert metrics.judge_runs == 3
    per_run = [2 / 3, 1 / 3, 2 / 2]
    mean = sum(per_run) / 3
    assert metrics.judge_run_accuracy_mean == pytest.approx(mean)
    spread = (sum((x - mean) ** 2 for x in per_run) / 3) ** 0.5
    assert metrics.judge_run_accuracy_spread == pytest.approx(spread)
    assert metrics.judge_accuracy == pytest.approx(2 / 3)


def test_multiple_choice_counts_in_accuracy_not_in_judge_or_f1() -> None:
    outcomes = [
        QuestionOutcome(dataset_id="d", category_name="mc", scored=True,
                        multiple_choice=True, choice_correct=True),
        QuestionOutcome(dataset_id="d", category_name="mc", scored=True,
                        multiple_choice=True, choice_correct=False),
        QuestionOutcome(dataset_id="d", category_name="mc", scored=True,
                        multiple_choice=True, choice_correct=None),
        QuestionOutcome(dataset_id="d", category_name="open", scored=True,
                        judge_label="CORRECT", judge_labels=["CORRECT"], f1=0.5, bleu1=0.25),
    ]  # fmt: skip
    results = aggregate("j", "completed", outcomes, excluded={}, f1_variants={"d": "f1-set-v1"})
    metrics = results.overall
    assert (metrics.scored, metrics.failed) == (3, 1)
    assert metrics.failures == {"unreadable_choice": 1}
    assert (metrics.option_questions, metrics.option_correct) == (2, 1)
    assert metrics.accuracy == pytest.approx(2 / 3)
    assert metrics.judge_accuracy == 1.0
    assert (metrics.f1_mean, metrics.bleu1_mean) == (0.5, 0.25)
    assert results.datasets["d"].f1_variant == "f1-set-v1"


def test_unjudged_questions_keep_f1_and_bleu_without_counting_as_failures() -> None:
    """Offline rescoring without a judge label for a question: its F1 and BLEU-1 count, it is
    neither correct, wrong nor failed, and judge accuracy is over the judged ones only."""
    outcomes = [
        _q("single-hop", "CORRECT", 1.0),
        QuestionOutcome(dataset_id="locomo", category_name="single-hop", scored=True,
                        judged=False, f1=0.5, bleu1=0.25),
        QuestionOutcome(dataset_id="locomo", category_name="temporal", scored=True,
                        judged=False, f1=0.0, bleu1=None),
        _q("temporal", None, 0.75),  # a judge that ran and could not be read: a failure
    ]  # fmt: skip
    results = aggregate("j", "completed", outcomes, excluded={})
    single = results.datasets["locomo"].categories["single-hop"]
    assert (single.questions, single.scored, single.failed, single.unjudged) == (2, 2, 0, 1)
    assert (single.judge_correct, single.judge_accuracy, single.accuracy) == (1, 1.0, 1.0)
    assert single.f1_mean == pytest.approx(0.75)
    assert single.bleu1_mean == pytest.approx(0.25)
    temporal = results.datasets["locomo"].categories["temporal"]
    assert (temporal.scored, temporal.unjudged, temporal.failures) == (1, 1, {"judge_failure": 1})
    assert temporal.judge_accuracy is None and temporal.accuracy is None
    assert temporal.f1_mean == 0.0  # the failed question's F1 is not counted
    assert temporal.bleu1_mean is None
    assert (results.overall.unjudged, results.overall.failed) == (2, 1)
