"""The audit trail of participant calls (SPEC R-7.3): one document per HTTP attempt, and on the
attempt whose answer was judged, the outcome of the contract validation."""

from __future__ import annotations

from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from aml_contract.api import Stage
from aml_runtime.db import Document
from aml_runtime.metrics import participant_call
from aml_runtime.participants import Attempt

VALID = "valid"


class CallRecorder:
    """The observer handed to the participant client for one item and one delivery."""

    def __init__(
        self,
        db: AsyncDatabase[Document],
        job_id: str,
        stage: Stage,
        request_id: str,
        delivery: int,
        version_id: str = "",
    ) -> None:
        self._db = db
        self._version_id = version_id
        self._fields = {"job_id": job_id, "stage": stage, "request_id": request_id,
                        "delivery": delivery}  # fmt: skip
        self._answered: Any = None

    async def __call__(self, attempt: Attempt) -> None:
        participant_call(
            self._version_id, attempt.operation, attempt.status, attempt.error_class,
            attempt.latency_ms,
        )  # fmt: skip
        result = await self._db.calls.insert_one({**self._fields, **attempt.model_dump()})
        if attempt.outcome == "ok":
            self._answered = result.inserted_id

    async def validated(self, outcome: str) -> None:
        """`valid`, or the contract violation's reason, on the last answered attempt."""
        if self._answered is not None:
            await self._db.calls.update_one(
                {"_id": self._answered}, {"$set": {"validation": outcome}}
            )
