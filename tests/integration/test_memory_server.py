"""The reference memory server as the platform sees it: a real process on a loopback port,
spoken to over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from aml_contract.participant import AddResponse, SearchResponse

KEY = "test-memory-key-123"
KEY_ENV = "AML_TEST_MEMORY_KEY"
TOKEN_AUTH = {"Authorization": f"Token {KEY}"}
STARTUP_TIMEOUT_S = 20.0


def free_port() -> int:
    # Bind to port 0 and release: the OS hands out a currently free port. Another process could
    # take it before the server binds, a race that is negligible on a test machine.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(process: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"memory server exited with {process.returncode}:\n{log.read_text()}"
            )
        try:
            if httpx.get(f"{base_url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"memory server at {base_url} not healthy after {STARTUP_TIMEOUT_S}s")


@contextmanager
def memory_server(
    db: Path, auth_method: str = "token", log_level: str = "warning"
) -> Iterator[str]:
    """Run `python -m aml_memory_server` until the block ends; yields its base URL. Its output
    goes to `<db>.log` (appended across restarts), for failure messages and log checks."""
    port = free_port()
    log = db.with_suffix(".log")
    command = [
        sys.executable,
        "-m",
        "aml_memory_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        str(db),
        "--auth-method",
        auth_method,
        "--key-env",
        KEY_ENV,
        "--log-level",
        log_level,
    ]
    base_url = f"http://127.0.0.1:{port}"
    with log.open("ab") as output:
        process = subprocess.Popen(
            command, env={**os.environ, KEY_ENV: KEY}, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            wait_healthy(process, base_url, log)
            yield base_url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with memory_server(tmp_path_factory.mktemp("memory") / "memories.db") as base_url:
        yield base_url


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, headers=TOKEN_AUTH, timeout=10.0) as http:
        yield http


def add_body(
    request_id: str, user_id: str, *contents: str, session_id: str = "eval:r:s:1"
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "user_id": user_id,
        "session_id": session_id,
        "messages": [
            {"role": "user", "content": text, "timestamp": 1683554160000 + i}
            for i, text in enumerate(contents)
        ],
    }


def search(client: httpx.Client, user_id: str, query: str, top_k: int = 10) -> SearchResponse:
    response = client.post("/search", json={"query": query, "user_id": user_id, "top_k": top_k})
    assert response.status_code == 200, response.text
    return SearchResponse.model_validate(response.json())


def test_health_needs_no_auth(server: str) -> None:
    assert httpx.get(f"{server}/health").status_code == 200


def test_add_then_search_finds_content(client: httpx.Client) -> None:
    user = "eval:run1:locomo:conv-1"
    body = add_body(
        "eval:run1:locomo:conv-1:chunk-0",
        user,
        "I went hiking in the Alps last weekend",
        "My sister adopted a golden retriever",
    )
    response = client.post("/add", json=body)
    assert response.status_code == 200
    echo = AddResponse.model_validate(response.json())
    assert echo.success is True
    assert (echo.request_id, echo.user_id, echo.session_id) == (
        body["request_id"],
        body["user_id"],
        body["session_id"],
    )

    found = search(client, user, "Where did she go hiking?")
    assert [item.content for item in found.data] == ["I went hiking in the Alps last weekend"]
    item = found.data[0]
    assert item.id == "eval:run1:locomo:conv-1:chunk-0#0"
    assert isinstance(item.score, float) and item.score > 0
    assert item.created_at == "2023-05-08T13:56:00.000Z"


def test_content_arrays_are_found_by_text_and_returned_whole(client: httpx.Client) -> None:
    user = "eval:run1:gallery:conv-parts"
    body = add_body("parts-0", user, "placeholder")
    parts = [
        {"type": "text", "text": "A photo of my kayak"},
        {"type": "image_url", "image_url": {"url": "https://example.org/kayak.png"}},
        {"type": "text", "text": "on Lake Tahoe"},
    ]
    body["messages"][0]["content"] = parts
    assert client.post("/add", json=body).status_code == 200
    # Found by either text part; the image URL is not searchable text.
    for query in ("kayak", "Tahoe"):
        found = search(client, user, query)
        assert [item.model_dump(mode="json")["content"] for item in found.data] == [parts]
    assert search(client, user, "example.org").data == []
    # A content-array query searches by its text parts.
    query = [parts[1], {"type": "text", "text": "where is the kayak?"}]
    response = client.post("/search", json={"query": query, "user_id": user, "top_k": 5})
    assert [item["content"] for item in response.json()["data"]] == [parts]


def test_results_ordered_by_relevance(client: httpx.Client) -> None:
    user = "eval:run1:locomo:conv-rank"
    body = add_body(
        "rank-0",
        user,
        "We talked about the weather",
        "The concert was loud",
        "The jazz concert downtown was the best concert of the year",
    )
    assert client.post("/add", json=body).status_code == 200
    found = search(client, user, "best jazz concert")
    assert [item.id for item in found.data] == ["rank-0#2", "rank-0#1"]
    scores = [item.score for item in found.data if isinstance(item.score, float)]
    assert len(scores) == 2
    assert scores == sorted(scores, reverse=True)


def test_user_scoping(client: httpx.Client) -> None:
    user_a, user_b = "eval:run1:locomo:conv-a", "eval:run1:locomo:conv-b"
    body_a = add_body("scope-a-0", user_a, "My secret recipe uses saffron")
    assert client.post("/add", json=body_a).status_code == 200
    body_b = add_body("scope-b-0", user_b, "I prefer basil in my recipe")
    assert client.post("/add", json=body_b).status_code == 200

    assert [i.id for i in search(client, user_a, "recipe saffron basil").data] == ["scope-a-0#0"]
    assert [i.id for i in search(client, user_b, "recipe saffron basil").data] == ["scope-b-0#0"]
    assert search(client, user_b, "saffron").data == []
    assert search(client, "eval:run1:locomo:nobody", "recipe").data == []


def test_concurrent_users_stay_isolated(client: httpx.Client) -> None:
    def add_and_search(n: int) -> list[str]:
        user = f"eval:run1:locomo:conc-{n}"
        body = add_body(f"conc-{n}-0", user, f"shared topic marmalade number{n}")
        assert client.post("/add", json=body).status_code == 200
        return [item.id for item in search(client, user, "marmalade", top_k=100).data]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(add_and_search, range(24)))
    assert results == [[f"conc-{n}-0#0"] for n in range(24)]


def test_idempotent_re_add(client: httpx.Client) -> None:
    user = "eval:run1:locomo:conv-retry"
    body = add_body("retry-0", user, "The violin lesson is on Tuesday")
    first = client.post("/add", json=body)
    second = client.post("/add", json=body)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert [item.id for item in search(client, user, "violin lesson").data] == ["retry-0#0"]


def test_reused_request_id_with_other_body_conflicts(client: httpx.Client) -> None:
    user = "eval:run1:locomo:conv-reuse"
    assert client.post("/add", json=add_body("reuse-0", user, "original text")).status_code == 200
    response = client.post("/add", json=add_body("reuse-0", user, "different text"))
    assert response.status_code == 409
    assert [item.content for item in search(client, user, "original different").data] == [
        "original text"
    ]


def test_top_k_respected(client: httpx.Client) -> None:
    user = "eval:run1:locomo:conv-topk"
    body = add_body("topk-0", user, *[f"note {n} about gardening" for n in range(7)])
    assert client.post("/add", json=body).status_code == 200
    assert len(search(client, user, "gardening", top_k=3).data) == 3
    assert len(search(client, user, "gardening", top_k=100).data) == 7
    # equal scores: the id breaks the tie, so the order is the same on every call
    first = [item.id for item in search(client, user, "gardening", top_k=7).data]
    assert first == [item.id for item in search(client, user, "gardening", top_k=7).data]


@pytest.mark.parametrize(
    "query", ['"unbalanced', "NEAR(a b)", "a AND OR NOT", "col:value*", "^-+(){}[]", "   "]
)
def test_hostile_queries_are_safe(client: httpx.Client, query: str) -> None:
    search(client, "eval:run1:locomo:conv-a", query)  # 200 with a valid body is the assertion


def test_empty_query_gives_empty_data(client: httpx.Client) -> None:
    assert search(client, "eval:run1:locomo:conv-a", "?!").data == []


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda b: b.update(metadata={"k": "v"}), id="forbidden-extra-field"),
        pytest.param(lambda b: b["messages"][0].update(content=""), id="empty-content"),
        pytest.param(lambda b: b.update(messages=[]), id="no-messages"),
        pytest.param(lambda b: b.pop("user_id"), id="missing-user-id"),
        pytest.param(lambda b: b["messages"][0].update(timestamp="yesterday"), id="bad-timestamp"),
        pytest.param(lambda b: b["messages"][0].update(timestamp=10**18), id="timestamp-range"),
    ],
)
def test_add_rejects_invalid_body(client: httpx.Client, mutate: Any) -> None:
    body = add_body("invalid-0", "eval:run1:locomo:conv-invalid", "some text")
    mutate(body)
    assert client.post("/add", json=body).status_code == 422


@pytest.mark.parametrize(
    "body",
    [
        {"query": "q", "user_id": "u", "top_k": 5, "filters": {}},
        {"query": "q", "user_id": "u", "top_k": 0},
        {"query": "", "user_id": "u", "top_k": 5},
    ],
    ids=["forbidden-extra-field", "top-k-zero", "empty-query"],
)
def test_search_rejects_invalid_body(client: httpx.Client, body: dict[str, Any]) -> None:
    assert client.post("/search", json=body).status_code == 422


GOOD_HEADERS = {
    "token": {"Authorization": f"Token {KEY}"},
    "bearer": {"Authorization": f"Bearer {KEY}"},
    "x-api-key": {"X-Api-Key": KEY},
}


@pytest.mark.parametrize("method", ["token", "bearer", "x-api-key"])
def test_auth_per_method(tmp_path: Path, method: str) -> None:
    wrong: list[dict[str, str]] = [
        {},
        {"Authorization": f"Token {KEY}x"},
        {"Authorization": f"Bearer {KEY}x"},
        {"X-Api-Key": f"{KEY}x"},
        # the right key under another method's header
        *[headers for other, headers in GOOD_HEADERS.items() if other != method],
    ]
    search_body = {"query": "alpha", "user_id": "u-auth", "top_k": 5}
    with (
        memory_server(tmp_path / "auth.db", auth_method=method) as base_url,
        httpx.Client(base_url=base_url) as http,
    ):
        good = GOOD_HEADERS[method]
        added = http.post("/add", json=add_body("auth-0", "u-auth", "alpha"), headers=good)
        assert added.status_code == 200
        assert http.post("/search", json=search_body, headers=good).status_code == 200
        for headers in wrong:
            add = http.post("/add", json=add_body("auth-1", "u-auth", "beta"), headers=headers)
            assert add.status_code == 401, headers
            assert KEY not in add.text
            found = http.post("/search", json=search_body, headers=headers)
            assert found.status_code == 401, headers
        # auth is checked before the body: no 422 details for an unauthenticated caller
        assert http.post("/add", json={"bogus": 1}).status_code == 401
        assert http.get("/health").status_code == 200


def test_key_never_logged(tmp_path: Path) -> None:
    db = tmp_path / "logged.db"
    with (
        memory_server(db, auth_method="bearer", log_level="debug") as base_url,
        httpx.Client(base_url=base_url) as http,
    ):
        body = add_body("log-0", "u-log", "delta")
        assert http.post("/add", json=body, headers=GOOD_HEADERS["bearer"]).status_code == 200
        assert http.post("/add", json=body, headers={"Authorization": KEY}).status_code == 401
    log = db.with_suffix(".log").read_text()
    assert "/add" in log  # the access log was on, so the check below means something
    assert KEY not in log


def test_auth_none_accepts_no_header(tmp_path: Path) -> None:
    with memory_server(tmp_path / "none.db", auth_method="none") as base_url:
        body = add_body("none-0", "u-none", "gamma ray")
        assert httpx.post(f"{base_url}/add", json=body).status_code == 200
        found = httpx.post(
            f"{base_url}/search", json={"query": "gamma", "user_id": "u-none", "top_k": 1}
        )
        assert [item["id"] for item in found.json()["data"]] == ["none-0#0"]


def test_missing_key_env_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AML_UNSET_KEY_VAR"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aml_memory_server",
            "--db",
            str(tmp_path / "x.db"),
            "--key-env",
            "AML_UNSET_KEY_VAR",
            "--port",
            str(free_port()),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert "AML_UNSET_KEY_VAR" in result.stderr


def test_persistence_across_restart(tmp_path: Path) -> None:
    db = tmp_path / "persist.db"
    user = "eval:run1:locomo:conv-persist"
    body = add_body("persist-0", user, "The lighthouse tour was in Maine")
    with memory_server(db) as base_url, httpx.Client(base_url=base_url, headers=TOKEN_AUTH) as http:
        assert http.post("/add", json=body).status_code == 200
    with memory_server(db) as base_url, httpx.Client(base_url=base_url, headers=TOKEN_AUTH) as http:
        assert [item.id for item in search(http, user, "lighthouse tour").data] == ["persist-0#0"]
        # a retry after the restart is still recognised
        assert http.post("/add", json=body).status_code == 200
        assert len(search(http, user, "lighthouse").data) == 1
