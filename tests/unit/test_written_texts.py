"""The searcher's map of who each text of a job was written for (aml_searcher.WrittenTexts):
read once per job, bounded in jobs and in texts per job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from aml_searcher import handlers
from aml_searcher.handlers import WrittenTexts


class _Texts:
    """`written_texts` of two jobs, counting the queries made."""

    def __init__(self) -> None:
        self.docs = [
            {"_id": f"{job}/d{index}", "job_id": job, "users": [f"{job}-u{index % 2}"]}
            for job in ("j1", "j2")
            for index in range(4)
        ]
        self.queries: list[dict[str, Any]] = []

    def find(self, query: dict[str, Any], projection: Any = None) -> AsyncIterator[Any]:
        self.queries.append(query)
        if "job_id" in query:
            found = [d for d in self.docs if d["job_id"] == query["job_id"]]
        else:
            found = [d for d in self.docs if d["_id"] in query["_id"]["$in"]]
        return self._iterate(found)

    async def _iterate(self, docs: list[dict[str, Any]]) -> AsyncIterator[Any]:
        for doc in docs:
            yield doc


class _Db:
    def __init__(self) -> None:
        self.written_texts = _Texts()


def _written() -> tuple[WrittenTexts, _Texts]:
    db = _Db()
    return WrittenTexts(cast(Any, db)), db.written_texts


async def test_a_jobs_texts_are_read_once() -> None:
    written, texts = _written()
    assert await written.owners("j1", {"d0", "d1", "nope"}) == {"d0": ["j1-u0"], "d1": ["j1-u1"]}
    assert await written.owners("j1", {"d3"}) == {"d3": ["j1-u1"]}
    assert await written.owners("j2", {"d0"}) == {"d0": ["j2-u0"]}
    assert texts.queries == [{"job_id": "j1"}, {"job_id": "j2"}]


async def test_no_text_no_query() -> None:
    written, texts = _written()
    assert await written.owners("j1", set()) == {}
    assert texts.queries == []


async def test_the_least_recently_used_job_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "_JOBS_KEPT", 1)
    written, texts = _written()
    await written.owners("j1", {"d0"})
    await written.owners("j2", {"d0"})
    await written.owners("j1", {"d0"})
    assert texts.queries == [{"job_id": "j1"}, {"job_id": "j2"}, {"job_id": "j1"}]


async def test_a_job_with_too_many_texts_is_looked_up_per_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handlers, "_TEXTS_KEPT_PER_JOB", 2)
    written, texts = _written()
    assert await written.owners("j1", {"d2"}) == {"d2": ["j1-u0"]}
    assert await written.owners("j1", {"d3"}) == {"d3": ["j1-u1"]}
    assert texts.queries[0] == {"job_id": "j1"}
    assert texts.queries[1:] == [{"_id": {"$in": ["j1/d2"]}}, {"_id": {"$in": ["j1/d3"]}}]
