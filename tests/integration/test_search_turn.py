"""The searcher hands its slot's turn to the next Search as soon as its own answer is read and
valid, not after that answer's audit record and isolation check (issue 30, a saturated
participant); an answer that breaks the contract keeps the turn until the job's failure is
decided. Against the participant simulator over HTTP and the nx-27017 wire server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr
from pymongo import AsyncMongoClient
from turns import turn_only_admission

from aml_contract.messages import QuestionWork
from aml_contract.participant import SearchRequest, encode
from aml_participant_simulator import Script, Simulator, running_simulator
from aml_participant_simulator.script import EndpointScript, Outcome
from aml_pipeline.jobs import Endpoints
from aml_pipeline.participants import ParticipantClient
from aml_pipeline.stage_worker import StageCall
from aml_runtime.broker import FinalFailure
from aml_runtime.documents import FailureKind
from aml_runtime.secrets import SecretBox
from aml_runtime.settings import ParticipantCallSettings
from aml_runtime.stores import Stores
from aml_searcher.handlers import SearchQuestion, WrittenTexts

pytestmark = pytest.mark.integration

JOB = "jturn"
USER = f"eval:{JOB}:ds:u"


@pytest.fixture
async def db(mongo_url: str) -> AsyncIterator[Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    yield client["aml_search_turn"]
    await client.drop_database("aml_search_turn")
    await client.close()


async def _search_under_turn(db: Any, search_script: EndpointScript) -> tuple[Any, list[str]]:
    """One Search computed as the question stage computes it (under the slot's turn), with a
    second call waiting for the turn; returns the outcome (or the exception) and the order in
    which the next call got the turn and the audit record was written."""
    events: list[str] = []
    stores = Stores.over(db)
    record_attempt = stores.audit.record_attempt

    async def recorded(record: Any) -> Any:
        await asyncio.sleep(0.05)  # a slow database: the next call must not wait for it
        events.append("audit written")
        return await record_attempt(record)

    stores.audit.record_attempt = recorded  # type: ignore[method-assign]
    admission = turn_only_admission("v")

    async def next_call() -> None:
        async with admission.turn():
            events.append("next call's turn")

    settings = ParticipantCallSettings(allow_loopback_targets=True, participant_max_attempts=1)
    client = ParticipantClient.from_settings(settings)
    with running_simulator(Simulator(Script(search=search_script))) as url:
        box = SecretBox(SecretStr(SecretBox.new_key()))
        await db.versions.insert_one(
            {"_id": "v", "add_url": f"{url}/add", "search_url": f"{url}/search",
             "health_url": f"{url}/health", "auth_method": "none", "secret_ref": None}
        )  # fmt: skip
        question = {
            "_id": f"{JOB}/ds/u:q0000",
            "user_id": USER,
            "search_body": encode(SearchRequest(query="Where?", user_id=USER, top_k=5)),
        }
        work = QuestionWork(job_id=JOB, version_id="v", item_id=question["_id"])
        search = SearchQuestion(stores, client, Endpoints(stores, box), WrittenTexts(stores))
        job = {"_id": JOB, "version_id": "v", "top_k": 5, "state": "running"}
        outcome: Any
        async with admission.turn():
            waiting = asyncio.create_task(next_call())
            try:
                outcome = await search(work, question, StageCall(1, admission, job))
            except FinalFailure as exc:
                outcome = exc
            events.append("compute returned")
        await asyncio.wait_for(waiting, 10)
    await client.aclose()
    return outcome, events


async def test_a_valid_answer_passes_the_turn_before_its_audit_record_is_written(db: Any) -> None:
    outcome, events = await _search_under_turn(db, EndpointScript())
    assert outcome["n_candidates"] == 0
    assert events == ["next call's turn", "audit written", "compute returned"]
    audited = await db.calls.find({"job_id": JOB}).to_list()
    assert [(c["operation"], c["validation"]) for c in audited] == [("search", "valid")]


async def test_an_answer_breaking_the_contract_keeps_the_turn_until_the_compute_ends(
    db: Any,
) -> None:
    broken = EndpointScript(then=Outcome(status=200, body='{"results": "not a list"}'))
    outcome, events = await _search_under_turn(db, broken)
    assert isinstance(outcome, FinalFailure)
    assert outcome.kind is FailureKind.CONTRACT_ERROR
    # The job's failure is decided under the turn: the next call waits for all of it.
    assert events == ["audit written", "compute returned", "next call's turn"]
