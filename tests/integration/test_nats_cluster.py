"""Jobs on a three-node JetStream cluster (three nats-server processes clustered on loopback,
every stream at R3, every service given the three URLs) riding through the loss of a node:
one that leads no stream SIGKILLed and restarted mid-job, then the node leading the work
stream. Each job is compared with an undisturbed one on the same cluster: the same answers and
results, every item there, no Add or Search sent more times than the retry table allows."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from llm_support import standin_in_stack
from nats.js.errors import ServiceUnavailableError
from pymongo import MongoClient
from served_participant import Participant, max_in_window, slow_simulator

from aml_contract import subjects
from aml_devtools.platform import Platform, PlatformConfig, register_participant, start_platform
from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_runtime.settings import nats_servers

pytestmark = pytest.mark.integration

_MISSING = [name for name in ("nats-server", "nx-27017") if find_executable(name) is None]
if _MISSING:
    pytest.skip(f"embedded components missing: {', '.join(_MISSING)}", allow_module_level=True)

DATASET = "synthetic"
CAPACITY = {"max_concurrency": 2, "max_rps": 20.0}
MAX_ATTEMPTS = 5
# The synthetic dataset's Add requests and questions.
ADDS = 12
QUESTIONS = 30
JOB_TIMEOUT = 180.0
# How long a killed node stays down.
DOWN_SECONDS = 4.0


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    data_dir = tmp_path_factory.mktemp("cluster")
    config = StackConfig(data_dir=data_dir, start_llm=False, nats_nodes=3)
    with EmbeddedStack(config) as stack:
        stack.start_infra()
        llm = standin_in_stack(stack, latency=0.02, capacity=4, name="llm-standin")
        yield start_platform(
            stack,
            PlatformConfig(
                datasets_root=Path("/nonexistent"),
                llm_concurrency=4,
                participant_max_attempts=MAX_ATTEMPTS,
                extra_env={
                    "AML_LLM_BASE_URL": f"{llm}/v1",
                    # The stand-in has no /tokenize.
                    "AML_TOKEN_COUNTER": "estimate",
                    "AML_PARTICIPANT_TIMEOUT_SECONDS": "5",
                },
            ),
        )


def test_the_stack_runs_the_streams_at_r3_on_three_nodes(platform: Platform) -> None:
    stack = platform.stack
    assert len(nats_servers(stack.nats_url)) == 3
    assert stack.env()["AML_STREAM_REPLICAS"] == "3"
    for stream in (subjects.WORK_STREAM, subjects.EVENTS_STREAM, subjects.FINISHED_STREAM):
        info = _stream_info(platform, stream)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.leader
        assert len(info.cluster.replicas or []) == 2


@dataclass
class Run:
    job_id: str
    key: str
    status: dict[str, Any]
    participant: Participant
    seconds: float
    # time.monotonic() when the job was seen ended.
    ended: float


Events = Callable[[Participant, Platform, float], None]


def _run(platform: Platform, team: str, events: Events | None = None) -> Run:
    # About 2 s of Adds and 6 s of Searches at the declared concurrency: the job is still
    # writing when a node goes and still running when it comes back.
    participant = Participant(slow_simulator(add_seconds=0.3, search_seconds=0.4))
    participant.up()
    try:
        version_id, key = register_participant(
            platform, participant.url, team, f"sim-{team}", capacity=dict(CAPACITY)
        )
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=platform.gateway_url, headers=auth, timeout=30) as api:
            job = {"version_id": version_id, "run_label": team, "datasets": [DATASET]}
            created = api.post("/v1/jobs", json=job)
            assert created.status_code == 201, created.text
            job_id = created.json()["job_id"]
            started = time.monotonic()
            while True:
                status = api.get(f"/v1/jobs/{job_id}").json()
                if status["state"] in ("completed", "failed"):
                    break
                elapsed = time.monotonic() - started
                assert elapsed < JOB_TIMEOUT, f"job {job_id} stuck: {status}"
                if events is not None:
                    events(participant, platform, elapsed)
                time.sleep(0.2)
    finally:
        participant.down()
    ended = time.monotonic()
    return Run(job_id, key, status, participant, ended - started, ended)


def _stream_info(platform: Platform, stream: str) -> Any:
    """The stream's info, asked again while the cluster has no leader for it (an election
    after a leader's loss takes a few seconds)."""

    async def ask() -> Any:
        nc = await nats.connect(nats_servers(platform.stack.nats_url), connect_timeout=2)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    return await nc.jetstream(timeout=2).stream_info(stream)
                except (nats.errors.TimeoutError, ServiceUnavailableError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()

    return asyncio.run(ask())


def _work_leader(platform: Platform) -> str:
    """The process of the node leading the work stream, once the cluster has elected one."""
    deadline = time.monotonic() + 30
    while True:
        info = _stream_info(platform, subjects.WORK_STREAM)
        if info.cluster is not None and info.cluster.leader:
            return platform.stack.nats_process(info.cluster.leader)
        assert time.monotonic() < deadline, f"no leader elected for the work stream: {info}"
        time.sleep(0.2)


def _answers(platform: Platform, job_id: str) -> dict[str, str]:
    db = MongoClient(platform.stack.mongo_url, tz_aware=True)["aml"]
    docs = db.answers.find({"job_id": job_id}, {"answer": 1})
    return {doc["_id"].split("/", 1)[1]: doc["answer"] for doc in docs}


def _results(platform: Platform, run: Run) -> dict[str, Any]:
    response = httpx.get(
        f"{platform.gateway_url}/v1/jobs/{run.job_id}/results",
        headers={"Authorization": f"Bearer {run.key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    return {"overall": body["overall"], "datasets": body["datasets"]}


def _sent(run: Run) -> dict[str, Counter[str]]:
    """How many times the participant received each Add (by request id) and each Search (by
    user and query)."""
    sent: dict[str, Counter[str]] = {"add": Counter(), "search": Counter()}
    for record in run.participant.simulator.requests:
        if record.endpoint in sent:
            body = json.loads(record.body)
            ident = body.get("request_id") or f"{body['user_id']}?{body['query']}"
            sent[record.endpoint][ident] += 1
    return sent


def _as_undisturbed(platform: Platform, run: Run, undisturbed: tuple[dict[str, str], Any]) -> None:
    shown = json.dumps(run.status)
    assert run.status["state"] == "completed", shown
    assert run.status["errors"] == [] and run.status["platform_failures"] == 0, shown
    answers, results = undisturbed
    assert _answers(platform, run.job_id) == answers
    assert _results(platform, run) == results
    sent = _sent(run)
    # Every item reached the participant, none beyond the retry table.
    assert len(sent["add"]) == ADDS and len(sent["search"]) == QUESTIONS
    assert max(sent["add"].values()) <= MAX_ATTEMPTS
    assert max(sent["search"].values()) <= MAX_ATTEMPTS
    # The declared capacity held while the cluster lost and regained a node.
    calls = [r for r in run.participant.simulator.requests if r.endpoint in ("add", "search")]
    assert max(r.concurrency_at_arrival for r in calls) <= CAPACITY["max_concurrency"]
    assert max_in_window([r.arrived_monotonic for r in calls]) <= CAPACITY["max_rps"]
    print(  # the duplicates a node's loss cost, for the report
        f"{run.job_id}: {run.seconds:.1f}s, Adds sent {sum(sent['add'].values())}, "
        f"Searches sent {sum(sent['search'].values())}"
    )


@pytest.fixture(scope="module")
def undisturbed(platform: Platform) -> tuple[dict[str, str], dict[str, Any]]:
    run = _run(platform, "team-calm")
    assert run.status["state"] == "completed", run.status
    print(f"{run.job_id} (undisturbed): {run.seconds:.1f}s")
    answers = _answers(platform, run.job_id)
    assert len(answers) == QUESTIONS
    sent = _sent(run)
    assert max(sent["add"].values()) == 1 and max(sent["search"].values()) == 1
    return answers, _results(platform, run)


class KillThenRestart:
    """At the job's first Add, SIGKILL the node `choose` names; restart it DOWN_SECONDS later,
    the job going on meanwhile on the other two. The restart runs on its own clock (a thread),
    not the status polls': asking the cluster who leads the work stream while a node is gone
    can take seconds (an election), and the job must not outrun the restart because of it."""

    def __init__(self, choose: Callable[[Platform], str]) -> None:
        self.choose = choose
        self.marks: dict[str, Any] = {}
        self._thread: threading.Thread | None = None

    def __call__(self, participant: Participant, platform: Platform, elapsed: float) -> None:
        if self._thread is None and participant.count("add") >= 1:
            self.marks["node"] = self.choose(platform)
            platform.stack.kill(self.marks["node"])
            self.marks["adds_at_kill"] = participant.count("add")
            self._thread = threading.Thread(target=self._bring_back, args=(platform,))
            self._thread.start()

    def _bring_back(self, platform: Platform) -> None:
        killed = time.monotonic()
        try:
            self.marks["leader_meanwhile"] = _work_leader(platform)
        finally:
            time.sleep(max(0.0, killed + DOWN_SECONDS - time.monotonic()))
            platform.stack.restart(self.marks["node"])
            self.marks["back"] = time.monotonic()

    def finish(self) -> None:
        """Wait for the restart (the next test needs all three nodes)."""
        if self._thread is not None:
            self._thread.join(timeout=120)


def _disturbed(
    platform: Platform, team: str, choose: Callable[[Platform], str]
) -> tuple[Run, dict[str, Any]]:
    disturbance = KillThenRestart(choose)
    try:
        run = _run(platform, team, disturbance)
    finally:
        disturbance.finish()
    marks = disturbance.marks
    assert "back" in marks, f"the node did not come back: {marks}"
    # The node went while the job was writing and came back before it ended.
    assert marks["adds_at_kill"] < ADDS
    assert marks["back"] < run.ended, f"the job ended before the node came back: {marks}"
    return run, marks


def test_a_follower_node_killed_and_restarted_mid_job(
    platform: Platform, undisturbed: tuple[dict[str, str], dict[str, Any]]
) -> None:
    def follower(platform: Platform) -> str:
        info = _stream_info(platform, subjects.WORK_STREAM)
        return platform.stack.nats_process(info.cluster.replicas[0].name)

    run, _ = _disturbed(platform, "team-follower", follower)
    _as_undisturbed(platform, run, undisturbed)


def test_the_work_stream_leaders_node_killed_mid_job(
    platform: Platform, undisturbed: tuple[dict[str, str], dict[str, Any]]
) -> None:
    run, marks = _disturbed(platform, "team-leader", _work_leader)
    # Another node led the work stream while that one was down.
    assert marks["leader_meanwhile"] != marks["node"]
    _as_undisturbed(platform, run, undisturbed)
