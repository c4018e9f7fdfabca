"""The benchmark's database command count (`pipeline_load.py --db-ops`): what the listener counts
and how a scenario's counts become commands per question; and how the machine's speed measured
during a scenario scales its CPU figures; and when the platform counts as started (its start-up
is in no scenario)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pymongo import monitoring
from scripts import BENCHMARKS, load_benchmark, load_script


@pytest.fixture(scope="module")
def listener_module() -> ModuleType:
    # Without AML_DB_OPS_DIR it registers nothing: only its listener class is used here.
    return load_script("db_ops_listener", BENCHMARKS / "db_ops" / "sitecustomize.py")


@pytest.fixture(scope="module")
def pipeline_load() -> ModuleType:
    return load_benchmark("pipeline_load_bench")


def _started(request_id: int, command: dict[str, Any]) -> monitoring.CommandStartedEvent:
    return monitoring.CommandStartedEvent(command, "aml", request_id, ("localhost", 27017), 1)


def _succeeded(request_id: int, name: str, reply: dict[str, Any]) -> Any:
    return monitoring.CommandSucceededEvent(
        timedelta(0), reply, name, request_id, ("localhost", 27017), 1
    )


def test_the_listener_counts_commands_by_collection_and_capacity_outcomes(
    listener_module: ModuleType,
) -> None:
    listener = listener_module._Listener()
    take = {"findAndModify": "capacity_slots", "query": {"pool": "v1/r"}, "update": {}}
    listener.started(_started(1, take))
    listener.succeeded(_succeeded(1, "findAndModify", {"value": None, "ok": 1}))
    reserve = {**take, "sort": {"free_at": 1}}
    listener.started(_started(2, reserve))
    listener.succeeded(_succeeded(2, "findAndModify", {"value": {"_id": "v1/r/0"}, "ok": 1}))
    # A bulk write of three statements is one round trip.
    updates = [{"q": {}, "u": {}}] * 3
    listener.started(_started(3, {"update": "capacity_slots", "updates": updates}))
    listener.started(_started(4, {"getMore": 7, "collection": "written_texts"}))
    listener.started(_started(5, {"hello": 1}))
    assert listener.counts == Counter(
        {
            "capacity_slots.findAndModify": 2,
            "(rate slot refused)": 1,
            "(rate next slot taken)": 1,
            "capacity_slots.update": 1,
            "written_texts.getMore": 1,
        }
    )


def test_a_scenarios_commands_per_question_per_service(
    pipeline_load: ModuleType, tmp_path: Path
) -> None:
    def write(name: str, counts: dict[str, int]) -> None:
        (tmp_path / f"{name}.json").write_text(json.dumps(counts), encoding="utf-8")

    write("aml_searcher-11", {"searches.find": 10, "(rate slot taken)": 4})
    before = pipeline_load.db_ops_snapshot(tmp_path)
    write("aml_searcher-11", {"searches.find": 30, "(rate slot taken)": 8})
    # A second replica (or a restart) adds to the same service.
    write("aml_searcher-12", {"searches.find": 20, "calls.insert": 20})
    after = pipeline_load.db_ops_snapshot(tmp_path)
    per = pipeline_load.db_ops_per_question(before, after, questions=20)
    assert per["searcher"]["total"] == 3.0  # 40 finds and 20 inserts; outcomes are no command
    assert per["searcher"]["commands"] == {
        "searches.find": 2.0,
        "calls.insert": 1.0,
        "(rate slot taken)": 0.2,
    }
    assert per["answerer"] == {"total": 0.0, "commands": {}}


def test_cpu_figures_are_scaled_by_the_runs_mean_slowdown(pipeline_load: ModuleType) -> None:
    reference = pipeline_load.REFERENCE_WORKLOAD_MS
    # A run spent half its samples in each of the machine's two speeds: the mean counts both.
    samples = [reference * 1.2] * 5 + [reference * 1.6] * 5
    machine = pipeline_load.machine_figures(samples)
    assert machine["samples"] == 10 and machine["slowdown"] == pytest.approx(1.4, abs=1e-3)
    scaled = pipeline_load.at_reference({"services": 42.0, "mongo": 14.0}, machine["slowdown"])
    assert scaled == {"services": 30.0, "mongo": 10.0}
    assert pipeline_load.machine_figures([])["slowdown"] is None
    assert pipeline_load.at_reference({"services": 42.0}, None) is None


def test_the_reference_workload_takes_measurable_cpu(pipeline_load: ModuleType) -> None:
    # Not a timing assertion: only that the figure is a CPU time of this process, not zero.
    assert pipeline_load.reference_workload_ms() > 1.0


def test_the_platform_has_started_once_every_service_is_quiet(pipeline_load: ModuleType) -> None:
    services = pipeline_load.SERVICES
    seconds = pipeline_load.STARTED_QUIET_SECONDS
    share = pipeline_load.STARTED_CPU_SHARE
    earlier = {name: 1.0 for name in services}
    idle = {name: 1.0 + share * seconds / 2 for name in services}
    assert pipeline_load.quiet(earlier, idle, seconds)
    # One worker still importing: not started.
    busy = idle | {services[-1]: 1.0 + share * seconds * 2}
    assert not pipeline_load.quiet(earlier, busy, seconds)
    # A worker not yet spawned (no process to read): not started either.
    missing = {name: value for name, value in idle.items() if name != services[1]}
    assert not pipeline_load.quiet(earlier, missing, seconds)
