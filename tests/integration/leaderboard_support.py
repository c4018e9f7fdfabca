"""Seeding for the publication and leaderboard tests: a finished full run as the scheduler
writes it, gated as the publisher leaves it, ready for admin review through the real API; a
coding run's too, with its attempts' plan and stage records as the stages write them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, get_args

from aml_contract.api.publication import GateCheckName
from aml_contract.messages import QuestionStage
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_runtime.clock import now_us
from aml_runtime.db import Document
from aml_runtime.documents import QuestionDocument
from aml_runtime.stores import Stores

DATASET = "locomo_refined"
CATEGORIES = ("single-hop", "multi-hop", "temporal", "open-domain")
PER_CATEGORY = 10
RELEASE: dict[str, str] = {
    "spec_hash": "5" * 64,
    "code_hash": "c" * 64,
    "dataset_bundle_hash": "d" * 64,
}
ANSWER_MODEL = "gpt-4o-mini"


def version_body(team: str, system: str, label: str, **changes: Any) -> dict[str, Any]:
    """`POST /v1/admin/versions`: the URLs are only checked (loopback allowed), never called."""
    base = "http://127.0.0.1:9"
    return {
        "team": team,
        "system_name": system,
        "version_label": label,
        "track": "textual",
        "board": "industrial",
        "add_url": f"{base}/add",
        "search_url": f"{base}/search",
        "health_url": f"{base}/health",
        "memory_system_key": f"msk-secret-{system}-{label}",
        **changes,
    }


def results(job_id: str, correct: Mapping[str, int], excluded: str | None = None) -> dict[str, Any]:
    """What the scheduler stores as `results`: `correct[category]` of PER_CATEGORY questions
    judged CORRECT (F1 1.0, BLEU-1 0.8; the others 0.25 and 0.2) in each category of DATASET,
    and in `excluded`, a category Overall leaves out, when given."""
    exclusions = {DATASET: [excluded]} if excluded else {}
    return aggregate(job_id, "completed", outcomes(correct, excluded), exclusions).model_dump(
        mode="json"
    )


def outcomes(correct: Mapping[str, int], excluded: str | None = None) -> list[QuestionOutcome]:
    """The question outcomes behind `results`."""
    categories = (*CATEGORIES, excluded) if excluded else CATEGORIES
    return [
        QuestionOutcome(
            dataset_id=DATASET,
            category_name=category,
            scored=True,
            judge_label="CORRECT" if index < correct.get(category, 0) else "WRONG",
            f1=1.0 if index < correct.get(category, 0) else 0.25,
            bleu1=0.8 if index < correct.get(category, 0) else 0.2,
            question_id=f"conv-{index}:q{position}",
        )
        for position, category in enumerate(categories)
        for index in range(PER_CATEGORY)
    ]


def gate(at: datetime, passed: bool = True) -> Document:
    """The publisher's gate outcome, every check passed (or the last one failed)."""
    names = get_args(GateCheckName)
    checks = [
        {
            "name": name,
            "passed": passed or index < len(names) - 1,
            "reason": f"{name}: equal to the release baseline"
            if passed or index < len(names) - 1
            else f"{name}: equal to a published result",
        }
        for index, name in enumerate(names)
    ]
    return {"checks": checks, "passed": passed, "at": at}


def finished_job(
    team_id: str,
    version_id: str,
    correct: Mapping[str, int],
    at: datetime,
    *,
    track: str = "textual",
    review_state: str | None = "pending_review",
    state: str = "completed",
    mode: str = "full",
) -> Document:
    """A job document as the gateway creates it and the scheduler ends it, gated by the
    publisher (`review_state`, `gate`) unless `review_state` is None."""
    job_id = f"j{uuid.uuid4().hex[:12]}"
    label = f"run-{job_id}"
    job: Document = {
        "_id": job_id,
        "team_id": team_id,
        "version_id": version_id,
        "mode": mode,
        "track": track,
        "run_label": label,
        "run_label_key": f"{team_id}/{label}",
        "submission_seq": 0,
        "submission_key": f"{team_id}/seed-{job_id}",
        "datasets": [DATASET],
        "state": state,
        "planned": True,
        "created_at": at,
        "started_at": at,
        "totals": {"add": 8, "questions": PER_CATEGORY * len(CATEGORIES)},
        "spec": {"answer_model": ANSWER_MODEL, "judge_model": ANSWER_MODEL, "top_k": "100"},
        **RELEASE,
        "dataset_bundles": {DATASET: RELEASE["dataset_bundle_hash"]},
    }
    if state in ("completed", "failed"):
        job["finished_at"] = at
    if state == "completed":
        job["results"] = results(job_id, correct)
    if review_state is not None:
        job["review_state"] = review_state
        job["gate"] = gate(at, passed=review_state != "gate_failed")
    return job


# -- the coding track --------------------------------------------------------------------------

CODING_DATASET = "synthetic-coding"
CODING_TASKS = 8
CONDITIONS = ("relevant", "noisy")


