"""The stand-in's HTTP surface, an ASGI app (Starlette, which FastAPI is built on):

- `POST /v1/chat/completions`: the OpenAI chat completion shape. A request arriving while
  `capacity` others are being served is answered 429 at once, in OpenAI's error shape; the
  others are answered after `latency_s` with a deterministic reply: a coding agent's
  conversation by the scripted agent (coding.py, over the `coding_tasks` it knows), any other
  prompt as replies.py says;
- `GET /v1/models`: the one model, marked as the scripted stand-in it is (`SCRIPTED_MODEL`);
- `GET /health`; `GET /stats` (a StatsReport); `GET /stats/intervals` (BusyIntervals: when each
  served request held its slot, on the `time.monotonic()` clock, which every process of the
  machine shares); `POST /stats/reset` (between a benchmark's scenarios, so that each reads its
  own figures; it also forgets the recorded requests and intervals);
- `GET /requests`: the `messages` of the last RECENT_REQUESTS valid chat requests, oldest
  first, as received (content parts included), so a test can see what the platform sent.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .coding import SCRIPTED_MODEL, CodingTasks, coding_reply, load_coding_tasks, word_count
from .replies import is_judge_prompt, reply_for
from .stats import CallStats

MODEL_FINGERPRINT = "aml-llm-standin"
# Requests kept for `GET /requests`: enough for a test's few calls, bounded under a benchmark.
RECENT_REQUESTS = 32


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    # A string, or OpenAI's list of content parts ({"type": "text", "text": ...}).
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(str(part.get("text", "")) for part in self.content)
        return self.content or ""


class ChatRequest(BaseModel):
    # Sampling options (temperature, seed, ...) are accepted and ignored: replies are fixed.
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def prompt(self) -> str:
        """The last user message: the platform sends its whole prompt as one."""
        users = [message for message in self.messages if message.role == "user"]
        return (users or self.messages)[-1].text()


def _estimate_tokens(text: str) -> int:
    # The answer and judge replies' `usage` (the platform records it as its own model use):
    # an estimate, deterministic for any text.
    return math.ceil(len(text.encode("utf-8")) / 3)


def _error(status: int, message: str, kind: str, code: str | None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def _completion(
    number: int, request: ChatRequest, reply: str, prompt_tokens: int, reply_tokens: int
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-standin-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "system_fingerprint": MODEL_FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": reply_tokens,
            "total_tokens": prompt_tokens + reply_tokens,
        },
    }


def create_app(
    latency_s: float, capacity: int, coding_tasks: CodingTasks | None = None
) -> Starlette:
    """`coding_tasks`: the tasks the scripted coding agent knows (default: the shipped
    synthetic-coding tasks, `load_coding_tasks()`)."""
    tasks = load_coding_tasks() if coding_tasks is None else coding_tasks
    stats = CallStats(latency_s, capacity)
    numbers = itertools.count(1)
    recent: deque[list[dict[str, Any]]] = deque(maxlen=RECENT_REQUESTS)

    async def chat(request: Request) -> Response:
        try:
            chat_request = ChatRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            stats.invalid()
            text = f"invalid request: {exc.error_count()} error(s)"
            return _error(400, text, "invalid_request_error", None)
        recent.append([message.model_dump(exclude_unset=True) for message in chat_request.messages])
        admitted = stats.arrive()
        started = time.monotonic()
        try:
            if not admitted:
                # At once, not queued: a platform that over-sends must show up as 429s.
                text = f"over capacity: at most {capacity} requests at once"
                return _error(429, text, "rate_limit_error", "rate_limit_exceeded")
            await asyncio.sleep(latency_s)
            texts = [(message.role, message.text()) for message in chat_request.messages]
            # First: an agent's observation may hold anything, a judge prompt's words included.
            # Its reply is never cut to max_tokens, which would only break the command.
            scripted = coding_reply(texts, tasks)
            if scripted is not None:
                reply, kind = scripted, "coding"
                prompt_tokens = word_count(text for _, text in texts)
                reply_tokens = word_count([reply])
            else:
                prompt = chat_request.prompt()
                max_tokens = chat_request.max_completion_tokens or chat_request.max_tokens
                reply = reply_for(prompt, max_tokens)
                kind = "judge" if is_judge_prompt(prompt) else "answer"
                prompt_tokens, reply_tokens = _estimate_tokens(prompt), _estimate_tokens(reply)
            stats.served(kind)
            body = _completion(next(numbers), chat_request, reply, prompt_tokens, reply_tokens)
            return JSONResponse(body)
        finally:
            stats.leave(admitted, started)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        # OpenAI's list shape, plus what a client may show its users: this is no model.
        model = {"id": MODEL_FINGERPRINT, "object": "model", "created": 0, "owned_by": "aml"}
        return JSONResponse({"object": "list", "data": [{**model, "description": SCRIPTED_MODEL}]})

    async def report(request: Request) -> Response:
        return Response(stats.report().model_dump_json(), media_type="application/json")

    async def intervals(request: Request) -> Response:
        return Response(stats.intervals().model_dump_json(), media_type="application/json")

    async def reset(request: Request) -> Response:
        stats.reset()
        recent.clear()
        return JSONResponse({"reset": True})

    async def requests(request: Request) -> Response:
        return JSONResponse({"requests": list(recent)})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/stats", report, methods=["GET"]),
            Route("/stats/intervals", intervals, methods=["GET"]),
            Route("/stats/reset", reset, methods=["POST"]),
            Route("/requests", requests, methods=["GET"]),
        ]
    )
