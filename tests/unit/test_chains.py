"""A user's chain of Adds (`aml_pipeline.chains`): the next Add is found by id in O(log n)
lookups (one right after a confirmation), and users start longest conversation first, a window
a little wider than the declared concurrency."""

from __future__ import annotations

from collections import Counter

import pytest

from aml_pipeline.capacity import Capacity
from aml_pipeline.chains import (
    HandedOn,
    active_window,
    add_order,
    bounded_put,
    first_not_done,
    start_order,
)


def _chain(done: int, length: int, last: str = "pending") -> dict[int, dict[str, str]]:
    return {
        seq: {"state": "done" if seq <= done else (last if seq == done + 1 else "pending")}
        for seq in range(1, length + 1)
    }


async def _search(
    chain: dict[int, dict[str, str]], start: int
) -> tuple[int, dict[str, str] | None, list[int]]:
    looked: list[int] = []

    async def lookup(seq: int) -> dict[str, str] | None:
        looked.append(seq)
        return chain.get(seq)

    seq, chunk = await first_not_done(lookup, start)
    return seq, chunk, looked


@pytest.mark.parametrize("length", [1, 2, 7, 64, 1000])
async def test_the_first_not_done_is_found_from_any_start_at_or_before_it(length: int) -> None:
    for done in sorted({0, 1, length // 2, length - 1, length}):
        for start in sorted({1, max(1, done // 3), done + 1}):
            if start > done + 1:
                continue
            seq, chunk, looked = await _search(_chain(done, length), start)
            assert seq == done + 1
            assert chunk == (None if done == length else {"state": "pending"})
            # Galloping then bisecting over the distance covered.
            distance = done + 1 - start + 1
            assert len(looked) <= 2 * distance.bit_length() + 1, (done, start, looked)


async def test_right_after_a_confirmation_the_next_add_is_one_lookup() -> None:
    seq, chunk, looked = await _search(_chain(41, 500), start=42)
    assert (seq, chunk, looked) == (42, {"state": "pending"}, [42])


async def test_a_failed_add_is_where_the_chain_stops() -> None:
    seq, chunk, _ = await _search(_chain(10, 30, last="failed"), start=1)
    assert (seq, chunk) == (11, {"state": "failed"})


def test_without_questions_users_start_with_the_longest_chain_then_by_id() -> None:
    users = ["b", "a", "c", "a", "c", "c", "d", "b"]
    assert add_order(users) == ["c", "a", "b", "d"]
    # The same order from each user's count of Adds and questions (what a planner keeps).
    assert start_order(Counter(users), {}, window=1) == add_order(users)
    assert add_order(["y", "x", "y"], ["x", "y", "y", "y", "y"]) == ["y", "x"]


def test_users_with_the_most_questions_per_add_start_first() -> None:
    # LoCoMo-10's ten conversations: (Adds, questions).
    locomo = {"conv-26": (28, 199), "conv-30": (27, 105), "conv-41": (46, 193),
              "conv-42": (44, 260), "conv-43": (43, 242), "conv-44": (46, 158),
              "conv-47": (46, 190), "conv-48": (46, 239), "conv-49": (34, 196),
              "conv-50": (39, 204)}  # fmt: skip
    adds = {user: counts[0] for user, counts in locomo.items()}
    asked = {user: counts[1] for user, counts in locomo.items()}
    assert start_order(adds, asked, window=4) == [
        "conv-26", "conv-42", "conv-49", "conv-43", "conv-50",
        "conv-48", "conv-41", "conv-47", "conv-30", "conv-44",
    ]  # fmt: skip
    # Equal questions per Add: more Adds first, then by id.
    assert start_order({"b": 2, "a": 2, "c": 4}, {"a": 4, "b": 4, "c": 8}, window=1) == [
        "c", "a", "b"
    ]  # fmt: skip


def test_a_chain_as_long_as_the_jobs_adds_shared_by_the_window_starts_first() -> None:
    # 100 short users and one long history: its 500 Adds take as long as the others' 1,000
    # shared by a window of 2, so it starts first, whatever its questions (started last, it
    # would still be written when the others are done).
    adds = {f"short-{n:03d}": 10 for n in range(100)} | {"long": 500}
    asked = {f"short-{n:03d}": 50 for n in range(100)} | {"long": 1}
    assert start_order(adds, asked, window=2)[0] == "long"
    # With a window of 1 it is no longer than the rest written one at a time: questions first.
    assert start_order(adds, asked, window=1)[-1] == "long"
    # Users with no question sort after those with some; a job of one user is that user.
    assert start_order({"q": 5, "none": 5, "x": 5}, {"q": 1}, window=1) == ["q", "none", "x"]
    assert start_order({"only": 3}, {}, window=4) == ["only"]


@pytest.mark.parametrize(("declared", "window"), [(1, 2), (4, 5), (8, 10), (16, 20), (64, 80)])
def test_the_window_is_a_little_wider_than_the_declared_concurrency(
    declared: int, window: int
) -> None:
    assert active_window(Capacity(key="v", max_concurrency=declared)) == window
    # A rate that many users' chains cannot keep busy changes nothing.
    assert active_window(Capacity(key="v", max_concurrency=declared, max_rps=1000.0)) == window


@pytest.mark.parametrize(
    ("declared", "rate", "window"), [(4, 10.0, 4), (16, 10.0, 4), (4, 0.5, 2), (64, 100.0, 31)]
)
def test_under_a_declared_rate_the_window_holds_the_users_the_rate_keeps_busy(
    declared: int, rate: float, window: int
) -> None:
    assert active_window(Capacity(key="v", max_concurrency=declared, max_rps=rate)) == window


def test_a_bounded_cache_forgets_everything_at_its_limit() -> None:
    memory: dict[str, int] = {}
    for n in range(3):
        bounded_put(memory, str(n), n, limit=3)
    bounded_put(memory, "2", 5, limit=3)  # an update never forgets
    assert memory == {"0": 0, "1": 1, "2": 5}
    bounded_put(memory, "3", 3, limit=3)
    assert memory == {"3": 3}


def test_a_handed_on_chunk_is_taken_once_by_its_first_delivery() -> None:
    now = [0.0]
    handed = HandedOn(keep_seconds=10.0, limit=3, clock=lambda: now[0])
    handed.keep({"_id": "a", "body": b"A"})
    handed.keep({"_id": "b", "body": b"B"})
    assert handed.take("a", delivered=1) == {"_id": "a", "body": b"A"}
    assert handed.take("a", delivered=1) is None  # taken
    # A later delivery reads the chunk (its first may have been sent elsewhere): dropped.
    assert handed.take("b", delivered=2) is None
    assert handed.take("b", delivered=1) is None
    assert handed.take("never", delivered=1) is None


def test_handed_on_chunks_are_kept_for_a_while_and_a_few_at_most() -> None:
    now = [0.0]
    handed = HandedOn(keep_seconds=10.0, limit=3, clock=lambda: now[0])
    handed.keep({"_id": "old"})
    now[0] = 10.5
    assert handed.take("old", delivered=1) is None  # too old to be trusted
    for name in ("a", "b", "c", "d"):
        handed.keep({"_id": name})
    # The oldest went first, to keep three.
    assert handed.take("a", delivered=1) is None
    assert [handed.take(n, delivered=1) for n in ("b", "c", "d")] == [
        {"_id": "b"}, {"_id": "c"}, {"_id": "d"}
    ]  # fmt: skip
    # Expired ones are dropped as new ones are kept, not only when taken.
    handed.keep({"_id": "e"})
    now[0] = 30.0
    handed.keep({"_id": "f"})
    assert len(handed) == 1
