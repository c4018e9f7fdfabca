"""One chat completion through the openai client's request path, against a real HTTP server on
loopback: the body the model receives, the key it is sent with, the reply's text, and what an
endpoint that answers something other than a chat completion yields."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from openai import APIStatusError, AsyncOpenAI

from aml_participant_simulator.server import serve_in_thread
from aml_pipeline.llm import ChatReply, MalformedReply, complete, complete_reply


@dataclass
class ScriptedLLM:
    """Answers each chat completion with the next scripted (status, JSON body), and keeps what
    it was sent."""

    replies: list[tuple[int, object]]
    received: list[tuple[dict[str, str], Any]] = field(default_factory=list)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http" and scope["path"] == "/v1/chat/completions"
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.received.append((headers, json.loads(body)))
        status, reply = self.replies.pop(0)
        payload = json.dumps(reply).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": payload})


def completion(content: object) -> dict[str, object]:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "finish_reason": "stop", "message": message}
    return {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [choice]}  # fmt: skip


@pytest.fixture
def llm() -> Iterator[tuple[ScriptedLLM, AsyncOpenAI]]:
    scripted = ScriptedLLM([])
    with serve_in_thread(scripted) as url:
        yield scripted, AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test-key", max_retries=0)


async def test_the_body_is_the_chat_request_and_the_reply_its_first_message(
    llm: tuple[ScriptedLLM, AsyncOpenAI],
) -> None:
    scripted, client = llm
    scripted.replies += [(200, completion("Paris")), (200, completion(None))]
    parts = [{"type": "text", "text": "Where?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]  # fmt: skip

    assert await complete(client, "answer-model", "Where is it?", 32, seed=7) == "Paris"
    # A model that said nothing answers with an empty text, not an error.
    assert await complete(client, "answer-model", parts, 16) == ""

    (headers, first), (_, second) = scripted.received
    assert first == {"model": "answer-model", "temperature": 0, "max_tokens": 32, "seed": 7,
                     "messages": [{"role": "user", "content": "Where is it?"}]}  # fmt: skip
    assert second["messages"] == [{"role": "user", "content": parts}]
    assert headers["authorization"] == "Bearer sk-test-key"
    await client.close()


@pytest.mark.parametrize(
    "reply",
    [
        {"error": "not a completion"},
        {"choices": []},
        {"choices": [{"index": 0}]},
        ["choices"],
        completion({"nested": "object"}),
    ],
    ids=["no-choices", "empty-choices", "no-message", "a-list", "content-not-text"],
)
async def test_a_reply_that_is_not_a_chat_completion_is_an_error_without_its_content(
    llm: tuple[ScriptedLLM, AsyncOpenAI], reply: object
) -> None:
    scripted, client = llm
    scripted.replies.append((200, reply))
    with pytest.raises(MalformedReply) as raised:
        await complete(client, "m", "q", 8)
    assert "not a completion" not in str(raised.value) and "nested" not in str(raised.value)
    await client.close()


async def test_an_error_status_is_the_clients_status_error(
    llm: tuple[ScriptedLLM, AsyncOpenAI],
) -> None:
    scripted, client = llm
    scripted.replies.append((503, {"error": {"message": "overloaded"}}))
    with pytest.raises(APIStatusError) as raised:
        await complete(client, "m", "q", 8)
    assert raised.value.status_code == 503
    await client.close()


async def test_the_reply_comes_with_the_tokens_the_provider_counted(
    llm: tuple[ScriptedLLM, AsyncOpenAI],
) -> None:
    """The platform's own model use (efficiency figures): `usage` as reported, 0 without it."""
    scripted, client = llm
    usage = {"prompt_tokens": 412, "completion_tokens": 7, "total_tokens": 419}
    scripted.replies += [(200, completion("Paris") | {"usage": usage}), (200, completion("Rome"))]
    assert await complete_reply(client, "m", "Where?", 8) == ChatReply("Paris", 412, 7)
    assert await complete_reply(client, "m", "Where?", 8) == ChatReply("Rome", 0, 0)
    await client.close()
