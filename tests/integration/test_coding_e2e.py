"""The coding track end to end (SPEC R-2.5): `synthetic-coding` smoke jobs through every service
as separate processes on real components (nats-server with JetStream, nx-27017), four memory
systems at once on one stack, each behind real HTTP on loopback: three participant simulators
whose Search is an oracle, empty or reverse-ranked (coding_participants.py), and the reference
memory server (tools/memory_server, BM25). The answerer solves each attempt with mini-swe-agent
in the bubblewrap sandbox and the scorer verifies it with the task's hidden tests; the agent's
model is the LLM stand-in's scripted coding agent (aml_llm_standin.coding: the gold fix when the
task's convention is in the memory section of its prompt, a plausible wrong fix otherwise), since
the local SmolLM2 cannot solve a coding task.

**The memory budget.** At the platform's default (AML_CODING_MEMORY_TOKENS=2000, counted by the
stand-in's `estimate` counter, 3 UTF-8 bytes a token) every scope of synthetic-coding fits whole:
a noisy scope's four trajectories take 1,320-1,962 tokens as memory lines, a relevant scope's one
324-533. So at 2,000 no ranking can push the relevant trajectory out, and the reverse-ranked
system would resolve exactly what the oracle does. The jobs here run at BUDGET tokens instead,
which separates them in the noisy condition: the oracle's relevant trajectory, first, reaches
its convention within 264-387 tokens; reversed, the other three trajectories (890-1,443 tokens)
then the relevant one's last messages take at least 1,142 tokens up to the convention. In the
relevant condition nothing can separate them: the scope holds the relevant trajectory alone, and
any order of its 324-533 tokens fits any budget that lets the oracle through. So the
reverse-ranked system resolves every relevant attempt and no noisy one.

Skipped where nats-server, nx-27017 or bubblewrap is missing (with the sandbox's one line)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from coding_participants import oracle, ranked_participant, reverse, scope_of
from job_support import submit_and_wait
from pymongo import MongoClient

from aml_contract.participant import AddRequest, SearchRequest, encode
from aml_devtools.platform import (
    PlatformConfig,
    register_memory_server,
    register_participant,
    start_memory_server,
    start_platform,
)
from aml_devtools.processes import find_executable
from aml_devtools.stack import EmbeddedStack, StackConfig
from aml_evaluation.chunker import AddChunk, plan_adds
from aml_evaluation.coding.bundle import (
    CONDITIONS,
    CodingBundle,
    load_coding_bundle,
    patch_files,
)
from aml_evaluation.coding.chunking import scope_user_id
from aml_evaluation.coding.synthetic import SHIPPED_BUNDLE_DIR, SYNTHETIC_CODING_ID
from aml_evaluation.context import estimated
from aml_evaluation.registry import load_dataset
from aml_llm_standin import create_app
from aml_llm_standin.app import MODEL_FINGERPRINT
from aml_memory_server.store import SqliteMemoryStore, content_text
from aml_participant_simulator import Ranking, Simulator, running_simulator
from aml_participant_simulator.memory import InProcessMemoryStore
from aml_participant_simulator.server import serve_in_thread
from aml_pipeline.coding_agent import memory_context
from aml_pipeline.sandbox import SandboxUnavailable, require_sandbox
from aml_runtime.settings import EvaluationSettings

pytestmark = pytest.mark.integration

if find_executable("nats-server") is None or find_executable("nx-27017") is None:
    pytest.skip("nats-server or nx-27017 is not installed", allow_module_level=True)

DATASET = SYNTHETIC_CODING_ID
SIMULATED = ("oracle", "empty", "reverse")
SYSTEMS = (*SIMULATED, "reference")
BUDGET = 1000
JOB_TIMEOUT = 600.0
# The stand-in answers at once, any number at a time: the platform's own pace is what runs.
LLM_CAPACITY = 64
# Attempts at the LLM at once across the four jobs (each holds its slot for its whole attempt).
ATTEMPTS_AT_ONCE = 4


@dataclass
class Run:
    job_id: str
    status: dict[str, Any]
    results: dict[str, Any]
    attempts: list[dict[str, Any]]
    answers: list[dict[str, Any]]
    audit: list[dict[str, Any]]
    # What the participant received (the simulators record it; the memory server does not).
    adds: list[bytes] | None


@dataclass
class Runs:
    by_system: dict[str, Run]
    seconds: float
    # The stand-in's calls by kind (coding, answer, judge).
    llm_calls: dict[str, int]


@pytest.fixture(scope="module")
def bundle() -> CodingBundle:
    return load_coding_bundle(SHIPPED_BUNDLE_DIR)


def _pages(api: httpx.Client, path: str, key: str, limit: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        page = api.get(path, params=params)
        page.raise_for_status()
        body = page.json()
        found.extend(body[key])
        cursor = body["next_cursor"]
        if cursor is None:
            return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, bundle: CodingBundle) -> Iterator[Runs]:
    try:
        require_sandbox()
    except SandboxUnavailable as unavailable:
        pytest.skip(str(unavailable))
    simulators = {name: ranked_participant(name, bundle) for name in SIMULATED}
    with (
        serve_in_thread(create_app(0.0, LLM_CAPACITY)) as llm_url,
        running_simulator(simulators["oracle"]) as oracle_url,
        running_simulator(simulators["empty"]) as empty_url,
        running_simulator(simulators["reverse"]) as reverse_url,
        EmbeddedStack(
            StackConfig(data_dir=tmp_path_factory.mktemp("platform"), start_llm=False)
        ) as stack,
    ):
        stack.start_infra()
        config = PlatformConfig(
            datasets_root=tmp_path_factory.mktemp("datasets"),
            llm_concurrency=ATTEMPTS_AT_ONCE,
            extra_env={
                "AML_LLM_BASE_URL": f"{llm_url}/v1",
                "AML_ANSWER_MODEL": MODEL_FINGERPRINT,
                # The stand-in has no /tokenize.
                "AML_TOKEN_COUNTER": "estimate",
                "AML_CODING_MEMORY_TOKENS": str(BUDGET),
            },
        )
        platform = start_platform(stack, config)
        memory = start_memory_server(stack)
        urls = {"oracle": oracle_url, "empty": empty_url, "reverse": reverse_url}
        versions = {
            name: register_participant(
                platform, urls[name], f"team-{name}", f"coding-{name}", track="coding"
            )
            for name in SIMULATED
        }
        versions["reference"] = register_memory_server(
            platform, memory, "team-reference", track="coding"
        )
        started = time.monotonic()
        with ThreadPoolExecutor(len(SYSTEMS)) as pool:
            waits = {
                name: pool.submit(
                    submit_and_wait,
                    platform.gateway_url,
                    key,
                    {
                        "version_id": version_id,
                        "mode": "smoke",
                        "track": "coding",
                        "run_label": f"coding-{name}",
                        "datasets": [DATASET],
                    },
                    JOB_TIMEOUT,
                )
                for name, (version_id, key) in versions.items()
            }
            ended = {name: wait.result() for name, wait in waits.items()}
        seconds = time.monotonic() - started
        llm_calls = httpx.get(f"{llm_url}/stats", timeout=10).json()["by_kind"]
        by_system: dict[str, Run] = {}
        mongo: MongoClient[dict[str, Any]]
        with MongoClient(stack.mongo_url) as mongo:
            for name, (job_id, status) in ended.items():
                key = versions[name][1]
                auth = {"Authorization": f"Bearer {key}"}
                with httpx.Client(base_url=platform.gateway_url, headers=auth, timeout=30) as api:
                    results = api.get(f"/v1/jobs/{job_id}/results")
                    attempts = _pages(api, f"/v1/jobs/{job_id}/attempts", "attempts", 200)
                    audit = _pages(api, f"/v1/jobs/{job_id}/audit", "records", 500)
                answers: list[dict[str, Any]] = list(
                    mongo["aml"]["answers"].find({"job_id": job_id})
                )
                simulator: Simulator | None = simulators.get(name)
                adds = (
                    None
                    if simulator is None
                    else [r.body for r in simulator.requests if r.endpoint == "add"]
                )
                by_system[name] = Run(
                    job_id=job_id,
                    status=status,
                    results=results.json(),
                    attempts=attempts,
                    answers=answers,
                    audit=audit,
                    adds=adds,
                )
        yield Runs(by_system, seconds, llm_calls)


# A memory system's Search over the Adds of synthetic-coding's every scope, as coding-v1 writes
# them: the request -> its candidates in the contract's shape, best first.
Searcher = Callable[[SearchRequest], list[dict[str, Any]]]


def planned_adds(run: str) -> list[AddChunk]:
    """The Adds a job over synthetic-coding writes, as the scheduler plans them."""
    return plan_adds(load_dataset(DATASET, Path("/nonexistent")), run)


def simulated(ranking: Ranking) -> Searcher:
    """A participant simulator's store ranking with `ranking` (the test doubles' own)."""
    store = InProcessMemoryStore()
    for add in planned_adds("run"):
        store.add(add.request)
    return lambda search: store.ranked(search, ranking)


def bm25(db: Path) -> Searcher:
    """The reference memory server's store (aml_memory_server.store)."""
    store = SqliteMemoryStore(db)
    for add in planned_adds("run"):
        store.add(add.request)

    def search(request: SearchRequest) -> list[dict[str, Any]]:
        found = store.search(request.user_id, content_text(request.query), request.top_k)
        return [item.model_dump(exclude_none=True) for item in found]

    return search


