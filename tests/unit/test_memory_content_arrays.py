"""Content arrays (text and image parts) in the reference memory server's store and the
participant simulator's: found by their text parts, handed back as they were written."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from aml_contract.participant import MAX_RESPONSE_BYTES, AddRequest, SearchItem, SearchResponse
from aml_evaluation import media
from aml_memory_server.store import SqliteMemoryStore, within_answer_limit
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