class SeedAttempt(NamedTuple):
    """One coding attempt as its stages leave it: verified (`resolved`, with the verdict's
    `reason`), or failed at `failed_at` (then `resolved` is None and `reason` the failure's)."""

    task: str
    condition: str
    task_type: str
    resolved: bool | None
    reason: str
    end_reason: str = "submitted"
    steps: int = 9
    failed_at: QuestionStage | None = None
    failure_kind: str = "platform_error"

    @property
    def question_id(self) -> str:
        return f"{self.task}:{self.condition}"


def coding_attempts(resolved: Mapping[str, int]) -> list[SeedAttempt]:
    """CODING_TASKS verified attempts per condition, `resolved[condition]` of them resolved;
    the first half of the tasks are debug ones, the others development ones."""
    return [
        SeedAttempt(
            task=f"task-{index:02d}",
            condition=condition,
            task_type="debug" if index < CODING_TASKS // 2 else "development",
            resolved=index < resolved.get(condition, 0),
            reason="every FAIL_TO_PASS test passes"
            if index < resolved.get(condition, 0)
            else "1 of 2 FAIL_TO_PASS tests still fail",
        )
        for index in range(CODING_TASKS)
        for condition in CONDITIONS
    ]


def coding_results(job_id: str, attempts: Sequence[SeedAttempt]) -> dict[str, Any]:
    """What the scheduler stores as a coding job's `results` for these attempts."""
    outcomes = [
        QuestionOutcome(
            dataset_id=CODING_DATASET,
            category_name=attempt.condition,
            scored=attempt.failed_at is None,
            failure_kind=attempt.failure_kind if attempt.failed_at else None,
            resolved=attempt.resolved,
            task_type=attempt.task_type,
            question_id=attempt.question_id,
        )
        for attempt in attempts
    ]
    return aggregate(job_id, "completed", outcomes, {}).model_dump(mode="json")


def finished_coding_job(
    team_id: str,
    version_id: str,
    attempts: Sequence[SeedAttempt],
    at: datetime,
    **fields: Any,
) -> Document:
    """`finished_job` of a coding version: CODING_DATASET's attempts and their results."""
    job = finished_job(team_id, version_id, {}, at, track="coding", **fields)
    job["datasets"] = [CODING_DATASET]
    job["dataset_bundles"] = {CODING_DATASET: RELEASE["dataset_bundle_hash"]}
    job["totals"] = {"add": 2 * len(attempts), "questions": len(attempts)}
    if "results" in job:
        job["results"] = coding_results(job["_id"], attempts)
    return job


async def seed_attempts(
    stores: Stores, job_id: str, attempts: Sequence[SeedAttempt], at: datetime
) -> list[str]:
    """Plan the attempts and write their stage records as the stages do (`store_outcome`);
    return their item ids. A verified attempt's records carry bodies (a patch, a trajectory,
    a test log) that no page of attempts may show."""
    questions = [
        QuestionDocument.model_validate(
            {
                "_id": f"{job_id}/{CODING_DATASET}/{attempt.question_id}",
                "job_id": job_id,
                "conversation_id": attempt.question_id,
                "dataset_id": CODING_DATASET,
                "question_id": attempt.question_id,
                "user_id": f"eval:{job_id}:{CODING_DATASET}:{attempt.question_id}",
                "question": f"Fix {attempt.task}.",
                "category": CONDITIONS.index(attempt.condition) + 1,
                "category_name": attempt.condition,
                "gold_answer": attempt.task,
                "f1_variant": "f1-locomo-v1",
                "scorer": "swe_resolved",
                "coding_task": attempt.task,
                "task_type": attempt.task_type,
                "top_k": 100,
            }
        )
        for attempt in attempts
    ]
    await stores.plans.insert_questions(questions)
    for question, attempt in zip(questions, attempts, strict=True):
        stages: list[tuple[QuestionStage, Document]] = [
            ("search", {"state": "done", "candidates": [], "n_candidates": 0}),
            (
                "answer",
                {
                    "state": "done",
                    "answer": "diff --git a/SECRET-PATCH b/SECRET-PATCH\n",
                    "end_reason": attempt.end_reason,
                    "steps": attempt.steps,
                    "trajectory": [{"role": "assistant", "content": "SECRET-TRAJECTORY"}],
                },
            ),
            (
                "score",
                {
                    "state": "done",
                    "dataset_id": CODING_DATASET,
                    "category_name": attempt.condition,
                    "resolved": attempt.resolved,
                    "reason": attempt.reason,
                    "coding_task": attempt.task,
                    "task_type": attempt.task_type,
                    "test_log": "SECRET-TEST-LOG",
                },
            ),
        ]
        for stage, fields in stages:
            if stage == attempt.failed_at:
                failed = {"failure_kind": attempt.failure_kind, "failure": attempt.reason}
                fields = {"state": "failed", **failed}
            await stores.records.store_outcome(stage, question.id, job_id, at, now_us(), fields)
            if stage == attempt.failed_at:
                break
    return [question.id for question in questions]
