"""The fixed answer and judge models are reached through any OpenAI-compatible endpoint."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar, cast

import httpx
import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionContentPartParam, ChatCompletionUserMessageParam

from aml_evaluation.context import TokenCount, estimated
from aml_evaluation.prompts import ContentPart
from aml_pipeline.capacity import Admission, Capacity, Departure
from aml_pipeline.outages import OutageExpired, Outages
from aml_runtime.broker import FinalFailure
from aml_runtime.documents import FailureKind
from aml_runtime.metrics import LLM_CALLS, LLM_ERRORS
from aml_runtime.settings import LLMSettings
from aml_runtime.telemetry import stage_span

LLM_CAPACITY_KEY = "llm"
_Parts = list[ChatCompletionContentPartParam]
_Parsed = TypeVar("_Parsed")


def make_llm_client(settings: LLMSettings) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value() or "unset",
        timeout=settings.llm_timeout_seconds,
        # Redelivery of the work message is the retry mechanism; keep one layer of it.
        max_retries=1,
    )


def llm_down(error: Exception) -> bool:
    """Whether a failed call says the LLM endpoint is unreachable or overloaded (R-4.13): no
    connection or a timeout, a 5xx, a 429. Anything else (a 400 for a prompt it refuses, a
    reply that is not a chat completion) is this call's own failure."""
    if isinstance(error, openai.APIConnectionError):
        return True
    if isinstance(error, openai.APIStatusError):
        return error.status_code >= 500 or error.status_code == 429
    return False


async def endpoint_answers(client: AsyncOpenAI) -> bool:
    """The probe of a paused LLM: its model list answers (any answer but a 5xx or a 429: an
    endpoint without the list is still up). Costs no completion and no rate slot."""
    try:
        await client.get("/models", cast_to=object)
    except openai.APIStatusError as exc:
        return not (exc.status_code >= 500 or exc.status_code == 429)
    except openai.APIError:
        return False
    return True


async def complete(
    client: AsyncOpenAI,
    model: str,
    prompt: str | Sequence[ContentPart],
    max_tokens: int,
    admission: Admission | None = None,
    seed: int = 0,
    outages: Outages | None = None,
    outage_seconds: float = 1800.0,
) -> str:
    """One chat completion of one user message: the prompt's text, or its ordered content
    parts in OpenAI's form (`text` and `image_url` parts, aml_evaluation.prompts.answer_content).
    Under a work item's `admission` of the deployment's LLM budget, each call also takes one of
    the budget's rate slots (when the provider sets a request rate).

    With `outages`, a call that finds the endpoint down pauses the LLM stages of every replica
    (`aml_pipeline.outages`) and waits, then asks again, the same request; an outage longer than
    `outage_seconds` fails it as the platform's own (`FinalFailure`, platform_error).

    The reply's text; `complete_reply` gives the tokens the provider counted with it."""
    reply = await complete_reply(
        client, model, prompt, max_tokens, admission, seed, outages, outage_seconds
    )
    return reply.text


async def complete_reply(
    client: AsyncOpenAI,
    model: str,
    prompt: str | Sequence[ContentPart],
    max_tokens: int,
    admission: Admission | None = None,
    seed: int = 0,
    outages: Outages | None = None,
    outage_seconds: float = 1800.0,
) -> ChatReply:
    """`complete`, with the reply's `usage` (prompt and completion tokens, 0 where the provider
    reports none): what the answer and score documents record of the platform's own model use."""
    failing_since: float | None = None
    while True:
        if outages is not None and outages.is_paused(LLM_CAPACITY_KEY):
            try:
                await outages.wait(LLM_CAPACITY_KEY, lambda: endpoint_answers(client))
            except OutageExpired as exc:
                raise FinalFailure(FailureKind.PLATFORM_ERROR, exc.reason) from None
        started = time.time()
        try:
            reply = await _complete_once(client, model, prompt, max_tokens, admission, seed)
        except Exception as exc:
            if outages is None or not llm_down(exc):
                raise
            failing_since = failing_since or started
            status = getattr(exc, "status_code", None)
            reason = f"HTTP {status}" if status else type(exc).__name__
            try:
                await outages.declare(
                    LLM_CAPACITY_KEY, "llm", failing_since, reason, outage_seconds
                )
            except OutageExpired as expired:
                raise FinalFailure(FailureKind.PLATFORM_ERROR, expired.reason) from None
            continue
        if outages is not None:
            await outages.succeeded(LLM_CAPACITY_KEY)
        return reply


