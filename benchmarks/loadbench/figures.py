"""What the callees saw, as the load benchmark's figures: each participant's requests (counts,
429s, the most at once and in a declared window, duplicates, arrival lags against the
platform's audited departures), the LLM stand-in's counts, a scenario's lower bound; and from
one job's records, each user's chain of Adds (the chain gaps, when its conversation was
written), the gaps while work was queued, the share of the time a callee was busy."""

from __future__ import annotations

import bisect
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import accumulate, pairwise
from typing import Any, TypeVar

import httpx
from pymongo import MongoClient

from aml_llm_standin import max_in_window
from aml_participant_simulator import RequestRecord, SimulatorSnapshot

from .harness import ADD_LATENCY, Bench, Team

K = TypeVar("K", bound=Hashable)


# -- the participants' requests and the LLM's calls --------------------------------------------


def simulator_records(team: Team, job_ids: Iterable[str]) -> list[RequestRecord]:
    """The team's Add and Search requests that belong to `job_ids` (user ids are per job)."""
    response = httpx.get(f"{team.url}/_sim/requests", timeout=300)
    response.raise_for_status()
    snapshot = SimulatorSnapshot.model_validate_json(response.content)
    prefixes = tuple(f"eval:{job_id}:" for job_id in job_ids)
    return [
        record
        for record in snapshot.requests
        if record.endpoint in ("add", "search")
        and str(_body(record).get("user_id", "")).startswith(prefixes)
    ]


def _body(record: RequestRecord) -> dict[str, Any]:
    try:
        value = json.loads(record.body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def planned_searches(bench: Bench, job_ids: Iterable[str]) -> Counter[bytes]:
    """How many questions of the jobs have each exact Search body: LoCoMo repeats question
    texts within a conversation, so one body may legitimately be sent more than once."""
    client: MongoClient[dict[str, Any]] = MongoClient(bench.stack.mongo_url)
    try:
        planned: Counter[bytes] = Counter()
        for job_id in job_ids:
            for question in client[bench.mongo_db].questions.find(
                {"job_id": job_id}, {"search_body": 1}
            ):
                planned[bytes(question["search_body"])] += 1
        return planned
    finally:
        client.close()


def duplicate_calls(
    records: Sequence[RequestRecord], key: Callable[[RequestRecord], K], expected: Counter[K]
) -> int:
    """Requests received again after their item had been answered 200: per key, the 200s beyond
    the expected count, plus the other requests arriving after the last expected 200 finished."""
    by_key: dict[K, list[RequestRecord]] = defaultdict(list)
    for record in records:
        by_key[key(record)].append(record)
    duplicates = 0
    for item, group in by_key.items():
        wanted = max(1, expected[item])
        ok = sorted(r.finished_monotonic for r in group if r.status == 200)
        duplicates += max(0, len(ok) - wanted)
        if len(ok) >= wanted:
            answered = ok[wanted - 1]
            late = [r for r in group if r.status != 200 and r.arrived_monotonic > answered]
            duplicates += len(late)
    return duplicates


def max_in_declared_window(arrivals: Sequence[float], max_rps: float) -> tuple[int, int, float]:
    """(most arrivals in any window, allowed, window): the declared rate as a count per window
    of ceil(rps)/rps seconds, which also covers rates below one per second."""
    allowed = max(1, math.ceil(max_rps))
    window = allowed / max_rps
    return max_in_window(arrivals, window), allowed, window


@dataclass
class AuditedDepartures:
    """When the platform's audit says each attempt left (the moment its headers started going
    out): per request as the participant can name it ("add <request_id>", "search <body>"), and
    every attempt of a job, status polls included (what the rate limit counts)."""

    by_request: dict[str, list[datetime]] = field(default_factory=dict)
    by_job: dict[str, list[datetime]] = field(default_factory=dict)


def audited_departures(bench: Bench, job_ids: Iterable[str]) -> AuditedDepartures:
    client: MongoClient[dict[str, Any]] = MongoClient(bench.stack.mongo_url, tz_aware=True)
    jobs = list(job_ids)
    try:
        db = client[bench.mongo_db]
        bodies = {
            str(question["_id"]): bytes(question["search_body"])
            for question in db.questions.find({"job_id": {"$in": jobs}}, {"search_body": 1})
        }
        by_request: dict[str, list[datetime]] = defaultdict(list)
        by_job: dict[str, list[datetime]] = defaultdict(list)
        calls = db.calls.find(
            {"job_id": {"$in": jobs}},
            {"item_id": 1, "started_at": 1, "operation": 1, "job_id": 1},
        )
        for call in calls:
            if call.get("started_at") is None:
                continue  # never left (refused before sending)
            by_job[call["job_id"]].append(call["started_at"])
            item = str(call["item_id"])
            if call["operation"] == "add":
                # An Add chunk's item id is its request_id.
                by_request[f"add {item}"].append(call["started_at"])
            elif call["operation"] == "search":
                # A streaming item "<question>@<point>" sends its question's body.
                body = bodies.get(item.split("@", 1)[0])
                if body is not None:
                    by_request[f"search {body.hex()}"].append(call["started_at"])
        return AuditedDepartures(
            {key: sorted(times) for key, times in by_request.items()},
            {key: sorted(times) for key, times in by_job.items()},
        )
    finally:
        client.close()


def request_key(record: RequestRecord) -> str | None:
    """How `AuditedDepartures.by_request` names the request a participant received."""
    if record.endpoint == "add":
        return f"add {_body(record).get('request_id')}"
    if record.endpoint == "search":
        return f"search {record.body.hex()}"
    return None


def arrival_lags(
    records: Sequence[RequestRecord], departures: dict[str, list[datetime]]
) -> dict[int, float]:
    """Per received Add and Search (by its arrival `seq`), its arrival at the participant's
    clock minus its departure in the platform's audit (the n-th arrival of a request against
    its n-th departure), in ms: how late the receiver saw what was sent. A rate window the
    participant saw exceeded although the departures kept it shows as a window-opening request
    with a lag beyond the margin."""
    arrived: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r.arrived_at):
        key = request_key(record)
        if key is not None:
            arrived[key].append(record)
    lags = {}
    for key, received in arrived.items():
        for record, left in zip(received, departures.get(key, []), strict=False):
            lags[record.seq] = (record.arrived_at - left).total_seconds() * 1000
    return lags


