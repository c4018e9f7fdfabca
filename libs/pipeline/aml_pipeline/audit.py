"""The audit trail of participant calls (SPEC R-7.3): one document per HTTP attempt, keyed to its
work item by `item_id`, and on the attempt whose answer was judged, the outcome of the contract
validation.

The answered attempt is written once, with its validation: the validation follows within
microseconds (it is a check of the answer in memory), and a second database round trip per
participant call costs more than anything else the audit does. An answered attempt that is
never validated (the item failed some other way) is written without one when the recorder
closes. Attempts land in the order they were made (a held attempt is written before the next).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from aml_contract.api.vocabulary import Stage
from aml_pipeline.participants import Attempt
from aml_runtime.db import Document
from aml_runtime.metrics import participant_call
from aml_runtime.stores import Stores

VALID = "valid"


class CallRecorder:
    """The observer handed to the participant client for one item and one delivery; use it as
    an async context manager, so an answered attempt is written however the item ends."""

    def __init__(
        self,
        stores: Stores,
        job_id: str,
        stage: Stage,
        item_id: str,
        delivery: int,
        version_id: str = "",
    ) -> None:
        self._audit = stores.audit
        self._version_id = version_id
        # The work item: an Add's request_id (an Add chunk's item id is its request_id), or a
        # question's id; the audit API derives the Add's contract request_id from it.
        self._fields = {"job_id": job_id, "stage": stage, "item_id": item_id,
                        "delivery": delivery}  # fmt: skip
        # The last answered attempt, not yet written (it waits for its validation).
        self._held: Document | None = None
        # The last answered attempt once written without a validation.
        self._answered: Any = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def __call__(self, attempt: Attempt) -> None:
        participant_call(
            self._version_id, attempt.operation, attempt.status, attempt.error_class,
            attempt.latency_ms,
        )  # fmt: skip
        await self.close()
        record = {**self._fields, **attempt.model_dump()}
        if attempt.outcome == "ok":
            self._held = record
        else:
            await self._audit.record_attempt(record)

    async def validated(self, outcome: str) -> None:
        """`valid`, or the contract violation's reason, on the last answered attempt."""
        if self._held is not None:
            record, self._held = self._held, None
            await self._audit.record_attempt({**record, "validation": outcome})
        elif self._answered is not None:
            await self._audit.record_validation(self._answered, outcome)

    async def close(self) -> None:
        """Write a held answered attempt as it is (no validation came for it)."""
        if self._held is not None:
            record, self._held = self._held, None
            self._answered = await self._audit.record_attempt(record)
