"""`aml team`: the CLI run in-process (`aml_devtools.cli.main`) against the real gateway served
by uvicorn on a real nx-27017 and nats-server, as a team uses it: request access, follow the
request until the key is delivered, list versions and datasets, submit, watch a job to its end,
read results, errors and audit pages. No pipeline runs: where a job moves or ends, the test
writes what the scheduler writes (as tests/integration/test_gateway_jobs.py does)."""

from __future__ import annotations

import asyncio
import json
import re
import stat
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import (
    ADMIN,
    ADMIN_TOKEN,
    Clock,
    health_server,
    record_calls,
    request_body,
    serve_in_thread,
)
from leaderboard_support import CODING_DATASET, SeedAttempt, coding_attempts, finished_coding_job
from pydantic import SecretStr
from pymongo import AsyncMongoClient
from test_gateway_jobs import end_job

from aml_devtools.cli import main
from aml_devtools.team_cli import progress_bar
from aml_gateway.main import create_app
from aml_gateway.settings import GatewaySettings
from aml_pipeline.jobs import record_error
from aml_pipeline.progress import counter_field
from aml_runtime.db import Document
from aml_runtime.secrets import SecretBox
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

T0 = datetime(2027, 5, 3, 9, 0, tzinfo=UTC)
# The Memory System Key sent with the request: never printed.
CANARY = f"canary-msk-{uuid.uuid4().hex}"


@dataclass
class Live:
    url: str
    clock: Clock
    db: Any


@pytest.fixture(scope="module")
def participant() -> Iterator[str]:
    with health_server() as url:
        yield url


