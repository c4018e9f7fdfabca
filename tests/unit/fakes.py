"""In-memory stand-ins for the few MongoDB operations the service handlers use, for fast handler
tests (and, at the end, a `Bus` over FastStream's in-memory test broker). Only the query and
update operators the handlers actually send are implemented; anything else raises
NotImplementedError, so a handler that starts relying on more of MongoDB fails its fast test
loudly instead of passing against a fake that quietly misreads the query.

Every operation yields to the event loop once, as a real round trip does: concurrent handler
calls interleave between database operations, which is what the guarded updates exist for."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, cast

from faststream.nats import NatsBroker
from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError
from pymongo.results import InsertOneResult, UpdateResult

Document = dict[str, Any]
_DUPLICATE_KEY = 11000
_MISSING = object()


def _get(document: Mapping[str, Any], path: str) -> Any:
    value: Any = document
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _condition(value: Any, condition: Any) -> bool:
    if isinstance(condition, Mapping) and any(str(k).startswith("$") for k in condition):
        return all(_operator(value, op, arg) for op, arg in condition.items())
    if isinstance(value, list) or isinstance(condition, (list, Mapping)):
        raise NotImplementedError("array or embedded-document equality")
    return value is not _MISSING and bool(value == condition)


def _operator(value: Any, op: str, arg: Any) -> bool:
    if op == "$ne":
        return value is _MISSING or bool(value != arg)
    if op == "$in":
        return value is not _MISSING and value in arg
    if op == "$exists":
        return (value is not _MISSING) == bool(arg)
    if op in ("$lt", "$gte"):
        if value is _MISSING:
            return False
        return bool(value < arg) if op == "$lt" else bool(value >= arg)
    raise NotImplementedError(f"query operator {op}")


def matches(document: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    for path, condition in query.items():
        if path.startswith("$"):
            raise NotImplementedError(f"top-level {path}")
        if not _condition(_get(document, path), condition):
            return False
    return True


def _project(document: Document, projection: Mapping[str, Any] | None) -> Document:
    if projection is None:
        return copy.deepcopy(document)
    if any("." in field or not value for field, value in projection.items()):
        raise NotImplementedError("only top-level inclusion projections")
    keep = {"_id", *projection}
    return {k: copy.deepcopy(v) for k, v in document.items() if k in keep}


def _set_path(document: Document, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    target = document
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value


def _apply(document: Document, update: Mapping[str, Any]) -> None:
    for op, fields in update.items():
        for path, value in fields.items():
            if op == "$set":
                _set_path(document, path, copy.deepcopy(value))
            elif op == "$inc":
                current = _get(document, path)
                _set_path(document, path, (0 if current is _MISSING else current) + value)
            else:
                raise NotImplementedError(f"update operator {op}")


def _sort_key(field: str) -> Callable[[Document], Any]:
    return lambda document: _get(document, field)


class FakeCursor:
    def __init__(self, documents: list[Document]) -> None:
        self._documents = documents

    def __aiter__(self) -> AsyncIterator[Document]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Document]:
        for document in self._documents:
            await asyncio.sleep(0)
            yield document

    async def to_list(self, length: int | None = None) -> list[Document]:
        await asyncio.sleep(0)
        return self._documents[:length] if length is not None else list(self._documents)


class FakeCollection:
    def __init__(self) -> None:
        self.documents: dict[Any, Document] = {}

    def _matching(self, query: Mapping[str, Any] | None) -> list[Document]:
        return [doc for doc in self.documents.values() if matches(doc, query or {})]

    async def find_one(
        self,
        query: Mapping[str, Any] | None = None,
        projection: Mapping[str, Any] | None = None,
        *,
        sort: Sequence[tuple[str, int]] | None = None,
    ) -> Document | None:
        await asyncio.sleep(0)
        found = self._matching(query)
        for field, direction in reversed(sort or []):
            if any(_get(doc, field) is _MISSING for doc in found):
                raise NotImplementedError("sorting documents that lack the sort field")
            found.sort(key=_sort_key(field), reverse=direction < 0)
        return _project(found[0], projection) if found else None

    def find(
        self, query: Mapping[str, Any] | None = None, projection: Mapping[str, Any] | None = None
    ) -> FakeCursor:
        return FakeCursor([_project(doc, projection) for doc in self._matching(query)])

    async def insert_one(self, document: Document) -> InsertOneResult:
        await asyncio.sleep(0)
        if document["_id"] in self.documents:
            raise DuplicateKeyError("duplicate _id", _DUPLICATE_KEY)
        self.documents[document["_id"]] = copy.deepcopy(document)
        return InsertOneResult(document["_id"], True)

    async def insert_many(self, documents: list[Document], *, ordered: bool = True) -> None:
        if ordered:
            raise NotImplementedError("ordered insert_many")
        await asyncio.sleep(0)
        errors = []
        for index, document in enumerate(documents):
            if document["_id"] in self.documents:
                errors.append({"index": index, "code": _DUPLICATE_KEY, "errmsg": "duplicate"})
            else:
                self.documents[document["_id"]] = copy.deepcopy(document)
        if errors:
            raise BulkWriteError({"writeErrors": errors, "nInserted": len(documents) - len(errors)})

    async def update_one(
        self, query: Mapping[str, Any], update: Mapping[str, Any], *, upsert: bool = False
    ) -> UpdateResult:
        if upsert:
            raise NotImplementedError("upsert")
        await asyncio.sleep(0)
        found = self._matching(query)
        if not found:
            return UpdateResult({"n": 0, "nModified": 0}, True)
        before = copy.deepcopy(found[0])
        _apply(found[0], update)
        return UpdateResult({"n": 1, "nModified": int(found[0] != before)}, True)

    async def find_one_and_update(
        self,
        query: Mapping[str, Any],
        update: Mapping[str, Any],
        projection: Mapping[str, Any] | None = None,
        *,
        return_document: bool = ReturnDocument.BEFORE,
    ) -> Document | None:
        await asyncio.sleep(0)
        found = self._matching(query)
        if not found:
            return None
        before = _project(found[0], projection)
        _apply(found[0], update)
        return (
            before if return_document == ReturnDocument.BEFORE else _project(found[0], projection)
        )


class FakeDatabase:
    """Collections by attribute or item, created on first use, as on a MongoDB database."""

    def __init__(self) -> None:
        self._collections: dict[str, FakeCollection] = {}

    def __getitem__(self, name: str) -> FakeCollection:
        return self._collections.setdefault(name, FakeCollection())

    def __getattr__(self, name: str) -> FakeCollection:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def typed(self) -> AsyncDatabase[Document]:
        """This fake where a handler expects a database (it answers only what handlers ask)."""
        return cast(AsyncDatabase[Document], self)


class FakeChatModel:
    """The part of the openai client the answerer and scorer use (`post` of a chat completion,
    `aml_pipeline.llm.complete`): each request is answered with `reply(prompt)`; every request
    body and prompt is kept."""

    def __init__(self, reply: str | Callable[[Any], str]) -> None:
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        self.prompts: list[Any] = []

    async def post(self, path: str, *, cast_to: type, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/chat/completions" and cast_to is dict
        self.requests.append(body)
        prompt = body["messages"][0]["content"]
        self.prompts.append(prompt)
        text = self.reply(prompt) if callable(self.reply) else self.reply
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


@dataclass
class TestBrokerBus:
    """`aml_runtime.broker.Bus` over FastStream's public `publish` of a broker under
    `TestNatsBroker`, so the handlers' publishes reach the test's in-memory subscribers with
    the headers and body the services send; purges are only recorded (nothing is queued)."""

    __test__ = False  # not a pytest class

    broker: NatsBroker
    purged: list[tuple[str, str]] = dataclass_field(default_factory=list)

    async def send(self, subject: str, stream: str, body: bytes, headers: dict[str, str]) -> None:
        await self.broker.publish(body, subject, headers=headers, stream=stream)

    async def purge(self, stream: str, subject: str) -> None:
        self.purged.append((stream, subject))
