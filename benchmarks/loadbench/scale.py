"""The scale scenarios, on a stack of their own (issue 30): `scale`, one job per size on a
generated dataset with a fast participant and LLM, so that the platform's own cost per item
dominates; `saturated`, one job against a participant declaring one request at a time. Each
job's CPU is sampled every second while it runs, and cut into phases by the participant's
records."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from aml_devtools.stack import MONGO
from aml_participant_simulator import RequestRecord

from .datasets import SATURATED_SIZE, Size
from .figures import (
    add_attempts,
    audited_departures,
    busy_figures,
    chain_gaps_ms,
    conversations_written,
    free_slot_chain_gaps_ms,
    llm_intervals,
    llm_stats,
    lower_bound,
    participant_bound,
    participant_figures,
    planned_searches,
    quantile_figures,
    queued_gaps_by_transition,
    queued_gaps_ms,
    ratio,
    simulator_records,
    to_monotonic,
)
from .harness import (
    SATURATED_PROFILE,
    SCALE_PROFILE,
    Bench,
    Team,
    ensure_team,
    job_seconds,
    job_summary,
    reset_callees,
    submit,
    wait_sampled,
)
from .report import render_scale
from .sampling import (
    CpuSamples,
    cpu_between,
    cpu_groups,
    machine_figures,
    peak_rss,
    reset_peak_rss,
    stage_cpu,
    wait_quiet,
)

SCALE_TEAM = "scale"
SATURATED_TEAM = "serial"
# How long a scale size waits for the previous job's tail (publication, reconciliation) to end.
SETTLE_SECONDS = 60.0


# -- the database's size -----------------------------------------------------------------------


def _dir_bytes(folder: Path) -> int:
    """Bytes the files under `folder` take on disk (allocated blocks)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            total += path.lstat().st_blocks * 512
        except OSError:
            continue  # removed meanwhile
    return total


def database_size(bench: Bench) -> dict[str, int | None]:
    """The platform's database now: nx-27017's data dir on disk (None for an external
    MongoDB) and what `dbStats` reports where the server supports it."""
    folder = bench.stack.data_dir / "mongo"
    size: dict[str, int | None] = {
        "dir_bytes": _dir_bytes(folder) if MONGO in bench.stack.processes else None
    }
    client: MongoClient[dict[str, Any]] = MongoClient(bench.stack.mongo_url)
    try:
        stats = client[bench.mongo_db].command("dbStats")
    except Exception:  # any server that does not support it: not measured
        stats = {}
    finally:
        client.close()
    for key in ("dataSize", "storageSize", "indexSize", "totalSize"):
        value = stats.get(key)
        size[key] = int(value) if isinstance(value, int | float) else None
    return size


def database_growth(
    before: dict[str, int | None], after: dict[str, int | None], items: int
) -> dict[str, Any]:
    """The database at the end of a job and what the job added, per item (the database holds
    every earlier job of the run too). On disk: nx-27017's data dir, else dbStats' totalSize."""
    key = "dir_bytes" if after.get("dir_bytes") is not None else "totalSize"
    end, start = after.get(key), before.get(key)
    grew = None if end is None or start is None else end - start
    return {
        "measured_as": key if end is not None else None,
        "end_bytes": end,
        "grew_bytes": grew,
        "bytes_per_item": None if grew is None else round(grew / max(1, items)),
        "before": before,
        "after": after,
    }


# -- one job -----------------------------------------------------------------------------------


@dataclass
class JobRun:
    """One scale or saturated job, as measured while it ran."""

    team: Team
    job_id: str
    submitted: float  # monotonic
    status: dict[str, Any]
    samples: CpuSamples
    records: list[RequestRecord]
    llm: dict[str, Any]
    intervals: list[tuple[float, float]]


def run_job(bench: Bench, team: Team, dataset: str) -> JobRun:
    """Submit one job on `dataset`, sample it until it ends, and read what the callees saw
    (before anything else asks the platform for figures)."""
    reset_callees(bench, team)
    bench.machine.clear()
    submitted = time.monotonic()
    job_id = submit(bench, team, dataset)
    status, samples = wait_sampled(bench, team, job_id)
    llm, intervals = llm_stats(bench), llm_intervals(bench)
    records = simulator_records(team, [job_id])
    return JobRun(team, job_id, submitted, status, samples, records, llm, intervals)


