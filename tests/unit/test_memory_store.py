from pathlib import Path

from aml_contract.participant import AddRequest, Message
from aml_memory_server.store import SqliteMemoryStore


def _add(store: SqliteMemoryStore, user: str, request: str, *texts: str) -> None:
    store.add(
        AddRequest(
            request_id=request,
            user_id=user,
            session_id="s",
            messages=[Message(role="user", content=text) for text in texts],
        )
    )


def test_a_users_ranking_does_not_depend_on_other_users(tmp_path: Path) -> None:
    store = SqliteMemoryStore(tmp_path / "m.db")
    _add(store, "a", "a-1", "Lena moved to Porto in March", "Tomas likes Porto wine", "rain")
    before = [(m.id, m.score) for m in store.search("a", "Where did Lena move?", 10)]
    # Another user writing many memories with the same words changes no score of user a.
    _add(store, "b", "b-1", *[f"Lena Porto moved {i}" for i in range(50)])
    after = [(m.id, m.score) for m in store.search("a", "Where did Lena move?", 10)]
    assert before == after and before[0][0] == "a-1#0"
    assert all(m.id.startswith("b-1#") for m in store.search("b", "Lena", 100))


def test_unknown_user_finds_nothing(tmp_path: Path) -> None:
    assert SqliteMemoryStore(tmp_path / "m.db").search("nobody", "anything", 5) == []
