"""What the load benchmark samples besides the callees: the machine's speed (a fixed workload
timed in the benchmark's own process), and each stack process's CPU seconds and peak RSS, read
from /proc (psutil is not a dependency); whether the services are quiet; the CPU figures
computed from the samples."""

from __future__ import annotations

import bisect
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aml_devtools.platform import GATEWAY, WORKERS
from aml_devtools.stack import MONGO, NATS, EmbeddedStack

# The platform's own processes: the gateway and every worker.
SERVICES = (GATEWAY, *WORKERS)

# The reference workload's mean on this machine with none of the project's processes running
# (2026-12-04 17:39-17:42 UTC, 416 samples over 3 minutes, load average 0.1; the samples fall
# into two states, about 22 and 36 ms); CPU figures are also shown scaled to it (`at_reference`).
REFERENCE_WORKLOAD_MS = 33.0
# A service has started once it uses less than this share of a core over this many seconds.
STARTED_CPU_SHARE = 0.05
STARTED_QUIET_SECONDS = 2.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- the machine's speed -----------------------------------------------------------------------


_REFERENCE_RECORD = {
    "speaker": "Caroline",
    "text": "I went to the LGBTQ support group yesterday and it was so powerful.",
    "dia_id": "D1:3",
    "tags": ["support", "group", "lgbtq"],
    "n": 0,
}


def reference_workload_ms() -> float:
    """CPU milliseconds of a fixed pure-Python job (JSON, string handling, arithmetic: the kind
    of work the services do), in this process. The shared two-core machine runs the same code
    up to half again as slow in one hour as in another (other tenants' load on the cores and
    their caches): the CPU figures of two runs compare only together with this figure."""
    started = time.process_time()
    total = 0
    for i in range(3000):
        back = json.loads(json.dumps({**_REFERENCE_RECORD, "n": i}))
        words = sorted(back["text"].lower().split())
        total += len(words) + sum(len(word) for word in words) + sum(j * j for j in range(30))
    assert total > 0
    return (time.process_time() - started) * 1000


def machine_figures(samples: Sequence[float]) -> dict[str, Any]:
    """The scenario's mean reference time and how much slower than the reference machine it
    ran (1.0: as fast; None without samples). The mean, not the median: CPU time adds up over
    the run, whichever of its two speeds the machine is in at a moment."""
    if not samples:
        return {"reference_ms": None, "samples": 0, "slowdown": None}
    mean = statistics.fmean(samples)
    return {
        "reference_ms": round(mean, 1),
        "samples": len(samples),
        "slowdown": round(mean / REFERENCE_WORKLOAD_MS, 3),
    }


def at_reference(cpu: dict[str, float], slowdown: float | None) -> dict[str, float] | None:
    """CPU figures scaled to the reference machine's speed (the run's divided by its slowdown)."""
    if not slowdown:
        return None
    return {name: round(value / slowdown, 2) for name, value in cpu.items()}


# -- the stack's processes (from /proc: psutil is not a dependency) ----------------------------


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name may hold spaces and parentheses: fields start after the last ")".
    return text.rsplit(")", 1)[1].split()


def _group_members(leader: int) -> list[int]:
    """Every live process of the leader's process group: each stack process is started in its
    own session, so the group is the process and whatever it spawned."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry.name))[2]) == leader:
                members.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return members


def group_peak_rss_mib(leader: int) -> float:
    """VmHWM (the resident high-water mark) summed over the group's processes."""
    kib = 0
    for pid in _group_members(leader):
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        kib += next((int(line.split()[1]) for line in lines if line.startswith("VmHWM:")), 0)
    return kib / 1024


def peak_rss(stack: EmbeddedStack) -> dict[str, float]:
    return {
        name: round(group_peak_rss_mib(proc.pid), 1)
        for name, proc in stack.processes.items()
        if proc.pid is not None and proc.is_running()
    }


def reset_peak_rss(stack: EmbeddedStack) -> bool:
    """Restart every stack process's resident high-water mark from its current size (writing
    5 to /proc/<pid>/clear_refs), so the next peak is one job's; False when the kernel did not
    allow it for some process (its peak is then since it started)."""
    done = True
    for proc in stack.processes.values():
        if proc.pid is None or not proc.is_running():
            continue
        for pid in _group_members(proc.pid):
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            except OSError:
                done = False
    return done


def cpu_snapshot(stack: EmbeddedStack) -> dict[str, float]:
    """CPU seconds so far of each running stack process's group, from one pass over /proc for
    all of them, not one per process: the scale scenario takes a snapshot every second, in a
    process sharing the machine's two cores with the platform it measures."""
    leaders = {
        proc.pid: name
        for name, proc in stack.processes.items()
        if proc.pid is not None and proc.is_running()
    }
    ticks = dict.fromkeys(leaders.values(), 0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry.name))
            name = leaders.get(int(fields[2]))
            if name is not None:
                ticks[name] += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return {name: value / CLK_TCK for name, value in ticks.items()}


