"""The coding track's results (R-2.5): a verified attempt is a verdict (resolved or not), an
attempt the platform failed is a failure and never unresolved; resolved / attempts per condition
(the categories), per dataset, Overall and per task type; earlier results keep their fields and
fingerprints; the evaluation spec of coding jobs holds the agent and the verify rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aml_contract.api.results import JobResults, Metrics
from aml_devtools.tables import render_results
from aml_evaluation.aggregate import QuestionOutcome, aggregate, results_fingerprint
from aml_evaluation.coding.grading import GRADING_VERSION
from aml_evaluation.confidence import headline_interval
from aml_gateway.ranking import headline
from aml_pipeline.coding_track import VERIFY_RULE
from aml_pipeline.evaluation_spec import build_evaluation_spec, coding_agent_config
from aml_runtime.documents import AnswerDocument, FailureKind, ScoreDocument, StageRecord
from aml_runtime.settings import EvaluationSettings
from aml_scheduler.handlers import question_outcome


def attempt(
    condition: str,
    resolved: bool | None,
    task_type: str = "debug",
    failure: str | None = None,
) -> QuestionOutcome:
    return QuestionOutcome(
        dataset_id="coding",
        category_name=condition,
        scored=failure is None,
        failure_kind=failure,
        resolved=resolved,
        task_type=task_type,
    )


OUTCOMES = [
    attempt("relevant", True, "debug"),
    attempt("relevant", True, "development"),
    attempt("relevant", False, "development"),
    attempt("noisy", True, "debug"),
    attempt("noisy", False, "debug"),
    attempt("noisy", False, "development"),
    # The LLM or the sandbox failed it: not an attempt, and not unresolved.
    attempt("noisy", None, "development", failure=FailureKind.PLATFORM_ERROR),
]


def coding_cell(attempts: int, resolved: int, failed: int = 0) -> Metrics:
    return Metrics(
        questions=attempts + failed,
        scored=attempts,
        failed=failed,
        failures={"platform_error": failed} if failed else {},
        judge_correct=0,
        judge_accuracy=None,
        f1_mean=None,
        headline="resolved_rate",
        attempts=attempts,
        resolved=resolved,
        resolved_rate=resolved / attempts,
        headline_ci=headline_interval(
            [1.0] * resolved + [0.0] * (attempts - resolved), resolved / attempts
        ),
    )


def test_resolved_per_condition_overall_and_task_type() -> None:
    results = aggregate("j1", "completed", OUTCOMES, excluded={"coding": []})
    coding = results.datasets["coding"]
    assert coding.categories == {
        "noisy": coding_cell(3, 1, failed=1),
        "relevant": coding_cell(3, 2),
    }
    assert coding.overall == coding_cell(6, 3, failed=1)
    assert results.overall == coding.overall
    assert coding.task_types == {
        "debug": coding_cell(3, 2),
        "development": coding_cell(3, 1, failed=1),
    }
    assert coding.points is None
    assert headline(results.overall) == 0.5
    assert coding.overall.accuracy is None  # no judge or option verdicts here
    dumped = results.model_dump(mode="json")
    assert dumped["overall"]["resolved_rate"] == 0.5
    assert set(dumped["datasets"]["coding"]["task_types"]) == {"debug", "development"}


def test_a_job_whose_attempts_all_failed_has_no_resolved_rate() -> None:
    failed = [attempt("relevant", None, failure=FailureKind.PLATFORM_ERROR)]
    cell = aggregate("j1", "completed", failed, excluded={}).overall
    assert (cell.attempts, cell.resolved_rate, cell.failed) == (None, None, 1)


# A results document as stored before the coding track (no attempts, task types): as the
# publication gate and the leaderboard read it.
STORED_BEFORE = json.loads(
    """{"job_id": "j0", "state": "completed",
    "overall": {"questions": 3, "scored": 2, "failed": 1, "failures": {"judge_failure": 1},
      "accuracy": 0.5, "judge_correct": 1, "judge_accuracy": 0.5, "unjudged": 0,
      "option_correct": 0, "option_questions": 0, "option_accuracy": null,
      "headline": "accuracy", "f1_mean": 0.25, "bleu1_mean": 0.2, "judge_runs": 1,
      "judge_run_accuracy_mean": 0.5, "judge_run_accuracy_spread": 0.0},
    "datasets": {"locomo": {"dataset_id": "locomo",
      "overall": {"questions": 3, "scored": 2, "failed": 1, "failures": {"judge_failure": 1},
        "accuracy": 0.5, "judge_correct": 1, "judge_accuracy": 0.5, "unjudged": 0,
        "option_correct": 0, "option_questions": 0, "option_accuracy": null,
        "headline": "accuracy", "f1_mean": 0.25, "bleu1_mean": 0.2, "judge_runs": 1,
        "judge_run_accuracy_mean": 0.5, "judge_run_accuracy_spread": 0.0},
      "categories": {"single-hop": {"questions": 3, "scored": 2, "failed": 1,
        "failures": {"judge_failure": 1}, "accuracy": 0.5, "judge_correct": 1,
        "judge_accuracy": 0.5, "unjudged": 0, "option_correct": 0, "option_questions": 0,
        "option_accuracy": null, "headline": "accuracy", "f1_mean": 0.25, "bleu1_mean": 0.2,
        "judge_runs": 1, "judge_run_accuracy_mean": 0.5, "judge_run_accuracy_spread": 0.0}},
      "excluded_from_overall": [], "f1_variant": "f1-locomo-v1"}}}"""
)


def test_earlier_results_keep_their_fields_and_fingerprint() -> None:
    # Read back and written again (what the API and the publisher do) it is the same document.
    again = JobResults.model_validate(STORED_BEFORE).model_dump(mode="json")
    assert again == STORED_BEFORE | {"track": None}
    assert results_fingerprint(again["datasets"]) == results_fingerprint(STORED_BEFORE["datasets"])
    # The same questions aggregated now give the same document: no coding field appears.
    outcomes = [
        QuestionOutcome(dataset_id="locomo", category_name="single-hop", scored=True,
                        judge_label=label, judge_labels=[label], f1=f1, bleu1=0.2)
        for label, f1 in (("CORRECT", 0.5), ("WRONG", 0.0))
    ] + [QuestionOutcome(dataset_id="locomo", category_name="single-hop", scored=True,
                         judge_labels=[None])]  # fmt: skip
    now = aggregate("j0", "completed", outcomes, excluded={}).model_dump(mode="json")
    assert results_fingerprint(now["datasets"]) == results_fingerprint(STORED_BEFORE["datasets"])
    # Only the intervals reported since (derived: outside the fingerprint) are new.
    locomo = now["datasets"]["locomo"]
    for cell in (locomo["overall"], *locomo["categories"].values()):
        assert cell.pop("headline_ci") is not None
    assert now["datasets"] == STORED_BEFORE["datasets"]


def test_the_results_table_shows_the_resolved_share() -> None:
    results = aggregate("j1", "completed", OUTCOMES, excluded={"coding": []})
    lines = render_results(results.model_dump(mode="json") | {"track": "coding"}).splitlines()
    assert lines[0] == "track coding: compare only with results of the same track"
    assert lines[1].split()[2:] == ["attempts", "resolved", "failed", "resolved", "%"]
    # Per condition (numbered, relevant first, as every coding dataset numbers them), the
    # dataset, each task type and Overall: attempts, resolved, failed by the platform, and
    # resolved % of the verified ones.
    rows = {" ".join(line.split()[:-4]): line.split()[-4:] for line in lines[3:8]}
    assert list(rows)[:2] == ["coding 1 relevant", "coding 2 noisy"]
    assert rows == {
        "coding 1 relevant": ["3", "2", "0", "66.7"],
        "coding 2 noisy": ["4", "1", "1", "33.3"],
        "coding (dataset)": ["7", "3", "1", "50.0"],
        "coding (type debug)": ["3", "2", "0", "66.7"],
        "coding (type development)": ["4", "1", "1", "33.3"],
    }
    assert lines[9].split() == ["Overall", "7", "3", "1", "50.0"]
    table = "\n".join(lines)
    # No judge, F1 or BLEU-1 columns: a coding attempt has none.
    assert " J " not in lines[1] and "F1" not in lines[1] and "BLEU" not in table
    assert "resolved % = resolved / verified attempts" in table
    assert "failed, by kind: platform_error 1" in table
    # Without a track, the attempts alone tell a coding job's results (`aml rescore`).
    assert "resolved %" in render_results(results.model_dump(mode="json"))
    plain = aggregate("j0", "completed", [], excluded={}).model_dump(mode="json")
    assert "resolved" not in render_results(plain)
    assert "resolved" not in render_results(plain | {"track": "textual"})


# --- the scheduler's reading of the records -------------------------------------------------


PLANNED = {"question_id": "t1:noisy", "dataset_id": "coding", "category_name": "noisy",
           "task_type": "debug"}  # fmt: skip


def test_a_verified_attempt_is_a_verdict_and_a_failed_one_a_failure() -> None:
    score = ScoreDocument.model_validate(
        {"_id": "j/coding/t1:noisy", "job_id": "j", "state": "done", "dataset_id": "coding",
         "category": 2, "category_name": "noisy", "resolved": False,
         "resolution": "RESOLVED_NO", "grading_version": GRADING_VERSION}
    )  # fmt: skip
    outcome = question_outcome(PLANNED, score)
    assert (outcome.scored, outcome.resolved, outcome.task_type) == (True, False, "debug")
    assert outcome.failure is None
    failed = StageRecord.model_validate(
        {"_id": "j/coding/t1:noisy", "job_id": "j", "state": "failed",
         "failure_kind": "platform_error", "failure": "gave up after 5 deliveries"}
    )  # fmt: skip
    outcome = question_outcome(PLANNED, failed)
    assert (outcome.scored, outcome.resolved, outcome.failure) == (False, None, "platform_error")
    assert outcome.task_type == "debug"
    # A textual question's record maps as before.
    textual = question_outcome({"dataset_id": "locomo", "category_name": "x"}, None)
    assert (textual.resolved, textual.task_type) == (None, None)


def test_the_coding_fields_are_typed_on_the_stage_documents() -> None:
    answer = AnswerDocument.model_validate(
        {"_id": "q", "job_id": "j", "state": "done", "answer": "", "end_reason": "wall_limit",
         "steps": 3, "tokens_in": 10, "tokens_out": 5, "agent": "mini-swe-agent 2.4.6",
         "agent_config_sha256": "0" * 64, "trajectory": [{"role": "system", "content": "x"}]}
    )  # fmt: skip
    assert (answer.end_reason, answer.steps, answer.trajectory) == (
        "wall_limit", 3, [{"role": "system", "content": "x"}],
    )  # fmt: skip


# --- the evaluation spec --------------------------------------------------------------------


def spec(coding: bool, **settings: Any) -> Any:
    return build_evaluation_spec(EvaluationSettings(**settings), coding=coding)


def test_the_coding_spec_holds_the_agent_and_the_verify_rules() -> None:
    coding = spec(True)
    assert coding.coding is not None
    agent = coding_agent_config(EvaluationSettings())
    assert coding.coding.agent == "mini-swe-agent 2.4.6"
    assert coding.coding.agent_config_sha256 == agent.fingerprint()
    assert coding.coding.agent_config == agent.model_dump(mode="json")
    assert (coding.coding.model.model, coding.coding.model.temperature) == ("gpt-4o-mini", 0.0)
    assert (coding.coding.verify, coding.coding.grading) == (VERIFY_RULE, GRADING_VERSION)
    assert coding.coding.verify_sandbox["wall_seconds"] == 1800.0
    summary = coding.summary()
    assert summary["coding.agent_config"] == agent.fingerprint()
    assert summary["coding.limits"] == "250 steps, 60.0 s per command, 1800.0 s per attempt"
    assert coding.content_hash != spec(False).content_hash


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("coding_step_limit", 100),
        ("coding_command_timeout_seconds", 30.0),
        ("coding_wall_seconds", 600.0),
        ("coding_memory_tokens", 500),
        ("coding_reply_max_tokens", 1024),
        ("coding_test_timeout_seconds", 900.0),
        ("answer_model", "other-model"),
    ],
)
def test_every_coding_setting_changes_the_coding_spec_only(field: str, value: object) -> None:
    assert spec(True, **{field: value}).content_hash != spec(True).content_hash
    if field.startswith("coding_"):
        # A textual or multimodal job's spec never depends on the coding settings.
        assert spec(False, **{field: value}).content_hash == spec(False).content_hash


def test_a_spec_without_the_coding_part_hashes_as_before() -> None:
    textual = spec(False)
    assert "coding" not in json.loads(textual.canonical_json())
    assert not any(key.startswith("coding.") for key in textual.summary())
