"""How a board orders its entries (R-5.3): plain functions over public entries, shared by the
API (`publication.board_entries`) and the pages, which show the same headline number.

A board is one track's (`publication.board_entries` reads one track): scores are never compared
across tracks (R-2.1), so nothing here looks at the track."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_contract.api.results import Metrics


def headline(metrics: Metrics) -> float | None:
    """The number a board ranks by: the mean token F1 of a cell scored by F1 alone; the share
    of resolved attempts of a coding cell; ATM-Bench's QS of a cell of its questions; else
    accuracy, else the judge's accuracy (entries published before `accuracy` existed)."""
    if metrics.headline == "f1_mean":
        return metrics.f1_mean
    if metrics.headline == "resolved_rate":
        return metrics.resolved_rate
    if metrics.headline == "qs_mean":
        return metrics.qs_mean
    return metrics.accuracy if metrics.accuracy is not None else metrics.judge_accuracy


def rank_key(entry: LeaderboardEntry) -> tuple[bool, float, datetime, str]:
    """Best Overall first, entries without a score last; ties: the earlier publication, then
    the entry id, so the order never depends on how the store returned them."""
    value = headline(entry.overall)
    return (value is None, -(value or 0.0), entry.published_at, entry.entry_id)


def ranked(entries: Iterable[LeaderboardEntry]) -> list[LeaderboardEntry]:
    return sorted(entries, key=rank_key)
