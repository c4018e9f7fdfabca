"""The searcher's map of who each text of a job was written for (aml_searcher.WrittenTexts):
only a search's candidates are looked up, by id, never a job's whole map; answers (also "written
to no one") are remembered, up to a bound."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

from aml_runtime.stores import Stores
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
        assert set(query) == {"_id"}, "only by id: a job's map is never read whole"
        return self._iterate([d for d in self.docs if d["_id"] in query["_id"]["$in"]])

    async def _iterate(self, docs: list[dict[str, Any]]) -> AsyncIterator[Any]:
        for doc in docs:
            yield doc


class _Db:
    def __init__(self) -> None:
        self.written_texts = _Texts()


def _written(kept: int = 1000) -> tuple[WrittenTexts, _Texts]:
    db = _Db()
    return WrittenTexts(Stores.over(cast(Any, db)), kept=kept), db.written_texts


def _asked(texts: _Texts) -> list[list[str]]:
    return [sorted(query["_id"]["$in"]) for query in texts.queries]


async def test_only_the_candidates_are_looked_up_and_each_once() -> None:
    written, texts = _written()
    assert await written.owners("j1", {"d0", "d1", "nope"}) == {"d0": ["j1-u0"], "d1": ["j1-u1"]}
    # Known ones (a text written to no one too) are not asked again.
    assert await written.owners("j1", {"d0", "nope", "d3"}) == {"d0": ["j1-u0"], "d3": ["j1-u1"]}
    assert await written.owners("j2", {"d0"}) == {"d0": ["j2-u0"]}
    assert _asked(texts) == [["j1/d0", "j1/d1", "j1/nope"], ["j1/d3"], ["j2/d0"]]


async def test_no_text_no_query() -> None:
    written, texts = _written()
    assert await written.owners("j1", set()) == {}
    assert texts.queries == []


async def test_the_least_recently_used_answers_are_forgotten() -> None:
    written, texts = _written(kept=2)
    await written.owners("j1", {"d0"})
    await written.owners("j1", {"d1"})
    await written.owners("j1", {"d0"})  # d0 used last: d1 is the one forgotten next
    await written.owners("j1", {"d2"})
    await written.owners("j1", {"d0"})
    await written.owners("j1", {"d1"})
    assert _asked(texts) == [["j1/d0"], ["j1/d1"], ["j1/d2"], ["j1/d1"]]
