"""The scenarios on the run's dataset (solo, repeat, teams-alone, teams): one smoke job per team
submitted at once, the awaited ones waited for, and the scenario measured as a whole (wall time
against its lower bound, CPU per question, peak RSS, what the callees saw)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import httpx

from .figures import (
    audited_departures,
    llm_intervals,
    llm_stats,
    lower_bound,
    participant_figures,
    planned_searches,
    ratio,
    simulator_records,
    to_monotonic,
    wall_parts,
)
from .harness import (
    SLOW_PROFILE,
    SLOW_TEAM,
    Bench,
    Team,
    db_ops_per_question,
    db_ops_snapshot,
    ensure_team,
    job_status,
    job_summary,
    submit,
    wait_jobs,
)
from .sampling import at_reference, cpu_per_question, cpu_snapshot, machine_figures, peak_rss


def collect(
    bench: Bench, jobs: dict[str, Team], awaited: set[str], finals: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Jobs and participants' figures of one scenario; the jobs not awaited are read as they
    stand now."""
    summaries = [
        job_summary(team, job_id, finals.get(job_id) or job_status(bench, team, job_id))
        for job_id, team in jobs.items()
    ]
    by_team: dict[str, list[str]] = defaultdict(list)
    for job_id, team in jobs.items():
        by_team[team.name].append(job_id)
    planned = planned_searches(bench, jobs)
    departures = audited_departures(bench, jobs)
    participants = {
        name: participant_figures(
            bench.teams[name],
            simulator_records(bench.teams[name], job_ids),
            planned,
            departures,
            job_ids,
        )
        for name, job_ids in by_team.items()
    }
    questions = sum(s["questions"] for s in summaries if s["job_id"] in awaited)
    return {"jobs": summaries, "questions": questions, "participants": participants}


def wall_seconds(summaries: Sequence[dict[str, Any]], awaited: set[str]) -> float | None:
    """The first awaited submission to the last awaited completion (one job: its own time)."""
    ended = [s for s in summaries if s["job_id"] in awaited]
    if not ended or any(s["finished_at"] is None for s in ended):
        return None
    start = min(datetime.fromisoformat(s["created_at"]) for s in ended)
    end = max(datetime.fromisoformat(s["finished_at"]) for s in ended)
    return round((end - start).total_seconds(), 1)


def run_scenario(
    bench: Bench, name: str, teams: Sequence[Team], awaited_teams: set[str]
) -> dict[str, Any]:
    """Submit one job per team at once, wait for the awaited teams' jobs, measure."""
    print(f"\n== {name}: {', '.join(t.name for t in teams)} on {bench.dataset} ==", flush=True)
    httpx.post(f"{bench.llm_url}/stats/reset", timeout=30).raise_for_status()
    bench.machine.clear()
    before = cpu_snapshot(bench.stack)
    ops_before = db_ops_snapshot(bench.db_ops)
    jobs = {submit(bench, team): team for team in teams}
    awaited = {job_id for job_id, team in jobs.items() if team.name in awaited_teams}
    finals = wait_jobs(bench, {job_id: jobs[job_id] for job_id in awaited})
    # Read before the collection below, whose own requests would be counted otherwise.
    after = cpu_snapshot(bench.stack)
    if bench.db_ops:
        time.sleep(1.5)  # every process rewrites its counts once a second
    ops_after = db_ops_snapshot(bench.db_ops)
    llm = llm_stats(bench)
    figures: dict[str, Any] = {"scenario": name, "dataset": bench.dataset}
    figures |= collect(bench, jobs, awaited, finals)
    figures["llm"] = llm
    in_bound = {t: p for t, p in figures["participants"].items() if t in awaited_teams}
    figures["bound"] = lower_bound(in_bound, llm)
    figures["wall_seconds"] = wall = wall_seconds(figures["jobs"], awaited)
    bound = figures["bound"]["seconds"]
    figures["bound_ratio"] = round(wall / bound, 3) if wall and bound else None
    figures["cpu_ms_per_question"] = cpu = cpu_per_question(before, after, figures["questions"])
    # The benchmark's own samples are in none of the processes measured above.
    figures["machine"] = machine = machine_figures(bench.machine)
    figures["cpu_ms_per_question_at_reference"] = at_reference(cpu, machine["slowdown"])
    if bench.db_ops:
        figures["db_ops_per_question"] = db_ops_per_question(
            ops_before, ops_after, figures["questions"]
        )
    figures["peak_rss_mib"] = peak_rss(bench.stack)
    if len(awaited) == 1 and len(jobs) == 1:
        figures["wall_parts"] = one_job_parts(bench, jobs, figures["jobs"][0], llm)
    return figures


def one_job_parts(
    bench: Bench, jobs: dict[str, Team], summary: dict[str, Any], llm: dict[str, Any]
) -> dict[str, float | None] | None:
    """`wall_parts` of a scenario's only job (solo, repeat), or None if it did not finish."""
    if summary["finished_at"] is None:
        return None
    ((job_id, team),) = jobs.items()
    return wall_parts(
        to_monotonic(summary["created_at"]),
        to_monotonic(summary["finished_at"]),
        simulator_records(team, [job_id]),
        llm_intervals(bench),
        int(llm["capacity"]),
    )


def scenario_solo(bench: Bench) -> dict[str, Any]:
    return run_scenario(bench, "solo", [ensure_team(bench, "team-1")], {"team-1"})


def scenario_repeat(bench: Bench, first: dict[str, Any]) -> dict[str, Any]:
    figures = run_scenario(bench, "repeat", [ensure_team(bench, "team-1")], {"team-1"})
    figures["vs_first"] = ratio(figures["wall_seconds"], first["wall_seconds"])
    return figures


def scenario_teams_alone(bench: Bench) -> dict[str, Any]:
    """Three teams at once: what the next scenario is compared with."""
    busy = [ensure_team(bench, name) for name in ("team-1", "team-2", "team-3")]
    return run_scenario(bench, "teams-alone", busy, {t.name for t in busy})


def scenario_teams(bench: Bench, alone: dict[str, Any] | None) -> dict[str, Any]:
    """The same three teams at once, plus a fourth that declares one request per 1,000 s: its
    job must not hold up the others (it is not waited for). Each team's time is compared with
    its time without the fourth (`teams-alone`); without that run, with the scenario's lower
    bound, which no run without the fourth team can beat either (so the ratio is an upper one)."""
    busy = [ensure_team(bench, name) for name in ("team-1", "team-2", "team-3")]
    slow = ensure_team(bench, SLOW_TEAM, SLOW_PROFILE)
    figures = run_scenario(bench, "teams", [*busy, slow], {t.name for t in busy})
    before = {job["team"]: job["seconds"] for job in (alone or {}).get("jobs", [])}
    figures["vs_alone"] = {
        job["team"]: ratio(job["seconds"], before.get(job["team"], figures["bound"]["seconds"]))
        for job in figures["jobs"]
        if job["team"] != slow.name
    }
    figures["compared_with"] = "teams-alone" if before else "lower bound"
    return figures
