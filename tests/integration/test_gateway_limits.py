"""The gateway's brakes against hostile input (issue 15), each tested with the input itself on
the real gateway served by uvicorn (on real nx-27017 and nats-server): oversized and endless
bodies, bodies that would be parsed before authentication, numbers and keys out of bounds,
unreachable search audits, per-address limits, unsafe production settings, a start without
NATS, and system names shared by two teams."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from gateway_support import ADMIN, gateway_settings, request_body
from gateway_support import serve_in_thread as serve
from pydantic import SecretStr
from pymongo import MongoClient
from pymongo.database import Database

from aml_gateway.main import UnsafeConfiguration, create_app
from aml_gateway.settings import GatewaySettings
from aml_runtime.db import Document
from aml_scheduler.planning import question_item_id

pytestmark = pytest.mark.integration

CAP = 1024 * 1024


@contextmanager
def served(mongo_url: str, nats_url: str, **changes: Any) -> Iterator[tuple[str, GatewaySettings]]:
    settings = gateway_settings(mongo_url, nats_url, "aml_limits", **changes)
    server, thread, base_url = serve(create_app(settings))
    try:
        yield base_url, settings
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def gateway(mongo_url: str, nats_url: str) -> Iterator[tuple[str, GatewaySettings]]:
    with served(mongo_url, nats_url) as found:
        yield found


def _documents(settings: GatewaySettings) -> dict[str, int]:
    """Documents per collection (tests may count; the gateway never does), the rate limits'
    buckets aside: a refused credential is counted there by design."""
    with _mongo(settings) as db:
        names = set(db.list_collection_names()) - {"rate_limits"}
        return {name: len(list(db[name].find())) for name in names}


@contextmanager
def _mongo(settings: GatewaySettings) -> Iterator[Database[Document]]:
    mongo: MongoClient[Document] = MongoClient(settings.mongo_url)
    try:
        yield mongo[settings.mongo_db]
    finally:
        mongo.close()


def _connect(base_url: str) -> socket.socket:
    host, port = base_url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _response(sock: socket.socket, timeout: float = 10) -> tuple[int, bytes]:
    """Status and raw bytes of the response on `sock` (read until the server closes or the
    headers and a small body are in)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 2:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    assert data, "no response"
    return int(data.split(b" ", 2)[1]), data


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


def _reset_peak_rss() -> None:
    # Linux: "5" resets VmHWM to the current RSS, so the peak measured is this test's alone.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


# --- 2: bodies -------------------------------------------------------------------------------


def test_a_declared_oversized_body_is_refused_before_it_is_read(
    gateway: tuple[str, GatewaySettings],
) -> None:
    base_url, settings = gateway
    before = _documents(settings)
    with _connect(base_url) as sock:
        # 100 MB announced, not one byte of it sent: the answer cannot depend on reading it.
        sock.sendall(
            b"POST /v1/access-requests HTTP/1.1\r\nHost: gw\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"
        )
        status, raw = _response(sock)
    assert status == 413, raw
    assert b"larger than 1048576 bytes" in raw
    assert _documents(settings) == before


def test_a_streamed_100_mb_body_stops_at_the_cap(gateway: tuple[str, GatewaySettings]) -> None:
    """Chunked (no Content-Length): counted as it arrives, refused once past the cap; the
    process (gateway in-thread) does not grow by anything like the body's size."""
    base_url, settings = gateway
    before = _documents(settings)
    chunk = b"[" + b"1," * 32767 + b"1"  # 64 KiB of valid-looking JSON
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    _reset_peak_rss()
    start = _rss_kib("VmRSS")
    sent = 0
    status, raw = 0, b""
    with _connect(base_url) as sock:
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer nope\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        try:
            while sent < 100 * 1000 * 1000:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
                sock.sendall(framed)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, raw = _response(sock)
    peak = _rss_kib("VmHWM")
    # The key is checked first (401) or the cap is met (413); either way the rest is unread.
    assert status in (401, 413), raw
    assert sent < 20 * CAP, f"the gateway kept reading: {sent} bytes sent"
    assert peak - start < 30 * 1024, f"RSS grew by {peak - start} KiB"
    assert _documents(settings) == before


def test_a_streamed_body_past_the_cap_is_413_on_a_public_route(
    gateway: tuple[str, GatewaySettings],
) -> None:
    base_url, _ = gateway
    chunk = b" " * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    _reset_peak_rss()
    start = _rss_kib("VmRSS")
    sent = 0
    with _connect(base_url) as sock:
        sock.sendall(
            b"POST /v1/access-requests HTTP/1.1\r\nHost: gw\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        try:
            while sent < 100 * 1000 * 1000:
                if select.select([sock], [], [], 0)[0]:
                    break
                sock.sendall(framed)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, raw = _response(sock)
    assert status == 413, raw
    assert sent < 20 * CAP
    assert _rss_kib("VmHWM") - start < 30 * 1024


@pytest.mark.parametrize(
    ("path", "status"),
    [("/v1/jobs", 401), ("/v1/admin/versions", 403), ("/v1/admin/jobs/j1/retention", 403)],
)
def test_credentials_are_checked_before_the_body_is_read(
    gateway: tuple[str, GatewaySettings], path: str, status: int
) -> None:
    """A body announced under the cap but never sent: the refusal comes at once, so the body
    was not waited for (FastAPI otherwise reads and parses it before any dependency)."""
    base_url, _ = gateway
    with _connect(base_url) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            "Content-Length: 900000\r\nAuthorization: Bearer wrong\r\n\r\n".encode()
        )
        answered, raw = _response(sock, timeout=5)
    assert answered == status, raw