def phase_times(run: JobRun) -> dict[str, float | None]:
    """The job's moments on the monotonic clock: submitted, created and finished (the
    platform's stamps), the first and last Add's arrival and the first Search's, and the first
    conversation written (the earliest answer to a user's last Add)."""
    adds = [r.arrived_monotonic for r in run.records if r.endpoint == "add"]
    searches = [r.arrived_monotonic for r in run.records if r.endpoint == "search"]
    written = conversations_written(run.records)
    finished = run.status.get("finished_at")
    return {
        "submitted": run.submitted,
        "created": to_monotonic(run.status["created_at"]),
        "finished": to_monotonic(finished) if finished else None,
        "first_add": min(adds, default=None),
        "last_add": max(adds, default=None),
        "first_search": min(searches, default=None),
        "first_written": min(written.values(), default=None),
    }


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 2)


def _per_second(count: int, seconds: float | None) -> float | None:
    return round(count / seconds, 1) if seconds else None


# The Adds-alone window (first Add -> first conversation written) is used for the CPU per Add
# only when it holds at least this share of the job's Adds; otherwise the whole Add phase is.
_ALONE_MIN_SHARE = 0.1


def scale_cpu(
    run: JobRun, moments: dict[str, float | None], adds: int, questions: int
) -> dict[str, Any]:
    """CPU ms per Add, per question and per item (Adds and questions, submission to the end);
    each for services, nats, database and their sum.

    Per Add: over the Adds alone, from the first Add's arrival to the first conversation
    written (no question exists before it), divided by the Adds that arrived meanwhile; the
    whole Add phase (first to last Add) when that window holds under a tenth of the Adds. Per
    question: what is left of the CPU from the first Add to the end once every Add is charged
    that much, per question. A split by time (the Add phase against what follows it) charges
    the questions answered while conversations are still being written to the Adds: once a
    job's first users are written long before its last, the Adds look dearer and the
    questions cheaper the larger the job, with nothing changed in either.

    By stage (`stage_cpu`, submission to the end): the adder's CPU per Add, the question
    stages' per question and the shared processes' per item, which no window decides."""
    first, last, end = moments["first_add"], moments["last_add"], moments["finished"]
    if first is None or last is None or end is None:
        return {"per_add": None, "per_question": None, "per_item": None, "by_process": None,
                "per_add_over": None, "by_stage": None}  # fmt: skip
    written = moments["first_written"]
    alone_end = last if written is None else min(last, written)
    arrivals = [r.arrived_monotonic for r in run.records if r.endpoint == "add"]
    alone_adds = sum(first <= at <= alone_end for at in arrivals)
    over = "adds alone"
    if alone_adds < _ALONE_MIN_SHARE * adds:
        alone_end, alone_adds, over = last, len(arrivals), "add phase"
    alone = cpu_between(run.samples, first, alone_end)
    from_first = cpu_between(run.samples, first, end)
    rest = {
        name: max(0.0, seconds - alone.get(name, 0.0) / max(1, alone_adds) * adds)
        for name, seconds in from_first.items()
    }
    whole = cpu_between(run.samples, run.submitted, end)
    return {
        "by_stage": stage_cpu(whole, adds, questions),
        "per_add": cpu_groups(alone, alone_adds),
        "per_add_over": over,
        "per_question": cpu_groups(rest, questions),
        "per_item": cpu_groups(whole, adds + questions),
        "by_process": {
            name: round(1000 * seconds / max(1, adds + questions), 2)
            for name, seconds in whole.items()
        },
    }


def job_participant(bench: Bench, run: JobRun) -> dict[str, Any]:
    """The limits table's figures of the job's participant (as `collect` for a scenario)."""
    return participant_figures(
        run.team,
        run.records,
        planned_searches(bench, [run.job_id]),
        audited_departures(bench, [run.job_id]),
        [run.job_id],
    )


# -- the scenarios -----------------------------------------------------------------------------


