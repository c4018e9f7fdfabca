"""The audit trail of participant calls (SPEC R-7.3): one document per HTTP attempt."""

from __future__ import annotations

from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.api import Stage
from aml_runtime.db import Document
from aml_runtime.participants import Attempt, Observer


def call_recorder(
    db: AsyncDatabase[Document], job_id: str, stage: Stage, request_id: str, delivery: int
) -> Observer:
    async def record(attempt: Attempt) -> None:
        await db.calls.insert_one(
            {
                "job_id": job_id,
                "stage": stage,
                "request_id": request_id,
                "delivery": delivery,
                **attempt.model_dump(),
            }
        )

    return record
