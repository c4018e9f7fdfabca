"""SQLite + FTS5 storage of memories, scoped by user_id.

A message whose content is an array of parts (text and images) is indexed by its text parts and
kept whole (`parts`, its JSON): Search returns it as it was written, images included, as long
as the answer stays within the contract's 4 MiB Search limit; past that, lower-ranked memories
come back as their text alone (`within_answer_limit`).

One connection guarded by a lock: SQLite serialises writers anyway, and a single connection
makes "committed before responding" trivially true for every later search. The handlers that
call in are sync, so FastAPI runs them in its thread pool and the lock never blocks the event
loop.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import TypeAdapter

from aml_contract.participant import (
    MAX_RESPONSE_BYTES,
    AddRequest,
    Content,
    SearchItem,
    TextPart,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_LIMIT = 2**62
# What the items of one Search answer may take, serialised: the contract's reading limit less
# room for the envelope (`{"data":[...]}`) and the separators.
ANSWER_BUDGET_BYTES = MAX_RESPONSE_BYTES["search"] - 64 * 1024
# Words for the FTS query: letters/digits/underscore runs. Everything else (quotes, operators,
# parentheses, column filters) is dropped, which is what makes arbitrary text safe for MATCH.
_WORD = re.compile(r"\w+")
_CONTENT: TypeAdapter[Content] = TypeAdapter(Content)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS add_requests (
    request_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    body_sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS memories (
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    request_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at TEXT,
    parts TEXT
);
CREATE INDEX IF NOT EXISTS memories_user ON memories(user_id);
"""


def _fts_table(user_id: str) -> str:
    """Each user has a full-text index of its own, so BM25's term statistics (document count,
    average length, term frequencies) are that user's alone: a user's ranking never depends on
    what other users hold or on when their memories arrived. The name is a digest, never the
    raw user_id, so no user_id can inject SQL."""
    return "fts_" + hashlib.sha256(user_id.encode()).hexdigest()[:32]


class TimestampOutOfRange(ValueError):
    """A message timestamp that no datetime can represent: a malformed request."""


class RequestIdConflict(Exception):
    """The request_id was already stored with a different body: not a retry but a client bug."""


@dataclass(frozen=True)
class MemoryRow:
    id: str
    request_id: str
    user_id: str
    session_id: str
    role: str
    content: str  # the searchable text
    created_at: str | None
    # The content array as written (JSON), for a message that had one; None: `content` is it.
    parts: str | None = None

    def stored_content(self) -> Content:
        """What Search hands back: the content as it was written."""
        return stored_content(self.content, self.parts)


def content_text(content: Content) -> str:
    """The searchable text of a message: the string itself, or the text parts joined by newlines
    (image parts carry no text this server can index)."""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content if isinstance(part, TextPart))


def stored_content(text: str, parts: str | None) -> Content:
    """A memory's content as written: its parts (JSON) when it had an array, else its text."""
    return text if parts is None else _CONTENT.validate_json(parts)


def iso_utc_from_ms(timestamp_ms: int | None) -> str | None:
    """ISO-8601 UTC with millisecond precision. Integer arithmetic on timedelta, so no float
    rounding of large millisecond values. Raises TimestampOutOfRange outside datetime's range."""
    if timestamp_ms is None:
        return None
    try:
        moment = _EPOCH + timedelta(milliseconds=timestamp_ms)
    except OverflowError as exc:
        raise TimestampOutOfRange(f"timestamp {timestamp_ms} ms is out of range") from exc
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def rows_from_add(request: AddRequest) -> list[MemoryRow]:
    """One row per message, id `<request_id>#<index>` with the index in the request, so ids stay
    stable even though messages without indexable text (blank, image-only) are skipped: they
    could never be found and the contract forbids returning empty content."""
    rows: list[MemoryRow] = []
    for index, message in enumerate(request.messages):
        text = content_text(message.content)
        if not text.strip():
            continue
        rows.append(
            MemoryRow(
                id=f"{request.request_id}#{index}",
                request_id=request.request_id,
                user_id=request.user_id,
                session_id=request.session_id,
                role=message.role,
                content=text,
                created_at=iso_utc_from_ms(message.timestamp),
                parts=None
                if isinstance(message.content, str)
                else json.dumps(message.model_dump(mode="json")["content"], separators=(",", ":")),
            )
        )
    return rows


