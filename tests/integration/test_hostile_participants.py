"""The real `ParticipantClient` against a hostile participant over loopback HTTP (SPEC R-4.9,
project issue 15): answers far beyond the size limits, gzip bombs, JSON nested 100,000 deep, a
202 whose task_id holds a NUL, and a server trickling one byte per second. Each is a contract
violation after exactly one request (or an outage bounded by the attempt deadline), and reading
it never grows the process by more than a small bounded amount.

The server is a stdlib `http.server` in a background thread that streams its bodies from one
small block, so the only large memory the test process could hold is the client's.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import SecretStr
from pymongo import AsyncMongoClient

from aml_adder.handlers import SendChunk
from aml_contract.messages import AddWork, QuestionWork
from aml_contract.participant import (
    MAX_RESPONSE_BYTES,
    AddRequest,
    Message,
    SearchRequest,
    encode,
)
from aml_pipeline.jobs import Endpoints, JobStates
from aml_pipeline.participants import Attempt, CallFailed, Endpoint, ParticipantClient
from aml_pipeline.stage_worker import StageCall, WorkItem
from aml_runtime.broker import FinalFailure
from aml_runtime.secrets import SecretBox
from aml_runtime.settings import CommonSettings, ParticipantCallSettings
from aml_runtime.stores import Stores
from aml_searcher.handlers import SearchQuestion, WrittenTexts

pytestmark = pytest.mark.integration

MB = 1024 * 1024
HUGE = 64 * MB
BLOCK = b"a" * (64 * 1024)
IDS = ("req-1", "user-1", "sess-1")
# Growth of the test process's resident memory allowed while a hostile answer is read: the
# limits are 4 MiB (Search) and less; reading 64 MB whole grew a process by hundreds of MB.
GROWTH_LIMIT = 30 * MB


def _gzip_bomb() -> bytes:
    """64 MB of JSON-ish text compressed to well under 1 MB, built without holding 64 MB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    parts = [packer.compress(b'{"data":[{"id":"x","content":"')]
    parts += [packer.compress(BLOCK) for _ in range(HUGE // len(BLOCK))]
    parts += [packer.compress(b'"}]}'), packer.flush()]
    return b"".join(parts)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._serve()

    def _serve(self) -> None:
        path = self.path
        self.server.hits[path] += 1
        self.server.headers_seen.append(dict(self.headers))
        try:
            self.server.routes[path](self)
        except (BrokenPipeError, ConnectionResetError):
            # The client stopped reading at its limit and closed the connection.
            self.close_connection = True

    # -- the hostile answers -----------------------------------------------------------------

    def head(self, status: int, length: int | None, **extra: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if length is not None:
            self.send_header("Content-Length", str(length))
        for name, value in extra.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()

    def huge(self, prefix: bytes, suffix: bytes, declare: bool) -> None:
        self.head(200, len(prefix) + HUGE + len(suffix) if declare else None, Connection="close")
        self.close_connection = True
        self.wfile.write(prefix)
        for _ in range(HUGE // len(BLOCK)):
            self.wfile.write(BLOCK)
        self.wfile.write(suffix)

    def body(self, status: int, payload: bytes, **extra: str) -> None:
        self.head(status, len(payload), **extra)
        self.wfile.write(payload)

    def trickle(self) -> None:
        self.head(200, None, Connection="close")
        self.close_connection = True
        for byte in b'{"data":[]}' * 10:
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(1.0)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hits: Counter[str] = Counter()
        self.headers_seen: list[dict[str, str]] = []
        bomb = _gzip_bomb()
        search_prefix = b'{"data":[{"id":"x","content":"'
        deep = b'{"success":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        # Under the 4 MiB limit as JSON, about 17 MB as BSON: too large to store.
        swelling = b'{"data":[{"id":"x","content":"y","n":[' + b"0," * 1_900_000 + b"0]}]}"
        self.routes: dict[str, Callable[[_Handler], None]] = {
            "/search-huge": lambda h: h.huge(search_prefix, b'"}]}', declare=False),
            "/search-huge-declared": lambda h: h.huge(search_prefix, b'"}]}', declare=True),
            "/search-gzip-bomb": lambda h: h.body(200, bomb, Content_Encoding="gzip"),
            "/search-trickle": lambda h: h.trickle(),
            "/health-huge": lambda h: h.huge(b"", b"", declare=False),
            "/health": lambda h: h.body(200, b"ok"),
            "/add-deep": lambda h: h.body(200, deep),
            "/add-202-nul": lambda h: h.body(202, b'{"task_id":"task\\u0000-1"}'),
            "/add-202-newline": lambda h: h.body(202, b'{"task_id":"task\\n-1"}'),
            "/add-202-slash": lambda h: h.body(202, b'{"task_id":"../admin?x=1#y"}'),
            "/add-bad-utf8": lambda h: h.body(200, b'{"success":true,"x":"\xff\xfe"}'),
            "/add-bad-gzip": lambda h: h.body(200, b"not gzip at all", Content_Encoding="gzip"),
            "/add-brotli": lambda h: h.body(200, b"{}", Content_Encoding="br"),
            "/search-swelling": lambda h: h.body(200, swelling),
            "/add-gzip-ok": lambda h: h.body(
                200,
                gzip.compress(
                    b'{"success":true,"request_id":"req-1","user_id":"user-1",'
                    b'"session_id":"sess-1"}'
                ),
                Content_Encoding="gzip",
            ),
        }
        done = (
            b'{"status":"done","result":{"success":true,"request_id":"req-1",'
            b'"user_id":"user-1","session_id":"sess-1"}}'
        )
        self.routes["/tasks/..%2Fadmin%3Fx%3D1%23y"] = lambda h: h.body(200, done)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    httpd = _Server()
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _client(timeout: float = 10.0, attempts: int = 3) -> ParticipantClient:
    settings = ParticipantCallSettings(
        allow_loopback_targets=True,
        participant_max_attempts=attempts,
        participant_backoff_base_seconds=0.001,
        participant_backoff_max_seconds=0.004,
        participant_timeout_seconds=timeout,
    )
    return ParticipantClient.from_settings(settings)


@pytest.fixture
async def client() -> AsyncIterator[ParticipantClient]:
    participant_client = _client()
    yield participant_client
    await participant_client.aclose()


def _endpoint(server: _Server, add: str = "add", search: str = "search") -> Endpoint:
    base = f"http://127.0.0.1:{server.server_address[1]}"
    return Endpoint(
        add_url=f"{base}/{add}",
        search_url=f"{base}/{search}",
        health_url=f"{base}/health",
        add_status_url_template=f"{base}/tasks/{{task_id}}",
        auth_method="bearer",
        secret=SecretStr("k"),
    )


class Observed:
    def __init__(self) -> None:
        self.attempts: list[Attempt] = []

    async def __call__(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)


class PeakRss:
    """The process's resident set size sampled every 2 ms from /proc/self/status while the
    block runs: its peak over the baseline taken just before."""

    def __init__(self) -> None:
        self.baseline = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __enter__(self) -> PeakRss:
        self.baseline = self.peak = _rss()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _add_body() -> bytes:
    message = Message(role="user", content="Miso is a cat")
    return encode(
        AddRequest(request_id=IDS[0], messages=[message], user_id=IDS[1], session_id=IDS[2])
    )


def _search_body() -> bytes:
    return encode(SearchRequest(query="cat", user_id=IDS[1], top_k=3))


# --- size limits ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/search-huge", "/search-huge-declared", "/search-gzip-bomb"])
async def test_a_64_mb_search_answer_is_a_bounded_contract_violation(
    server: _Server, client: ParticipantClient, path: str
) -> None:
    observe = Observed()
    with PeakRss() as rss, pytest.raises(CallFailed) as failed:
        await client.search(_endpoint(server, search=path[1:]), _search_body(), 3, observe)
    print(f"{path}: peak RSS growth {rss.growth / MB:.1f} MB")
    assert rss.growth < GROWTH_LIMIT
    assert failed.value.kind == "contract_error"
    assert failed.value.reason == "search response: body larger than the 4 MiB limit"
    # Final at once: one request, audited with status, size read and the violation.
    assert server.hits[path] == 1
    (attempt,) = observe.attempts
    assert (attempt.status, attempt.outcome, attempt.error_class) == (
        200,
        "final",
        "ResponseTooLarge",
    )
    assert attempt.validation == failed.value.reason
    assert attempt.response_bytes is not None
    assert attempt.response_bytes <= MAX_RESPONSE_BYTES["search"] + 2 * MB
    if path != "/search-huge-declared":
        # Read up to the limit, then stopped (the declared length is refused before reading).
        assert attempt.response_bytes > MAX_RESPONSE_BYTES["search"]


async def test_a_64_mb_health_answer_is_unhealthy_and_bounded(
    server: _Server, client: ParticipantClient
) -> None:
    endpoint = _endpoint(server).model_copy(
        update={"health_url": _endpoint(server).health_url + "-huge"}
    )
    with PeakRss() as rss:
        healthy = await client.health(endpoint)
    print(f"health: peak RSS growth {rss.growth / MB:.1f} MB")
    assert healthy is False
    assert rss.growth < GROWTH_LIMIT
    assert server.hits["/health-huge"] == 1
    # A small answer still is healthy.
    assert await client.health(_endpoint(server)) is True


# --- malformed answers: contract errors after exactly one request ----------------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/add-deep", "add response: JSON nested deeper than 64 levels"),
        ("/add-bad-utf8", "add response: body is not valid JSON"),
        ("/add-bad-gzip", "add response: body is not valid gzip"),
        ("/add-brotli", "add response: unsupported Content-Encoding 'br'"),
        ("/add-202-nul", "add 202 response: task_id: Value error, task_id must hold printable"),
        ("/add-202-newline", "add 202 response: task_id: Value error, task_id must hold"),
    ],
)
async def test_malformed_add_answers_are_final_contract_errors(
    server: _Server, client: ParticipantClient, path: str, reason: str
) -> None:
    observe = Observed()
    with pytest.raises(CallFailed) as failed:
        await client.add(_endpoint(server, add=path[1:]), _add_body(), IDS, observe)
    assert failed.value.kind == "contract_error"
    assert failed.value.reason.startswith(reason), failed.value.reason
    assert len(failed.value.reason) < 300
    assert server.hits[path] == 1
    assert [a.operation for a in observe.attempts] == ["add"]
    # No status poll was attempted.
    assert not any(p.startswith("/tasks/") for p in server.hits)


async def test_a_task_id_is_percent_encoded_into_the_status_url(
    server: _Server, client: ParticipantClient
) -> None:
    # "../admin?x=1#y" cannot add a path segment, a query or a fragment to the status URL.
    observe = Observed()
    await client.add(_endpoint(server, add="add-202-slash"), _add_body(), IDS, observe)
    assert server.hits["/tasks/..%2Fadmin%3Fx%3D1%23y"] == 1
    assert [(a.operation, a.status) for a in observe.attempts] == [
        ("add", 202),
        ("add_status", 200),
    ]


async def test_a_gzip_answer_is_decoded(server: _Server, client: ParticipantClient) -> None:
    observe = Observed()
    await client.add(_endpoint(server, add="add-gzip-ok"), _add_body(), IDS, observe)
    (attempt,) = observe.attempts
    assert attempt.outcome == "ok"
    assert attempt.response_bytes == len(
        b'{"success":true,"request_id":"req-1","user_id":"user-1","session_id":"sess-1"}'
    )
    # Only encodings the client can decode within its limits are asked for.
    assert server.headers_seen[-1].get("Accept-Encoding") == "gzip, deflate"


# --- the attempt deadline ---------------------------------------------------------------------


async def test_a_trickling_server_is_bounded_by_the_attempt_deadline(server: _Server) -> None:
    client = _client(timeout=1.0, attempts=2)
    observe = Observed()
    started = time.monotonic()
    try:
        with pytest.raises(CallFailed) as failed:
            await client.search(
                _endpoint(server, search="search-trickle"), _search_body(), 3, observe
            )
    finally:
        await client.aclose()
    elapsed = time.monotonic() - started
    # Two attempts of at most 1 s each (plus a few ms of back-off), though each byte came
    # well within the read timeout.
    assert elapsed < 3.5
    assert failed.value.kind == "participant_outage"
    assert "network error: DeadlineExceeded" in failed.value.reason
    assert server.hits["/search-trickle"] == 2
    assert [(a.error_class, a.outcome) for a in observe.attempts] == [
        ("DeadlineExceeded", "retry"),
        ("DeadlineExceeded", "final"),
    ]
    # Each attempt ended at its deadline, not when the trickle (110 s) would have: a loaded
    # machine may run the cancellation a little late.
    assert all(900 <= a.latency_ms < 2500 for a in observe.attempts)


# --- through the adder and the searcher: contract errors, audited, never platform errors -------

JOB = "jhostile"


@pytest.fixture
async def db(mongo_url: str) -> AsyncIterator[Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    database = client["aml_hostile"]
    await database.jobs.insert_one({"_id": JOB, "version_id": "v", "top_k": 3, "state": "running"})
    yield database
    await client.drop_database("aml_hostile")
    await client.close()


async def _version(db: Any, server: _Server, add: str = "add", search: str = "search") -> None:
    endpoint = _endpoint(server, add=add, search=search)
    await db.versions.delete_many({"_id": "v"})
    await db.versions.insert_one(
        {"_id": "v", "add_url": endpoint.add_url, "search_url": endpoint.search_url,
         "health_url": endpoint.health_url, "auth_method": "none", "secret_ref": None,
         "add_status_url_template": endpoint.add_status_url_template},
    )  # fmt: skip


class _Running:
    """The job is running (these tests drive the handler without a broker)."""

    async def is_active(self, job_id: str) -> bool:
        return True


def _job_states(db: Any) -> JobStates:
    return cast(JobStates, _Running())


def _endpoints(db: Any) -> Endpoints:
    return Endpoints(Stores.over(db), SecretBox(SecretStr(SecretBox.new_key())))


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/add-deep", "add response: JSON nested deeper than 64 levels"),
        ("/add-202-nul", "add 202 response: task_id: Value error"),
    ],
)
async def test_the_adder_fails_a_malformed_add_as_a_contract_error_after_one_request(
    db: Any, server: _Server, client: ParticipantClient, path: str, reason: str
) -> None:
    # Before: RecursionError / httpx.InvalidURL escaped, the delivery was retried and ended as
    # "platform_error: gave up after 5 deliveries" after 13-16 requests (issue 15).
    await _version(db, server, add=path[1:])
    before = server.hits[path]
    request_id = f"{JOB}:{path}"
    await db.add_chunks.insert_one(
        {"_id": request_id, "state": "pending", "user_id": IDS[1], "session_id": IDS[2],
         "seq": 1, "body": _add_body()}
    )  # fmt: skip
    handler = SendChunk(
        CommonSettings(), Stores.over(db), cast(Any, None), client, _endpoints(db), _job_states(db)
    )
    item = cast(WorkItem, SimpleNamespace(delivered=1, admission=None))
    work = AddWork(job_id=JOB, version_id="v", request_id=request_id)
    with pytest.raises(FinalFailure) as failed:
        await handler.add(work, item)
    assert failed.value.kind == "contract_error"
    assert failed.value.reason.startswith(reason)
    assert server.hits[path] - before == 1
    (call,) = await db.calls.find({"item_id": request_id}).to_list()
    assert (call["operation"], call["status"], call["outcome"]) == (
        "add",
        200 if path == "/add-deep" else 202,
        "ok",
    )
    assert call["validation"] == failed.value.reason
    assert call["response_bytes"] > 0


@pytest.mark.parametrize(
    ("path", "reason", "outcome"),
    [
        ("/search-huge", "search response: body larger than the 4 MiB limit", "final"),
        ("/search-swelling", "search response: the items take", "ok"),
    ],
)
async def test_the_searcher_fails_an_oversized_search_as_a_contract_error(
    db: Any, server: _Server, client: ParticipantClient, path: str, reason: str, outcome: str
) -> None:
    await _version(db, server, search=path[1:])
    before = server.hits[path]
    question = {"_id": f"{JOB}/{path}", "user_id": IDS[1], "search_body": _search_body()}
    work = QuestionWork(job_id=JOB, version_id="v", item_id=question["_id"])
    stores = Stores.over(db)
    search = SearchQuestion(stores, client, _endpoints(db), WrittenTexts(stores))
    with PeakRss() as rss, pytest.raises(FinalFailure) as failed:
        await search(work, question, StageCall(delivered=1))
    print(f"searcher {path}: peak RSS growth {rss.growth / MB:.1f} MB")
    # Parsing the swelling answer's 1.9 million numbers is a list of ~15 MB (more while it
    # grows); its stored size is counted without encoding it (encoding took ~25 MB more).
    assert rss.growth < GROWTH_LIMIT + (40 * MB if path == "/search-swelling" else 0)
    assert failed.value.kind == "contract_error"
    assert failed.value.reason.startswith(reason)
    assert server.hits[path] - before == 1
    (call,) = await db.calls.find({"item_id": question["_id"]}).to_list()
    assert (call["status"], call["outcome"]) == (200, outcome)
    assert call["validation"] == failed.value.reason
    assert call["response_bytes"] > 3 * MB