def measure_size(bench: Bench, team: Team, size: Size) -> dict[str, Any]:
    """One size: its job on the generated dataset, and every figure of the scale table."""
    print(f"\n== scale {size.label} (Adds/questions/users) on {size.dataset_id} ==", flush=True)
    if not wait_quiet(bench.stack, SETTLE_SECONDS):
        print(f"  note: the services were not quiet within {SETTLE_SECONDS:.0f} s", flush=True)
    rss_reset = reset_peak_rss(bench.stack)
    database_before = database_size(bench)
    run = run_job(bench, team, size.dataset_id)
    stages = run.status["stages"]
    adds, questions = stages["add"]["total"], stages["search"]["total"]
    moments = phase_times(run)
    participant = job_participant(bench, run)
    bound = lower_bound({team.name: participant}, run.llm)
    wall = job_seconds(run.status)
    llm_busy = (
        busy_figures(run.intervals, moments["first_written"], moments["finished"])
        if moments["first_written"] is not None and moments["finished"] is not None
        else busy_figures([], 0.0, 0.0)
    )
    return {
        "size": {"adds": size.adds, "questions": size.questions, "users": size.users},
        "dataset": size.dataset_id,
        "job": job_summary(team, run.job_id, run.status),
        "adds": adds,
        "questions": questions,
        "users": len(add_attempts(run.records)),
        "wall_seconds": None if wall is None else round(wall, 1),
        "plan_seconds": _span(moments["created"], moments["first_add"]),
        "add_phase_seconds": _span(moments["first_add"], moments["last_add"]),
        "question_phase_seconds": _span(moments["last_add"], moments["finished"]),
        "adds_per_second": _per_second(adds, _span(moments["first_add"], moments["last_add"])),
        "questions_per_second": _per_second(
            questions, _span(moments["last_add"], moments["finished"])
        ),
        "cpu_ms": scale_cpu(run, moments, adds, questions),
        "chain_gap_ms": quantile_figures(chain_gaps_ms(run.records)),
        "free_slot_chain_gap_ms": quantile_figures(
            free_slot_chain_gaps_ms(run.records, SCALE_PROFILE.max_concurrency)
        ),
        "first_written_seconds": _span(moments["created"], moments["first_written"]),
        "llm_after_first_written": llm_busy,
        "llm": run.llm,
        "peak_rss_mib": peak_rss(bench.stack),
        "peak_rss_since": "this job" if rss_reset else "process start",
        "database": database_growth(database_before, database_size(bench), adds + questions),
        "bound": bound,
        "bound_ratio": round(wall / bound["seconds"], 3) if wall and bound["seconds"] else None,
        "participant": participant,
        "machine": machine_figures(bench.machine),
    }


def vs_smallest(sizes: Sequence[dict[str, Any]]) -> None:
    """Each size's CPU figures divided by the smallest size's (the first), into `vs_smallest`."""
    first = sizes[0]["cpu_ms"] if sizes else None
    for figures in sizes:
        cpu = figures["cpu_ms"]
        figures["vs_smallest"] = {
            phase: {
                group: ratio(value, ((first or {}).get(phase) or {}).get(group))
                for group, value in (cpu.get(phase) or {}).items()
            }
            for phase in ("per_add", "per_question", "per_item", "by_stage")
        }


def scenario_scale(bench: Bench, sizes: Sequence[Size], results: dict[str, Any]) -> None:
    """One job per size on the same stack, smallest first; each size's figures land in
    `results["scale"]` as soon as it is done (a timeout still reports the finished ones)."""
    team = ensure_team(bench, SCALE_TEAM, SCALE_PROFILE)
    scale: dict[str, Any] = {"scenario": "scale", "sizes": [], "jobs": []}
    results["scale"] = scale
    for size in sizes:
        figures = measure_size(bench, team, size)
        scale["sizes"].append(figures)
        scale["jobs"].append(figures["job"])
        vs_smallest(scale["sizes"])
        print("\n".join(render_scale(scale)), flush=True)


def scenario_saturated(bench: Bench) -> dict[str, Any]:
    """A participant version declaring one request at a time (80 ms per call) with one job on
    the generated SATURATED_SIZE dataset: how close to its own service time the platform keeps
    it busy, and the gap from each answer to the next request while work was queued."""
    print(f"\n== saturated {SATURATED_SIZE.label} on {SATURATED_SIZE.dataset_id} ==", flush=True)
    team = ensure_team(bench, SATURATED_TEAM, SATURATED_PROFILE)
    wait_quiet(bench.stack, SETTLE_SECONDS)
    run = run_job(bench, team, SATURATED_SIZE.dataset_id)
    moments = phase_times(run)
    stages = run.status["stages"]
    wall = job_seconds(run.status)
    participant = job_participant(bench, run)
    start = to_monotonic(run.status["created_at"])
    return {
        "scenario": "saturated",
        "dataset": SATURATED_SIZE.dataset_id,
        "jobs": [job_summary(team, run.job_id, run.status)],
        "adds": stages["add"]["total"],
        "questions": stages["search"]["total"],
        "wall_seconds": None if wall is None else round(wall, 1),
        "plan_seconds": _span(moments["created"], moments["first_add"]),
        "participant_bound": participant_bound(run.records),
        "queued_gap_ms": quantile_figures(queued_gaps_ms(run.records, start)),
        "queued_gap_ms_by_transition": queued_gaps_by_transition(run.records, start),
        "chain_gap_ms": quantile_figures(chain_gaps_ms(run.records)),
        "llm": run.llm,
        "participant": participant,
    }