async def _conventions_shown(bundle: CodingBundle, search: Searcher, budget: int) -> dict[str, int]:
    """Per condition, in how many scopes the task's convention reaches the agent's prompt: the
    platform's own rule (coding-context-v1, the `estimate` counter) over the real trajectories,
    searched with the task's problem statement as a job searches."""
    shown: dict[str, int] = dict.fromkeys(CONDITIONS, 0)
    for task in bundle.tasks:
        assert task.stand_in is not None
        convention = " ".join(task.stand_in.convention.split())
        for condition in CONDITIONS:
            user_id = scope_user_id("run", DATASET, task.task_id, condition)
            candidates = search(
                SearchRequest(query=task.problem_statement, user_id=user_id, top_k=100)
            )
            memory = await memory_context(candidates, budget, estimated)
            shown[condition] += convention in " ".join(memory.text.split())
    return shown


async def test_the_budget_and_the_rankings_give_the_figures_asserted(
    bundle: CodingBundle, tmp_path: Path
) -> None:
    """The claims of the module docstring and of the figures below, from the real trajectory
    sizes and the real rule, without the pipeline."""
    default = EvaluationSettings().coding_memory_tokens
    assert (default, BUDGET) == (2000, 1000)
    best, worst = simulated(oracle(bundle)), simulated(reverse(bundle))
    everywhere = {"relevant": 8, "noisy": 8}
    # At the default budget every scope fits whole: the reverse ranking hides nothing.
    assert await _conventions_shown(bundle, worst, default) == everywhere
    assert await _conventions_shown(bundle, best, BUDGET) == everywhere
    assert await _conventions_shown(bundle, worst, BUDGET) == {"relevant": 8, "noisy": 0}
    reference = bm25(tmp_path / "memory.db")
    assert await _conventions_shown(bundle, reference, BUDGET) == everywhere
    # 429 tokens is where BM25's last convention (almanac-fiscal-quarters, noisy) comes in.
    assert await _conventions_shown(bundle, reference, 428) == {"relevant": 8, "noisy": 7}
    assert await _conventions_shown(bundle, reference, 429) == everywhere


