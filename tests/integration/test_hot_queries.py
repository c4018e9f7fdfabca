"""The scheduler's hot path on a real nx-27017: what moving a user on after each Add
confirmation costs does not grow with the job. Every database command of each confirmation is
recorded; each is a lookup by `_id` (or a user's questions by `user_id`, once per user), the
server's plan for each uses an index, and a job of 300 Adds per user costs the same commands
per confirmation as one of 5. A restarted scheduler finds every user's place in O(log n)
lookups."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from faststream.nats import NatsBroker
from pymongo import AsyncMongoClient, monitoring
from pymongo.asynchronous.database import AsyncDatabase

from aml_contract import subjects
from aml_contract.messages import AddDone
from aml_contract.participant import user_chunk_id
from aml_pipeline.chains import add_order
from aml_pipeline.evaluation_spec import build_evaluation_spec
from aml_runtime.broker import JetStreamBus
from aml_runtime.db import Document
from aml_runtime.documents import ensure_indexes
from aml_runtime.stores import Stores
from aml_scheduler.handlers import ScheduleJobs
from aml_scheduler.settings import SchedulerSettings

pytestmark = pytest.mark.integration

USERS = 4
VERSION = "ver-hot"


@dataclass
class Commands(monitoring.CommandListener):
    """The commands sent while `recording`: (name, collection, filter)."""

    recording: bool = False
    seen: list[tuple[str, str, Document]] = field(default_factory=list)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.recording:
            return
        name = event.command_name
        collection = str(event.command.get(name, ""))
        query = event.command.get("filter")
        if query is None and name == "update":
            query = event.command["updates"][0]["q"]
        self.seen.append((name, collection, dict(query or {})))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> list[tuple[str, str, Document]]:
        taken, self.seen = self.seen, []
        return taken


@pytest.fixture
async def env(
    mongo_url: str, broker: NatsBroker, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[AsyncDatabase[Document], Commands]]:
    commands = Commands()
    client: AsyncMongoClient[Document] = AsyncMongoClient(mongo_url, event_listeners=[commands])
    db = client[f"aml_hot_{request.node.name[:40]}"]
    await ensure_indexes(db)
    await db.versions.insert_one(
        {"_id": VERSION, "capacity": {"max_concurrency": 2, "max_rps": 100.0}}
    )
    yield db, commands
    js = broker.connection.jetstream()
    await js.purge_stream(subjects.WORK_STREAM)
    await client.close()


def _scheduler(db: AsyncDatabase[Document], broker: NatsBroker) -> ScheduleJobs:
    settings = SchedulerSettings()
    # Neither the participant client nor the secrets serve a release.
    unused = cast(Any, None)
    spec = build_evaluation_spec(settings)
    return ScheduleJobs(settings, Stores.over(db), JetStreamBus(broker), unused, unused, spec, "c")


async def _plan(db: AsyncDatabase[Document], job_id: str, per_user: int) -> list[str]:
    users = [f"eval:{job_id}:gen:conv-{n}" for n in range(USERS)]
    await db.add_chunks.insert_many(
        [
            {
                "_id": user_chunk_id(user, seq),
                "job_id": job_id,
                "user_id": user,
                "seq": seq,
                "state": "pending",
                "body": b"x" * 2000,
            }
            for user in users
            for seq in range(1, per_user + 1)
        ]
    )
    order = add_order(user for user in users for _ in range(per_user))
    await db.jobs.insert_one(
        {
            "_id": job_id,
            "state": "running",
            "planned": True,
            "version_id": VERSION,
            "users": order,
            "totals": {"add": USERS * per_user, "questions": 0},
        }
    )
    return order


async def _confirm(
    db: AsyncDatabase[Document],
    scheduler: ScheduleJobs,
    job_id: str,
    user: str,
    seq: int,
    commands: Commands | None = None,
    next_released: bool = False,
) -> list[tuple[str, str, Document]]:
    """Confirm the Add as the adder would, then announce it; the scheduler's commands."""
    await db.add_chunks.update_one({"_id": user_chunk_id(user, seq)}, {"$set": {"state": "done"}})
    event = AddDone(job_id=job_id, request_id=user_chunk_id(user, seq), outcome="done",
                    user_id=user, seq=seq, next_released=next_released)  # fmt: skip
    if commands is None:
        await scheduler.on_add_done(event)
        return []
    commands.recording = True
    try:
        await scheduler.on_add_done(event)
    finally:
        commands.recording = False
    return commands.take()


def _hot_filter(collection: str, query: Document) -> bool:
    """A lookup by id, or a user's questions by its memory user_id (a single-field index)."""
    if set(query) == {"_id"}:
        return True
    return collection == "questions" and set(query) == {"user_id"}


