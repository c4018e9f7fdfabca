"""Cross-user leakage (R-4.11) detected by the searcher, against the participant simulator in
leak mode over HTTP and the nx-27017 MongoDB wire server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from pymongo import AsyncMongoClient

from aml_contract.messages import QuestionWork
from aml_contract.participant import AddRequest, Message, SearchRequest, encode
from aml_evaluation.evidence import normalize_text
from aml_participant_simulator import Script, ScriptedLeak, Simulator, running_simulator
from aml_participant_simulator.script import EndpointScript
from aml_pipeline.jobs import Endpoints
from aml_pipeline.participants import ParticipantClient
from aml_pipeline.stage_worker import StageCall
from aml_runtime.secrets import SecretBox
from aml_runtime.settings import ParticipantCallSettings
from aml_runtime.stores import Stores
from aml_scheduler.planning import plan_written_texts
from aml_searcher.handlers import SearchQuestion, WrittenTexts

pytestmark = pytest.mark.integration


JOB = "jleak"
ALICE, BOB = f"eval:{JOB}:ds:alice", f"eval:{JOB}:ds:bob"


@pytest.fixture
async def db(mongo_url: str) -> AsyncIterator[Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    yield client["aml_isolation"]
    await client.drop_database("aml_isolation")
    await client.close()


def _add(request_id: str, user: str, text: str) -> AddRequest:
    return AddRequest(
        request_id=request_id,
        user_id=user,
        session_id="s",
        messages=[Message(role="user", content=text)],
    )


async def test_search_records_another_users_text_as_a_leak(db: Any) -> None:
    writes = [
        _add(f"eval:{JOB}:ds:alice:chunk-1", ALICE, "Alice: my sister Lena moved to Porto"),
        _add(f"eval:{JOB}:ds:bob:chunk-1", BOB, "Bob: my brother Lena moved to Lisbon"),
    ]
    await db.written_texts.insert_many(plan_written_texts(JOB, [encode(r) for r in writes]))

    simulator = Simulator(Script(search=EndpointScript(leak=ScriptedLeak(count=1))))
    settings = ParticipantCallSettings(allow_loopback_targets=True, participant_max_attempts=1)
    client = ParticipantClient.from_settings(settings)
    with running_simulator(simulator) as url:
        with httpx.Client(base_url=url) as http:
            for request in writes:
                assert http.post("/add", content=encode(request)).status_code == 200
        box = SecretBox(SecretStr(SecretBox.new_key()))
        await db.versions.insert_one(
            {"_id": "v", "add_url": f"{url}/add", "search_url": f"{url}/search",
             "health_url": f"{url}/health", "auth_method": "none", "secret_ref": None}
        )  # fmt: skip
        await db.jobs.insert_one({"_id": JOB, "version_id": "v", "top_k": 5, "state": "running"})
        question = {
            "_id": f"{JOB}/ds/alice:q0000",
            "user_id": ALICE,
            "search_body": encode(SearchRequest(query="Where did Lena move?", user_id=ALICE,
                                                top_k=5)),
            "evidence_markers": {"D1:1": [normalize_text("my sister Lena moved to Porto")]},
        }  # fmt: skip
        work = QuestionWork(job_id=JOB, version_id="v", item_id=question["_id"])
        stores = Stores.over(db)
        search = SearchQuestion(stores, client, Endpoints(stores, box), WrittenTexts(stores))
        result = await search(work, question, StageCall(delivered=1))
    await client.aclose()

    assert result["leaks"] == 1
    leaked = [c for c in result["candidates"] if c["content"].startswith("Bob:")]
    assert len(leaked) == 1
    # The evidence is ranked where the candidates are (the scorer need not read them back).
    own = next(n for n, c in enumerate(result["candidates"], 1) if c["content"].startswith("Ali"))
    assert result["evidence_ranks"] == {"D1:1": own}
    errors = await db.job_errors.find({"job_id": JOB}).to_list()
    assert [e["kind"] for e in errors] == ["isolation_violation"]
    assert BOB in errors[0]["reason"] and ALICE not in errors[0]["reason"]
