"""The load benchmark's harness: what the callees do and declare (the participant profiles, the
LLM stand-in's latency and capacity), starting them and the platform on the embedded stack,
counting the services' database commands (`--db-ops`), and the smoke jobs: submitted, polled
until they end (the machine's speed sampled meanwhile, and for a single job every process's
CPU), summarised."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from aml_devtools.platform import Platform, PlatformConfig, register_participant
from aml_devtools.processes import ManagedProcess, free_port, http_ready
from aml_devtools.stack import HOST, EmbeddedStack
from aml_participant_simulator import EndpointScript, Script, ScriptedCapacity

from .sampling import SERVICES, CpuSamples, cpu_snapshot, quiet_snapshot, reference_workload_ms

ROOT = Path(__file__).resolve().parents[2]

# The load scenarios' callees: each team's participant and the LLM stand-in.
ADD_LATENCY = 0.3
SEARCH_LATENCY = 0.1
DECLARED_CONCURRENCY = 4
DECLARED_RPS = 10.0
SLOW_TEAM = "team-4"
SLOW_TEAM_RPS = 0.001
LLM_LATENCY = 0.5
LLM_CONCURRENCY = 8
STANDIN = "llm-standin"
# The callees' scheduling priority (`favour`): below 0 needs root.
CALLEE_NICENESS = -5

POLL_SECONDS = 2.0
# The machine's speed while a scenario runs: `reference_workload_ms` is timed every this many
# seconds during the scenario (under 1% of a core, in the benchmark's own process).
MACHINE_SAMPLE_SECONDS = 5.0
# CPU is sampled this often while a scale job runs (phases are cut between samples).
CPU_SAMPLE_SECONDS = 1.0
PROGRESS_EVERY_SECONDS = 30.0
# Loaded by every process started with it on PYTHONPATH (`--db-ops`).
DB_OPS_LISTENER = ROOT / "benchmarks" / "db_ops"


class BenchmarkTimeout(Exception):
    """The global --timeout passed."""


@dataclass(frozen=True)
class Profile:
    """A simulated participant: how long it takes per call, and the capacity its version
    declares (the simulator answers 429 at once beyond that concurrency)."""

    add_latency: float
    search_latency: float
    max_concurrency: int
    max_rps: float


LOAD_PROFILE = Profile(ADD_LATENCY, SEARCH_LATENCY, DECLARED_CONCURRENCY, DECLARED_RPS)
SLOW_PROFILE = replace(LOAD_PROFILE, max_rps=SLOW_TEAM_RPS)

# `--scenario scale` (issue 30): the platform's own cost per item as one job grows, with a fast
# participant and a fast LLM so that the platform's cost dominates; one job per size, smallest
# first, each on a generated LoCoMo-format dataset registered with `aml dataset add`.
SCALE_PROFILE = Profile(add_latency=0.01, search_latency=0.01, max_concurrency=16, max_rps=1000.0)
SCALE_LLM_LATENCY = 0.02
SCALE_LLM_CONCURRENCY = 32
# The services' own default (AML_WORKER_CONCURRENCY), not the embedded stack's 8: only the
# declared capacities may bind (an adder taking 8 Adds at once would hold a 16-slot participant
# to half of what it declared).
SCALE_WORKER_CONCURRENCY = 256
# `saturated`: a participant that declares one request at a time, of realistic latency.
SATURATED_PROFILE = Profile(
    add_latency=0.08, search_latency=0.08, max_concurrency=1, max_rps=1000.0
)


@dataclass
class Team:
    name: str
    url: str
    version_id: str
    key: str
    max_concurrency: int
    max_rps: float
    add_latency: float = ADD_LATENCY


@dataclass
class Bench:
    stack: EmbeddedStack
    platform: Platform
    llm_url: str
    dataset: str
    deadline: float
    # Where the processes write their database command counts (`--db-ops`), else None.
    db_ops: Path | None = None
    teams: dict[str, Team] = field(default_factory=dict)
    labels: Counter[str] = field(default_factory=Counter)
    # The current scenario's `reference_workload_ms` samples.
    machine: list[float] = field(default_factory=list)
    # The platform's database (AML_MONGO_DB): "aml", or a fresh name in an external MongoDB.
    mongo_db: str = "aml"


# -- the stack ---------------------------------------------------------------------------------


def start_standin(
    stack: EmbeddedStack, latency: float = LLM_LATENCY, concurrency: int = LLM_CONCURRENCY
) -> str:
    port = free_port(HOST)
    url = f"http://{HOST}:{port}"
    argv = [
        sys.executable, "-m", "aml_llm_standin", "--host", HOST, "--port", str(port),
        "--latency", str(latency), "--concurrency", str(concurrency),
    ]  # fmt: skip
    favour(stack.start_process(STANDIN, argv, ready=http_ready(f"{url}/health")))
    return url


def favour(process: ManagedProcess) -> None:
    """The callees (participants, the LLM) stand for other machines: they run at a higher
    priority, so their arrival clocks do not lag by however long the platform's processes
    keep them off this machine's two cores (a lag the platform cannot see, which shows as
    arrivals bunched closer than they were sent). Without the privilege to raise it (not
    root), they run as they are; the report says which."""
    if process.pid is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, process.pid, CALLEE_NICENESS)
    except PermissionError:
        print(f"  note: {process.name} runs at normal priority (no privilege to raise it)")


def platform_config(
    datasets_root: Path,
    llm_url: str,
    llm_concurrency: int = LLM_CONCURRENCY,
    worker_concurrency: int = 8,
    extra_env: dict[str, str] | None = None,
) -> PlatformConfig:
    return PlatformConfig(
        datasets_root=datasets_root,
        llm_concurrency=llm_concurrency,
        worker_concurrency=worker_concurrency,
        # The stand-in replies at once whatever the prompt, so the release's spec defaults apply
        # (the embedded defaults are shortened for the slow local model).
        answer_context_tokens=2000,
        answer_max_tokens=128,
        judge_max_tokens=64,
        judge_retries=1,
        extra_env={
            "AML_LLM_BASE_URL": f"{llm_url}/v1",
            # The stand-in has no /tokenize: the context budget uses the stated estimate.
            "AML_TOKEN_COUNTER": "estimate",
            # `repeat` and `teams` resubmit a team's smoke job at once.
            "AML_QUOTAS": json.dumps({"smoke_interval": 0}),
            **(extra_env or {}),
        },
    )


def simulator_script(profile: Profile = LOAD_PROFILE) -> Script:
    return Script(
        add=EndpointScript(latency=profile.add_latency),
        search=EndpointScript(latency=profile.search_latency),
        # 429 at once beyond the declared concurrency: over-sending must show, not queue.
        capacity=ScriptedCapacity(max_concurrency=profile.max_concurrency, on_excess="reject_429"),
    )


def start_team(bench: Bench, name: str, profile: Profile = LOAD_PROFILE) -> Team:
    stack = bench.stack
    script = stack.data_dir / f"sim-{name}.json"
    script.write_text(simulator_script(profile).model_dump_json(), encoding="utf-8")
    port = free_port(HOST)
    url = f"http://{HOST}:{port}"
    argv = [
        sys.executable, "-m", "aml_participant_simulator",
        "--host", HOST, "--port", str(port), "--script", str(script),
    ]  # fmt: skip
    favour(stack.start_process(f"sim-{name}", argv, ready=http_ready(f"{url}/health")))
    capacity = {"max_concurrency": profile.max_concurrency, "max_rps": profile.max_rps}
    version_id, key = register_participant(
        bench.platform, url, name, f"sim-{name}", capacity=capacity
    )
    team = Team(
        name, url, version_id, key, profile.max_concurrency, profile.max_rps, profile.add_latency
    )
    bench.teams[name] = team
    return team


def ensure_team(bench: Bench, name: str, profile: Profile = LOAD_PROFILE) -> Team:
    """The team started earlier in this run, or a new one."""
    return bench.teams.get(name) or start_team(bench, name, profile)


def wait_until_started(stack: EmbeddedStack, timeout: float = 120.0) -> dict[str, float]:
    """Wait until every service has finished starting, i.e. is quiet for STARTED_QUIET_SECONDS
    (the workers are not probed for readiness, and go on importing and connecting for a second
    or two after they are spawned); returns the CPU seconds each used to start. A scenario
    measures the jobs' cost, not the processes' start-up, which would otherwise land in the
    first scenario only (about 0.5-0.8 s of CPU per worker: some 2 ms per question of
    LoCoMo-10)."""
    later = quiet_snapshot(stack, timeout)
    if later is not None:
        return {name: round(later[name], 2) for name in SERVICES}
    raise BenchmarkTimeout("the platform's services did not settle after starting")


def reset_callees(bench: Bench, team: Team) -> None:
    """Each job's records, memories and LLM figures on their own: the simulator forgets what
    it saw and stored (its Search scans its store), the stand-in its counts."""
    httpx.post(f"{team.url}/_sim/reset", timeout=60).raise_for_status()
    httpx.post(f"{bench.llm_url}/stats/reset", timeout=30).raise_for_status()


# -- database commands (`--db-ops`) ------------------------------------------------------------


def count_db_ops(folder: Path) -> None:
    """Every process started from now on counts its database commands into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["AML_DB_OPS_DIR"] = str(folder)
    paths = (str(DB_OPS_LISTENER), os.environ.get("PYTHONPATH", ""))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))


