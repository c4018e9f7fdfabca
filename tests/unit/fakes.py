"""Fakes for the unit tests' outer seams other than MongoDB: the part of the openai client the
answerer and scorer call (`FakeChatModel`) and a `Bus` over FastStream's in-memory test broker
(`TestBrokerBus`). MongoDB is faked at the stores, not the driver: see tests/unit/fake_stores.py
(held to the real stores by tests/integration/test_store_fakes.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faststream.nats import NatsBroker

Document = dict[str, Any]


class FakeChatModel:
    """The part of the openai client the answerer and scorer use (`post` of a chat completion,
    `aml_pipeline.llm.complete`): each request is answered with `reply(prompt)`; every request
    body and prompt is kept."""

    def __init__(self, reply: str | Callable[[Any], str]) -> None:
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self.prompts: list[Any] = []

    async def post(self, path: str, *, cast_to: type, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/chat/completions" and cast_to is dict
        self.requests.append(body)
        prompt = body["messages"][0]["content"]
        self.prompts.append(prompt)
        text = self.reply(prompt) if callable(self.reply) else self.reply
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


@dataclass
class TestBrokerBus:
    """`aml_runtime.broker.Bus` over FastStream's public `publish` of a broker under
    `TestNatsBroker`, so the handlers' publishes reach the test's in-memory subscribers with
    the headers and body the services send; purges are only recorded (nothing is queued)."""

    __test__ = False  # not a pytest class

    broker: NatsBroker
    purged: list[tuple[str, str]] = field(default_factory=list)

    async def send(self, subject: str, stream: str, body: bytes, headers: dict[str, str]) -> None:
        await self.broker.publish(body, subject, headers=headers, stream=stream)

    async def purge(self, stream: str, subject: str) -> None:
        self.purged.append((stream, subject))