async def _complete_once(
    client: AsyncOpenAI,
    model: str,
    prompt: str | Sequence[ContentPart],
    max_tokens: int,
    admission: Admission | None,
    seed: int,
) -> ChatReply:
    # The parts are built in OpenAI's shape (aml_evaluation stays free of the SDK's types).
    message: ChatCompletionUserMessageParam = {
        "role": "user",
        "content": prompt if isinstance(prompt, str) else cast(_Parts, list(prompt)),
    }
    body = {
        "model": model,
        "messages": [message],
        "temperature": 0,
        "max_tokens": max_tokens,
        "seed": seed,
    }
    return await _chat(client, model, body, admission, chat_reply)


async def _chat(
    client: AsyncOpenAI,
    model: str,
    body: Mapping[str, object],
    admission: Admission | None,
    parse: Callable[[object], _Parsed],
) -> _Parsed:
    """One chat completion request under the admission, with its span and metrics."""
    # openai's own HTTP stack is not the instrumented httpx: the call gets its span here.
    with stage_span("llm.chat", model=model, max_tokens=body.get("max_tokens")):
        async with _llm_request(admission) as departure:
            departure.at = time.time()
            # Timed from the call itself, not from the admission wait before it.
            started = time.monotonic()
            try:
                # The client's own request path (base URL, key, timeout, retries, status
                # errors) with the body as built here: `chat.completions.create` would walk the
                # messages through its type-driven transform and build a response model, which
                # cost about 0.5 ms of CPU per call and add nothing to a body built from typed
                # parts. The reply is read as plain JSON (`parse`).
                reply = await client.post("/chat/completions", cast_to=dict, body=body)
                parsed = parse(reply)
            except Exception as exc:
                LLM_CALLS.labels(model, "error").observe(time.monotonic() - started)
                LLM_ERRORS.labels(model, type(exc).__name__).inc()
                raise
            LLM_CALLS.labels(model, "ok").observe(time.monotonic() - started)
    return parsed


class ChatReply(NamedTuple):
    """A chat completion's text and the tokens the provider counted (0 where it reports none)."""

    text: str
    tokens_in: int
    tokens_out: int


class ContextLengthExceeded(Exception):
    """The provider refused the conversation as longer than the model's context window."""


class LLMUnavailable(Exception):
    """The LLM is down (its outage declared, here or by any replica): the call was not waited
    out. Transient: the work item is redelivered, and its lane stays paused until the LLM
    answers again."""


def context_exceeded(error: Exception) -> bool:
    """Whether a failed call is the provider's refusal of an over-long conversation: a 400 with
    OpenAI's `context_length_exceeded` code, llama.cpp's `exceed_context_size_error`, or either
    one's message ("maximum context length", "exceeds the available context size")."""
    if not isinstance(error, openai.BadRequestError):
        return False
    body: dict[str, object] = error.body if isinstance(error.body, dict) else {}
    inner = body.get("error")
    found = inner if isinstance(inner, dict) else body
    words = " ".join(
        str(value)
        for value in (error.code, error.type, error.message, *found.values())
        if value is not None
    ).lower()
    return any(
        marker in words
        for marker in (
            "context_length_exceeded",
            "exceed_context_size",
            "maximum context length",
            "exceeds the available context size",
        )
    )


def chat_reply(reply: object) -> ChatReply:
    """`reply_text` and the reply's `usage` (prompt and completion tokens)."""
    text = reply_text(reply)
    usage = reply.get("usage") if isinstance(reply, dict) else None
    counts = usage if isinstance(usage, dict) else {}

    def count(name: str) -> int:
        value = counts.get(name)
        return value if isinstance(value, int) and value >= 0 else 0

    return ChatReply(text, count("prompt_tokens"), count("completion_tokens"))


