"""Whole jobs riding through outages (SPEC R-4.13), every service a separate process on real
components: nats-server with JetStream, nx-27017, the participant simulator over loopback HTTP
(stopped, then served again on the same port) and the LLM stand-in (its process killed, then
restarted). Each disturbed job is compared with an undisturbed one of the same dataset: the
same answers and results, no item sent more than the retry table allows, the declared capacity
never exceeded when the participant comes back to a backlog, the pause visible in the API
while it lasts, and the stall watchdog (60 s here) quiet through pauses longer than that.

Outages longer than their window run on a second platform with short windows: the job fails
as participant_outage with the outage's start and end, and an answer model down too long fails
its questions as the platform's (the job is then not publishable and not charged)."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from llm_support import standin_in_stack
from pymongo import MongoClient
from served_participant import Participant, max_in_window, slow_simulator

from aml_devtools.platform import Platform, PlatformConfig, register_participant, start_platform
from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_participant_simulator.recording import RequestRecord
from aml_runtime.db import read_time

# Minutes of real-time outages: run beside the other tests (dev.py).
pytestmark = [pytest.mark.integration, pytest.mark.wallclock]

_MISSING = [name for name in ("nats-server", "nx-27017") if find_executable(name) is None]
if _MISSING:
    pytest.skip(f"embedded components missing: {', '.join(_MISSING)}", allow_module_level=True)

STANDIN = "llm-standin"
DATASET = "synthetic"
CAPACITY = {"max_concurrency": 2, "max_rps": 20.0}
MAX_ATTEMPTS = 5
# The synthetic dataset's Add requests.
ADDS = 12
JOB_TIMEOUT = 420.0


def _platform(factory: pytest.TempPathFactory, env: dict[str, str]) -> Iterator[Platform]:
    data_dir = factory.mktemp("platform")
    with EmbeddedStack(StackConfig(data_dir=data_dir, start_llm=False)) as stack:
        stack.start_infra()
        llm = standin_in_stack(stack, latency=0.05, capacity=4, name=STANDIN)
        config = PlatformConfig(
            datasets_root=Path("/nonexistent"),
            llm_concurrency=4,
            participant_max_attempts=MAX_ATTEMPTS,
            extra_env={
                "AML_LLM_BASE_URL": f"{llm}/v1",
                # The stand-in has no /tokenize.
                "AML_TOKEN_COUNTER": "estimate",
                # A job that nothing moves for 60 s is failed, unless it waits out a pause:
                # every outage below outlasts that.
                "AML_JOB_STALL_SECONDS": "60",
                "AML_PARTICIPANT_TIMEOUT_SECONDS": "5",
                **env,
            },
        )
        yield start_platform(stack, config)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """Production's outage windows (10 and 30 minutes) and retry schedule."""
    yield from _platform(tmp_path_factory, {})


