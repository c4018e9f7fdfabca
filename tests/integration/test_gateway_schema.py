"""The gateway against its own OpenAPI schema, property-based (schemathesis): whatever a client
sends, the gateway never answers 5xx and every documented response matches its schema.

The real gateway app is served by uvicorn on loopback, on a real nx-27017 and nats-server. One
team is registered first, so generated requests carry working credentials (the admin token on
`/v1/admin/...`, the team's Leaderboard API Key elsewhere); a second run sends the generated
`Authorization` headers as they are, which covers missing and wrong credentials.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from gateway_support import gateway_settings, serve_in_thread
from hypothesis import strategies as st
from pydantic import SecretStr
from schemathesis.checks import not_a_server_error, response_schema_conformance
from schemathesis.schemas import BaseSchema

from aml_gateway.main import create_app
from aml_gateway.settings import GatewaySettings

pytestmark = pytest.mark.integration

ADMIN_TOKEN = "s" * 32
ADMIN_PREFIX = "/v1/admin/"
CHECKS = [not_a_server_error, response_schema_conformance]
# Per operation and phase; enough to reach every validation branch, few enough that the module
# stays well under a minute and a half on two cores.
MAX_EXAMPLES = 25

# schemathesis makes one test per operation at collection time, before any fixture runs, so the
# schema is the gateway's own document, built without starting it (no lifespan, no I/O); the
# fixture checks that the running gateway serves exactly this document. (Loading it from the
# live server through `schemathesis.pytest.from_fixture` would be the other way, but that lazy
# parametrization fails on pytest 9.2 with schemathesis 4.32.5: `'Function' object has no
# attribute '_nodeid'`.)
OPENAPI = json.loads(json.dumps(create_app(GatewaySettings(environment="development")).openapi()))


def _load(*, max_examples: int, coverage: bool) -> BaseSchema:
    config = {
        "generation": {
            "max-examples": max_examples,
            # Reproducible runs, and no `.hypothesis` example database written.
            "deterministic": True,
            "database": "none",
        },
        # Boundary values and malformed inputs of every parameter, beside the random ones.
        "phases": {"coverage": {"enabled": coverage}},
        "request-timeout": 30,
    }
    return schemathesis.openapi.from_dict(
        json.loads(json.dumps(OPENAPI)), config=schemathesis.Config.from_dict(config)
    )


schema = _load(max_examples=MAX_EXAMPLES, coverage=True)
# Only the credentials differ from the run with `schema`: its boundary cases are not repeated.
schema_as_sent = _load(max_examples=10, coverage=False)

# What the fixture created, by the name the API gives it: generated ids and URLs find nothing
# or are refused, so half the generated cases use these instead and reach the success answers.
KNOWN: dict[str, str] = {}
# Where a body names participant endpoints: the gateway itself, whose `/health` answers 200.
ENDPOINT_PATHS = {
    "add_url": "/add",
    "search_url": "/search",
    "health_url": "/health",
    "add_status_url_template": "/tasks/{task_id}",
}


def _known_path_parameters(path: str) -> Callable[[Any], Any]:
    def replace(parameters: Any) -> Any:
        if not isinstance(parameters, dict) or not KNOWN:
            return parameters
        replaced = dict(parameters)
        for name in replaced:
            key = name
            if name == "request_id" and "/access-requests/" in path:
                # An access request's id (a job's audit names a search by `item_id`: not known).
                key = "access_request_id"
            if key in KNOWN:
                replaced[name] = KNOWN[key]
        return replaced

    return replace


def _known_body(body: Any) -> Any:
    if not isinstance(body, dict) or not KNOWN:
        return body
    replaced = dict(body)
    for name, endpoint in ENDPOINT_PATHS.items():
        if name in replaced:
            replaced[name] = KNOWN["base_url"] + endpoint
    if isinstance(replaced.get("contact"), dict):
        # The schema cannot say what a valid address is, so generated ones are refused.
        replaced["contact"] = {**replaced["contact"], "email": "ada@example.org"}
    if "version_id" in replaced:
        replaced["version_id"] = KNOWN["version_id"]
    return replaced


@schema.hook
def before_generate_path_parameters(
    context: schemathesis.HookContext, strategy: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    assert context.operation is not None
    return st.one_of(strategy, strategy.map(_known_path_parameters(context.operation.path)))


@schema.hook
def before_generate_body(
    context: schemathesis.HookContext, strategy: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, strategy.map(_known_body))


@dataclass(frozen=True)
class LiveGateway:
    base_url: str
    team_key: str


def _created(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture(scope="module")
def live_gateway(mongo_url: str, nats_url: str) -> Iterator[LiveGateway]:
    # Generated requests all come from one address: `gateway_settings` lifts the limits.
    settings = gateway_settings(
        mongo_url, nats_url, "aml_schema", admin_token=SecretStr(ADMIN_TOKEN)
    )
    server, thread, base_url = serve_in_thread(create_app(settings))
    try:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            created = _seed(client, base_url)
        KNOWN.update(created)
        yield LiveGateway(base_url=base_url, team_key=created["team_key"])
    finally:
        KNOWN.clear()
        server.should_exit = True
        thread.join(timeout=30)


def _seed(client: httpx.Client, base_url: str) -> dict[str, str]:
    """A team with one version and one job, and a pending access request."""
    assert client.get("/openapi.json").json() == OPENAPI, "the tests use a stale schema"
    endpoints = {name: base_url + path for name, path in ENDPOINT_PATHS.items()}
    version = _created(
        client.post(
            "/v1/admin/versions",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            json={
                "team": "schema-team",
                "system_name": "schema-system",
                "version_label": "1.0",
                "add_url": endpoints["add_url"],
                "search_url": endpoints["search_url"],
                "health_url": endpoints["health_url"],
                "memory_system_key": "msk-schema",
            },
        )
    )
    team_key = version["leaderboard_api_key"]
    job = _created(
        client.post(
            "/v1/jobs",
            headers={"Authorization": f"Bearer {team_key}"},
            json={"version_id": version["version_id"], "run_label": "schema-smoke"},
        )
    )
    access_request = _created(
        client.post(
            "/v1/access-requests",
            json={
                "kind": "new_key",
                "contact": {"name": "Ada", "email": "ada@example.org", "organisation": "Lab"},
                "system_name": "schema-system",
                "version_label": "2.0",
                "tracks": ["textual"],
                "board": "industrial",
                "auth_method": "none",
                **endpoints,
            },
        )
    )
    return {
        "base_url": base_url,
        "team_key": team_key,
        "version_id": version["version_id"],
        "job_id": job["job_id"],
        "access_request_id": access_request["id"],
    }


def with_credentials(case: schemathesis.Case, gateway: LiveGateway) -> None:
    """The admin token on admin routes, the team's Leaderboard API Key on every other one."""
    token = ADMIN_TOKEN if case.operation.path.startswith(ADMIN_PREFIX) else gateway.team_key
    # The schema declares `authorization` as a plain header, so a generated value may be there
    # already, in any letter case: replaced, never sent twice.
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    case.headers = {**headers, "Authorization": f"Bearer {token}"}


@schema.parametrize()
def test_gateway_conforms_to_its_schema(case: schemathesis.Case, live_gateway: LiveGateway) -> None:
    with_credentials(case, live_gateway)
    case.call_and_validate(base_url=live_gateway.base_url, checks=CHECKS)


@schema_as_sent.parametrize()
def test_missing_or_wrong_credentials_conform(
    case: schemathesis.Case, live_gateway: LiveGateway
) -> None:
    # The `authorization` header as generated: often absent, never a valid key or token.
    case.call_and_validate(base_url=live_gateway.base_url, checks=CHECKS)
