"""Efficiency figures of whole jobs, through every service as separate processes on real
components (nats-server with JetStream, nx-27017), the participant simulator over loopback HTTP
and the LLM stand-in (which reports `usage`): a participant with a known latency distribution
(the figures match the latencies it drew, within the histogram's 2% and the loopback's own
time), one returning oversized candidates (retrieved tokens far above those used, every question
truncated) and one whose first answers to some Searches are a 503, a 429 and a timeout (counted,
retried, left out of the first attempts).

Latency is measured by the platform (request sent to response received), so it is the drawn
latency plus the way through loopback and the simulator's own handling, which a loaded
two-core machine stretches without bound. So each figure is asserted against both ends: the
exact order statistic of the latencies the audit recorded, within the histogram's 2% (what the
figure claims), and never below the order statistic the participant drew (each recorded
latency holds its drawn one), with only a loose sanity bound above it."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from job_support import submit_and_wait
from llm_support import standin_in_stack

from aml_devtools.platform import Platform, PlatformConfig, register_participant, start_platform
from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_evaluation.registry import load_dataset
from aml_evaluation.wordcount import count_words
from aml_participant_simulator import (
    EndpointScript,
    FixedLatency,
    Outcome,
    Script,
    Simulator,
    UniformLatency,
    running_simulator,
)

pytestmark = pytest.mark.integration

_MISSING = [name for name in ("nats-server", "nx-27017") if find_executable(name) is None]
if _MISSING:
    pytest.skip(f"embedded components missing: {', '.join(_MISSING)}", allow_module_level=True)

JOB_TIMEOUT = 120.0
DATASET = "synthetic"
RESOLUTION = 0.02
# Far above the way through loopback on a quiet machine (a few ms), yet far below the drawn
# latencies' spread: a figure above drawn + this is not measuring the participant.
SANITY_MS = 1000.0
# Each attempt's deadline (AML_PARTICIPANT_TIMEOUT_SECONDS): a slower answer is a timeout. Far
# above the scripted latencies, so a loaded machine does not turn an ordinary call into one.
TIMEOUT_SECONDS = 3.0
CAPACITY = {"max_concurrency": 4, "max_rps": 50}
DEPLOYMENT = "loopback-test"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    data_dir = tmp_path_factory.mktemp("platform")
    with EmbeddedStack(StackConfig(data_dir=data_dir, start_llm=False)) as stack:
        stack.start_infra()
        llm = standin_in_stack(stack, latency=0.01, capacity=4, name="llm-standin")
        config = PlatformConfig(
            datasets_root=Path("/nonexistent"),
            llm_concurrency=4,
            extra_env={
                "AML_LLM_BASE_URL": f"{llm}/v1",
                # The stand-in has no /tokenize.
                "AML_TOKEN_COUNTER": "estimate",
                # Retries at once rather than after seconds.
                "AML_PARTICIPANT_BACKOFF_BASE_SECONDS": "0.05",
                "AML_PARTICIPANT_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS),
                "AML_DEPLOYMENT_LABEL": DEPLOYMENT,
            },
        )
        yield start_platform(stack, config)


@dataclass
class Run:
    results: dict[str, Any]
    simulator: Simulator
    job_id: str
    key: str


def run(platform: Platform, team: str, script: Script) -> Run:
    """A smoke job (the synthetic dataset) against a simulated participant: its results, and
    the simulator that recorded every request."""
    simulator = Simulator(script)
    with running_simulator(simulator) as url:
        version_id, key = register_participant(
            platform, url, team, f"sim-{team}", capacity=CAPACITY
        )
        job = {"version_id": version_id, "run_label": team, "datasets": [DATASET]}
        job_id, status = submit_and_wait(platform.gateway_url, key, job, JOB_TIMEOUT)
        assert status["state"] == "completed", status
    response = httpx.get(
        f"{platform.gateway_url}/v1/jobs/{job_id}/results",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return Run(response.json(), simulator, job_id, key)


def audited_latencies(platform: Platform, done: Run, operation: str) -> list[float]:
    """`latency_ms` of the job's successful first attempts of `operation`, from its audit."""
    latencies, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        response = httpx.get(
            f"{platform.gateway_url}/v1/jobs/{done.job_id}/audit",
            params=params,
            headers={"Authorization": f"Bearer {done.key}"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        page = response.json()
        latencies += [
            record["latency_ms"]
            for record in page["records"]
            if record["operation"] == operation and record["attempt"] == 1
            and record["outcome"] == "ok"
        ]  # fmt: skip
        cursor = page["next_cursor"]
        if cursor is None:
            return latencies


def nearest_rank(values: list[float], percent: int) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(percent * len(ordered) / 100)) - 1]


def assert_measured(reported: float, audited: float, drawn: float) -> None:
    """A reported percentile against the same order statistic of the audited latencies (its
    histogram bucket's upper bound: at most 2% above) and of the participant's drawn ones."""
    assert audited <= reported <= audited * (1 + RESOLUTION) + 1e-9, (reported, audited)
    assert drawn <= reported <= drawn + SANITY_MS, (reported, drawn)


