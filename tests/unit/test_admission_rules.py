"""The pure rules behind admission before dequeue: work subjects and lanes, and how a declared
rate becomes slots."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import ValidationError
from turns import turn_only_admission

from aml_contract import subjects
from aml_pipeline.capacity import Admission, Capacity, CapacityLimiter, Departure, Refused
from aml_pipeline.stage_worker import Lanes, sandbox_lanes


async def _capacity(lane: str) -> Capacity:
    return Capacity(key=lane, max_concurrency=1)


def test_work_subjects_name_stage_version_and_job() -> None:
    assert subjects.work_subject("search", "ver-1a2b", "j3c4d") == "aml.work.search.ver-1a2b.j3c4d"
    # A failed job's purge covers every stage of that job and nothing of any other job.
    assert subjects.job_work_filter("ver-1a2b", "j3c4d") == "aml.work.*.ver-1a2b.j3c4d"
    assert all(s.endswith(".*.*") for s in subjects.WORK_SUBJECTS)


@pytest.mark.parametrize("raw", ["v.1", "a b", "*", ">", "", "x" * 65, "ver/1"])
def test_ids_that_cannot_be_subject_tokens_are_hashed_the_same_everywhere(raw: str) -> None:
    token = subjects.token(raw)
    assert token == subjects.token(raw)
    assert token.startswith("h") and len(token) == 33
    assert all(c.isalnum() for c in token)


def test_per_version_lanes() -> None:
    lanes = Lanes("add", "adder", per_version=True, capacity_of=_capacity)
    assert lanes.lane_of("aml.work.add.ver-1.j1") == "ver-1"
    assert lanes.lane_of("aml.work.search.ver-1.j1") is None  # another stage's work
    assert lanes.lane_of("aml.work.add") is None  # an earlier release's subject
    assert lanes.consumer("ver-1") == "adder-ver-1"
    assert lanes.filter_subject("ver-1") == "aml.work.add.ver-1.*"


def test_one_lane_for_an_llm_stage() -> None:
    lanes = Lanes("score", "scorer", per_version=False, capacity_of=_capacity)
    assert lanes.lane_of("aml.work.score.ver-1.j1") == lanes.lane_of("aml.work.score.ver-2.j9")
    assert lanes.consumer("all") == "scorer"
    assert lanes.filter_subject("all") == "aml.work.score.*.*"


async def test_the_verify_lane_is_counted_by_its_process_alone() -> None:
    """The scorer's verify lane: its own work subject, one lane, and slots its process counts
    without the database (the stores here would fail any call)."""
    lanes = sandbox_lanes("verify", "scorer-verify", 2)
    assert lanes.lane_of("aml.work.verify.ver-1.j1") == "all"
    assert lanes.lane_of("aml.work.score.ver-1.j1") is None  # the LLM lane's work
    assert lanes.filter_subject("all") == "aml.work.verify.*.*"
    capacity = await lanes.capacity_of("all")
    assert (capacity.scope, capacity.max_concurrency, capacity.max_rps) == ("process", 2, None)
    limiter = CapacityLimiter(cast(Any, SimpleNamespace(slots=None, accounts=None)))
    first, second = await limiter.try_admit(capacity), await limiter.try_admit(capacity)
    assert isinstance(first, Admission) and isinstance(second, Admission)
    assert await limiter.try_admit(capacity) == Refused("concurrency")
    async with first.request():  # no rate slot to take or stamp
        pass
    await first.release()
    assert isinstance(await limiter.try_admit(capacity), Admission)
    with pytest.raises(ValidationError):
        Capacity(key="sandbox", max_concurrency=1, max_rps=1.0, scope="process")


@pytest.mark.parametrize(
    ("rps", "slots", "period"),
    [
        (10.0, 10, 1.0),
        (4.0, 4, 1.0),
        (2.5, 2, 1.0),  # never three in a second
        (1.0, 1, 1.0),
        (0.5, 1, 2.0),
        (0.001, 1, 1000.0),
    ],
)
def test_a_declared_rate_as_slots(rps: float, slots: int, period: float) -> None:
    capacity = Capacity(key="v", max_concurrency=4, max_rps=rps)
    assert capacity.rate_slots == slots
    assert capacity.rate_period == pytest.approx(period)
    # What a second can hold never exceeds the declaration.
    assert capacity.rate_slots / capacity.rate_period <= rps + 1e-9


def test_no_rate_means_no_rate_slots() -> None:
    capacity = Capacity(key="llm", max_concurrency=8)
    assert capacity.rate_slots == 0
    assert capacity.rate_period == 0.0


async def test_a_kept_alive_request_departs_when_its_headers_start_going_out() -> None:
    departure = Departure()
    await departure.trace("http11.send_request_headers.started", {})
    sent = departure.at
    assert sent is not None
    time.sleep(0.01)
    await departure.trace("http11.receive_response_headers.complete", {})
    assert departure.at == sent


async def test_a_request_that_opened_its_connection_departs_when_answered() -> None:
    """The receiver may see it late by its accept: its answer is the first moment the sender
    knows the receiver has seen it, so the rate slot counts from then."""
    departure = Departure()
    await departure.trace("connection.connect_tcp.started", {})
    await departure.trace("connection.connect_tcp.complete", {})
    await departure.trace("http11.send_request_headers.started", {})
    sent = departure.at
    assert sent is not None
    time.sleep(0.01)
    await departure.trace("http11.receive_response_headers.complete", {})
    assert departure.at is not None and departure.at > sent
    assert departure.opened_connection


async def test_the_audit_times_a_request_from_its_headers_whatever_its_connection() -> None:
    """The rate stamp of a fresh connection's request moves to its answer; when it left (what
    the audit records as its start) does not."""
    departure = Departure()
    await departure.trace("connection.connect_tcp.started", {})
    await departure.trace("http11.send_request_headers.started", {})
    sent_at = departure.sent_at
    assert sent_at is not None and departure.sent_monotonic is not None
    time.sleep(0.01)
    # The client may resend on another connection (a kept-alive one the server had closed).
    await departure.trace("http11.send_request_headers.started", {})
    await departure.trace("http11.receive_response_headers.complete", {})
    assert departure.sent_at == sent_at
    assert departure.at is not None and departure.at > sent_at


@pytest.mark.parametrize(
    ("declared", "first", "rest"),
    [
        # (concurrency, rate): (concurrency slots, rate slots) of each share
        ((8, 100.0), ((0, 1), (0, 12)), ((1, 8), (12, 100))),
        ((4, 10.0), ((0, 1), (0, 1)), ((1, 4), (1, 10))),
        ((16, None), ((0, 2), (0, 0)), ((2, 16), (0, 0))),
        # A pool of one slot is not split: the two stages take it in turn.
        ((3, 2.5), ((0, 1), (0, 1)), ((1, 3), (1, 2))),
        ((1, 0.5), ((0, 1), (0, 1)), ((0, 1), (0, 1))),
        ((2, 1.9), ((0, 1), (0, 1)), ((1, 2), (0, 1))),
    ],
)
def test_two_stages_with_work_at_one_key_split_each_pool_an_eighth_to_the_rest(
    declared: tuple[int, float | None],
    first: tuple[tuple[int, int], tuple[int, int]],
    rest: tuple[tuple[int, int], tuple[int, int]],
) -> None:
    capacity = Capacity(key="ver-1", max_concurrency=declared[0], max_rps=declared[1])
    assert capacity.slot_range("concurrency") == (0, declared[0])
    assert capacity.slot_range("rate") == (0, capacity.rate_slots)
    for share, ranges in (("first", first), ("rest", rest)):
        shared = capacity.shared(share)  # type: ignore[arg-type]
        assert (shared.slot_range("concurrency"), shared.slot_range("rate")) == ranges
        assert shared.key == capacity.key and shared.rate_period == capacity.rate_period


async def test_a_turn_passed_early_lets_the_next_call_go_while_the_holder_goes_on() -> None:
    """`Admission.pass_turn`: the holder's call is over; the next call takes the turn at once,
    and the end of the holder's block releases nothing (it is no longer the holder's)."""
    admission = turn_only_admission("k")
    order: list[str] = []
    release_second = asyncio.Event()

    async def second() -> None:
        async with admission.turn():
            order.append("second")
            await release_second.wait()

    async def third() -> None:
        async with admission.turn():
            order.append("third")

    async with admission.turn():
        waiting = asyncio.create_task(second())
        await asyncio.sleep(0)
        admission.pass_turn()
        await asyncio.sleep(0.01)
        assert order == ["second"]  # while the first block still runs
        admission.pass_turn()  # not its turn any more: passes nothing
        late = asyncio.create_task(third())
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)
    assert order == ["second"]  # the first block's end did not free the second's turn
    release_second.set()
    await asyncio.wait_for(asyncio.gather(waiting, late), 5)
    assert order == ["second", "third"]