@pytest.fixture(scope="module")
def short_windows(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """Outage windows of 12 s and retries spanning a few seconds, so an outage outlives them."""
    yield from _platform(
        tmp_path_factory,
        {
            "AML_PARTICIPANT_OUTAGE_SECONDS": "12",
            "AML_LLM_OUTAGE_SECONDS": "12",
            "AML_PARTICIPANT_BACKOFF_BASE_SECONDS": "0.3",
        },
    )


@dataclass
class Run:
    job_id: str
    key: str
    status: dict[str, Any]
    # Every `paused` entry the status showed while the job ran, by kind.
    pauses_seen: dict[str, set[str]]
    requests: list[RequestRecord]
    version_id: str


def _run(
    platform: Platform,
    team: str,
    events: Callable[[Participant, Platform, float], None] | None = None,
) -> Run:
    """A smoke job of a new team on the synthetic dataset; `events(participant, platform,
    elapsed)` is called at every poll to disturb it."""
    # About 3 s of Adds and 4.5 s of Searches at the declared concurrency.
    participant = Participant(slow_simulator(add_seconds=0.5, search_seconds=0.3))
    participant.up()
    try:
        version_id, key = register_participant(
            platform, participant.url, team, f"sim-{team}", capacity=dict(CAPACITY)
        )
        auth = {"Authorization": f"Bearer {key}"}
        seen: dict[str, set[str]] = defaultdict(set)
        with httpx.Client(base_url=platform.gateway_url, headers=auth, timeout=30) as api:
            job = {"version_id": version_id, "run_label": team, "datasets": [DATASET]}
            created = api.post("/v1/jobs", json=job)
            assert created.status_code == 201, created.text
            job_id = created.json()["job_id"]
            started = time.monotonic()
            while True:
                status = api.get(f"/v1/jobs/{job_id}").json()
                for pause in status["paused"]:
                    seen[pause["kind"]].add(pause["message"])
                if status["state"] in ("completed", "failed"):
                    break
                elapsed = time.monotonic() - started
                assert elapsed < JOB_TIMEOUT, f"job {job_id} stuck: {status}"
                if events is not None:
                    events(participant, platform, elapsed)
                time.sleep(0.25)
    finally:
        participant.down()
    return Run(job_id, key, status, dict(seen), list(participant.simulator.requests), version_id)


def _shown(run: Run, kind: str, start: str) -> bool:
    return any(message.startswith(start) for message in run.pauses_seen.get(kind, ()))


def _db(platform: Platform) -> Any:
    return MongoClient(platform.stack.mongo_url, tz_aware=True)["aml"]


def _answers(platform: Platform, job_id: str) -> dict[str, str]:
    """Each question's answer, by its id without the job's."""
    docs = _db(platform).answers.find({"job_id": job_id}, {"answer": 1})
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


def _attempts(platform: Platform, job_id: str) -> dict[str, list[dict[str, Any]]]:
    """The audited attempts of each participant call of the job, by item."""
    calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in _db(platform).calls.find({"job_id": job_id}):
        calls[call["item_id"]].append(call)
    return calls


def _moment(stored: Any) -> float:
    moment = read_time(stored)
    assert moment is not None
    return moment.timestamp()


def _outages(platform: Platform, key: str) -> list[dict[str, Any]]:
    return list(_db(platform).outages.find({"key": key}).sort("since", 1))


def _within_declared(run: Run) -> None:
    """The declared capacity held, before, during and after the outage (R-4.12)."""
    calls = [r for r in run.requests if r.endpoint in ("add", "search")]
    assert max(r.concurrency_at_arrival for r in calls) <= CAPACITY["max_concurrency"]
    assert max_in_window([r.arrived_monotonic for r in calls]) <= CAPACITY["max_rps"]


def _same_bytes_on_every_retry(run: Run) -> None:
    """What the participant received more than once was the same request, byte for byte."""
    bodies: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    for record in run.requests:
        if record.endpoint in ("add", "search"):
            sent = json.loads(record.body)
            ident = sent.get("request_id") or f"{sent['user_id']}?{sent['query']}"
            bodies[(record.endpoint, ident)].add(record.body)
    assert all(len(variants) == 1 for variants in bodies.values())


@pytest.fixture(scope="module")
def undisturbed(platform: Platform) -> tuple[dict[str, str], dict[str, Any]]:
    run = _run(platform, "team-calm")
    assert run.status["state"] == "completed", json.dumps(run.status)
    assert run.pauses_seen == {}
    answers = _answers(platform, run.job_id)
    assert len(answers) == 30
    return answers, _results(platform, run)


def test_a_participant_blip_and_a_short_llm_outage_are_ridden_through(
    platform: Platform, undisturbed: tuple[dict[str, str], dict[str, Any]]
) -> None:
    """The participant down 5 s in the Add phase and 5 s in the Search phase (the retries alone
    ride it through: five attempts span at least 22.5 s), the answer model down 30 s (paused at
    its first failure)."""
    marks: dict[str, float] = {}

    def events(participant: Participant, platform: Platform, elapsed: float) -> None:
        if "add_down" not in marks and participant.first("add"):
            participant.down()
            marks["add_down"] = elapsed
        elif "add_down" in marks and "add_up" not in marks and elapsed >= marks["add_down"] + 5:
            participant.up()
            marks["add_up"] = elapsed
        # Once every Add is written: a conversation's questions are searched while others are
        # still being written, so the first Search is not yet the Search phase.
        if (
            "llm_down" not in marks
            and participant.count("add") >= ADDS
            and participant.first("search")
        ):
            participant.down()
            platform.stack.kill(STANDIN)
            marks["llm_down"] = elapsed
        elif "llm_down" in marks and "search_up" not in marks and elapsed >= marks["llm_down"] + 5:
            participant.up()
            marks["search_up"] = elapsed
        elif "llm_down" in marks and "llm_up" not in marks and elapsed >= marks["llm_down"] + 30:
            platform.stack.restart(STANDIN)
            marks["llm_up"] = elapsed
            marks["llm_back_at"] = time.time()

    run = _run(platform, "team-blip", events)
    assert set(marks) == {"add_down", "add_up", "llm_down", "search_up", "llm_up", "llm_back_at"}
    shown = json.dumps(run.status)
    assert run.status["state"] == "completed", shown
    assert run.status["platform_failures"] == 0 and run.status["errors"] == [], shown
    answers, results = undisturbed
    assert _answers(platform, run.job_id) == answers
    assert _results(platform, run) == results
    # The blip needed no pause; the LLM's was shown while it lasted.
    assert _outages(platform, run.version_id) == []
    assert "participant" not in run.pauses_seen
    assert any(
        m.startswith("paused: answer model unreachable since ") for m in run.pauses_seen["llm"]
    )
    llm_outages = [o for o in _outages(platform, "llm") if o["since"] >= time.time() - 600]
    assert llm_outages and llm_outages[-1]["how"] == "ended"
    # From the first answer that failed to the first that passed, after the restart.
    assert llm_outages[-1]["until"] >= marks["llm_back_at"]
    # No Add beyond the retry table; what came twice came byte-identical.
    attempts = _attempts(platform, run.job_id)
    adds = {item: calls for item, calls in attempts.items() if calls[0]["stage"] == "add"}
    assert len(adds) == ADDS and max(len(calls) for calls in adds.values()) <= MAX_ATTEMPTS
    assert any(len(calls) > 1 for calls in adds.values())  # the blip was felt
    searches = [calls for calls in attempts.values() if calls[0]["stage"] == "search"]
    assert len(searches) == 30 and max(len(calls) for calls in searches) <= MAX_ATTEMPTS
    assert any(len(calls) > 1 for calls in searches)
    _same_bytes_on_every_retry(run)
    _within_declared(run)


def test_participants_down_60s_in_the_add_and_search_phases_and_the_llm_down_120s(
    platform: Platform, undisturbed: tuple[dict[str, str], dict[str, Any]]
) -> None:
    """Two teams at once: one's participant down 60 s from its first Add, the other's 60 s
    from its first Search, and the answer model down 120 s from then. Each longer than the
    stall watchdog's limit (60 s here) and far longer than the retry table's attempts: each
    version's lane and the LLM stages pause, are probed, resume, and both jobs complete as if
    nothing had happened."""

    llm_back_at: list[float] = []

    def outage_from(endpoint: str, llm: bool) -> Callable[[Participant, Platform, float], None]:
        marks: dict[str, float] = {}

        def events(participant: Participant, platform: Platform, elapsed: float) -> None:
            if "down" not in marks and participant.first(endpoint):
                participant.down()
                if llm:
                    platform.stack.kill(STANDIN)
                marks["down"] = elapsed
            if "down" in marks and "up" not in marks and elapsed >= marks["down"] + 60:
                participant.up()
                marks["up"] = elapsed
            llm_back = "down" in marks and elapsed >= marks["down"] + 120
            if llm and llm_back and "llm_up" not in marks:
                platform.stack.restart(STANDIN)
                marks["llm_up"] = elapsed
                llm_back_at.append(time.time())

        return events

    with ThreadPoolExecutor(max_workers=2) as pool:
        in_add = pool.submit(_run, platform, "team-down-add", outage_from("add", llm=False))
        in_search = pool.submit(_run, platform, "team-down-search", outage_from("search", llm=True))
        runs = {"add": in_add.result(), "search": in_search.result()}
    answers, results = undisturbed
    for stage, run in runs.items():
        shown = json.dumps(run.status)
        assert run.status["state"] == "completed", shown
        assert run.status["errors"] == [] and run.status["platform_failures"] == 0, shown
        assert _answers(platform, run.job_id) == answers
        assert _results(platform, run) == results

        # The pause, as the API showed it while it lasted, and as the audit keeps it.
        assert _shown(run, "participant", "paused: participant unreachable since ")
        (outage,) = _outages(platform, run.version_id)
        assert outage["how"] == "ended" and 55 <= outage["seconds"] <= 60 + 45 + 20

        # Nothing beyond the retry table: its attempts before the pause, then one per resume.
        attempts = _attempts(platform, run.job_id)
        calls = {item: made for item, made in attempts.items() if made[0]["stage"] == stage}
        assert len(calls) == (12 if stage == "add" else 30)
        assert max(len(made) for made in calls.values()) <= MAX_ATTEMPTS + 1
        # During the pause no further work was taken: only the calls in flight when it began.
        during = {
            item
            for item, made in calls.items()
            for call in made
            if outage["since"] + 1 < _moment(call["started_at"]) < outage["until"] - 1
        }
        assert len(during) <= CAPACITY["max_concurrency"]
        _same_bytes_on_every_retry(run)
        # The backlog after the outage went out within the declared capacity.
        _within_declared(run)
    assert any(
        _shown(run, "llm", "paused: answer model unreachable since ") for run in runs.values()
    )
    # From the first answer that failed to the first that passed, after the restart at 120 s.
    llm = _outages(platform, "llm")[-1]
    assert llm["how"] == "ended" and llm_back_at and llm["until"] >= llm_back_at[0]


def test_a_participant_down_longer_than_its_window_fails_the_job_with_start_and_end(
    short_windows: Platform,
) -> None:
    """In the Add phase: the Add's failure ends the job as participant_outage; the error
    summary names the outage's start and end. Nothing is sent while it waits."""

    def events(participant: Participant, platform: Platform, elapsed: float) -> None:
        if participant.first("add"):
            participant.down()

    run = _run(short_windows, "team-gone", events)
    assert run.status["state"] == "failed", json.dumps(run.status)
    errors = run.status["errors"]
    assert errors and errors[0]["kind"] == "participant_outage"
    reason = errors[0]["reason"]
    assert "participant unreachable from " in reason and " UTC to " in reason
    assert "longer than AML_PARTICIPANT_OUTAGE_SECONDS = 12 s" in reason
    (outage,) = _outages(short_windows, run.version_id)
    assert outage["how"] == "expired" and outage["seconds"] >= 12
    # Charged: the participant's outage, not the platform's.
    assert run.status["charged"] is True


def test_a_participant_down_longer_than_its_window_in_the_search_phase_fails_the_job(
    short_windows: Platform,
) -> None:
    def events(participant: Participant, platform: Platform, elapsed: float) -> None:
        if participant.first("search"):
            participant.down()

    run = _run(short_windows, "team-gone-search", events)
    assert run.status["state"] == "failed", json.dumps(run.status)
    assert run.status["stage"] is None
    kinds = Counter(error["kind"] for error in run.status["errors"])
    assert kinds["participant_outage"] >= 1
    assert all(kind == "participant_outage" for kind in kinds)
    reasons = [e["reason"] for e in run.status["errors"]]
    assert any("longer than AML_PARTICIPANT_OUTAGE_SECONDS = 12 s" in r for r in reasons)
    # Only the calls in flight failed: the job's queued work was purged, not failed one by one.
    assert sum(kinds.values()) <= CAPACITY["max_concurrency"]


def test_an_llm_down_longer_than_its_window_is_the_platforms_failure_not_the_teams(
    short_windows: Platform,
) -> None:
    marks: dict[str, float] = {}

    def events(participant: Participant, platform: Platform, elapsed: float) -> None:
        if "down" not in marks and participant.first("search"):
            platform.stack.kill(STANDIN)
            marks["down"] = elapsed

    try:
        run = _run(short_windows, "team-llm-gone", events)
    finally:
        short_windows.stack.restart(STANDIN)
    assert run.status["state"] == "completed", json.dumps(run.status)
    assert run.status["platform_failures"] > 0
    assert run.status["publishable"] is False and run.status["charged"] is False
    assert run.status["state_summary"].startswith("completed — not publishable")
    reasons = [e["reason"] for e in run.status["errors"] if e["kind"] == "platform_error"]
    assert reasons and all("answer model unreachable from " in r for r in reasons)
    assert all("AML_LLM_OUTAGE_SECONDS = 12 s" in r for r in reasons)


def test_every_outage_is_audited_once(platform: Platform) -> None:
    """Each outage of the runs above is one history entry (not one per waiting call)."""
    history = list(_db(platform).outages.find({}))
    by_key = Counter(entry["key"] for entry in history)
    ids = [entry["_id"] for entry in history]
    assert len(ids) == len(set(ids))
    assert by_key["llm"] >= 2
    assert all(entry["reason"] and entry["since"] < entry["until"] for entry in history)