@pytest.fixture(scope="module")
async def live(mongo_url: str, nats_url: str) -> AsyncIterator[Live]:
    settings = GatewaySettings(
        mongo_url=mongo_url,
        nats_url=nats_url,
        mongo_db=f"aml_cli_{uuid.uuid4().hex[:8]}",
        admin_token=SecretStr(ADMIN_TOKEN),
        secret_keys=SecretStr(SecretBox.new_key()),
        allow_loopback_targets=True,
        environment="development",
    )
    clock = Clock(T0)
    server, thread, url = serve_in_thread(create_app(settings, clock))
    mongo: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url)
    try:
        yield Live(url, clock, mongo[settings.mongo_db])
    finally:
        await mongo.close()
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def env(live: Live, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("AML_API_URL", live.url)
    for name in ("AML_API_KEY", "AML_REQUEST_TOKEN", "AML_MEMORY_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["team", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def approve(live: Live, request_id: str) -> dict[str, Any]:
    response = httpx.post(
        f"{live.url}/v1/admin/access-requests/{request_id}/approve", headers=ADMIN, timeout=30
    )
    assert response.status_code == 200, response.text
    grant: dict[str, Any] = response.json()
    return grant


def new_team(live: Live, participant: str, name: str) -> dict[str, Any]:
    created = httpx.post(
        f"{live.url}/v1/access-requests",
        json=request_body(participant, system_name=name),
        timeout=30,
    )
    assert created.status_code == 201, created.text
    return approve(live, created.json()["id"])


def test_request_access_follow_it_and_receive_the_key_once(
    live: Live,
    participant: str,
    env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    body = request_body(participant, system_name="from-a-file")
    del body["memory_system_key"]
    request_file = tmp_path / "request.json"
    request_file.write_text(json.dumps(body))
    env.setenv("AML_MEMORY_KEY", CANARY)
    # Flags override the file's fields.
    code, out, err = run(
        capsys, "request", "--file", str(request_file), "--system-name", "cli-system"
    )
    assert code == 0, err
    request_id = re.search(r"access request (acc-\w+) \(new_key\): pending", out)
    token = re.search(r"request token \(shown once; keep it\): (amlreq_\S+)", out)
    assert request_id and token, out
    assert "health check: ok" in out and CANARY not in out
    request_id_, token_ = request_id.group(1), token.group(1)

    code, out, _ = run(capsys, "request-status", request_id_, "--token", token_)
    assert code == 0 and f"access request {request_id_} (new_key): pending" in out
    assert "system cli-system 1.0" in out

    grant = approve(live, request_id_)
    key = grant["leaderboard_api_key"]
    # The token from the environment; the key to a private file, not to the terminal.
    env.setenv("AML_REQUEST_TOKEN", token_)
    key_file = tmp_path / "leaderboard.key"
    code, out, _ = run(capsys, "request-status", request_id_, "--key-file", str(key_file))
    assert code == 0 and "approved" in out and key not in out
    assert f"version {grant['version_id']}" in out
    assert key_file.read_text().strip() == key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    code, out, _ = run(capsys, "request-status", request_id_)
    assert code == 0 and key not in out
    assert "the Leaderboard API Key was delivered on an earlier read" in out

    # A wrong token: one line with the status and the API's reason.
    code, out, err = run(capsys, "request-status", request_id_, "--token", "amlreq_wrong")
    assert code == 2 and out == ""
    assert err == (
        "aml team request-status: HTTP 401: unknown Leaderboard API Key or request token\n"
    )

    # add_version with the delivered key: no request token this time.
    env.setenv("AML_API_KEY", key)
    code, out, err = run(
        capsys, "request", "--file", str(request_file), "--kind", "add_version",
        "--version-label", "2.0", "--board", "industrial",
    )  # fmt: skip
    assert code == 0, err
    assert "(add_version): pending" in out and "request token" not in out
    assert key not in out + err and CANARY not in out + err


async def test_submit_watch_results_errors_and_audit(
    live: Live, participant: str, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    grant = new_team(live, participant, "cli-watch")
    key, version_id = grant["leaderboard_api_key"], grant["version_id"]
    env.setenv("AML_API_KEY", key)

    code, out, _ = run(capsys, "versions")
    assert code == 0 and version_id in out and "cli-watch" in out
    code, out, _ = run(capsys, "datasets")
    assert code == 0
    assert re.search(r"synthetic\s+textual\s+\d+\s+smoke \(default\)", out), out
    assert re.search(r"locomo_refined\s+textual\s+\S+\s+smoke; full suite", out), out

    # Refusals are one line: the HTTP status and the API's own reason.
    code, out, err = run(capsys, "submit", version_id, "--dataset", "nope")
    assert code == 2 and out == ""
    assert err.startswith("aml team submit: HTTP 422: unknown dataset(s): nope; a smoke run may")
    assert err.count("\n") == 1 and key not in err
    code, _, err = run(capsys, "submit", version_id, "--mode", "full", "--smoke-passed")
    assert code == 2
    assert "HTTP 422: a full run needs every checklist item: api_contract_correct" in err

    code, out, err = run(capsys, "submit", version_id, "--run-label", "cli-smoke-1")
    assert code == 0, err
    match = re.search(r"job (j\w+) submitted: smoke run 'cli-smoke-1'", out)
    assert match, out
    assert "on track textual: synthetic (queued)" in out
    job_id = match.group(1)

    async def pipeline() -> None:
        """What the scheduler and the stages write while the job runs."""
        await asyncio.sleep(0.5)
        await live.db.jobs.update_one(
            {"_id": job_id},
            {
                "$set": {
                    "state": "running",
                    "planned": True,
                    "started_at": datetime.now(UTC),
                    "totals": {"add": 4, "questions": 2},
                    counter_field("add", "done"): 2,
                }
            },
        )
        await asyncio.sleep(0.5)
        await live.db.jobs.update_one(
            {"_id": job_id},
            {"$set": {counter_field("add", "done"): 4, counter_field("search", "done"): 1}},
        )
        await asyncio.sleep(0.5)
        await end_job(live.db, job_id, "completed", datetime.now(UTC))

    watched, _ = await asyncio.gather(
        asyncio.to_thread(main, ["team", "watch", job_id, "--interval", "0.1", "--max-wait", "60"]),
        pipeline(),
    )
    out = capsys.readouterr().out
    with capsys.disabled():  # shown with -s: what a team sees
        print(out)
    assert watched == 0, out
    assert f"job {job_id} queued" in out
    assert "add       [" + "#" * 15 + "." * 15 + "] 2/4   50.0%" in out
    assert "add       [" + "#" * 30 + "] 4/4  100.0%" in out
    assert "search    [" + "#" * 15 + "." * 15 + "] 1/2   50.0%" in out
    assert f"job {job_id} completed" in out
    assert re.search(r"Overall\s+2\s+2\s+0\s+50\.0", out), out

    code, out, _ = run(capsys, "results", job_id)
    assert code == 0 and "single-hop" in out and "Overall" in out
    # The results name their track; no multiple choice here, so no MC column.
    assert out.startswith("track textual: compare only with results of the same track\n")
    assert " MC" not in out
    code, out, _ = run(capsys, "errors", job_id)
    assert code == 0 and f"job {job_id} completed" in out and "no errors recorded" in out

    # Audit pages: three records, two per page.
    await record_calls(live.db, job_id, [("add", "r1", [503, 200]), ("search", "q1", [200])])
    code, out, _ = run(capsys, "audit", job_id, "--limit", "2")
    assert code == 0 and "audit, page 1 (2 records)" in out
    assert re.search(r"stage\s+op\s+item\s+try", out), out
    assert re.search(r"add\s+add\s+r1\s+1\.1\s+503\s+12\s+retry", out), out
    assert f"more: aml team audit {job_id} --page 2" in out
    code, out, _ = run(capsys, "audit", job_id, "--limit", "2", "--page", "2")
    assert code == 0 and "page 2 (1 records)" in out and "search" in out and "more:" not in out
    code, _, err = run(capsys, "audit", job_id, "--limit", "2", "--page", "3")
    assert code == 2 and "has only 2 audit page(s)" in err
    code, out, _ = run(capsys, "audit", job_id, "--item-id", "q1")
    assert code == 0 and "(1 records)" in out
    assert re.search(r"search\s+search\s+q1\s+1\.1\s+200", out), out

    # A failed job: watch exits 1 with the error summary.
    live.clock.advance(timedelta(hours=1))
    code, out, _ = run(capsys, "submit", version_id, "--run-label", "cli-smoke-2")
    failing = re.search(r"job (j\w+) submitted", out)
    assert code == 0 and failing, out
    job_id = failing.group(1)
    for item in ("conv-1", "conv-2"):
        reason = "add: the response is not JSON"
        await record_error(Stores.over(live.db), job_id, "add", "contract_error", item, reason)
    await end_job(live.db, job_id, "failed", datetime.now(UTC), "contract_error")
    code, out, _ = run(capsys, "watch", job_id, "--interval", "0.1")
    assert code == 1
    assert f"job {job_id} failed" in out
    assert re.search(r"add\s+contract_error\s+2", out), out
    assert "[add/contract_error] conv-1: add: the response is not JSON" in out
    code, out, _ = run(capsys, "errors", job_id)
    assert code == 0 and "[add/contract_error] conv-2" in out
    assert key not in capsys.readouterr().out


async def test_results_of_a_coding_job(
    live: Live, participant: str, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`aml team results` of a coding job: resolved % per memory condition, per task type and
    Overall, with the attempts the platform failed apart (never unresolved)."""
    grant = new_team(live, participant, "cli-coding")
    env.setenv("AML_API_KEY", grant["leaderboard_api_key"])
    failed = SeedAttempt("task-08", "noisy", "debug", None, "sandbox fault", failed_at="score")
    attempts = [*coding_attempts({"relevant": 6, "noisy": 3}), failed]
    job = finished_coding_job(
        grant["team_id"], grant["version_id"], attempts, T0, review_state=None
    )
    await live.db.jobs.insert_one(job)
    code, out, err = run(capsys, "results", job["_id"])
    assert code == 0, err
    with capsys.disabled():  # shown with -s: what a team sees
        print(out)
    lines = out.splitlines()
    assert lines[0] == "track coding: compare only with results of the same track"
    assert lines[1].split()[2:] == ["attempts", "resolved", "failed", "resolved", "%"]
    # (label, attempts, resolved, failed, resolved %): 9 of the 16 verified attempts resolved.
    rows = {
        " ".join(line.split()[1:-4]): line.split()[-4:]
        for line in lines
        if line.startswith(CODING_DATASET)
    }
    assert rows == {
        "1 relevant": ["8", "6", "0", "75.0"],
        "2 noisy": ["9", "3", "1", "37.5"],
        "(dataset)": ["17", "9", "1", "56.2"],
        "(type debug)": ["9", "7", "1", "87.5"],
        "(type development)": ["8", "2", "0", "25.0"],
    }
    assert re.search(r"^Overall\s+17\s+9\s+1\s+56\.2$", out, re.M), out
    assert "failed, by kind: platform_error 1" in out
    assert "counted in no share (never unresolved)" in out
    assert "J " not in lines[1] and "BLEU" not in out


def test_errors_without_key_job_or_gateway(
    live: Live, participant: str, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "results", "j-none")
    assert code == 2 and out == ""
    assert err == "aml team results: no Leaderboard API Key: set AML_API_KEY (or pass --api-key)\n"
    grant = new_team(live, participant, "cli-errors")
    key = grant["leaderboard_api_key"]
    code, _, err = run(capsys, "watch", "j-none", "--api-key", key)
    assert code == 2 and err == "aml team watch: HTTP 404: job j-none not found\n"
    code, _, err = run(capsys, "versions", "--api-key", "aml_wrong")
    assert err == "aml team versions: HTTP 401: unknown Leaderboard API Key\n"
    # Flags override the environment; a gateway that does not answer is one line too.
    code, _, err = run(capsys, "versions", "--api-key", key, "--api-url", "http://127.0.0.1:9")
    assert code == 2 and err.startswith("aml team versions: cannot reach http://127.0.0.1:9")
    assert key not in err


def test_progress_bars() -> None:
    assert progress_bar("add", 0, 0, 0).endswith("not planned yet")
    assert progress_bar("add", 10, 5, 0) == "add       [" + "#" * 15 + "." * 15 + "]  5/10   50.0%"
    # A failure always shows, however small its share.
    bar = progress_bar("search", 1000, 10, 1)
    assert "!" in bar and bar.endswith(" 11/1000    1.1%  1 failed")
    assert (
        progress_bar("score", 4, 2, 2)
        == "score     [" + "#" * 15 + "!" * 15 + "] 4/4  100.0%  2 failed"
    )