async def complete_chat(
    client: AsyncOpenAI,
    model: str,
    messages: Sequence[Mapping[str, object]],
    max_tokens: int,
    admission: Admission | None = None,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    outages: Outages | None = None,
    outage_seconds: float = 1800.0,
) -> ChatReply:
    """One chat completion of a whole conversation (`role`/`content` text messages), for a
    caller that makes many calls for one work item (the coding agent: each of its steps is one
    call). Each call takes one of the LLM budget's rate slots under the item's `admission`,
    whose concurrency slot the item holds throughout, so the budget's concurrency and rate hold
    across every step and every replica.

    An outage is not waited out here, unlike `complete`: the caller's own clock would run
    meanwhile (an attempt has a wall limit). A call that finds the LLM paused, or finds it down
    (and declares the outage, pausing every replica's LLM stages), raises `LLMUnavailable`: the
    item is redelivered once the LLM answers. An outage past `outage_seconds` fails the item as
    the platform's (`FinalFailure`, platform_error). A conversation over the model's context
    window raises `ContextLengthExceeded`."""
    if outages is not None and outages.is_paused(LLM_CAPACITY_KEY):
        raise LLMUnavailable("the LLM is paused by an outage")
    body = {
        "model": model,
        "messages": [{"role": str(m["role"]), "content": str(m["content"])} for m in messages],
        "temperature": temperature,
        "max_tokens": max_tokens,
        "seed": seed,
    }
    started = time.time()
    try:
        reply = await _chat(client, model, body, admission, chat_reply)
    except Exception as exc:
        if context_exceeded(exc):
            raise ContextLengthExceeded(str(exc)) from exc
        if outages is None or not llm_down(exc):
            raise
        status = getattr(exc, "status_code", None)
        reason = f"HTTP {status}" if status else type(exc).__name__
        try:
            await outages.declare(LLM_CAPACITY_KEY, "llm", started, reason, outage_seconds)
        except OutageExpired as expired:
            raise FinalFailure(FailureKind.PLATFORM_ERROR, expired.reason) from None
        raise LLMUnavailable(f"the LLM is down ({reason})") from exc
    if outages is not None:
        await outages.succeeded(LLM_CAPACITY_KEY)
    return reply


class MalformedReply(ValueError):
    """An OpenAI-compatible endpoint answered 200 with something that is not a chat completion."""


def reply_text(reply: object) -> str:
    """The first choice's message text of a chat completion's JSON; an empty text when the model
    said nothing (`content` null). Anything that is not a chat completion is an error (retried
    like any failed call), named without the reply's content."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        raise MalformedReply("the LLM's reply holds no choices[0].message")
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise MalformedReply(f"the LLM's message content is {type(content).__name__}, not text")
    return content


@contextlib.asynccontextmanager
async def _llm_request(admission: Admission | None) -> AsyncIterator[Departure]:
    if admission is None:
        yield Departure()
        return
    async with admission.request() as departure:
        yield departure


def llm_capacity(settings: LLMSettings) -> Capacity:
    """The LLM's declared capacity, one budget for the whole deployment: every answerer and
    scorer replica admits its work under this key (aml_pipeline.capacity)."""
    rpm = settings.llm_requests_per_minute
    return Capacity(
        key=LLM_CAPACITY_KEY,
        max_concurrency=settings.llm_concurrency,
        max_rps=rpm / 60.0 if rpm else None,
    )


def make_token_counter(settings: LLMSettings, http: httpx.AsyncClient) -> TokenCount:
    """The answer model's token count (aml_evaluation.context): its own tokenizer through a
    llama.cpp server's `/tokenize`, or the conservative estimate."""
    if settings.token_counter == "estimate":
        return estimated
    root = settings.llm_base_url.rstrip("/").removesuffix("/v1")

    async def count(text: str) -> int:
        response = await http.post(f"{root}/tokenize", json={"content": text})
        response.raise_for_status()
        return len(response.json()["tokens"])

    return count