def _question_scope(item_id: str) -> tuple[str, str]:
    """(task, condition) of a coding question's item id, `<job>/<dataset>/<task>:<condition>`."""
    task, condition = item_id.rsplit("/", 1)[1].split(":")
    return task, condition


def _by_scope(run: Run) -> dict[tuple[str, str], dict[str, Any]]:
    """The run's answer documents by (task, condition)."""
    return {_question_scope(answer["_id"]): answer for answer in run.answers}


def _resolved(run: Run) -> dict[str, int]:
    cells = run.results["datasets"][DATASET]["categories"]
    return {condition: cells[condition]["resolved"] for condition in CONDITIONS}


def test_every_job_completes_with_every_attempt_verified(runs: Runs) -> None:
    print(f"\nfour synthetic-coding jobs at once: {runs.seconds:.1f} s")
    for name, run in runs.by_system.items():
        assert run.status["state"] == "completed", (name, run.status)
        assert run.status["errors"] == [], (name, run.status["errors"])
        assert len(run.attempts) == 16, name
        outcomes = {attempt["outcome"] for attempt in run.attempts}
        assert outcomes <= {"resolved", "unresolved"}, (name, run.attempts)


@pytest.mark.parametrize(
    ("system", "relevant", "noisy"),
    [
        # The relevant trajectory first: its convention within 387 tokens in every scope.
        ("oracle", 8, 8),
        # No memories: the agent applies the fix the problem statement suggests, which misses
        # the convention the hidden tests check.
        ("empty", 0, 0),
        # See the module docstring: nothing else in a relevant scope to put first; in a noisy
        # one the three other trajectories fill the budget before the convention.
        ("reverse", 8, 0),
        # BM25 over the scope's messages with the problem statement as the query ranks the
        # message stating the convention among its first seven in every scope (first or second
        # in a relevant one), within 429 tokens (almanac-fiscal-quarters, noisy: seventh, after
        # four messages of other sessions on calendar quarters and date ranges and two of its
        # own), so it resolves every attempt at any budget from 429 tokens up:
        # synthetic-coding's distractors share the vocabulary but do not outrank the
        # convention lexically.
        ("reference", 8, 8),
    ],
)
def test_resolved_attempts_per_memory_system(
    runs: Runs, system: str, relevant: int, noisy: int
) -> None:
    run = runs.by_system[system]
    assert _resolved(run) == {"relevant": relevant, "noisy": noisy}
    overall = run.results["overall"]
    assert (overall["attempts"], overall["resolved"]) == (16, relevant + noisy)