def request_fingerprint(request: AddRequest) -> str:
    """Hash of the parsed request, to tell a retry (same body) from a reused request_id."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


def fts_match_query(query: str) -> str | None:
    """An FTS5 MATCH expression that ORs every distinct word of `query`, each as a quoted string
    so that FTS5 keywords (AND, NOT, NEAR) and syntax characters lose their meaning. None when
    the query has no words: there is nothing to match."""
    words = dict.fromkeys(word.lower() for word in _WORD.findall(query))
    if not words:
        return None
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)


class SqliteMemoryStore:
    def __init__(self, db_path: Path) -> None:
        self._lock = threading.Lock()
        # check_same_thread=False: the thread pool serves requests from several threads; the
        # lock, not thread affinity, is what keeps access serial.
        self._conn = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a 200 on Add promises the memory is persisted, also across a power loss.
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)
            # A database written before content arrays were kept gains the column.
            columns = {row[1] for row in self._conn.execute("PRAGMA table_info(memories)")}
            if "parts" not in columns:
                self._conn.execute("ALTER TABLE memories ADD COLUMN parts TEXT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def add(self, request: AddRequest) -> None:
        """Store the request's messages unless this request_id was stored before (a retry).
        Committed before returning, so the memory is immediately searchable (SPEC R-4.6).
        Raises RequestIdConflict when the request_id was stored with a different body."""
        rows = rows_from_add(request)
        fingerprint = request_fingerprint(request)
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                stored = self._conn.execute(
                    "SELECT body_sha256 FROM add_requests WHERE request_id = ?",
                    (request.request_id,),
                ).fetchone()
                if stored is None:
                    self._insert(request, rows, fingerprint)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        if stored is not None and stored[0] != fingerprint:
            raise RequestIdConflict(request.request_id)

    def _insert(self, request: AddRequest, rows: list[MemoryRow], fingerprint: str) -> None:
        """Caller holds the lock and an open transaction."""
        self._conn.execute(
            "INSERT INTO add_requests VALUES (?, ?, ?, ?)",
            (request.request_id, request.user_id, request.session_id, fingerprint),
        )
        for row in rows:
            cursor = self._conn.execute(
                "INSERT INTO memories (id, request_id, user_id, session_id, role, content,"
                " created_at, parts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.id,
                    row.request_id,
                    row.user_id,
                    row.session_id,
                    row.role,
                    row.content,
                    row.created_at,
                    row.parts,
                ),
            )
            table = _fts_table(row.user_id)
            self._conn.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5("
                "content, tokenize = 'porter unicode61 remove_diacritics 2')"
            )
            self._conn.execute(
                f"INSERT INTO {table} (rowid, content) VALUES (?, ?)",
                (cursor.lastrowid, row.content),
            )

    def search(self, user_id: str, query: str, top_k: int) -> list[SearchItem]:
        """BM25 over `user_id`'s own index, best first; ties broken by id so equal-scoring
        results come back in the same order every time. score = -bm25() since FTS5's bm25 is
        lower-is-better and the contract's score is higher-is-better."""
        match = fts_match_query(query)
        if match is None:
            return []
        table = _fts_table(user_id)
        with self._lock:
            exists = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
            if exists is None:
                return []
            found = self._conn.execute(
                f"SELECT m.id, m.content, m.created_at, m.parts, bm25({table}) AS rank"
                f" FROM {table} JOIN memories AS m ON m.rowid = {table}.rowid"
                f" WHERE {table} MATCH ? AND m.user_id = ?"
                " ORDER BY rank ASC, m.id ASC LIMIT ?",
                # Clamped: the contract puts no upper bound on top_k, SQLite's LIMIT is 64-bit.
                (match, user_id, min(top_k, _MAX_LIMIT)),
            ).fetchall()
        return within_answer_limit(
            [
                (
                    SearchItem(
                        id=memory_id,
                        content=stored_content(content, parts),
                        score=-float(rank),
                        created_at=created_at,
                    ),
                    content,
                )
                for memory_id, content, created_at, parts, rank in found
            ],
            ANSWER_BUDGET_BYTES,
        )


def within_answer_limit(ranked: list[tuple[SearchItem, str]], budget: int) -> list[SearchItem]:
    """Ranked items (each with its text) that fit `budget` bytes serialised: an item whose
    images would pass it comes back as its text alone, and the answer ends before an item whose
    text alone would. Images are what grows an answer (a data URL of a photo is hundreds of KB),
    so the best-ranked ones keep theirs and every item still says what it remembers."""
    kept: list[SearchItem] = []
    used = 0
    for item, text in ranked:
        size = len(item.model_dump_json(exclude_none=True)) + 1
        if used + size > budget and not isinstance(item.content, str):
            item = item.model_copy(update={"content": text})
            size = len(item.model_dump_json(exclude_none=True)) + 1
        if used + size > budget:
            break
        kept.append(item)
        used += size
    return kept
