"""`aml check` against real servers on loopback: the reference memory server (started as a
team would start it, `python -m aml_memory_server`) must pass every rule; the participant
simulator, scripted to break one rule at a time, must fail exactly that rule."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

import aml_participant_simulator.simulator as simulator_module
from aml_contract.participant import AddRequest
from aml_devtools.cli import main as aml_main
from aml_devtools.conformance import REPLAY_ADVICE, CheckTarget, Report, run_check
from aml_devtools.processes import free_port
from aml_participant_simulator import Script, Simulator, running_simulator
from aml_participant_simulator.memory import InProcessMemoryStore

KEY = "conformance-test-key-1234"
KEY_ENV = "AML_CONFORMANCE_TEST_KEY"


@pytest.fixture(scope="module")
def reference_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The reference memory server with token auth, as a separate process."""
    directory = tmp_path_factory.mktemp("reference")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "aml_memory_server",
        "--port",
        str(port),
        "--db",
        str(directory / "memories.db"),
        "--auth-method",
        "token",
        "--key-env",
        KEY_ENV,
        "--log-level",
        "warning",
    ]
    log = (directory / "server.log").open("wb")
    process = subprocess.Popen(
        command, env={**os.environ, KEY_ENV: KEY}, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, (directory / "server.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "reference memory server did not start"
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def urls(base: str) -> dict[str, str]:
    return {
        "add_url": f"{base}/add",
        "search_url": f"{base}/search",
        "health_url": f"{base}/health",
    }


def verdicts(report: Report) -> dict[str, str]:
    return {r.rule: r.status for r in report.results}


def check_simulator(script: dict[str, Any], **target: Any) -> Report:
    with running_simulator(Script.model_validate_json(json.dumps(script))) as base:
        return _run(CheckTarget(**urls(base), **target))


def _run(target: CheckTarget) -> Report:
    # A fresh event loop per check, as the CLI runs it.
    return asyncio.run(run_check(target))


def test_reference_server_passes_every_rule_through_the_cli(
    reference_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "check",
        "--add",
        f"{reference_server}/add",
        "--search",
        f"{reference_server}/search",
        "--health",
        f"{reference_server}/health",
        "--auth-method",
        "token",
        "--key",
        KEY,
        "--json",
    ]
    code = aml_main(argv)
    out = capsys.readouterr().out
    report = Report.model_validate_json(out)
    assert code == 0, out
    statuses = verdicts(report)
    expected_pass = {
        "health",
        "auth.accepted",
        "add.response",
        "add.searchable",
        "add.idempotent",
        "search.shape",
        "search.top_k",
        "search.empty",
        "isolation",
        "auth.required",
    }
    assert {rule for rule, status in statuses.items() if status == "pass"} == expected_pass
    # Plain http on loopback: acceptable for a local check, with the https warning.
    assert statuses["urls"] == "warn"
    assert set(report.latency_ms) >= {"health", "add", "search"}
    assert report.response_bytes["add"].max > 0
    assert KEY not in out


def test_reference_server_text_report_names_no_failure(
    reference_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    os.environ[KEY_ENV] = KEY
    try:
        code = aml_main(
            [
                "check",
                "--add",
                f"{reference_server}/add",
                "--search",
                f"{reference_server}/search",
                "--health",
                f"{reference_server}/health",
                "--auth-method",
                "token",
                "--key-env",
                KEY_ENV,
            ]
        )
    finally:
        del os.environ[KEY_ENV]
    out = capsys.readouterr().out
    assert code == 0, out
    assert "FAIL" not in out
    assert "result: conformant" in out
    assert "latency search" in out


def test_wrong_key_against_reference_server_fails_auth(reference_server: str) -> None:
    report = _run(
        CheckTarget(**urls(reference_server), auth_method="token", key=SecretStr("not-the-key"))
    )
    failed = {r.rule: r for r in report.failed}
    assert set(failed) == {"auth.accepted"}
    assert "HTTP 401" in failed["auth.accepted"].detail
    assert failed["auth.accepted"].fix is not None and "Token <key>" in failed["auth.accepted"].fix
    assert "not-the-key" not in report.model_dump_json()


@pytest.mark.parametrize(
    ("script", "rule", "message", "received"),
    [
        (
            {"search": {"then": {"mode": "items_wrapper"}}},
            "search.shape",
            "an `items` wrapper is not allowed",
            '{"items":',
        ),
        (
            {"add": {"then": {"mode": "wrong_request_id"}}},
            "add.response",
            "request_id must echo the request's",
            ':wrong"',
        ),
        (
            {"add": {"then": {"mode": "missing_ids"}}},
            "add.response",
            "request_id: Field required",
            '{"success":true}',
        ),
        (
            {"search": {"then": {"mode": "too_many_items"}}},
            "search.top_k",
            "exceed top_k=",
            '{"data":',
        ),
        (
            {"search": {"then": {"mode": "non_numeric_score"}}},
            "search.shape",
            "item 1: score",
            '"high"',
        ),
    ],
)
def test_faulty_simulator_fails_the_right_rule(
    script: dict[str, Any], rule: str, message: str, received: str
) -> None:
    report = check_simulator(script)
    failed = {r.rule: r for r in report.failed}
    assert set(failed) == {rule}, report.results
    assert message in failed[rule].detail
    assert received in (failed[rule].received or "")
    assert failed[rule].fix


def test_refused_credentials_fail_auth_and_exit_non_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = Script.model_validate({"auth": {"method": "bearer", "key": KEY}})
    with running_simulator(script) as base:
        code = aml_main(
            [
                *("check", "--add", f"{base}/add", "--search", f"{base}/search"),
                *("--health", f"{base}/health", "--auth-method", "bearer", "--key", "wrong-key"),
            ]
        )
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  auth.accepted" in out
    assert "HTTP 401" in out
    assert "wrong-key" not in out


def test_server_accepting_requests_without_key_is_a_warning() -> None:
    # The simulator checks no credentials when its script declares none.
    report = check_simulator({}, auth_method="x-api-key", key=SecretStr(KEY))
    statuses = verdicts(report)
    assert statuses["auth.required"] == "warn"
    assert not report.failed


class StoresEveryReplay(InProcessMemoryStore):
    """A server that keys nothing on request_id: a replayed Add is stored again, under new
    memory ids, as the contract allows (R-4.6, R-4.10)."""

    def add(self, request: AddRequest) -> bool:
        fresh = f"{request.request_id}:{secrets.token_hex(4)}"
        return super().add(request.model_copy(update={"request_id": fresh}))


def test_server_storing_a_replay_twice_conforms_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(simulator_module, "InProcessMemoryStore", StoresEveryReplay)
    with running_simulator(Script()) as base:
        argv = ["check", "--add", f"{base}/add", "--search", f"{base}/search"]
        argv += ["--health", f"{base}/health"]
        code = aml_main([*argv, "--json"])
        out = capsys.readouterr().out
        assert code == 0, out
        printed = json.loads(out)
        replay = next(r for r in printed["results"] if r["rule"] == "add.idempotent")
        assert replay["status"] == "warn" and "stored twice" in replay["detail"], replay
        assert replay["fix"] == REPLAY_ADVICE
        assert not Report.model_validate(printed).failed, out

        assert aml_main(argv) == 0
        text = capsys.readouterr().out
    assert "WARN  add.idempotent" in text and REPLAY_ADVICE in text
    assert "FAIL" not in text and "result: conformant" in text


def test_asynchronous_add_is_polled_through_the_status_url() -> None:
    simulator = Simulator(
        Script.model_validate({"add": {"then": {"mode": "async_202", "pending_polls": 1}}})
    )
    with running_simulator(simulator) as base:
        report = _run(CheckTarget(**urls(base), status_url_template=f"{base}/tasks/{{task_id}}"))
    statuses = verdicts(report)
    assert statuses["add.async_202"] == "pass"
    assert not report.failed, report.failed
    assert report.latency_ms["add_status"].count >= 2


def test_asynchronous_add_without_status_url_is_a_violation() -> None:
    report = check_simulator({"add": {"then": {"mode": "async_202"}}})
    failed = {r.rule: r for r in report.failed}
    assert set(failed) == {"add.response"}
    assert "no Add-status URL" in failed["add.response"].detail


def test_leaking_server_fails_isolation() -> None:
    report = check_simulator({"search": {"leak": {"count": 1}}})
    failed = {r.rule: r for r in report.failed}
    assert "isolation" in failed
    assert "returned memories of another user" in failed["isolation"].detail
