"""Submitting a job through the gateway and waiting for it to end, as a team's client does:
shared by the integration tests that run whole jobs on the real stack."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import httpx

from aml_participant_simulator.recording import RequestRecord

FINAL_STATES = ("completed", "failed")


def submit_and_wait(
    gateway_url: str, key: str, job: dict[str, Any], timeout: float, poll: float = 0.5
) -> tuple[str, dict[str, Any]]:
    """POST the job, then poll its status until it is completed or failed: (job id, status).
    Fails the test when the gateway refuses the job or the job outlives `timeout` seconds."""
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=gateway_url, headers=auth, timeout=30) as api:
        created = api.post("/v1/jobs", json=job)
        assert created.status_code == 201, created.text
        job_id: str = created.json()["job_id"]
        deadline = time.monotonic() + timeout
        while (status := api.get(f"/v1/jobs/{job_id}").json())["state"] not in FINAL_STATES:
            assert time.monotonic() < deadline, f"job {job_id} stuck: {status}"
            time.sleep(poll)
    return job_id, status


def accepted_bodies(requests: Iterable[RequestRecord], endpoint: str) -> list[dict[str, Any]]:
    """The bodies of the requests the participant accepted (200) at `endpoint`, in the order
    they arrived."""
    accepted = sorted(
        (r for r in requests if r.status == 200 and r.endpoint == endpoint),
        key=lambda r: r.arrived_monotonic,
    )
    return [json.loads(r.body) for r in accepted]


def job_results(gateway_url: str, key: str, job_id: str) -> dict[str, Any]:
    """The job's results as its team reads them, or {"error": ...} when there are none."""
    response = httpx.get(
        f"{gateway_url}/v1/jobs/{job_id}/results",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    return response.json() if response.status_code == 200 else {"error": response.text}
