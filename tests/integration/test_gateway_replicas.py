"""The per-address limits hold for gateway replicas together (issue 34): two gateway processes
on one embedded stack (real nx-27017 and nats-server), one database, and the declared limits
counted across both, as a Deployment scaled out behind a Service would be."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gateway_support import ADMIN, ADMIN_TOKEN, health_server, request_body
from pymongo import MongoClient

from aml_devtools.processes import free_port, http_ready
from aml_devtools.stack import HOST, EmbeddedStack, StackConfig
from aml_runtime.db import Document
from aml_runtime.secrets import SecretBox

pytestmark = pytest.mark.integration

DB = "aml_replicas"
AUTH_BURST = 5
ACCESS_BURST = 4


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """The URLs of two gateway processes sharing one stack and database, and the stack's
    MongoDB URL."""
    with EmbeddedStack(
        StackConfig(data_dir=tmp_path_factory.mktemp("replicas"), start_llm=False)
    ) as stack:
        stack.start_infra()
        env = {
            "AML_MONGO_DB": DB,
            "AML_ADMIN_TOKEN": ADMIN_TOKEN,
            "AML_SECRET_KEYS": SecretBox.new_key(),
            "AML_ALLOW_LOOPBACK_TARGETS": "true",
            "AML_HOST": HOST,
            "AML_METRICS_PORT": "0",
            # One earned back a minute: nothing is earned back while a test runs.
            "AML_AUTH_FAILURE_BURST": str(AUTH_BURST),
            "AML_AUTH_FAILURES_PER_MINUTE": "1",
            "AML_ACCESS_REQUEST_BURST": str(ACCESS_BURST),
            "AML_ACCESS_REQUESTS_PER_HOUR": "1",
        }
        urls = []
        for n in (1, 2):
            port = free_port(HOST)
            url = f"http://{HOST}:{port}"
            stack.start_process(
                f"gateway-{n}",
                [sys.executable, "-m", "aml_gateway"],
                {**env, "AML_PORT": str(port)},
                ready=http_ready(f"{url}/health"),
            )
            urls.append(url)
        yield urls[0], urls[1], stack.mongo_url


def test_failed_authentications_are_counted_across_both_replicas(
    replicas: tuple[str, str, str],
) -> None:
    one, two, _ = replicas
    wrong = {"Authorization": "Bearer aml_guess"}
    with httpx.Client(base_url=one, timeout=30) as a, httpx.Client(base_url=two, timeout=30) as b:
        # 3 + 2 failures: the declared 5, from one address, over two processes.
        assert [a.get("/v1/jobs", headers=wrong).status_code for _ in range(3)] == [401] * 3
        assert [b.get("/v1/jobs", headers=wrong).status_code for _ in range(2)] == [401] * 2
        # The sixth is refused on either replica, before any key is looked at.
        for client in (b, a):
            refused = client.get("/v1/jobs", headers=wrong)
            assert refused.status_code == 429, refused.text
            assert "too many failed authentications" in refused.json()["detail"]["reason"]
            assert 1 <= int(refused.headers["Retry-After"]) <= 60
            # The admin token too: the limit is the address's, whatever it sends.
            assert client.get("/v1/admin/reviews", headers=ADMIN).status_code == 429


def test_access_requests_are_counted_across_both_replicas_even_at_once(
    replicas: tuple[str, str, str],
) -> None:
    one, two, mongo_url = replicas
    with health_server() as participant:

        def send(n: int) -> int:
            body = request_body(participant, system_name=f"replicated-{n}")
            with httpx.Client(base_url=(one, two)[n % 2], timeout=60) as client:
                return client.post("/v1/access-requests", json=body).status_code

        # Twelve at once, six to each replica: exactly the declared burst is accepted.
        with ThreadPoolExecutor(max_workers=12) as pool:
            statuses = list(pool.map(send, range(12)))
    assert sorted(statuses) == [201] * ACCESS_BURST + [429] * (12 - ACCESS_BURST), statuses
    mongo: MongoClient[Document] = MongoClient(mongo_url)
    try:
        db = mongo[DB]
        assert db.access_requests.count_documents({}) == ACCESS_BURST
        # One bucket per (limit, address), shared; each kept only until it is full again.
        buckets = list(db.rate_limits.find())
        assert {bucket["_id"] for bucket in buckets} == {
            "access_requests/127.0.0.1",
            "auth_failures/127.0.0.1",
        }
        assert all("expires" in bucket for bucket in buckets)
        indexes = {tuple(index["key"]): index for index in db.rate_limits.list_indexes()}
        assert indexes[("expires",)]["expireAfterSeconds"] == 0
    finally:
        mongo.close()
