"""Content arrays (text and image parts) in the reference memory server's store and the
participant simulator's: found by their text parts, handed back as they were written."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from aml_contract.participant import (
    MAX_RESPONSE_BYTES,
    AddRequest,
    SearchItem,
    SearchRequest,
    SearchResponse,
)
from aml_evaluation import media
from aml_memory_server.store import SqliteMemoryStore, rows_from_add, within_answer_limit
from aml_participant_simulator import memory as simulator_memory
from aml_participant_simulator.memory import InProcessMemoryStore

IMAGE = media.data_url("red.png", b"\x89PNG\r\n\x1a\n" + bytes(8))
ARRAY: list[dict[str, Any]] = [
    {"type": "text", "text": "my first canvas, painted red"},
    {"type": "image_url", "image_url": {"url": IMAGE}},
]


def _request(user: str = "u1") -> AddRequest:
    return AddRequest.model_validate(
        {
            "request_id": f"r-{user}",
            "user_id": user,
            "session_id": "s",
            "messages": [
                {"role": "user", "content": ARRAY, "timestamp": 0},
                {"role": "assistant", "content": "what a bold colour"},
                # Image only: nothing to find it by, so not stored.
                {"role": "user", "content": [ARRAY[1]]},
            ],
        }
    )


def test_the_memory_server_returns_the_array_it_stored(tmp_path: Path) -> None:
    store = SqliteMemoryStore(tmp_path / "m.db")
    store.add(_request())
    store.add(_request("u2"))
    found = store.search("u1", "which canvas was red?", 5)
    assert [item.model_dump(mode="json")["content"] for item in found] == [ARRAY]
    assert found[0].id == "r-u1#0"
    assert [i.content for i in store.search("u1", "bold colour", 5)] == ["what a bold colour"]
    # The image's base64 is not searchable text.
    assert store.search("u1", IMAGE.rsplit(",", 1)[1][:12], 5) == []
    store.close()


def test_a_database_from_before_content_arrays_gains_the_column(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as old:
        old.execute(
            "CREATE TABLE memories (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE,"
            " request_id TEXT NOT NULL, user_id TEXT NOT NULL, session_id TEXT NOT NULL,"
            " role TEXT NOT NULL, content TEXT NOT NULL, created_at TEXT)"
        )
    store = SqliteMemoryStore(db)
    store.add(_request())
    assert [i.model_dump(mode="json")["content"] for i in store.search("u1", "canvas", 5)] == [
        ARRAY
    ]
    store.close()


def test_the_simulator_returns_the_array_it_stored() -> None:
    store = InProcessMemoryStore()
    assert store.add(_request())
    found = store.search("u1", "red canvas", 5)
    assert [item["content"] for item in found] == [ARRAY]
    assert [item["content"] for item in store.search("u1", "bold", 5)] == ["what a bold colour"]
    assert store.search("u2", "red canvas", 5) == []


def test_the_memory_server_keeps_its_answer_within_the_search_limit(tmp_path: Path) -> None:
    # 12 photos of ~530 KB as data URLs, all matching: ~6.4 MB whole, over the 4 MiB a Search
    # answer may take. The best-ranked keep their images; the rest come back as their text.
    photo = media.data_url("photo.png", b"\x89PNG\r\n\x1a\n" + bytes(400_000))
    store = SqliteMemoryStore(tmp_path / "m.db")
    for add in range(3):
        store.add(
            AddRequest.model_validate(
                {
                    "request_id": f"r{add}",
                    "user_id": "u1",
                    "session_id": "s",
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": f"canvas number {add}-{n}"},
                                {"type": "image_url", "image_url": {"url": photo}},
                            ],
                        }
                        for n in range(4)
                    ],
                }
            )
        )
    found = store.search("u1", "canvas", 100)
    answer = SearchResponse(data=found).model_dump_json(exclude_none=True)
    assert len(answer) <= MAX_RESPONSE_BYTES["search"]
    assert len(found) == 12
    whole = [isinstance(item.content, list) for item in found]
    assert whole == [True] * whole.count(True) + [False] * whole.count(False)
    assert 5 <= whole.count(True) <= 7
    assert all(
        item.content.startswith("canvas number") for item in found if isinstance(item.content, str)
    )
    store.close()


def test_an_answer_ends_before_an_item_whose_text_alone_passes_the_budget() -> None:
    items = [(SearchItem(id=f"m{n}", content="x" * 100), "x" * 100) for n in range(5)]
    kept = within_answer_limit(items, budget=300)
    assert [item.id for item in kept] == ["m0", "m1"]


# The simulator's store keeps each user's memories apart, so a Search reads the asking user's
# memories alone. These check it answers exactly as a plain scan over every memory would.


class _ScanStore:
    """The reference: one list of every memory in storage order, scanned whole per request."""

    def __init__(self) -> None:
        self.memories: list[simulator_memory.Memory] = []
        self.request_ids: set[str] = set()

    def add(self, request: AddRequest) -> bool:
        if request.request_id in self.request_ids:
            return False
        self.request_ids.add(request.request_id)
        for row in rows_from_add(request):
            self.memories.append(
                simulator_memory.Memory(
                    row.id,
                    row.user_id,
                    row.content,
                    row.created_at,
                    simulator_memory.words(row.content),
                    row.stored_content(),
                    row.session_id,
                )
            )
        return True

    def search(self, user_id: str, query: str, top_k: int) -> list[dict[str, Any]]:
        wanted = simulator_memory.words(query)
        scored = [(float(len(wanted & m.words)), m) for m in self.memories if m.user_id == user_id]
        hits = sorted((pair for pair in scored if pair[0] > 0), key=lambda pair: -pair[0])
        return [simulator_memory.item(m, score) for score, m in hits[:top_k]]

    def foreign(
        self, user_id: str, query: str, count: int, from_user_id: str | None
    ) -> list[simulator_memory.Memory]:
        wanted = simulator_memory.words(query)
        others = [
            m
            for m in self.memories
            if m.user_id != user_id and (from_user_id is None or m.user_id == from_user_id)
        ]
        others.sort(key=lambda m: -len(wanted & m.words))
        return others[:count]


_VOCAB = ["red", "blue", "canvas", "Porto", "wine", "rain", "dog", "beach", "moved", "pottery"]


def _text(rng: random.Random) -> str:
    # Few words from a small vocabulary: many memories tie on score.
    return " ".join(rng.choices(_VOCAB, k=rng.randint(1, 4)))


def _random_request(rng: random.Random, request_id: str, user: str) -> AddRequest:
    messages: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        content: Any = _text(rng)
        if kind < 0.1:
            content = "   "  # nothing to find it by: not stored
        elif kind < 0.25:
            content = [{"type": "text", "text": content}, ARRAY[1]]
        message: dict[str, Any] = {"role": rng.choice(["user", "assistant"]), "content": content}
        if rng.random() < 0.5:
            message["timestamp"] = rng.randint(0, 2_000_000_000_000)
        messages.append(message)
    return AddRequest.model_validate(
        {"request_id": request_id, "user_id": user, "session_id": "s", "messages": messages}
    )


def test_the_simulator_store_answers_as_a_scan_over_every_memory() -> None:
    rng = random.Random(30)
    users = [f"u{n}" for n in range(7)]
    store, reference = InProcessMemoryStore(), _ScanStore()
    sent: list[AddRequest] = []
    for n in range(400):
        # Now and then a retry of an earlier request (idempotent: stored once).
        if sent and rng.random() < 0.1:
            request = rng.choice(sent)
        else:
            request = _random_request(rng, f"r{n}", rng.choice(users))
            sent.append(request)
        assert store.add(request) == reference.add(request)
        if n % 40 == 39:
            assert store.all() == reference.memories
            for _ in range(30):
                user = rng.choice([*users, "nobody"])
                query = _text(rng) + rng.choice(["", " unknown", "?"])
                top_k = rng.choice([1, 3, 10, 1000])
                assert store.search(user, query, top_k) == reference.search(user, query, top_k)
                source = rng.choice([None, None, user, *users, "nobody"])
                count = rng.choice([1, 2, 5, 100])
                assert [m.id for m in store.foreign(user, query, count, source)] == [
                    m.id for m in reference.foreign(user, query, count, source)
                ]
    assert store.all() == reference.memories
    assert len(reference.memories) > 500


def _user_requests(user: str, memories: int) -> list[AddRequest]:
    rng = random.Random(user)
    return [
        AddRequest.model_validate(
            {
                "request_id": f"{user}-r{n}",
                "user_id": user,
                "session_id": "s",
                "messages": [{"role": "user", "content": _text(rng)} for _ in range(10)],
            }
        )
        for n in range(memories // 10)
    ]


def test_a_simulator_search_reads_the_asking_users_memories_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[str] = []

    class Watched(simulator_memory.Memory):
        """Records every memory whose owner or words a Search looks at."""

        def __getattribute__(self, name: str) -> Any:
            if name in {"words", "user_id", "content", "stored"}:
                read.append(object.__getattribute__(self, "user_id"))
            return super().__getattribute__(name)

    monkeypatch.setattr(simulator_memory, "Memory", Watched)
    users = [f"u{n}" for n in range(100)]
    requests = {user: _user_requests(user, 200) for user in users}
    crowded = InProcessMemoryStore()
    for batch in zip(*requests.values(), strict=True):  # users' Adds interleaved
        for request in batch:
            crowded.add(request)
    assert len(crowded.all()) == 100 * 200
    rng = random.Random(7)
    for user in rng.sample(users, 5):
        alone = InProcessMemoryStore()
        for request in requests[user]:
            alone.add(request)
        for _ in range(10):
            query, top_k = _text(rng), rng.choice([1, 5, 50])
            read.clear()
            found = crowded.search(user, query, top_k)
            # Every memory read was the user's own, and no more reads than a store holding
            # the user's 200 memories alone takes.
            assert set(read) == {user}
            reads = len(read)
            read.clear()
            assert found == alone.search(user, query, top_k)
            assert reads == len(read)
        # Leakage from a named user reads that user's memories only.
        source = rng.choice([other for other in users if other != user])
        read.clear()
        crowded.foreign(user, "red", 3, source)
        assert set(read) == {source}


def test_a_ranking_given_to_the_simulator_orders_what_its_search_returns() -> None:
    """A test's own retrieval (`Simulator(script, ranking)`): it sees the asking user's memories
    in storage order, with the session each was written in, and what it returns is sent, cut to
    top_k, with scores falling in its order."""
    store = InProcessMemoryStore()
    writes = (("u", "s1", ["a", "b"]), ("other", "s9", ["x"]), ("u", "s2", ["c"]))
    for user, session, texts in writes:
        messages = [{"role": "user", "content": text} for text in texts]
        store.add(AddRequest.model_validate(
            {"request_id": f"{user}-{session}", "user_id": user, "session_id": session,
             "messages": messages}
        ))  # fmt: skip
    seen: list[list[tuple[str, str]]] = []

    def newest_first(
        request: SearchRequest, memories: Sequence[simulator_memory.Memory]
    ) -> list[simulator_memory.Memory]:
        seen.append([(memory.content, memory.session_id) for memory in memories])
        return list(reversed(memories))

    search = SearchRequest(query="anything", user_id="u", top_k=2)
    found = store.ranked(search, newest_first)
    assert seen == [[("a", "s1"), ("b", "s1"), ("c", "s2")]]
    assert [(item["content"], item["score"]) for item in found] == [("c", 2.0), ("b", 1.0)]