def test_a_known_latency_distribution_comes_out_as_drawn(platform: Platform) -> None:
    script = Script(
        search=EndpointScript(latency=UniformLatency(kind="uniform", low=0.05, high=0.3, seed=5)),
        add=EndpointScript(latency=FixedLatency(kind="fixed", seconds=0.1)),
    )
    done = run(platform, "team-latency", script)
    simulator, figures = done.simulator, done.results["efficiency"]
    assert figures["method"] == "efficiency-v1"
    assert figures["measured_under"] == {
        "search_top_k": {DATASET: 100}, "max_concurrency": 4, "max_rps": 50.0,
        "deployment": DEPLOYMENT,
    }  # fmt: skip

    drawn = [r.latency_s * 1000 for r in simulator.requests if r.endpoint == "search"]
    assert len(drawn) == 30
    search = figures["overall"]["search"]
    assert (search["items"], search["attempts"], search["retried"]["count"]) == (30, 30, 0)
    first = search["first_attempts"]
    assert first["count"] == 30 and first["resolution"] == RESOLUTION
    audited = audited_latencies(platform, done, "search")
    assert len(audited) == 30
    for percent in (50, 95, 99):
        reported = first[f"p{percent}_ms"]
        assert_measured(reported, nearest_rank(audited, percent), nearest_rank(drawn, percent))
    assert first["max_ms"] == max(audited) and max(drawn) <= first["max_ms"]

    adds = [r for r in simulator.requests if r.endpoint == "add"]
    add = figures["overall"]["add"]
    assert add["items"] == add["first_attempts"]["count"] == len(adds)
    audited_adds = audited_latencies(platform, done, "add")
    for percent in (50, 95):
        reported = add["first_attempts"][f"p{percent}_ms"]
        assert_measured(reported, nearest_rank(audited_adds, percent), 100.0)
    # Per dataset as per job (one dataset); per category, Searches only.
    dataset = figures["datasets"][DATASET]
    assert dataset["overall"]["search"] == search
    categories = dataset["categories"]
    assert sum(cell["search"]["items"] for cell in categories.values()) == 30
    assert all(cell["add"] is None for cell in categories.values())

    # The platform's own model use, as the stand-in reported it.
    llm = figures["overall"]["llm"]
    assert llm["questions"] == 30
    assert llm["answer_tokens_in_mean"] > 0 and llm["answer_tokens_out_mean"] > 0
    assert llm["judge_tokens_in_mean"] > 0 and llm["judge_tokens_out_mean"] > 0
    context = figures["overall"]["context"]
    assert context["questions"] == 30
    assert context["retrieved_tokens_mean"] >= context["used_tokens_mean"] > 0


def test_oversized_candidates_are_retrieved_in_full_and_mostly_lost(platform: Platform) -> None:
    memory = "Mira keeps a detailed diary of every trip she takes with her sister Lena. " * 10
    candidates = [
        {"id": f"m{n}", "content": f"{n}: {memory}", "score": 1.0 - n / 100} for n in range(25)
    ]
    body = json.dumps({"data": candidates})
    search = EndpointScript(
        then=Outcome(status=200, body=body, headers={"content-type": "application/json"})
    )
    done = run(platform, "team-oversized", Script(search=search))
    context = done.results["efficiency"]["overall"]["context"]
    texts = [str(candidate["content"]) for candidate in candidates]
    words = [count_words(text) for text in texts]
    # The context budget (200 tokens here) keeps only the first, always kept, candidate.
    assert context["questions"] == context["truncated_questions"] == 30
    assert (context["candidates_returned_mean"], context["candidates_used_mean"]) == (25.0, 1.0)
    assert context["retrieved_tokens_mean"] == sum(words)
    assert context["retrieved_bytes_mean"] == sum(len(text.encode()) for text in texts)
    assert context["used_tokens_mean"] == words[0]
    assert context["retrieved_tokens_mean"] > 20 * context["used_tokens_mean"]


def test_retried_calls_are_counted_apart_from_first_attempts(platform: Platform) -> None:
    questions = [q.question for q in load_dataset(DATASET, Path("/nonexistent")).questions]
    unavailable, limited, slow = questions[0], questions[5], questions[10]
    slow_answer = Outcome(mode="slow", delay_s=TIMEOUT_SECONDS + 0.5)
    search = EndpointScript(
        by_key={
            unavailable: [Outcome(status=503)],
            limited: [Outcome(status=429)],
            slow: [slow_answer],
        }
    )
    done = run(platform, "team-retried", Script(search=search))
    simulator, calls = done.simulator, done.results["efficiency"]["overall"]["search"]
    assert (calls["items"], calls["attempts"]) == (30, 33)
    assert (calls["timeouts"], calls["rate_limited"], calls["errors"]) == (1, 1, 1)
    assert calls["first_attempts"]["count"] == 27
    assert calls["retried"]["count"] == 6
    # The timed-out attempt is the slowest retried one: about the attempt's deadline (which
    # starts a moment before the request leaves).
    assert calls["retried"]["max_ms"] >= 0.9 * TIMEOUT_SECONDS * 1000
    assert calls["first_attempts"]["max_ms"] < TIMEOUT_SECONDS * 1000
    searched = [r for r in simulator.requests if r.endpoint == "search"]
    assert len(searched) == 33