def quiet(earlier: dict[str, float], later: dict[str, float], seconds: float) -> bool:
    """Whether every service used less than `STARTED_CPU_SHARE` of a core between two CPU
    snapshots `seconds` apart (a service missing from either counts as busy: not started)."""
    return all(
        name in earlier
        and name in later
        and later[name] - earlier[name] < STARTED_CPU_SHARE * seconds
        for name in SERVICES
    )


def quiet_snapshot(stack: EmbeddedStack, timeout: float) -> dict[str, float] | None:
    """The processes' CPU seconds once every service has been quiet for a sampling interval,
    or None when they were not within `timeout`."""
    deadline = time.monotonic() + timeout
    earlier = cpu_snapshot(stack)
    while time.monotonic() < deadline:
        time.sleep(STARTED_QUIET_SECONDS)
        later = cpu_snapshot(stack)
        if quiet(earlier, later, STARTED_QUIET_SECONDS):
            return later
        earlier = later
    return None


def wait_quiet(stack: EmbeddedStack, timeout: float) -> bool:
    """Wait until every service is quiet (as after starting), e.g. for the previous job's
    publication to end; False when it was not within `timeout`."""
    return quiet_snapshot(stack, timeout) is not None


# -- CPU figures -------------------------------------------------------------------------------


def cpu_per_question(
    before: dict[str, float], after: dict[str, float], questions: int
) -> dict[str, float]:
    per = {name: 1000 * (after[name] - before.get(name, 0.0)) / max(1, questions) for name in after}
    per["services"] = sum(per.get(name, 0.0) for name in SERVICES)
    per["broker+database"] = per.get(NATS, 0.0) + per.get(MONGO, 0.0)
    return {name: round(value, 2) for name, value in per.items()}


# (monotonic time, CPU seconds so far per stack process)
CpuSamples = list[tuple[float, dict[str, float]]]


def cpu_at(samples: CpuSamples, moment: float) -> dict[str, float]:
    """Each process's CPU seconds at `moment`, linear between the samples around it (held at
    the first or last sample outside them)."""
    times = [t for t, _ in samples]
    after = bisect.bisect_left(times, moment)
    if after == 0:
        return dict(samples[0][1])
    if after == len(samples):
        return dict(samples[-1][1])
    (t0, c0), (t1, c1) = samples[after - 1], samples[after]
    share = (moment - t0) / (t1 - t0) if t1 > t0 else 1.0
    return {name: c0.get(name, 0.0) + share * (c1[name] - c0.get(name, 0.0)) for name in c1}


def cpu_between(samples: CpuSamples, start: float, end: float) -> dict[str, float]:
    before, after = cpu_at(samples, start), cpu_at(samples, end)
    return {name: after[name] - before.get(name, 0.0) for name in after}


# The workers that serve only Adds, and only questions: their CPU is each kind's own, whenever
# it is spent (`stage_cpu`).
ADD_WORKERS = ("adder",)
QUESTION_WORKERS = ("searcher", "answerer", "scorer")


def stage_cpu(seconds: dict[str, float], adds: int, questions: int) -> dict[str, float]:
    """CPU ms by who did the work, a split no time window decides: the adder's per Add, the
    three question stages' per question, and the rest of the platform (scheduler, gateway,
    publisher, nats, the database: work of both kinds) per item; without the database when it
    is not a process of this stack (an external MongoDB)."""
    own_add = sum(seconds.get(name, 0.0) for name in ADD_WORKERS)
    own_question = sum(seconds.get(name, 0.0) for name in QUESTION_WORKERS)
    shared_names = [name for name in (*SERVICES, NATS, MONGO)
                    if name not in ADD_WORKERS + QUESTION_WORKERS]  # fmt: skip
    shared = sum(seconds.get(name, 0.0) for name in shared_names)
    return {
        "add": round(1000 * own_add / max(1, adds), 2),
        "question": round(1000 * own_question / max(1, questions), 2),
        "shared": round(1000 * shared / max(1, adds + questions), 2),
    }


def cpu_groups(seconds: dict[str, float], items: int) -> dict[str, float | None]:
    """CPU ms per item of the services (the gateway and the six workers together), nats-server,
    the database (None when it is not a process of this stack: an external MongoDB), and the
    platform (the three together; without the database when it is not measured)."""
    per = {name: 1000 * value / max(1, items) for name, value in seconds.items()}
    services = sum(per.get(name, 0.0) for name in SERVICES)
    database = per.get(MONGO)
    groups: dict[str, float | None] = {
        "services": services,
        "nats": per.get(NATS, 0.0),
        "database": database,
        "platform": services + per.get(NATS, 0.0) + (database or 0.0),
    }
    return {name: None if value is None else round(value, 2) for name, value in groups.items()}
