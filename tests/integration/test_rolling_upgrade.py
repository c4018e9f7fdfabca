"""A rolling upgrade replayed on one machine: the answerer is replaced by "another build" (the same
code under another code hash, `AML_CODE_HASH_OVERRIDE`) while a job's Adds are still running,
every service a separate process on nats-server, nx-27017 and the LLM stand-in. The job records
both builds (`code_hashes`), the job status shows them, and the publication gate refuses it as
mixed code; an undisturbed job records the one build it was submitted under and passes that
check."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from llm_support import standin_in_stack

from aml_contract.api.publication import ReleaseBaseline
from aml_devtools.platform import Platform, PlatformConfig, register_participant, start_platform
from aml_devtools.processes import find_executable, free_port
from aml_devtools.stack import HOST, EmbeddedStack, StackConfig
from aml_participant_simulator import Script, Simulator
from aml_participant_simulator.script import EndpointScript
from aml_runtime.codehash import CODE_HASH_OVERRIDE, code_hash

pytestmark = pytest.mark.integration

_MISSING = [name for name in ("nats-server", "nx-27017") if find_executable(name) is None]
if _MISSING:
    pytest.skip(f"embedded components missing: {', '.join(_MISSING)}", allow_module_level=True)

DATASET = "synthetic"
JOB_TIMEOUT = 300.0
OTHER_BUILD = "f" * 64
# The running build, as the workers compute it from the same installed files.
OWN_BUILD = code_hash()


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    data_dir = tmp_path_factory.mktemp("platform")
    with EmbeddedStack(StackConfig(data_dir=data_dir, start_llm=False)) as stack:
        stack.start_infra()
        llm = standin_in_stack(stack, latency=0.05, capacity=4, name="llm-standin")
        config = PlatformConfig(
            datasets_root=Path("/nonexistent"),
            llm_concurrency=4,
            # Only the code hash matters here: the gate's code_hash check then compares with
            # the build that runs.
            release_baseline=ReleaseBaseline(
                answer_model="m",
                spec_hash="s",
                code_hash=OWN_BUILD,
                dataset_bundle_hash="d",
                question_counts={DATASET: 0},
            ),
            extra_env={"AML_LLM_BASE_URL": f"{llm}/v1", "AML_TOKEN_COUNTER": "estimate"},
        )
        yield start_platform(stack, config)


def replace_answerer(platform: Platform, env: dict[str, str]) -> None:
    """Stop the answerer and start it again under `env` (a new build, as a rolling upgrade
    would: its queued work waits in the stream meanwhile)."""
    platform.stack.process("answerer").stop()
    argv = [sys.executable, "-m", "aml_answerer"]
    platform.stack.start_process("answerer", argv, {**platform.env, **env})


def run_job(platform: Platform, team: str, upgrade: bool) -> dict[str, Any]:
    """A smoke job on the synthetic dataset, until it is gated: its status. With `upgrade`, the
    answerer is replaced by another build once the participant has seen the first Add (each
    Add takes half a second: the question stages have not started)."""
    simulator = Simulator(Script(add=EndpointScript(latency=0.5)))
    port = free_port(HOST)
    with simulator.running(HOST, port):
        version_id, key = register_participant(
            platform,
            f"http://{HOST}:{port}",
            team,
            f"sim-{team}",
            capacity={"max_concurrency": 2, "max_rps": 20.0},
        )
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=platform.gateway_url, headers=auth, timeout=30) as api:
            job = {"version_id": version_id, "run_label": team, "datasets": [DATASET]}
            created = api.post("/v1/jobs", json=job)
            assert created.status_code == 201, created.text
            job_id = created.json()["job_id"]
            deadline = time.monotonic() + JOB_TIMEOUT
            while True:
                status: dict[str, Any] = api.get(f"/v1/jobs/{job_id}").json()
                if status["state"] in ("completed", "failed") and status["gate"] is not None:
                    return status
                assert time.monotonic() < deadline, f"job {job_id} stuck: {status}"
                if upgrade and any(r.endpoint == "add" for r in simulator.requests):
                    replace_answerer(platform, {CODE_HASH_OVERRIDE: OTHER_BUILD})
                    upgrade = False
                time.sleep(0.25)


def code_hash_check(status: dict[str, Any]) -> dict[str, Any]:
    checks = {check["name"]: check for check in status["gate"]["checks"]}
    found: dict[str, Any] = checks["code_hash"]
    return found


def test_a_job_processed_by_two_builds_is_refused_by_the_gate(platform: Platform) -> None:
    calm = run_job(platform, "team-calm", upgrade=False)
    assert calm["state"] == "completed", calm
    assert calm["code_hash"] == OWN_BUILD
    assert calm["code_hashes"] == [OWN_BUILD]
    check = code_hash_check(calm)
    assert check["passed"], check

    try:
        mixed = run_job(platform, "team-upgraded", upgrade=True)
    finally:
        replace_answerer(platform, {})
    # The job itself finishes: every item was processed, by one build or the other.
    assert mixed["state"] == "completed", mixed
    assert mixed["code_hash"] == OWN_BUILD
    assert mixed["code_hashes"] == sorted([OWN_BUILD, OTHER_BUILD])
    check = code_hash_check(mixed)
    assert not check["passed"]
    assert check["reason"].startswith(
        f"mixed code: the job's items were processed by builds "
        f"{', '.join(h[:12] for h in sorted([OWN_BUILD, OTHER_BUILD]))} "
        f"(submitted under {OWN_BUILD[:12]})"
    )
    assert mixed["publishable"] is False
