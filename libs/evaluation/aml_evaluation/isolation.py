"""Cross-user leakage (SPEC R-4.11): Search must only return memories of the requested user_id.

The platform knows every text it wrote and under which user_ids. A candidate whose text the
platform wrote only under *other* user_ids of the same job is a leak. Texts are compared by a
digest of their exact content (a memory system that rewrites what it stores is not caught by
this check; one that hands back another user's message verbatim is)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel


def text_digest(text: str) -> str:
    return hashlib.sha256(text.strip().encode()).hexdigest()


def content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        ]
        return "\n".join(parts) if parts else None
    return None


class Leak(BaseModel):
    rank: int
    candidate_id: str
    written_for: list[str]


def candidate_digests(candidates: Iterable[Mapping[str, Any]]) -> list[str | None]:
    """Each candidate's text digest, None for a candidate without text."""
    texts = (content_text(candidate.get("content")) for candidate in candidates)
    return [None if text is None else text_digest(text) for text in texts]


def owners_of_texts(writes: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(user_id, text) pairs → digest → the sorted user_ids the text was written under."""
    owners: dict[str, set[str]] = {}
    for user_id, text in writes:
        owners.setdefault(text_digest(text), set()).add(user_id)
    return {digest: sorted(users) for digest, users in owners.items()}


def find_leaks(
    user_id: str,
    candidates: list[dict[str, Any]],
    owners: Mapping[str, list[str]],
    digests: Sequence[str | None] | None = None,
) -> list[Leak]:
    """The candidates whose text was written only for other users. `digests`: each candidate's
    text digest (None without text), when the caller computed them already."""
    if digests is None:
        digests = candidate_digests(candidates)
    leaks = []
    for rank, (candidate, digest) in enumerate(zip(candidates, digests, strict=True), start=1):
        if digest is None:
            continue
        written_for = owners.get(digest)
        if written_for and user_id not in written_for:
            leaks.append(
                Leak(rank=rank, candidate_id=str(candidate.get("id")), written_for=written_for)
            )
    return leaks
