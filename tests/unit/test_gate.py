"""The publication gate (R-3.8) case by case: each check failing alone blocks publication with a
reason naming the compared values; a job that passes every check is publishable."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from aml_contract.api.publication import GateCheck, GateCheckName, ReleaseBaseline
from aml_evaluation.aggregate import results_fingerprint
from aml_publisher.gate import (
    CHECK_NAMES,
    NO_BASELINE,
    JobFacts,
    PublishedFacts,
    StageCounts,
    gate_passed,
    job_facts,
    run_gate,
)
from aml_publisher.settings import PublisherSettings

BASELINE = ReleaseBaseline(
    answer_model="gpt-4o-mini",
    spec_hash="spec-1",
    code_hash="code-1",
    dataset_bundle_hash="bundle-1",
    question_counts={"locomo_refined": 10, "synthetic": 3},
)


def metrics(questions: int) -> dict[str, Any]:
    return {
        "questions": questions,
        "scored": questions,
        "failed": 0,
        "failures": {},
        "accuracy": 0.5,
        "judge_correct": questions // 2,
        "judge_accuracy": 0.5,
        "f1_mean": 0.25,
    }


def results(overall: float = 0.5) -> dict[str, Any]:
    """A stored JobResults dump: LoCoMo's adversarial category is excluded from its overall
    but its questions still count."""
    locomo = {
        "dataset_id": "locomo_refined",
        "overall": metrics(8) | {"accuracy": overall},
        "categories": {"single-hop": metrics(8), "adversarial": metrics(2)},
        "excluded_from_overall": ["adversarial"],
    }
    synthetic = {
        "dataset_id": "synthetic",
        "overall": metrics(3),
        "categories": {"facts": metrics(3)},
        "excluded_from_overall": [],
    }
    return {
        "job_id": "j1",
        "state": "completed",
        "overall": metrics(11),
        "datasets": {"locomo_refined": locomo, "synthetic": synthetic},
    }


FINGERPRINT = results_fingerprint(results()["datasets"])


def good_job(**changes: Any) -> JobFacts:
    job = JobFacts(
        job_id="j1",
        mode="full",
        state="completed",
        version_id="ver-1",
        track="textual",
        answer_model="gpt-4o-mini",
        spec_hash="spec-1",
        code_hash="code-1",
        dataset_bundle_hash="bundle-1",
        totals={"add": 4, "questions": 13},
        stages={
            "add": StageCounts(done=4),
            "search": StageCounts(done=13),
            "answer": StageCounts(done=13),
            "score": StageCounts(done=13),
        },
        errors=0,
        question_counts={"locomo_refined": 10, "synthetic": 3},
        results_fingerprint=FINGERPRINT,
    )
    return job.model_copy(update=changes)


def by_name(checks: list[GateCheck]) -> dict[str, GateCheck]:
    return {check.name: check for check in checks}


def failing(checks: list[GateCheck]) -> dict[str, str]:
    return {check.name: check.reason for check in checks if not check.passed}


def test_all_checks_pass_in_order() -> None:
    checks = run_gate(good_job(), BASELINE, [])
    assert [check.name for check in checks] == list(get_args(GateCheckName))
    assert get_args(GateCheckName) == CHECK_NAMES
    assert failing(checks) == {}
    assert gate_passed(checks)
    reasons = by_name(checks)
    assert reasons["mode_full"].reason == "mode is 'full'"
    assert reasons["all_items_succeeded"].reason == (
        "job completed; done: add 4/4, search 13/13, answer 13/13, score 13/13; no failed item, "
        "error summary empty"
    )
    assert reasons["spec_hash"].reason == "evaluation spec hash 'spec-1' equals the baseline"
    assert reasons["question_counts"].reason == "locomo_refined 10, synthetic 3 equal the baseline"
    assert reasons["not_duplicate"].reason == (
        f"no published entry for version ver-1 on track textual, and results fingerprint "
        f"{FINGERPRINT[:12]} matches none of 0 published entries"
    )


def test_no_checks_is_not_a_pass() -> None:
    assert not gate_passed([])


@pytest.mark.parametrize(
    ("changes", "name", "reason"),
    [
        (
            {"mode": "smoke"},
            "mode_full",
            "mode is 'smoke', not 'full': only full runs are published",
        ),
        ({"mode": None}, "mode_full", "missing: the job records no mode"),
        (
            {"stages": {**good_job().stages, "search": StageCounts(done=12, failed=1)}},
            "all_items_succeeded",
            "search: 12 of 13 done, 1 failed",
        ),
        (
            {"stages": {**good_job().stages, "add": StageCounts(done=3, failed=1)}},
            "all_items_succeeded",
            "add: 3 of 4 done, 1 failed",
        ),
        (
            {"stages": {**good_job().stages, "score": StageCounts(done=12)}},
            "all_items_succeeded",
            "score: 12 of 13 done, 0 failed",
        ),
        ({"errors": 2}, "all_items_succeeded", "2 entries in the error summary"),
        (
            {"state": "failed", "failure": "contract violation"},
            "all_items_succeeded",
            "job state is 'failed', not 'completed' (contract violation)",
        ),
        ({"totals": None}, "all_items_succeeded", "missing: the job records no planned totals"),
        (
            {"answer_model": "gpt-4o"},
            "answer_model",
            "answer model 'gpt-4o' differs from the baseline 'gpt-4o-mini'",
        ),
        (
            {"answer_model": None},
            "answer_model",
            "missing: the job records no answer model (baseline 'gpt-4o-mini')",
        ),
        (
            {"spec_hash": "spec-0"},
            "spec_hash",
            "evaluation spec hash 'spec-0' differs from the baseline 'spec-1'",
        ),
        (
            {"spec_hash": None},
            "spec_hash",
            "missing: the job records no evaluation spec hash (baseline 'spec-1')",
        ),
        (
            {"code_hash": "code-0"},
            "code_hash",
            "pipeline code hash 'code-0' differs from the baseline 'code-1'",
        ),
        (
            {"code_hash": None},
            "code_hash",
            "missing: the job records no pipeline code hash (baseline 'code-1')",
        ),
        (
            {"code_hashes": ["code-1", "code-2"]},
            "code_hash",
            "mixed code: the job's items were processed by builds code-1, code-2 (submitted under "
            "code-1): the services were replaced mid-job (a rolling upgrade), the platform's "
            "doing; run the job again",
        ),
        (
            {"code_hashes": ["code-2"]},
            "code_hash",
            "mixed code: the job's items were processed by builds code-2 (submitted under "
            "code-1): the services were replaced mid-job (a rolling upgrade), the platform's "
            "doing; run the job again",
        ),
        (
            {"dataset_bundle_hash": "bundle-0"},
            "dataset_bundle_hash",
            "dataset bundle hash 'bundle-0' differs from the baseline 'bundle-1'",
        ),
        (
            {"dataset_bundle_hash": None},
            "dataset_bundle_hash",
            "missing: the job records no dataset bundle hash (baseline 'bundle-1')",
        ),
        (
            {"question_counts": {"locomo_refined": 8, "synthetic": 3}},
            "question_counts",
            "locomo_refined: 8 questions, baseline 10",
        ),
        (
            {"question_counts": {"locomo_refined": 10}},
            "question_counts",
            "synthetic: not in the results (baseline 3)",
        ),
        (
            {"question_counts": {"locomo_refined": 10, "synthetic": 3, "extra": 5}},
            "question_counts",
            "extra: 5, not in the baseline",
        ),
        (
            {"question_counts": None, "results_fingerprint": FINGERPRINT},
            "question_counts",
            "missing: the job has no results to count (baseline locomo_refined 10, synthetic 3)",
        ),
        ({"version_id": None}, "not_duplicate", "missing: version_id"),
    ],
)
def test_each_check_failing_alone_blocks_publication(
    changes: dict[str, Any], name: str, reason: str
) -> None:
    checks = run_gate(good_job(**changes), BASELINE, [])
    assert failing(checks) == {name: reason}
    assert not gate_passed(checks)


def test_without_a_baseline_every_baseline_check_fails() -> None:
    checks = run_gate(good_job(), None, [])
    baseline_checks = ["answer_model", "spec_hash", "code_hash", "dataset_bundle_hash"]
    assert failing(checks) == {name: NO_BASELINE for name in [*baseline_checks, "question_counts"]}


def entry(**changes: Any) -> PublishedFacts:
    published = PublishedFacts(
        entry_id="lb-1",
        job_id="j0",
        version_id="ver-0",
        track="textual",
        results_fingerprint="0" * 64,
    )
    return published.model_copy(update=changes)


def test_duplicate_by_version_and_track() -> None:
    checks = run_gate(good_job(), BASELINE, [entry(version_id="ver-1")])
    assert failing(checks) == {
        "not_duplicate": "version ver-1 on track textual is already published (entry lb-1)"
    }


def test_same_version_on_another_track_is_not_a_duplicate() -> None:
    checks = run_gate(good_job(), BASELINE, [entry(version_id="ver-1", track="multimodal")])
    assert gate_passed(checks)
    assert "matches none of 1 published entries" in by_name(checks)["not_duplicate"].reason


def test_duplicate_by_results_fingerprint() -> None:
    checks = run_gate(good_job(), BASELINE, [entry(results_fingerprint=FINGERPRINT)])
    assert failing(checks) == {
        "not_duplicate": f"results fingerprint {FINGERPRINT[:12]} equals that of published "
        "entry lb-1"
    }


def test_a_disqualified_entry_is_not_a_duplicate_of_its_version() -> None:
    checks = run_gate(good_job(), BASELINE, [entry(version_id="ver-1", disqualified=True)])
    assert gate_passed(checks)


def test_copied_results_of_a_disqualified_entry_are_still_a_duplicate() -> None:
    disqualified = entry(results_fingerprint=FINGERPRINT, disqualified=True)
    checks = run_gate(good_job(), BASELINE, [disqualified])
    assert failing(checks) == {
        "not_duplicate": f"results fingerprint {FINGERPRINT[:12]} equals that of disqualified "
        "published entry lb-1"
    }


def test_a_job_is_not_a_duplicate_of_its_own_entry() -> None:
    own = entry(job_id="j1", version_id="ver-1", results_fingerprint=FINGERPRINT)
    assert gate_passed(run_gate(good_job(), BASELINE, [own]))


def test_a_smoke_job_fails_with_every_reason_that_applies() -> None:
    checks = run_gate(good_job(mode="smoke", spec_hash="spec-0"), BASELINE, [])
    assert set(failing(checks)) == {"mode_full", "spec_hash"}


# -- reading the stored job document ----------------------------------------------------------


def job_document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "_id": "j1",
        "team_id": "team-1",
        "version_id": "ver-1",
        "mode": "full",
        "track": "textual",
        "state": "completed",
        "planned": True,
        "spec": {"spec_hash": "spec-1", "answer_model": "gpt-4o-mini", "top_k": "100"},
        "spec_hash": "spec-1",
        "code_hash": "code-1",
        "dataset_bundle_hash": "bundle-1",
        "totals": {"add": 4, "questions": 13},
        "results": results(),
    }
    return document | changes


def test_job_facts_from_the_stored_document() -> None:
    stages = {stage: StageCounts(done=13) for stage in ("search", "answer", "score")}
    facts = job_facts(job_document(), {"add": StageCounts(done=4), **stages}, 0)
    assert facts == good_job()
    assert gate_passed(run_gate(facts, BASELINE, []))


def test_one_build_recorded_on_the_job_passes_and_two_do_not() -> None:
    stages = {stage: StageCounts(done=13) for stage in ("search", "answer", "score")}
    stages["add"] = StageCounts(done=4)
    # As nx-27017 keeps a `$set` true: 1.
    one = job_facts(job_document(code_hashes={"code-1": 1}), stages, 0)
    assert one.code_hashes == ["code-1"]
    assert gate_passed(run_gate(one, BASELINE, []))
    two = job_facts(job_document(code_hashes={"code-2": True, "code-1": True}), stages, 0)
    assert two.code_hashes == ["code-1", "code-2"]
    assert set(failing(run_gate(two, BASELINE, []))) == {"code_hash"}


def test_question_counts_include_excluded_categories() -> None:
    facts = job_facts(job_document(), {}, 0)
    assert facts.question_counts == {"locomo_refined": 10, "synthetic": 3}
    assert job_facts(job_document(results={"datasets": {}}), {}, 0).question_counts == {}


def test_a_failed_job_without_results_is_missing_them() -> None:
    document = job_document(state="failed", failure="Health check failed")
    del document["results"]
    facts = job_facts(document, {}, 1)
    reasons = failing(run_gate(facts, BASELINE, []))
    assert set(reasons) == {"all_items_succeeded", "question_counts", "not_duplicate"}
    assert reasons["not_duplicate"] == "missing: results fingerprint (no results)"
    assert reasons["all_items_succeeded"].startswith(
        "job state is 'failed', not 'completed' (Health check failed); add: 0 of 4 done, 0 failed"
    )


def test_items_failed_by_the_platform_are_named_as_its_failure() -> None:
    """The answer model was down for two questions: the gate fails, saying first whose failure
    it was and that the team is not charged."""
    reason = "2 questions failed by the platform (platform_error)"
    stages = {"add": StageCounts(done=4), "search": StageCounts(done=13),
              "answer": StageCounts(done=11, failed=2), "score": StageCounts(done=11)}  # fmt: skip
    document = job_document(platform_failures=2, platform_failure_reason=reason)
    facts = job_facts(document, stages, 2)
    assert (facts.platform_failures, facts.platform_failure_reason) == (2, reason)
    reasons = failing(run_gate(facts, BASELINE, []))
    assert set(reasons) == {"all_items_succeeded"}
    assert reasons["all_items_succeeded"] == (
        f"{reason}: the platform's failure, not the participant's; the run is not charged to "
        "the team's quota; answer: 11 of 13 done, 2 failed; score: 11 of 13 done, 0 failed; "
        "2 entries in the error summary"
    )
    # A clean job records none.
    assert job_facts(job_document(platform_failures=0), {}, 0).platform_failures == 0


def test_fingerprint_is_canonical() -> None:
    datasets = results()["datasets"]
    reordered = dict(reversed(list(datasets.items())))
    assert results_fingerprint(reordered) == FINGERPRINT
    # A store that reads 1.0 back as 1 gives the same fingerprint.
    assert results_fingerprint({"a": {"x": 1.0}}) == results_fingerprint({"a": {"x": 1}})
    assert results_fingerprint(results(overall=0.75)["datasets"]) != FINGERPRINT


def test_baseline_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AML_RELEASE_BASELINE", BASELINE.model_dump_json())
    assert PublisherSettings().release_baseline == BASELINE
    monkeypatch.setenv("AML_RELEASE_BASELINE", "")
    assert PublisherSettings().release_baseline is None
    monkeypatch.delenv("AML_RELEASE_BASELINE")
    assert PublisherSettings().release_baseline is None