def db_ops_snapshot(folder: Path | None) -> dict[str, Counter[str]]:
    """Commands sent so far, per service (replicas and restarts summed)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for path in folder.glob("*.json") if folder else ():
        name = path.stem.rsplit("-", 1)[0].removeprefix("aml_")
        counts[name].update(json.loads(path.read_text(encoding="utf-8")))
    return counts


def db_ops_per_question(
    before: dict[str, Counter[str]], after: dict[str, Counter[str]], questions: int
) -> dict[str, dict[str, Any]]:
    """Per service: database commands per question, in total and by "<collection>.<command>"
    (the parenthesised capacity outcomes are not commands of their own)."""
    per: dict[str, dict[str, Any]] = {}
    for name in SERVICES:
        sent = after.get(name, Counter()) - before.get(name, Counter())
        total = sum(n for key, n in sent.items() if not key.startswith("("))
        per[name] = {
            "total": round(total / max(1, questions), 2),
            "commands": {key: round(n / max(1, questions), 3) for key, n in sent.most_common()},
        }
    return per


# -- jobs --------------------------------------------------------------------------------------


def submit(bench: Bench, team: Team, dataset: str | None = None) -> str:
    """A smoke job of the team on `dataset` (default: the run's): a smoke run may name any
    dataset in the gateway's AML_SMOKE_DATASETS, registered ones included."""
    bench.labels[team.name] += 1
    job = {
        "version_id": team.version_id,
        "mode": "smoke",
        "run_label": f"load-{team.name}-{bench.labels[team.name]}",
        "datasets": [dataset or bench.dataset],
    }
    response = httpx.post(
        f"{bench.platform.gateway_url}/v1/jobs",
        headers={"Authorization": f"Bearer {team.key}"},
        json=job,
        timeout=30,
    )
    if response.status_code != 201:
        raise RuntimeError(f"submission for {team.name} refused: {response.text}")
    job_id: str = response.json()["job_id"]
    return job_id


def job_status(bench: Bench, team: Team, job_id: str) -> dict[str, Any]:
    response = httpx.get(
        f"{bench.platform.gateway_url}/v1/jobs/{job_id}",
        headers={"Authorization": f"Bearer {team.key}"},
        timeout=30,
    )
    response.raise_for_status()
    status: dict[str, Any] = response.json()
    return status


def stages_text(stages: dict[str, dict[str, int]]) -> str:
    """A job's progress by stage, as printed: "plan 1/1 add 40/40 search 12/20 ..."."""
    return " ".join(
        f"{stage} {p['done']}/{p['total']}" + (f" ({p['failed']} failed)" if p["failed"] else "")
        for stage, p in stages.items()
        if stage != "aggregate"
    )


def _progress_line(team: Team, status: dict[str, Any]) -> str:
    stages = stages_text(status["stages"])
    return f"  [{status['elapsed_seconds']:6.0f}s] {team.name:<8} {status['state']:<9} {stages}"


def wait_jobs(bench: Bench, jobs: dict[str, Team]) -> dict[str, dict[str, Any]]:
    """Poll until every job in `jobs` has ended; bounded by the global deadline."""
    final: dict[str, dict[str, Any]] = {}
    last_print = 0.0
    next_sample = 0.0
    while len(final) < len(jobs):
        if time.monotonic() >= next_sample:
            bench.machine.append(reference_workload_ms())
            next_sample = time.monotonic() + MACHINE_SAMPLE_SECONDS
        if time.monotonic() > bench.deadline:
            raise BenchmarkTimeout(f"jobs still running at the deadline: {set(jobs) - set(final)}")
        statuses = {
            job_id: job_status(bench, team, job_id)
            for job_id, team in jobs.items()
            if job_id not in final
        }
        verbose = time.monotonic() - last_print >= PROGRESS_EVERY_SECONDS
        for job_id, status in statuses.items():
            ended = status["state"] in ("completed", "failed")
            if verbose or ended:
                print(_progress_line(jobs[job_id], status), flush=True)
            if ended:
                final[job_id] = status
        last_print = time.monotonic() if verbose else last_print
        if len(final) < len(jobs):
            time.sleep(POLL_SECONDS)
    return final


def wait_sampled(bench: Bench, team: Team, job_id: str) -> tuple[dict[str, Any], CpuSamples]:
    """Poll the job until it ends (bounded by the global deadline), with every process's CPU
    sampled every CPU_SAMPLE_SECONDS meanwhile and once more when the end is seen."""
    samples: CpuSamples = [(time.monotonic(), cpu_snapshot(bench.stack))]
    next_poll = next_machine = last_print = 0.0
    while True:
        now = time.monotonic()
        if now > bench.deadline:
            raise BenchmarkTimeout(f"job {job_id} still running at the deadline")
        if now >= next_machine:
            bench.machine.append(reference_workload_ms())
            next_machine = now + MACHINE_SAMPLE_SECONDS
        if now >= next_poll:
            status = job_status(bench, team, job_id)
            ended = status["state"] in ("completed", "failed")
            if ended or now - last_print >= PROGRESS_EVERY_SECONDS:
                print(_progress_line(team, status), flush=True)
                last_print = now
            if ended:
                samples.append((time.monotonic(), cpu_snapshot(bench.stack)))
                return status, samples
            next_poll = now + POLL_SECONDS
        time.sleep(CPU_SAMPLE_SECONDS)
        samples.append((time.monotonic(), cpu_snapshot(bench.stack)))


def job_seconds(status: dict[str, Any]) -> float | None:
    """Submission to completion, from the platform's own timestamps."""
    if not status.get("finished_at"):
        return None
    created = datetime.fromisoformat(status["created_at"])
    finished = datetime.fromisoformat(status["finished_at"])
    return (finished - created).total_seconds()


def job_summary(team: Team, job_id: str, status: dict[str, Any]) -> dict[str, Any]:
    seconds = job_seconds(status)
    return {
        "team": team.name,
        "job_id": job_id,
        "state": status["state"],
        "seconds": None if seconds is None else round(seconds, 1),
        "created_at": status["created_at"],
        "finished_at": status.get("finished_at"),
        "stages": status["stages"],
        "errors": [f"{e['stage']}/{e['kind']}: {e['reason']}" for e in status["errors"][:5]],
        "questions": status["stages"]["search"]["total"],
    }