def _lag_figures(lags: Iterable[float]) -> dict[str, Any]:
    ordered = sorted(lags)
    return {
        "matched": len(ordered),
        "p50": round(_quantile(ordered, 0.5), 1),
        "p99": round(_quantile(ordered, 0.99), 1),
        "max": round(ordered[-1], 1) if ordered else 0.0,
    }


def participant_figures(
    team: Team,
    records: Sequence[RequestRecord],
    planned: Counter[bytes],
    departures: AuditedDepartures | None = None,
    job_ids: Sequence[str] = (),
) -> dict[str, Any]:
    adds = [r for r in records if r.endpoint == "add"]
    searches = [r for r in records if r.endpoint == "search"]
    arrivals = [r.arrived_monotonic for r in records]
    rejected = sum(1 for r in records if r.outcome == "reject_429")
    served_latency = sum(r.latency_s for r in records if r.outcome != "reject_429")
    # Distinct Adds per user: a retried Add is one link of the user's sequential chain.
    first_of_request = {str(_body(r).get("request_id")): r for r in adds}
    adds_per_user = Counter(str(_body(r).get("user_id")) for r in first_of_request.values())
    in_window, allowed, window = max_in_declared_window(arrivals, team.max_rps)
    max_concurrency = max((r.total_concurrency_at_arrival for r in records), default=0)
    request_ids: Counter[str] = Counter(dict.fromkeys(first_of_request, 1))
    audited = departures or AuditedDepartures()
    lags = arrival_lags(records, audited.by_request)
    left = sorted(t.timestamp() for job in job_ids for t in audited.by_job.get(job, []))
    departed_in_window = max_in_declared_window(left, team.max_rps)[0]
    return {
        "declared": {"max_concurrency": team.max_concurrency, "max_rps": team.max_rps},
        "add_latency_s": team.add_latency,
        "requests": {"add": len(adds), "search": len(searches)},
        "rejected_429": rejected,
        "served_latency_s": round(served_latency, 1),
        "longest_add_chain": max(adds_per_user.values(), default=0),
        "max_concurrency": max_concurrency,
        "max_in_1s": max_in_window(arrivals),
        "max_in_declared_window": {"count": in_window, "allowed": allowed, "window_s": window},
        "within_declared": max_concurrency <= team.max_concurrency
        and in_window <= allowed
        and rejected == 0,
        # The same window over the audited departures (the platform's own clock): what the
        # platform promises; arrivals add the way to the participant and its clock's lag.
        "departures_max_in_declared_window": departed_in_window,
        "duplicates": {
            "add": duplicate_calls(adds, lambda r: str(_body(r).get("request_id")), request_ids),
            "search": duplicate_calls(searches, lambda r: r.body, planned),
        },
        "busiest_1s": busiest_window(records, lags=lags),
        "add_arrival_lag_ms": _lag_figures(lags[r.seq] for r in adds if r.seq in lags),
        "search_arrival_lag_ms": _lag_figures(lags[r.seq] for r in searches if r.seq in lags),
    }


