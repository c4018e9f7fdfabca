"""Seeding for the publication and leaderboard tests: a finished full run as the scheduler
writes it, gated as the publisher leaves it, ready for admin review through the real API."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, get_args

from aml_contract.api.publication import GateCheckName
from aml_evaluation.aggregate import QuestionOutcome, aggregate
from aml_runtime.db import Document

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
    categories = (*CATEGORIES, excluded) if excluded else CATEGORIES
    outcomes = [
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
    exclusions = {DATASET: [excluded]} if excluded else {}
    return aggregate(job_id, "completed", outcomes, exclusions).model_dump(mode="json")


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