def test_an_invalid_body_without_a_key_is_401_not_422(
    gateway: tuple[str, GatewaySettings],
) -> None:
    base_url, _ = gateway
    junk = b'{"version_id": ' + b"[" * 400_000  # invalid JSON, under the cap
    with httpx.Client(base_url=base_url, timeout=30) as client:
        response = client.post(
            "/v1/jobs", content=junk, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 401, response.text
        # A wrong key on an access request is refused before its body is read, too.
        wrong = client.post(
            "/v1/access-requests",
            content=junk,
            headers={"Content-Type": "application/json", "Authorization": "Bearer nope"},
        )
        assert wrong.status_code == 401, wrong.text


# --- 4: bounds -------------------------------------------------------------------------------


def test_out_of_bounds_numbers_and_keys_are_refused_and_nothing_is_stored(
    gateway: tuple[str, GatewaySettings], participant: str
) -> None:
    base_url, settings = gateway
    before = _documents(settings)
    cases = [
        request_body(participant, run_limits={"max_requests_per_run": 2**63}),
        request_body(participant, run_limits={"max_requests_per_run": 10**30}),
        request_body(participant, run_limits={"max_run_hours": 1e308}),
        request_body(participant, capacity={"max_concurrency": 2**64, "max_rps": 5}),
        request_body(participant, capacity={"max_concurrency": 2, "max_rps": 1e300}),
        request_body(participant, memory_system_key="k" * 1_000_000),
        request_body(participant, system_name="s" * 100_000),
        request_body(participant, tracks=["textual"] * 10_000),
    ]
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for body in cases:
            response = client.post("/v1/access-requests", json=body)
            assert response.status_code == 422, response.text
        for number in ("NaN", "Infinity", "1e400", str(2**70)):
            raw = json.dumps(request_body(participant, capacity={"max_rps": "X"}))
            not_finite = client.post(
                "/v1/access-requests",
                content=raw.replace('"X"', number),
                headers={"Content-Type": "application/json"},
            )
            assert not_finite.status_code == 422, (number, not_finite.text)
        key = client.post(
            "/v1/admin/versions",
            headers=ADMIN,
            json={
                "team": "bounded",
                "system_name": "bounded",
                "version_label": "1",
                "add_url": f"{participant}/add",
                "search_url": f"{participant}/search",
                "health_url": f"{participant}/health",
                "memory_system_key": "k" * 1_000_000,
            },
        )
        assert key.status_code == 422, key.text
    # No document and no sealed secret from any refused request.
    assert _documents(settings) == before


# --- 5: search audit with a real item id -----------------------------------------------------


def test_a_search_is_read_by_its_real_item_id(
    gateway: tuple[str, GatewaySettings], participant: str
) -> None:
    base_url, settings = gateway
    with httpx.Client(base_url=base_url, timeout=30) as client:
        registered = client.post(
            "/v1/admin/versions",
            headers=ADMIN,
            json={
                "team": "audit-team",
                "system_name": "audit-system",
                "version_label": "1",
                "add_url": f"{participant}/add",
                "search_url": f"{participant}/search",
                "health_url": f"{participant}/health",
                "memory_system_key": "msk",
            },
        ).json()
        team = {"Authorization": f"Bearer {registered['leaderboard_api_key']}"}
        job = client.post(
            "/v1/jobs",
            headers=team,
            json={"version_id": registered["version_id"], "run_label": "audit-1"},
        ).json()
        item_id = question_item_id(job["job_id"], "synthetic", "conv-1:q3")
        candidates = [{"id": "m1", "content": "the answer", "score": 0.9}]
        with _mongo(settings) as db:
            db.searches.insert_one(
                {"_id": item_id, "job_id": job["job_id"], "state": "done",
                 "candidates": candidates, "leaks": 0}
            )  # fmt: skip
        base = f"/v1/jobs/{job['job_id']}/audit/searches/"
        for path in (base + item_id, base + quote(item_id, safe="")):
            found = client.get(path, headers=team)
            assert found.status_code == 200, (path, found.text)
            assert found.json()["item_id"] == item_id
            assert found.json()["candidates"] == candidates
        missing = client.get(base + item_id + "x", headers=team)
        assert missing.status_code == 404
        # Another team's key finds nothing there either.
        other = client.get(base + item_id, headers={"Authorization": "Bearer aml_wrong"})
        assert other.status_code == 401


# --- 7: per-address limits -------------------------------------------------------------------


def test_access_requests_are_limited_per_address(
    mongo_url: str, nats_url: str, participant: str
) -> None:
    with (
        served(mongo_url, nats_url, access_request_burst=2, access_requests_per_hour=1) as (
            base_url,
            settings,
        ),
        httpx.Client(base_url=base_url, timeout=30) as client,
    ):
        for n in range(2):
            body = request_body(participant, system_name=f"limited-{n}")
            assert client.post("/v1/access-requests", json=body).status_code == 201
        before = _documents(settings)
        refused = client.post("/v1/access-requests", json=request_body(participant))
        assert refused.status_code == 429, refused.text
        # One request earned back per hour.
        assert 3000 < int(refused.headers["Retry-After"]) <= 3600
        assert "too many access requests" in refused.json()["detail"]["reason"]
        assert _documents(settings) == before


def test_failed_authentications_are_limited_per_address(
    mongo_url: str, nats_url: str, participant: str
) -> None:
    with (
        served(mongo_url, nats_url, auth_failure_burst=3, auth_failures_per_minute=6) as (
            base_url,
            _,
        ),
        httpx.Client(base_url=base_url, timeout=30) as client,
    ):
        registered = client.post(
            "/v1/admin/versions",
            headers=ADMIN,
            json={
                "team": "limited-team",
                "system_name": "limited-system",
                "version_label": "1",
                "add_url": f"{participant}/add",
                "search_url": f"{participant}/search",
                "health_url": f"{participant}/health",
                "memory_system_key": "msk",
            },
        ).json()
        good = {"Authorization": f"Bearer {registered['leaderboard_api_key']}"}
        assert client.get("/v1/versions", headers=good).status_code == 200
        wrong = {"Authorization": "Bearer aml_guess"}
        assert client.get("/v1/jobs", headers=wrong).status_code == 401
        assert client.get("/v1/admin/reviews", headers=wrong).status_code == 403
        assert client.get("/v1/access-requests/acc-x", headers=wrong).status_code == 401
        # The burst is used up: refused before any key is looked at, the good one included.
        for headers in (wrong, good):
            refused = client.get("/v1/versions", headers=headers)
            assert refused.status_code == 429, refused.text
            assert 1 <= int(refused.headers["Retry-After"]) <= 10
        # Public pages and the leaderboard are not behind the limit.
        assert client.get("/v1/leaderboard").status_code == 200
        time.sleep(10.5)  # six a minute: one earned back every 10 s
        assert client.get("/v1/versions", headers=good).status_code == 200


# --- 6: configuration, start, public surface -------------------------------------------------


def test_production_refuses_loopback_targets() -> None:
    settings = GatewaySettings(
        environment="production",
        admin_token=SecretStr("a" * 32),
        allow_loopback_targets=True,
    )
    with pytest.raises(UnsafeConfiguration, match="AML_ALLOW_LOOPBACK_TARGETS"):
        create_app(settings)


def test_no_cdn_documentation_pages(gateway: tuple[str, GatewaySettings]) -> None:
    base_url, _ = gateway
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert client.get(path).status_code == 404, path
        assert client.get("/openapi.json").status_code == 200


def test_start_without_nats_names_the_url_and_exits(mongo_url: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"nats://user:secret@127.0.0.1:{port}"
    env = {
        **os.environ,
        "AML_NATS_URL": url,
        "AML_MONGO_URL": mongo_url,
        "AML_START_TIMEOUT_SECONDS": "2",
        "AML_PORT": "0",
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "aml_gateway"], env=env, capture_output=True, text=True, timeout=60
    )
    output = (done.stdout + done.stderr).strip()
    assert done.returncode != 0
    assert time.monotonic() - started < 30
    assert f"nats://***@127.0.0.1:{port}" in output and "secret" not in output
    assert len(output.splitlines()) == 1, output
    assert "Traceback" not in output


def test_a_system_name_belongs_to_one_team(
    gateway: tuple[str, GatewaySettings], participant: str
) -> None:
    base_url, settings = gateway

    def register(team: str, label: str) -> httpx.Response:
        return client.post(
            "/v1/admin/versions",
            headers=ADMIN,
            json={
                "team": team,
                "system_name": "shared-name",
                "version_label": label,
                "add_url": f"{participant}/add",
                "search_url": f"{participant}/search",
                "health_url": f"{participant}/health",
                "memory_system_key": "msk",
            },
        )

    with httpx.Client(base_url=base_url, timeout=30) as client:
        assert register("first-team", "1").status_code == 201
        assert register("first-team", "2").status_code == 201  # the owner's next version
        before = _documents(settings)
        taken = register("second-team", "1")
        assert taken.status_code == 409, taken.text
        assert "unique across teams" in taken.json()["detail"]["reason"]
        # Nothing of the refused registration stays: no team, no version, no secret.
        assert _documents(settings) == before
        # A new_key request for the name is accepted with a warning and refused at approval.
        created = client.post(
            "/v1/access-requests", json=request_body(participant, system_name="shared-name")
        )
        assert created.status_code == 201, created.text
        assert any("system_name" in warning for warning in created.json()["warnings"])
        before = _documents(settings)
        approved = client.post(
            f"/v1/admin/access-requests/{created.json()['id']}/approve", headers=ADMIN
        )
        assert approved.status_code == 409, approved.text
        assert _documents(settings) == before