def _quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def busiest_window(
    records: Sequence[RequestRecord], window: float = 1.0, lags: dict[int, float] | None = None
) -> list[str]:
    """The arrivals of the first window [t, t + window) holding the most, as "+seconds endpoint
    status" from its first arrival, with its arrival lag (`arrival_lags`) when known: to
    see how a rate was exceeded, when it was."""
    ordered = sorted(records, key=lambda r: r.arrived_monotonic)
    best: tuple[int, int] = (0, 0)  # (count, start index)
    start = 0
    for end, record in enumerate(ordered):
        while record.arrived_monotonic - ordered[start].arrived_monotonic >= window:
            start += 1
        best = max(best, (end - start + 1, -start))
    count, first = best[0], -best[1]
    t0 = ordered[first].arrived_monotonic if ordered else 0.0
    known = lags or {}

    def lag(record: RequestRecord) -> str:
        return f" (lag {known[record.seq]:.0f} ms)" if record.seq in known else ""

    return [
        f"+{r.arrived_monotonic - t0:.3f} {r.endpoint} {r.status}{lag(r)}"
        for r in ordered[first : first + count]
    ]


def to_monotonic(moment: str | datetime) -> float:
    """A wall-clock time of this machine (the platform's stamps) on the monotonic clock the
    simulator and the stand-in record with."""
    value = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return value.timestamp() - (time.time() - time.monotonic())


def llm_stats(bench: Bench) -> dict[str, Any]:
    response = httpx.get(f"{bench.llm_url}/stats", timeout=30)
    response.raise_for_status()
    stats: dict[str, Any] = response.json()
    stats["within_declared"] = (
        stats["max_concurrency"] <= stats["capacity"] and stats["rejected_429"] == 0
    )
    return stats


def llm_intervals(bench: Bench) -> list[tuple[float, float]]:
    response = httpx.get(f"{bench.llm_url}/stats/intervals", timeout=60)
    response.raise_for_status()
    return [(float(a), float(b)) for a, b in response.json()["intervals"]]


def lower_bound(participants: dict[str, dict[str, Any]], llm: dict[str, Any]) -> dict[str, Any]:
    """The least time the observed work could take within the declared limits, as the largest
    of its terms: `llm` = served LLM calls x latency / capacity; per participant `rate` =
    requests / max_rps, `latency` = the sum of its served latencies / max_concurrency, `chain` =
    the longest user's Adds x its Add latency (one Add per user at a time)."""
    terms: dict[str, float] = {"llm": llm["served"] * llm["latency_s"] / llm["capacity"]}
    for name, p in participants.items():
        requests = p["requests"]["add"] + p["requests"]["search"]
        declared = p["declared"]
        terms[f"{name} rate"] = requests / declared["max_rps"]
        terms[f"{name} latency"] = p["served_latency_s"] / declared["max_concurrency"]
        terms[f"{name} chain"] = p["longest_add_chain"] * p.get("add_latency_s", ADD_LATENCY)
    limiting = max(terms, key=lambda name: terms[name])
    return {
        "seconds": round(terms[limiting], 1),
        "limiting": limiting,
        "terms": {name: round(value, 1) for name, value in terms.items()},
    }


def ratio(value: float | None, reference: float | None) -> float | None:
    """`value / reference` to three places, None when either is missing or zero."""
    return round(value / reference, 3) if value and reference else None


# -- one job's timings, from the participant's records -----------------------------------------


def _user(record: RequestRecord) -> str:
    return str(_body(record).get("user_id", ""))