def test_results_are_resolved_rates_per_condition_and_task_type(
    runs: Runs, bundle: CodingBundle
) -> None:
    types: dict[str, int] = defaultdict(int)
    for task in bundle.tasks:
        types[task.task_type] += len(CONDITIONS)
    for name, run in runs.by_system.items():
        results = run.results
        assert results["track"] == "coding"
        data = results["datasets"][DATASET]
        assert set(data["categories"]) == {"relevant", "noisy"}, name
        cells = [results["overall"], data["overall"], *data["categories"].values()]
        cells += data["task_types"].values()
        for cell in cells:
            assert cell["headline"] == "resolved_rate", (name, cell)
            assert cell["resolved_rate"] == cell["resolved"] / cell["attempts"], (name, cell)
            assert (cell["failed"], cell["judge_accuracy"]) == (0, None), (name, cell)
        assert {c: data["categories"][c]["attempts"] for c in CONDITIONS} == {
            "relevant": 8,
            "noisy": 8,
        }
        assert {t: cell["attempts"] for t, cell in data["task_types"].items()} == types


def test_adds_carry_the_trajectories_turns_and_no_relevance_label(
    runs: Runs, bundle: CodingBundle
) -> None:
    """What the participant received is exactly coding-v1's Adds, built from the trajectories'
    turns alone: no field beyond the contract's, nothing naming the relevant trajectory, and a
    noisy scope written oldest first (never in the conditions file's order)."""
    created = {t.trajectory_id: t.created_at for t in bundle.trajectories}
    for name in SIMULATED:
        run = runs.by_system[name]
        assert run.adds is not None
        planned = {encode(add.request) for add in planned_adds(run.job_id)}
        assert set(run.adds) == planned, name
        sent: dict[str, list[AddRequest]] = defaultdict(list)
        for body in run.adds:
            document = json.loads(body)
            assert set(document) == {"request_id", "messages", "user_id", "session_id"}
            assert all(set(m) <= {"role", "content", "timestamp"} for m in document["messages"])
            request = AddRequest.model_validate(document)
            sent[request.user_id].append(request)
        assert len(sent) == 2 * len(bundle.tasks)
        for user_id, requests in sent.items():
            requests.sort(key=lambda r: int(r.request_id.rsplit("-", 1)[1]))
            task, condition = scope_of(user_id)
            trajectories = list(dict.fromkeys(r.session_id.rsplit(":", 1)[1] for r in requests))
            scope = [t.trajectory_id for t in bundle.scope(task, condition)]
            assert sorted(trajectories) == sorted(scope), (name, user_id)
            assert trajectories == sorted(trajectories, key=lambda t: (created[t], t))


