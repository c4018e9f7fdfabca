"""The simulated participant's memory: messages kept per user_id in process memory, found again
by word overlap, or by a `Ranking` the simulator is given (a test's stand-in for a participant's
retrieval: one that knows the benchmark's answers, one that finds nothing, ...). Deliberately
simple: the simulator is about the protocol, not retrieval quality; the reference memory server
(aml_memory_server) is the realistic one."""

from __future__ import annotations

import heapq
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from aml_contract.participant import AddRequest, Content, SearchRequest
from aml_memory_server.store import rows_from_add

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Memory:
    id: str
    user_id: str
    content: str  # the searchable text
    created_at: str | None
    words: frozenset[str]
    # The content as written (an array of text and image parts, or the text itself): what
    # Search hands back.
    stored: Content
    # The Add's session_id: which session (or coding trajectory) the message was written in.
    session_id: str = ""


# A participant's own retrieval in place of word overlap: a Search and its user's memories in
# storage order -> the memories it returns, best first (at most top_k are sent).
Ranking = Callable[[SearchRequest, Sequence[Memory]], Sequence[Memory]]


def words(text: str) -> frozenset[str]:
    return frozenset(word.lower() for word in _WORD.findall(text))


def item(memory: Memory, score: float) -> dict[str, Any]:
    """A Search item in the contract shape (R-4.8); created_at only when known."""
    stored = memory.stored
    content = stored if isinstance(stored, str) else [part.model_dump() for part in stored]
    out: dict[str, Any] = {"id": memory.id, "content": content, "score": score}
    if memory.created_at is not None:
        out["created_at"] = memory.created_at
    return out


class InProcessMemoryStore:
    """Written from the server's event loop, read from test threads: hence the lock.

    Memories are kept twice, by reference: in one list in storage order (`all`, and leakage
    from any other user) and in one list per user_id, so that a Search reads that user's
    memories alone, however many other users have stored. Both lists only ever grow (a reset
    replaces the whole store), so a reader takes a list and its length under the lock and reads
    that prefix without copying it while later Adds append past it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memories: list[Memory] = []
        self._by_user: dict[str, list[Memory]] = {}
        self._request_ids: set[str] = set()

    def add(self, request: AddRequest) -> bool:
        """Store the request's messages; False (and nothing stored) when the request_id was
        stored before, which makes retries idempotent. Raises TimestampOutOfRange."""
        rows = rows_from_add(request)
        memories = [
            Memory(
                row.id,
                row.user_id,
                row.content,
                row.created_at,
                words(row.content),
                row.stored_content(),
                row.session_id,
            )
            for row in rows
        ]
        with self._lock:
            if request.request_id in self._request_ids:
                return False
            self._request_ids.add(request.request_id)
            self._memories.extend(memories)
            for memory in memories:
                self._by_user.setdefault(memory.user_id, []).append(memory)
            return True

    def all(self) -> list[Memory]:
        """Every memory, in storage order across users (a copy: for tests and inspection)."""
        with self._lock:
            return list(self._memories)

    def _user(self, user_id: str) -> Iterator[Memory]:
        """`user_id`'s memories stored so far, in storage order, not copied."""
        with self._lock:
            mine = self._by_user.get(user_id, [])
            count = len(mine)
        return islice(mine, count)

    def _stored(self) -> Iterator[Memory]:
        """Every memory stored so far, in storage order, not copied."""
        with self._lock:
            memories = self._memories
            count = len(memories)
        return islice(memories, count)

    def search(self, user_id: str, query: str, top_k: int) -> list[dict[str, Any]]:
        """`user_id`'s memories sharing at least one word with the query, best first; the score
        is the number of distinct shared words, ties in storage order (stable sort)."""
        wanted = words(query)
        scored = [(float(len(wanted & memory.words)), memory) for memory in self._user(user_id)]
        hits = sorted((pair for pair in scored if pair[0] > 0), key=lambda pair: -pair[0])
        return [item(memory, score) for score, memory in hits[:top_k]]

    def ranked(self, request: SearchRequest, ranking: Ranking) -> list[dict[str, Any]]:
        """The request's user's memories as `ranking` orders them, at most top_k; scores fall
        from the number returned to 1, so they agree with the order."""
        found = list(ranking(request, list(self._user(request.user_id))))[: request.top_k]
        return [item(memory, float(len(found) - rank)) for rank, memory in enumerate(found)]

    def foreign(
        self, user_id: str, query: str, count: int, from_user_id: str | None
    ) -> list[Memory]:
        """Memories of other users for leakage: best overlap first, but taken even without
        overlap, so that leakage shows whenever another user has stored anything. Ties in
        storage order (nsmallest is sorted()[:count], stable)."""
        wanted = words(query)
        if from_user_id is not None:
            if from_user_id == user_id:
                return []
            others: Iterable[Memory] = self._user(from_user_id)
        else:
            others = (memory for memory in self._stored() if memory.user_id != user_id)
        return heapq.nsmallest(count, others, key=lambda memory: -len(wanted & memory.words))