def add_attempts(records: Iterable[RequestRecord]) -> dict[str, list[list[RequestRecord]]]:
    """Per user, its Adds in the order they first arrived (one per user at a time, in order),
    each as the list of its attempts."""
    by_user: dict[str, dict[str, list[RequestRecord]]] = defaultdict(dict)
    for record in sorted(records, key=lambda r: r.arrived_monotonic):
        if record.endpoint == "add":
            request_id = str(_body(record).get("request_id"))
            by_user[_user(record)].setdefault(request_id, []).append(record)
    return {user: list(adds.values()) for user, adds in by_user.items()}


def _answered(attempts: Sequence[RequestRecord], before: float = math.inf) -> float | None:
    """When the participant answered 200 to an Add (the last such answer before `before`)."""
    times = [r.finished_monotonic for r in attempts if r.status == 200]
    times = [t for t in times if t <= before]
    return max(times) if times else None


def chain_gaps_ms(records: Iterable[RequestRecord]) -> list[float]:
    """For each user's consecutive Adds k, k + 1: from the participant's answer to Add k to
    Add k + 1's arrival (what the platform adds to every link of a user's chain), in ms."""
    gaps = []
    for adds in add_attempts(records).values():
        for earlier, later in pairwise(adds):
            arrived = later[0].arrived_monotonic
            answered = _answered(earlier, arrived)
            if answered is not None:
                gaps.append((arrived - answered) * 1000)
    return gaps


def free_slot_chain_gaps_ms(records: Sequence[RequestRecord], capacity: int) -> list[float]:
    """The chain gaps (`chain_gaps_ms`) during which the participant had a free slot the whole
    time (fewer than `capacity` requests in flight from the answer to the next arrival): the
    platform's own part of a link, where the rest of the gaps also wait for the declared
    capacity, busy with other users' requests."""
    events = sorted(
        [(r.arrived_monotonic, 1) for r in records] + [(r.finished_monotonic, -1) for r in records]
    )
    times = [moment for moment, _ in events]
    in_flight = list(accumulate(step for _, step in events))
    gaps = []
    for adds in add_attempts(records).values():
        for earlier, later in pairwise(adds):
            arrived = later[0].arrived_monotonic
            answered = _answered(earlier, arrived)
            if answered is None:
                continue
            # In flight just after the answer, and after every event before the arrival.
            first = max(0, bisect.bisect_right(times, answered) - 1)
            last = bisect.bisect_left(times, arrived)
            if max(in_flight[first:last], default=0) < capacity:
                gaps.append((arrived - answered) * 1000)
    return gaps


def conversations_written(records: Iterable[RequestRecord]) -> dict[str, float]:
    """Per user, when the participant answered its last Add."""
    written = {}
    for user, adds in add_attempts(records).items():
        answered = _answered(adds[-1])
        if answered is not None:
            written[user] = answered
    return written


def queued_gaps_ms(records: Sequence[RequestRecord], job_start: float) -> list[float]:
    """`queued_gaps` without the endpoints."""
    return [gap for _, gap in queued_gaps(records, job_start)]


def queued_gaps_by_transition(
    records: Sequence[RequestRecord], job_start: float
) -> dict[str, dict[str, Any]]:
    """`queued_gaps` per "<answered endpoint> -> <next endpoint>" (an Add's answer followed by
    a Search, say, hands the slot from one service to another)."""
    by: dict[str, list[float]] = defaultdict(list)
    for transition, gap in queued_gaps(records, job_start):
        by[transition].append(gap)
    return {transition: quantile_figures(gaps) for transition, gaps in sorted(by.items())}


def queued_gaps(records: Sequence[RequestRecord], job_start: float) -> list[tuple[str, float]]:
    """Each time the participant answered while work was queued for it: from that answer to
    the next request's arrival, in ms. Work is queued at a moment when some request that
    arrives later was already due by what the participant had answered: an Add once the same
    user's previous Add was answered (its first from the job's start), a Search once its
    user's last Add was (the platform's own order, e.g. every conversation written first, is
    not an excuse: from the participant's side that work was waiting)."""
    written = conversations_written(records)
    due: dict[int, float] = {}
    for adds in add_attempts(records).values():
        ready = job_start
        for attempts in adds:
            for record in attempts:
                due[record.seq] = ready
            ready = _answered(attempts) or attempts[-1].finished_monotonic
    for record in records:
        if record.endpoint == "search":
            due[record.seq] = written.get(_user(record), job_start)
    arrivals = sorted(
        (r.arrived_monotonic, due[r.seq], r.endpoint)
        for r in records
        if r.endpoint in ("add", "search")
    )
    # Latest-first minimum of the due times: was anything arriving from index i on already due?
    earliest_due = [math.inf] * (len(arrivals) + 1)
    for index in range(len(arrivals) - 1, -1, -1):
        earliest_due[index] = min(arrivals[index][1], earliest_due[index + 1])
    times = [arrived for arrived, _, _ in arrivals]
    gaps = []
    for record in records:
        if record.endpoint not in ("add", "search") or record.outcome == "reject_429":
            continue
        answered = record.finished_monotonic
        following = bisect.bisect_left(times, answered)
        if following < len(times) and earliest_due[following] <= answered:
            transition = f"{record.endpoint} -> {arrivals[following][2]}"
            gaps.append((transition, (times[following] - answered) * 1000))
    return gaps


