"""The participant simulator: a raw ASGI app that plays a participant (SPEC section 4) the way its
Script says, and records every request it receives.

Raw ASGI rather than a framework's routing: a scripted outcome may be any status, any bytes, or
no answer at all (the connection dropped), which a framework would "correct"."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from aml_contract.participant import AddRequest, SearchRequest
from aml_memory_server.auth import is_authorized
from aml_memory_server.store import TimestampOutOfRange, content_text

from .latency import LatencySampler
from .memory import InProcessMemoryStore, Memory, Ranking, item
from .recording import TOTAL, RequestRecord, SimulatorSnapshot
from .responses import JSON_TYPE, NOT_JSON_BODY, add_body, add_ok, json_bytes, search_body
from .script import ENDPOINTS, Endpoint, EndpointScript, Outcome, Script, ScriptedCapacity
from .server import serve_in_loop, serve_in_thread

_CONTRACT_ROUTES: dict[tuple[str, str], Endpoint] = {
    ("POST", "/add"): "add",
    ("POST", "/search"): "search",
    ("GET", "/health"): "health",
}
_TASKS_PREFIX = "/tasks/"
_CONTROL_PATHS = {"/_sim/requests": "GET", "/_sim/reset": "POST", "/_sim/script": "POST"}
# Bounds the wait in _drop for uvicorn to notice the closed connection (one or two loop
# iterations in practice), so that a server that never notices cannot hang the request.
_DROP_SETTLE_ITERATIONS = 100


@dataclass(frozen=True)
class _Dropped:
    abort: bool


_Action = Response | _Dropped


@dataclass
class _Task:
    """An accepted asynchronous Add (mode async_202) and how far its polling has got."""

    request: AddRequest
    pending_polls: int
    result: Literal["done", "failed"]
    polls: int = 0


class _Gate:
    """One capacity limit. The semaphore is created on first use, inside the serving event loop
    (asyncio primitives belong to one loop; a simulator may be served by several in turn)."""

    def __init__(self, capacity: ScriptedCapacity) -> None:
        self.capacity = capacity
        self._slots: asyncio.Semaphore | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.capacity.max_concurrency)
        return self._slots

    async def enter(self) -> bool:
        """Take a slot, waiting in queue mode; False when the request is to be rejected."""
        slots = self._semaphore()
        if slots.locked() and self.capacity.on_excess != "queue":
            return False
        await slots.acquire()
        return True

    def leave(self) -> None:
        self._semaphore().release()


@dataclass
class _Context:
    """What one request went through, filled in as it goes, for its record."""

    endpoint: Endpoint
    latency_s: float
    gates: list[_Gate]
    entered: list[_Gate] = field(default_factory=list)
    active: bool = False
    outcome: str = "cancelled"
    status: int | None = None
    sequence_key: str | None = None
    attempt: int | None = None


def _json_response(status: int, value: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json_bytes(value), status_code=status, headers=headers, media_type=JSON_TYPE)


def _reason(text: str) -> dict[str, str]:
    # The platform's own error shape (SPEC ), as the reference memory server uses.
    return {"reason": text}


def _lenient_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object when it is one, else empty: only to find a sequence key, which
    must not depend on the request being valid."""
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _key_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    # A multimodal query (a content array) is keyed by its canonical JSON.
    return "" if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


async def _drop(send: Send, abort: bool) -> None:
    """Close the connection without answering. ASGI has no message for that, so this reaches
    the transport through the server's send callable: uvicorn's `send` is a bound method of its
    request cycle, which holds the transport (the server helpers here run uvicorn with h11)."""
    cycle = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if not isinstance(transport, asyncio.Transport):
        raise RuntimeError("drop mode needs the simulator to run under uvicorn")
    if abort:
        transport.abort()
    else:
        transport.close()
    # uvicorn marks the cycle disconnected once the loop has run connection_lost; returning
    # before that would make it answer the silence with a 500 on the closing transport.
    for _ in range(_DROP_SETTLE_ITERATIONS):
        if getattr(cycle, "disconnected", True):
            break
        await asyncio.sleep(0)