async def _uses_an_index(db: AsyncDatabase[Document], collection: str, query: Document) -> bool:
    plan = await db.command("explain", {"find": collection, "filter": query})
    text = str(plan.get("queryPlanner", {}).get("winningPlan"))
    # nx-27017 reports its SQLite plan ("SEARCH ... USING INDEX"); MongoDB its stages.
    return any(mark in text for mark in ("USING INDEX", "USING PRIMARY KEY", "IXSCAN", "IDHACK",
                                         "EXPRESS"))  # fmt: skip


async def _costs(
    db: AsyncDatabase[Document], commands: Commands, broker: NatsBroker, job_id: str, per_user: int
) -> list[list[tuple[str, str, Document]]]:
    """The commands of each confirmation but each user's last."""
    scheduler = _scheduler(db, broker)
    order = await _plan(db, job_id, per_user)
    await scheduler.release(job_id)
    per_confirmation = []
    for seq in range(1, per_user):
        for user in order[:3]:  # the window: 2 at once and one more
            per_confirmation.append(await _confirm(db, scheduler, job_id, user, seq, commands))
    return per_confirmation


async def test_a_confirmation_costs_the_same_few_indexed_lookups_at_any_size(
    env: tuple[AsyncDatabase[Document], Commands], broker: NatsBroker
) -> None:
    db, commands = env
    small = await _costs(db, commands, broker, "j-small", per_user=5)
    large = await _costs(db, commands, broker, "j-large", per_user=300)
    shapes = {
        (name, collection, tuple(sorted(query)))
        for confirmation in small + large
        for name, collection, query in confirmation
    }
    # The job's state and the user's next Add, each by id; nothing written.
    assert shapes == {("find", "jobs", ("_id",)), ("find", "add_chunks", ("_id",))}
    assert {len(c) for c in small} == {len(c) for c in large} == {2}
    for _name, collection, query in large[-1]:
        assert _hot_filter(collection, query)
        assert await _uses_an_index(db, collection, query), (collection, query)


async def test_a_finished_user_releases_its_questions_by_user_and_starts_the_next(
    env: tuple[AsyncDatabase[Document], Commands], broker: NatsBroker
) -> None:
    db, commands = env
    scheduler = _scheduler(db, broker)
    order = await _plan(db, "j-finish", per_user=3)
    await scheduler.release("j-finish")
    for seq in (1, 2):
        await _confirm(db, scheduler, "j-finish", order[0], seq)
    seen = await _confirm(db, scheduler, "j-finish", order[0], 3, commands)
    finds = [(collection, query) for name, collection, query in seen if name == "find"]
    assert all(_hot_filter(collection, query) for collection, query in finds), finds
    assert ("questions", {"user_id": order[0]}) in finds
    assert await _uses_an_index(db, "questions", {"user_id": order[0]})
    # The fourth user (outside the window of three until now) starts: its first Add is read.
    assert ("add_chunks", {"_id": user_chunk_id(order[3], 1)}) in finds
    assert len(seen) <= 12, seen


async def test_a_restarted_scheduler_finds_each_users_place_in_log_lookups(
    env: tuple[AsyncDatabase[Document], Commands], broker: NatsBroker
) -> None:
    db, commands = env
    order = await _plan(db, "j-restart", per_user=300)
    # Three users 150, 37 and 299 Adds in (the fourth waits outside the window).
    for user, written in zip(order[:3], (150, 37, 299), strict=True):
        await db.add_chunks.update_many(
            {"user_id": user, "seq": {"$lte": written}}, {"$set": {"state": "done"}}
        )
    restarted = _scheduler(db, broker)
    commands.recording = True
    await restarted.release("j-restart")
    commands.recording = False
    lookups: dict[str, int] = {}
    published: set[str] = set()
    for name, collection, query in commands.take():
        if collection == "add_chunks":
            assert name == "find" and set(query) == {"_id"}
            user = str(query["_id"]).rsplit(":chunk-", 1)[0]
            lookups[user] = lookups.get(user, 0) + 1
            published.add(str(query["_id"]))
    # Galloping then bisecting: about 2 log2(n) lookups (the whole chain would be 300).
    for user, written in zip(order[:3], (150, 37, 299), strict=True):
        assert lookups[user] <= 2 * written.bit_length() + 2, (user, lookups[user])
        assert user_chunk_id(user, written + 1) in published
    assert order[3] not in lookups


async def test_an_add_the_adder_handed_on_costs_the_scheduler_nothing(
    env: tuple[AsyncDatabase[Document], Commands], broker: NatsBroker
) -> None:
    db, commands = env
    scheduler = _scheduler(db, broker)
    order = await _plan(db, "j-handed", per_user=5)
    await scheduler.release("j-handed")
    assert await _confirm(db, scheduler, "j-handed", order[0], 1, commands, True) == []
