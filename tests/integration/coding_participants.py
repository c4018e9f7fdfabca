"""Memory systems of known quality for the coding track's end-to-end tests: participant
simulators (real HTTP servers on loopback that speak the participant contract and record every
request) whose Search orders a coding scope's memories (one per message of each trajectory the
scope's Adds wrote) as a test double of a participant would:

- `oracle`: the scope's relevant trajectory first, in its own order, then the other memories in
  the order they were written. It knows the bundle's conditions, which no participant does: the
  best any memory system could return;
- `empty`: nothing, whatever was written;
- `reverse`: the oracle's order reversed, so the relevant trajectory comes last, behind every
  other memory of its scope.

A scope is the memory user `eval:<run>:<dataset>:<task>:<condition>` (rule coding-v1) and a
memory's trajectory is the last part of its Add's session_id, `eval:<run>:<task>:<condition>:
<trajectory>`: what every participant receives."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aml_contract.participant import SearchRequest
from aml_evaluation.coding.bundle import CONDITIONS, CodingBundle, Condition
from aml_participant_simulator import Memory, Ranking, Script, Simulator


def scope_of(user_id: str) -> tuple[str, Condition]:
    """(task, condition) of a coding scope's memory user."""
    _, task, name = user_id.rsplit(":", 2)
    for condition in CONDITIONS:
        if condition == name:
            return task, condition
    raise ValueError(f"{user_id!r} is not a coding scope's memory user")


def trajectory_of(memory: Memory) -> str:
    return memory.session_id.rsplit(":", 1)[1]


def oracle(bundle: CodingBundle) -> Ranking:
    def rank(request: SearchRequest, memories: Sequence[Memory]) -> list[Memory]:
        task, _ = scope_of(request.user_id)
        relevant = set(bundle.conditions.root[task].relevant)
        first = [memory for memory in memories if trajectory_of(memory) in relevant]
        return first + [memory for memory in memories if trajectory_of(memory) not in relevant]

    return rank


def empty(bundle: CodingBundle) -> Ranking:
    def rank(request: SearchRequest, memories: Sequence[Memory]) -> list[Memory]:
        return []

    return rank


def reverse(bundle: CodingBundle) -> Ranking:
    best = oracle(bundle)

    def rank(request: SearchRequest, memories: Sequence[Memory]) -> list[Memory]:
        return list(reversed(best(request, memories)))

    return rank


RANKINGS: dict[str, Callable[[CodingBundle], Ranking]] = {
    "oracle": oracle,
    "empty": empty,
    "reverse": reverse,
}


def ranked_participant(name: str, bundle: CodingBundle) -> Simulator:
    """A participant that answers every Add and ranks every Search as `name` says."""
    return Simulator(Script(), RANKINGS[name](bundle))