class Simulator:
    """A scripted participant. Serve it with `serve()` (in the running event loop) or
    `running()` / `running_simulator()` (in a background thread), or as any ASGI app; read what
    it saw from `requests`, `peak_concurrency` and `peak_active`, or over HTTP from
    GET /_sim/requests. With a `ranking`, Search returns what it picks instead of the memories
    sharing words with the query (the scripted outcomes and leaks apply as before)."""

    def __init__(self, script: Script, ranking: Ranking | None = None) -> None:
        # Guards everything read from other threads than the serving one (tests read records
        # while the server thread writes them). Never held across an await.
        self._lock = threading.Lock()
        self._script = script
        # Python only, not part of the JSON script: a test's own retrieval (memory.Ranking).
        self._ranking = ranking
        self._store = InProcessMemoryStore()
        self._in_flight: dict[str, int] = dict.fromkeys([*ENDPOINTS, TOTAL], 0)
        self._active: dict[str, int] = dict.fromkeys([*ENDPOINTS, TOTAL], 0)
        self._reset(keep_memories=True)

    # -- state ------------------------------------------------------------------------------

    def _reset(self, keep_memories: bool) -> None:
        """Back to a fresh start under the current script. In-flight counts survive (those
        requests are still running and will decrement them); peaks restart from them."""
        with self._lock:
            self._peak: dict[str, int] = dict(self._in_flight)
            self._peak_active: dict[str, int] = dict(self._active)
            self._records: list[RequestRecord] = []
            self._seq = 0
            self._attempts: dict[tuple[Endpoint, str], int] = {}
            self._samplers = {
                e: LatencySampler(self._script.endpoint(e).latency) for e in ENDPOINTS
            }
            self._gates: dict[str, _Gate] = {
                e: _Gate(capacity)
                for e in ENDPOINTS
                if (capacity := self._script.endpoint(e).capacity) is not None
            }
            if self._script.capacity is not None:
                self._gates[TOTAL] = _Gate(self._script.capacity)
            self._tasks: dict[str, _Task] = {}
            self._task_counter = 0
            if not keep_memories:
                self._store = InProcessMemoryStore()

    def reset(self, keep_memories: bool = False) -> None:
        self._reset(keep_memories)

    def replace_script(self, script: Script, keep_memories: bool = False) -> None:
        self._script = script
        self._reset(keep_memories)

    @property
    def script(self) -> Script:
        return self._script

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return sorted(self._records, key=lambda record: record.seq)

    @property
    def peak_concurrency(self) -> dict[str, int]:
        with self._lock:
            return dict(self._peak)

    @property
    def peak_active(self) -> dict[str, int]:
        with self._lock:
            return dict(self._peak_active)

    @property
    def memories(self) -> list[Memory]:
        return self._store.all()

    def snapshot(self) -> SimulatorSnapshot:
        return SimulatorSnapshot(
            requests=self.requests,
            peak_concurrency=self.peak_concurrency,
            peak_active=self.peak_active,
        )

    # -- serving ----------------------------------------------------------------------------

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> AbstractAsyncContextManager[str]:
        """`async with simulator.serve() as base_url:` in the running event loop."""
        return serve_in_loop(self, host, port)

    def running(self, host: str = "127.0.0.1", port: int = 0) -> AbstractContextManager[str]:
        """`with simulator.running() as base_url:` from a background thread."""
        return serve_in_thread(self, host, port)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # served with lifespan off; no websockets
        method, path = scope["method"], scope["path"]
        endpoint = _CONTRACT_ROUTES.get((method, path))
        task_id = ""
        if endpoint is None and method == "GET" and path.startswith(_TASKS_PREFIX):
            task_id = path[len(_TASKS_PREFIX) :]
            if task_id and "/" not in task_id:
                endpoint = "tasks"
        if endpoint is not None:
            await self._contract(endpoint, task_id, scope, receive, send)
            return
        if _CONTROL_PATHS.get(path) == method:
            response = await self._control(path, Request(scope, receive))
        elif path in _CONTROL_PATHS or path in {p for _, p in _CONTRACT_ROUTES}:
            response = _json_response(405, _reason(f"{method} not allowed on {path}"))
        else:
            response = _json_response(404, _reason(f"no such path: {path}"))
        await response(scope, receive, send)

    async def _control(self, path: str, request: Request) -> Response:
        keep = request.query_params.get("keep_memories", "").lower() in {"1", "true", "yes"}
        if path == "/_sim/requests":
            return Response(self.snapshot().model_dump_json(), media_type=JSON_TYPE)
        if path == "/_sim/script":
            try:
                script = Script.model_validate_json(await request.body())
            except ValidationError as exc:
                return _json_response(422, _reason(str(exc)))
            self.replace_script(script, keep_memories=keep)
        else:
            self.reset(keep_memories=keep)
        return _json_response(200, {"reset": True, "kept_memories": keep})

    # -- the contract endpoints ---------------------------------------------------------------

    async def _contract(
        self, endpoint: Endpoint, task_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        arrived_monotonic, arrived_at = time.monotonic(), datetime.now(UTC)
        with self._lock:
            seq = self._seq
            self._seq += 1
            for scope_name in (endpoint, TOTAL):
                self._in_flight[scope_name] += 1
                self._peak[scope_name] = max(self._peak[scope_name], self._in_flight[scope_name])
            concurrency, total = self._in_flight[endpoint], self._in_flight[TOTAL]
            # Drawn at arrival, for every request, so that the draws follow arrival order.
            latency = self._samplers[endpoint].sample()
            gates = [
                self._gates[name]
                for name in (TOTAL, endpoint)
                if name in self._gates and not (name == TOTAL and endpoint == "health")
            ]
            script = self._script
        ctx = _Context(endpoint=endpoint, latency_s=latency, gates=gates)
        body = b""
        finished = False

        def finish() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            for gate in ctx.entered:
                gate.leave()
            with self._lock:
                for scope_name in (endpoint, TOTAL):
                    self._in_flight[scope_name] -= 1
                    if ctx.active:
                        self._active[scope_name] -= 1
                self._records.append(
                    RequestRecord(
                        seq=seq,
                        endpoint=endpoint,
                        method=scope["method"],
                        path=scope["path"],
                        query_string=scope.get("query_string", b"").decode("latin-1"),
                        headers=[
                            (name.decode("latin-1"), value.decode("latin-1"))
                            for name, value in scope["headers"]
                        ],
                        body=body,
                        arrived_monotonic=arrived_monotonic,
                        arrived_at=arrived_at,
                        finished_monotonic=time.monotonic(),
                        concurrency_at_arrival=concurrency,
                        total_concurrency_at_arrival=total,
                        sequence_key=ctx.sequence_key,
                        attempt=ctx.attempt,
                        outcome=ctx.outcome,
                        status=ctx.status,
                        latency_s=ctx.latency_s,
                    )
                )

        try:
            request = Request(scope, receive)
            body = await request.body()
            action = await self._answer(script, ctx, request.headers, body, task_id)
            ctx.status = None if isinstance(action, _Dropped) else action.status_code
            # Finished (recorded, slots freed, out of the in-flight count) before the answer
            # goes out: once a client holds its response, the record is readable and its next
            # request must not be counted as concurrent with this one.
            finish()
            if isinstance(action, _Dropped):
                await _drop(send, action.abort)
            else:
                await action(scope, receive, send)
        except ClientDisconnect:
            ctx.outcome = "cancelled"
        finally:
            finish()

    async def _answer(
        self, script: Script, ctx: _Context, headers: Headers, body: bytes, task_id: str
    ) -> _Action:
        """Auth, then capacity, then latency, then the scripted outcome: a participant checks
        credentials before spending a slot, and a rejection is immediate."""
        endpoint = ctx.endpoint
        auth = script.auth
        if endpoint != "health" and auth is not None and auth.method != "none":
            key = auth.key.get_secret_value() if auth.key else None
            if not is_authorized(auth.method, key, headers):
                ctx.outcome = "unauthorized"
                return _json_response(
                    401, _reason(f"missing or wrong credentials for auth method {auth.method}")
                )
        for gate in ctx.gates:
            if not await gate.enter():
                return self._reject(ctx, gate.capacity)
            ctx.entered.append(gate)
        with self._lock:
            ctx.active = True
            for scope_name in (endpoint, TOTAL):
                self._active[scope_name] += 1
                self._peak_active[scope_name] = max(
                    self._peak_active[scope_name], self._active[scope_name]
                )
        if ctx.latency_s > 0:
            await asyncio.sleep(ctx.latency_s)

        part = script.endpoint(endpoint)
        key = self._sequence_key(endpoint, part, body, task_id)
        with self._lock:
            attempt = self._attempts.get((endpoint, key), 0)
            self._attempts[(endpoint, key)] = attempt + 1
        sequence = part.by_key.get(key, part.responses)
        outcome = sequence[attempt] if attempt < len(sequence) else part.then
        ctx.sequence_key, ctx.attempt, ctx.outcome = key, attempt, outcome.effective_mode
        if outcome.delay_s > 0:
            await asyncio.sleep(outcome.delay_s)
        return self._apply(ctx, part, outcome, body, task_id)

    @staticmethod
    def _reject(ctx: _Context, capacity: ScriptedCapacity) -> Response:
        status = 429 if capacity.on_excess == "reject_429" else 503
        ctx.outcome = capacity.on_excess
        retry_after = capacity.retry_after
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        text = f"over capacity: at most {capacity.max_concurrency} concurrent requests"
        return _json_response(status, _reason(text), headers)

    @staticmethod
    def _sequence_key(endpoint: Endpoint, part: EndpointScript, body: bytes, task_id: str) -> str:
        if endpoint == "health" or part.sequence == "global":
            return ""
        if endpoint == "tasks":
            return task_id
        field_name = {"add": "request_id", "search": "query"}[endpoint]
        if part.sequence == "user_id":
            field_name = "user_id"
        return _key_text(_lenient_json(body).get(field_name))

    def _apply(
        self, ctx: _Context, part: EndpointScript, outcome: Outcome, body: bytes, task_id: str
    ) -> _Action:
        mode = outcome.effective_mode
        if mode in ("drop", "status", "not_json") and outcome.persist:
            self._persist_quietly(body)
        if mode == "drop":
            return _Dropped(outcome.abort)
        if mode == "status":
            if outcome.body is not None:
                content = outcome.body.encode("utf-8")
            else:
                content = outcome.body_base64 or b""
            return Response(content, status_code=outcome.status or 200, headers=outcome.headers)
        if mode == "not_json":
            headers = {"content-type": JSON_TYPE, **outcome.headers}
            return Response(NOT_JSON_BODY, status_code=outcome.status or 200, headers=headers)
        if ctx.endpoint == "health":
            return _json_response(outcome.status or 200, {"status": "ok"}, outcome.headers)
        if ctx.endpoint == "tasks":
            return self._poll(ctx, outcome, task_id)
        if ctx.endpoint == "add":
            return self._add(ctx, outcome, body)
        return self._search(ctx, part, outcome, body)

    def _persist_quietly(self, body: bytes) -> None:
        """`persist` on a non-ok outcome: the participant processed the write but the answer is
        lost or wrong. A body that is not a valid Add simply stores nothing."""
        with suppress(ValidationError, TimestampOutOfRange):
            self._store.add(AddRequest.model_validate_json(body))

    def _invalid(self, ctx: _Context, text: str) -> Response:
        ctx.outcome = "invalid_request"
        return _json_response(422, _reason(text))

    def _add(self, ctx: _Context, outcome: Outcome, body: bytes) -> Response:
        mode = outcome.effective_mode
        try:
            request = AddRequest.model_validate_json(body)
        except ValidationError as exc:
            return self._invalid(ctx, f"invalid add request: {exc.error_count()} error(s)")
        if mode == "async_202":
            with self._lock:
                self._task_counter += 1
                task_id = f"task-{self._task_counter}"
                self._tasks[task_id] = _Task(request, outcome.pending_polls, outcome.task_result)
            return _json_response(outcome.status or 202, {"task_id": task_id}, outcome.headers)
        if mode in ("ok", "slow") or outcome.persist:
            try:
                self._store.add(request)
            except TimestampOutOfRange as exc:
                return self._invalid(ctx, str(exc))
        return Response(
            add_body(mode, request),
            status_code=outcome.status or 200,
            headers=outcome.headers,
            media_type=JSON_TYPE,
        )

    def _poll(self, ctx: _Context, outcome: Outcome, task_id: str) -> Response:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is not None:
                task.polls += 1
        if task is None:
            ctx.outcome = "not_found"
            return _json_response(404, _reason(f"no such task: {task_id}"))
        status = outcome.status or 200
        if task.polls <= task.pending_polls:
            return _json_response(status, {"status": "pending"}, outcome.headers)
        if task.result == "failed":
            payload = {"status": "failed", "reason": "scripted task failure"}
            return _json_response(status, payload, outcome.headers)
        # The memory becomes searchable when the task is done, as asks of a real one.
        try:
            self._store.add(task.request)
        except TimestampOutOfRange as exc:
            return self._invalid(ctx, str(exc))
        done = {"status": "done", "result": add_ok(task.request)}
        return _json_response(status, done, outcome.headers)

    def _search(
        self, ctx: _Context, part: EndpointScript, outcome: Outcome, body: bytes
    ) -> Response:
        try:
            request = SearchRequest.model_validate_json(body)
        except ValidationError as exc:
            return self._invalid(ctx, f"invalid search request: {exc.error_count()} error(s)")
        query = content_text(request.query)
        if self._ranking is None:
            items = self._store.search(request.user_id, query, request.top_k)
        else:
            items = self._store.ranked(request, self._ranking)
        if part.leak is not None:
            foreign = self._store.foreign(
                request.user_id, query, part.leak.count, part.leak.from_user_id
            )
            # Ranked first, above every own memory, so the leak survives any top_k.
            top = float(items[0]["score"]) if items else 0.0
            items = ([item(memory, top + 1.0) for memory in foreign] + items)[: request.top_k]
        return Response(
            search_body(outcome.effective_mode, items, request.top_k),
            status_code=outcome.status or 200,
            headers=outcome.headers,
            media_type=JSON_TYPE,
        )


@contextmanager
def running_simulator(
    target: Script | Simulator, host: str = "127.0.0.1", port: int = 0
) -> Iterator[str]:
    """Serve `target` from a background thread until the block ends; yields the base URL. Pass
    a Simulator to read its records afterwards."""
    simulator = target if isinstance(target, Simulator) else Simulator(target)
    with serve_in_thread(simulator, host, port) as url:
        yield url


@asynccontextmanager
async def serving_simulator(
    target: Script | Simulator, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """The async twin of running_simulator: serves in the running event loop."""
    simulator = target if isinstance(target, Simulator) else Simulator(target)
    async with serve_in_loop(simulator, host, port) as url:
        yield url
