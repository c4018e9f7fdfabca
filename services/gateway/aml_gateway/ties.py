"""Whether each entry of a board is distinguishable from the entry ranked just above it: a paired
bootstrap of their Overall over the questions both answered (`aml_evaluation.confidence.tied`),
from the per-question values the scheduler kept for each full run
(`aml_runtime.stores.leaderboard.HeadlineOutcomes`).

Ties are between adjacent entries as shown, so a board filtered to one board of a track has
ties of its own. They are computed when a board (the tuple of its entry ids, in order) is first
shown and kept in the gateway's process (`Ties`, held by `Services`), so a page view computes
nothing: an entry's values never change once it is published, and a new entry or a
disqualification makes another tuple. Each adjacent pair is kept too, so a board that gained one
entry computes only the pairs around it. The bootstrap runs in a worker thread (some 0.6 s for
two runs of 10,000 questions), never on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aml_contract.api.leaderboard import LeaderboardEntry
from aml_evaluation.confidence import CONFIDENCE, ConfidenceMethod, tied
from aml_runtime.stores import Stores
from aml_runtime.stores.leaderboard import HeadlineOutcomes

# Entry ids of a board in its order, and of an adjacent pair (above, below).
BoardKey = tuple[str, ...]
PairKey = tuple[str, str]


@dataclass
class Ties:
    """The ties of the boards and adjacent pairs shown lately, least recently shown dropped
    first past the bounds."""

    boards_kept: int = 256
    pairs_kept: int = 4096
    method: ConfidenceMethod = CONFIDENCE
    _boards: OrderedDict[BoardKey, tuple[bool | None, ...]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _pairs: OrderedDict[PairKey, bool | None] = field(
        default_factory=OrderedDict, init=False, repr=False
    )

    def board(self, key: BoardKey) -> tuple[bool | None, ...] | None:
        found = self._boards.get(key)
        if found is not None:
            self._boards.move_to_end(key)
        return found

    def keep_board(self, key: BoardKey, ties: tuple[bool | None, ...]) -> None:
        self._boards[key] = ties
        while len(self._boards) > self.boards_kept:
            self._boards.popitem(last=False)

    def pair(self, key: PairKey) -> tuple[bool, bool | None]:
        """(whether it is known, its tie)."""
        if key not in self._pairs:
            return False, None
        self._pairs.move_to_end(key)
        return True, self._pairs[key]

    def keep_pair(self, key: PairKey, tie: bool | None) -> None:
        self._pairs[key] = tie
        while len(self._pairs) > self.pairs_kept:
            self._pairs.popitem(last=False)


def compare(
    above: HeadlineOutcomes | None, below: HeadlineOutcomes | None, method: ConfidenceMethod
) -> bool | None:
    """The tie of two runs: None where no paired comparison is possible (either kept no
    values, they rank by different headlines, or they share no question)."""
    if above is None or below is None or above.headline != below.headline:
        return None
    return tied(above.values, below.values, method)


async def board_ties(
    stores: Stores, ties: Ties, entries: Sequence[LeaderboardEntry], job_ids: Mapping[str, str]
) -> tuple[bool | None, ...]:
    """`tied_with_above` of each entry in board order (`job_ids`: entry id -> its job)."""
    key = tuple(entry.entry_id for entry in entries)
    known = ties.board(key)
    if known is not None:
        return known

    async def outcomes(entry_id: str) -> HeadlineOutcomes | None:
        job_id = job_ids.get(entry_id)
        return None if job_id is None else await stores.leaderboard.headline_outcomes_of(job_id)

    found: list[bool | None] = [None] if key else []
    # Only the values of the pair at hand are held: a board of many large runs never holds
    # them all at once.
    held: tuple[str, HeadlineOutcomes | None] | None = None
    for above, below in itertools.pairwise(key):
        cached, tie = ties.pair((above, below))
        if not cached:
            upper = held[1] if held is not None and held[0] == above else await outcomes(above)
            lower = await outcomes(below)
            held = (below, lower)
            tie = await asyncio.to_thread(compare, upper, lower, ties.method)
            ties.keep_pair((above, below), tie)
        found.append(tie)
    ties.keep_board(key, tuple(found))
    return tuple(found)


async def mark_ties(
    stores: Stores, ties: Ties, entries: list[LeaderboardEntry], job_ids: Mapping[str, str]
) -> list[LeaderboardEntry]:
    """The entries, in board order, each with `tied_with_above` set."""
    marks = await board_ties(stores, ties, entries, job_ids)
    return [
        entry.model_copy(update={"tied_with_above": tie})
        for entry, tie in zip(entries, marks, strict=True)
    ]
