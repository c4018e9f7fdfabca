"""A coding job's attempts for its owner (R-2.5, R-3.7): one per task and memory condition, a
page at a time, from the planned questions and their stage records (`aml_runtime.stores`), so
the page shows why each attempt ended as it did, not only the shares of the results."""

from __future__ import annotations

from collections.abc import Mapping

from aml_contract.api.attempts import AttemptPage, AttemptStage, CodingAttempt
from aml_contract.messages import QuestionStage
from aml_runtime.db import Document
from aml_runtime.stores import Stores

PAGE_LIMIT = 200
# Checked in this order: a stage after a failed one has no record.
_STAGES: tuple[AttemptStage, ...] = ("search", "answer", "score")

Records = Mapping[QuestionStage, Mapping[str, Document]]


def coding_attempt(question: Document, records: Records) -> CodingAttempt:
    """What one attempt came to: the first stage that failed, else the verify stage's verdict,
    else pending (an attempt still on its way, or one of a job that failed before it)."""
    item_id = str(question["_id"])
    found = {stage: records.get(stage, {}).get(item_id) for stage in _STAGES}
    answer = found["answer"] or {}
    fields: Document = {
        "item_id": item_id,
        "dataset_id": question["dataset_id"],
        # The question id (`<task>:<condition>`) stands in where the plan names no task.
        "task": question.get("coding_task") or question["question_id"],
        "condition": question["category_name"],
        "task_type": question.get("task_type"),
        "end_reason": answer.get("end_reason"),
        "steps": answer.get("steps"),
    }
    for stage in _STAGES:
        record = found[stage]
        if record is not None and record["state"] == "failed":
            return CodingAttempt(
                **fields,
                outcome="failed",
                failed_at=stage,
                failure_kind=record.get("failure_kind"),
                reason=record.get("failure"),
            )
    score = found["score"]
    if score is None or score.get("resolved") is None:
        return CodingAttempt(**fields, outcome="pending")
    reason = score.get("reason")
    # Why no patch reached verification is the answer's to say (a diff refused, one too large).
    if answer.get("patch_rejected"):
        reason = f"{reason}: {answer['patch_rejected']}" if reason else answer["patch_rejected"]
    resolved = bool(score["resolved"])
    return CodingAttempt(
        **fields,
        outcome="resolved" if resolved else "unresolved",
        resolved=resolved,
        reason=reason,
    )


async def attempts_page(stores: Stores, job_id: str, after: str | None, limit: int) -> AttemptPage:
    questions = await stores.plans.attempts_page(job_id, after, limit)
    shown = questions[:limit]
    records = await stores.records.attempt_records([str(q["_id"]) for q in shown])
    attempts = [coding_attempt(question, records) for question in shown]
    more = len(questions) > limit
    return AttemptPage(attempts=attempts, next_cursor=attempts[-1].item_id if more else None)