def _time(record: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(record["started_at"])


def test_each_scopes_adds_were_confirmed_before_its_search(runs: Runs) -> None:
    for name, run in runs.by_system.items():
        confirmed: dict[tuple[str, str], datetime] = {}
        searched: dict[tuple[str, str], datetime] = {}
        for record in run.audit:
            if record["operation"] == "add" and record["outcome"] == "ok":
                assert record["validation"] == "valid", record
                written = scope_of(record["item_id"].rsplit(":", 1)[0])
                done = _time(record) + timedelta(milliseconds=record["latency_ms"])
                confirmed[written] = max(done, confirmed.get(written, done))
            elif record["operation"] == "search":
                # Its first attempt, should there be more.
                asked, at = _question_scope(record["item_id"]), _time(record)
                searched[asked] = min(at, searched.get(asked, at))
        assert set(confirmed) == set(searched) and len(searched) == 16, name
        for scope, at in searched.items():
            assert confirmed[scope] <= at, (name, scope, confirmed[scope], at)


def test_each_attempt_records_its_patch_end_and_steps(runs: Runs, bundle: CodingBundle) -> None:
    """Every attempt submitted after two steps (the scripted agent applies a patch, then
    submits): its answer document holds the sandbox's diff of the files the task's fix changes,
    and its memory section kept to the budget. Resolved exactly when the convention reached the
    agent's prompt."""
    for name, run in runs.by_system.items():
        verdicts = {(a["task"], a["condition"]): a["outcome"] == "resolved" for a in run.attempts}
        answers = _by_scope(run)
        assert len(answers) == 16, name
        for (task_id, condition), answer in answers.items():
            task = bundle.task(task_id)
            assert task.stand_in is not None
            assert (answer["end_reason"], answer["steps"]) == ("submitted", 2), (name, answer)
            assert answer["model"] == MODEL_FINGERPRINT
            patch = answer["answer"]
            assert patch.startswith("diff --git"), (name, task_id, patch[:200])
            assert answer["patch_sha256"] == hashlib.sha256(patch.encode()).hexdigest()
            assert answer["patch_files"] == patch_files(task.gold_patch)
            assert answer["context_tokens"] <= BUDGET
            if name == "empty":
                assert (answer["candidates_returned"], answer["candidates_used"]) == (0, 0)
            prompt = answer["trajectory"][1]["content"]
            shown = " ".join(task.stand_in.convention.split()) in " ".join(prompt.split())
            assert verdicts[(task_id, condition)] is shown, (name, task_id, condition)


def test_the_agent_model_was_the_scripted_stand_in_alone(runs: Runs) -> None:
    """Two calls per attempt, all of them the coding agent's: no answer or judge call."""
    assert runs.llm_calls == {"coding": 2 * 16 * len(SYSTEMS)}
