"""The audit trail of participant calls (aml_pipeline.audit) on nx-27017: one document per
attempt, in the order made, the answered one written once with its validation."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pymongo import ASCENDING, AsyncMongoClient, monitoring

from aml_pipeline.audit import VALID, CallRecorder
from aml_pipeline.participants import Attempt
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration


class _Writes(monitoring.CommandListener):
    def __init__(self) -> None:
        self.sent: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in {"insert", "update"}:
            self.sent.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _attempt(number: int, status: int, outcome: str, operation: str = "search") -> Attempt:
    return Attempt.model_validate(
        {"operation": operation, "attempt": number, "started_at": datetime.now(UTC),
         "latency_ms": 5.0, "status": status, "error_class": None, "outcome": outcome}
    )  # fmt: skip


@pytest.fixture
async def audit(mongo_url: str, request: pytest.FixtureRequest) -> Any:
    writes = _Writes()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url, event_listeners=[writes])
    yield client[f"aml_audit_{request.node.name[:40]}"], writes
    await client.close()


async def test_the_answered_attempt_is_written_once_with_its_validation(audit: Any) -> None:
    db, writes = audit
    async with CallRecorder(Stores.over(db), "j1", "search", "j1/q0001", delivery=1) as observe:
        await observe(_attempt(1, 503, "retry"))
        await observe(_attempt(2, 200, "ok"))
        await observe.validated(VALID)
    calls = await db.calls.find({"job_id": "j1"}).sort("_id", ASCENDING).to_list()
    assert [(c["attempt"], c["status"], c.get("validation")) for c in calls] == [
        (1, 503, None),
        (2, 200, VALID),
    ]
    # Keyed to the work item, a question here; only an Add has a (contract) request_id.
    assert all(c["item_id"] == "j1/q0001" and "request_id" not in c for c in calls)
    # One insert per attempt, no update: the validation went in with the answered attempt.
    assert writes.sent == ["insert", "insert"]


async def test_a_contract_violation_is_recorded_on_the_answered_attempt(audit: Any) -> None:
    db, _ = audit
    async with CallRecorder(Stores.over(db), "j2", "search", "j2/q0001", delivery=2) as observe:
        await observe(_attempt(1, 200, "ok"))
        await observe.validated("search response: items is not a list")
    call = await db.calls.find_one({"job_id": "j2"})
    assert call is not None
    assert call["validation"] == "search response: items is not a list"
    assert call["delivery"] == 2


async def test_an_answered_attempt_never_validated_is_still_written(audit: Any) -> None:
    """An item that fails some other way after its answer (the worker's own error) keeps the
    attempt in the trail: the recorder writes it when it closes."""
    db, _ = audit
    with pytest.raises(RuntimeError):
        async with CallRecorder(Stores.over(db), "j3", "add", "j3/c0001", delivery=1) as observe:
            await observe(_attempt(1, 200, "ok", operation="add"))
            raise RuntimeError("the platform failed after the answer")
    calls = await db.calls.find({"job_id": "j3"}).to_list()
    assert [(c["attempt"], c["status"], c.get("validation")) for c in calls] == [(1, 200, None)]


async def test_attempts_keep_their_order_around_an_answered_one(audit: Any) -> None:
    """An Add answered 202, then status polls: the held answered attempt is written before the
    next attempt, so the trail reads in the order the requests were made."""
    db, _ = audit
    async with CallRecorder(Stores.over(db), "j4", "add", "j4/c0001", delivery=1) as observe:
        await observe(_attempt(1, 202, "ok", operation="add"))
        await observe(_attempt(1, 503, "retry", operation="add_status"))
        await observe(_attempt(2, 200, "ok", operation="add_status"))
        await observe.validated(VALID)
    calls = await db.calls.find({"job_id": "j4"}).sort("_id", ASCENDING).to_list()
    assert [(c["operation"], c["status"], c.get("validation")) for c in calls] == [
        ("add", 202, None),
        ("add_status", 503, None),
        ("add_status", 200, VALID),
    ]