def participant_bound(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The participant's busy part of a job: from its first request's arrival to its last
    answer, against the sum of the times it took to answer (arrival to answer, 429s left
    out): at one request at a time, 1.0 means it never waited for the platform."""
    calls = [r for r in records if r.endpoint in ("add", "search")]
    served = [r for r in calls if r.outcome != "reject_429"]
    if not served:
        return {"wall_s": None, "service_s": None, "ratio": None}
    wall = max(r.finished_monotonic for r in calls) - min(r.arrived_monotonic for r in calls)
    service = sum(r.finished_monotonic - r.arrived_monotonic for r in served)
    return {
        "wall_s": round(wall, 2),
        "service_s": round(service, 2),
        "scripted_s": round(sum(r.latency_s for r in served), 2),
        "ratio": round(wall / service, 3) if service else None,
    }


def busy_figures(
    intervals: Sequence[tuple[float, float]], start: float, end: float
) -> dict[str, Any]:
    """Over [start, end): the share of the time with at least one interval open (`busy`) and
    the mean number open (`mean_in_flight`)."""
    span = end - start
    if span <= 0:
        return {"window_s": 0.0, "busy": None, "mean_in_flight": None}
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end)
    covered = 0.0
    reach = start
    for a, b in clipped:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    total = sum(b - a for a, b in clipped)
    return {
        "window_s": round(span, 1),
        "busy": round(covered / span, 3),
        "mean_in_flight": round(total / span, 2),
    }


def wall_parts(
    created: float,
    finished: float,
    records: Sequence[RequestRecord],
    intervals: Sequence[tuple[float, float]],
    capacity: int,
) -> dict[str, float | None]:
    """Where one job's wall goes, told against the LLM (LoCoMo-10's bound), all on the monotonic
    clock: `plan_s` (created to the first Add's arrival); `until_written_s` (from there to the
    first conversation written in full: the LLM has nothing to answer before); from there to
    the end of the LLM's last call, the share of its capacity used (`llm_used`: mean calls in
    flight over `capacity`) and the seconds of capacity left unused (`llm_unused_s`: the window
    times the unused share, starvation and the platform's own gaps between calls); the LLM's
    calls after the last Search's arrival (`llm_after_last_search_s`: its backlog); and the
    completion (`completion_s`: the last call's end to the job's finish)."""
    adds = [r.arrived_monotonic for r in records if r.endpoint == "add"]
    searches = [r.arrived_monotonic for r in records if r.endpoint == "search"]
    written = min(conversations_written(records).values(), default=None)
    last_call = max((end for _, end in intervals), default=None)
    first_add = min(adds, default=None)
    parts: dict[str, float | None] = {
        "plan_s": _rounded(first_add, created),
        "until_written_s": _rounded(written, first_add),
        "llm_used": None,
        "llm_unused_s": None,
        "llm_after_last_search_s": _rounded(last_call, max(searches, default=None)),
        "completion_s": _rounded(finished, last_call),
    }
    if written is not None and last_call is not None and last_call > written:
        busy = busy_figures(intervals, written, last_call)
        used = busy["mean_in_flight"] / capacity
        parts["llm_used"] = round(used, 3)
        parts["llm_unused_s"] = round(busy["window_s"] * (1 - used), 1)
    return parts


def _rounded(end: float | None, start: float | None) -> float | None:
    return None if end is None or start is None else round(end - start, 1)


def quantile_figures(values: Iterable[float]) -> dict[str, Any]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0, "p50": None, "p90": None, "max": None}
    return {
        "count": len(ordered),
        "p50": round(_quantile(ordered, 0.5), 1),
        "p90": round(_quantile(ordered, 0.9), 1),
        "max": round(ordered[-1], 1),
    }
