"""How a coding task's memory scope is written (SPEC R-2.5, R-4.4, R-4.5): rule ``coding-v1``.

**Scopes.** Per task and condition (``relevant``, ``noisy``) one memory user,
``eval:<run>:<dataset>:<task>:<condition>``, holds the trajectories the bundle's conditions file
lists for it. They are written oldest first (``created_at``, ties by trajectory id): never in
the conditions file's order, which could hint at which one is relevant. Relevance labels are
never sent: an Add carries only a trajectory's turns.

**Messages.** Each turn of a trajectory becomes one contract :class:`Message`, in order: its
``role`` (``user``, ``assistant`` or ``tool``) and ``content`` unchanged, and ``timestamp`` the
turn's time in Unix milliseconds, or the trajectory's ``created_at`` for a turn the source did not
date (as ``chunk-v1`` dates every message of a session by the session).

**Adds.** One Add per trajectory, ``session_id`` =
``eval:<run>:<task>:<condition>:<trajectory>`` (R-4.4's ``eval:<run>:<sample>:<session>`` with
the scope as the sample, so the same trajectory in two scopes is two sessions). A trajectory is
split only when it exceeds an Add's limits, 20 messages or 2,000 words (R-4.5; words counted by
:data:`aml_evaluation.wordcount.WORD_COUNTER_VERSION`), and then only between steps: steps are
packed greedily in order and a new Add starts when the next step would take the current one over
a limit. A step is never split; it holds at most 20 turns (the bundle refuses more), and one
step of more than 2,000 words is an Add of its own, as ``chunk-v1`` does with a long message.
Adds never span trajectories. Per scope, Adds are numbered ``seq`` = 1, 2, ... across its
trajectories, and ``request_id`` = ``<user_id>:chunk-<seq>``.

**One rule, two readings.** This module writes a bundle's Adds from the bundle itself; a job
writes them from the registry's dataset (:mod:`aml_evaluation.coding.dataset`, chunked by
:mod:`aml_evaluation.chunker` under ``coding-v1``). Both pack with the chunker's
:func:`~aml_evaluation.chunker.pack_steps`, and the tests hold the two to the same Adds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from aml_contract.participant import (
    AddRequest,
    Message,
    memory_session_id,
    memory_user_id,
    user_chunk_id,
)
from aml_evaluation.chunker import CODING_CHUNKER_VERSION as CODING_CHUNKER_VERSION  # re-export
from aml_evaluation.chunker import AddChunk, pack_steps
from aml_evaluation.coding.bundle import CONDITIONS, CodingBundle, Condition, Step, Trajectory

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def unix_ms(moment: datetime) -> int:
    """Exact Unix milliseconds (no float rounding), sub-millisecond parts dropped."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def scope_key(task_id: str, condition: Condition) -> str:
    """The scope's name inside memory ids: ``<task>:<condition>``."""
    return f"{task_id}:{condition}"


def scope_user_id(run: str, dataset: str, task_id: str, condition: Condition) -> str:
    return memory_user_id(run, dataset, scope_key(task_id, condition))


def step_messages(step: Step, created_at: datetime) -> list[Message]:
    return [
        Message(
            role=turn.role,
            content=turn.content,
            timestamp=unix_ms(turn.timestamp if turn.timestamp is not None else created_at),
        )
        for turn in step.turns
    ]


def trajectory_chunks(trajectory: Trajectory) -> list[list[Message]]:
    """The messages of each Add a trajectory is written with under coding-v1."""
    return pack_steps([step_messages(step, trajectory.created_at) for step in trajectory.steps])


def coding_adds(
    task_id: str,
    condition: Condition,
    trajectories: Sequence[Trajectory],
    *,
    run: str,
    dataset: str,
) -> list[AddChunk]:
    """Every Add of one scope, in send order (trajectories oldest first, see the module
    docstring); ``conversation_id`` of each is the scope, ``<task>:<condition>``."""
    scope = scope_key(task_id, condition)
    user_id = memory_user_id(run, dataset, scope)
    adds: list[AddChunk] = []
    for trajectory in sorted(trajectories, key=lambda t: (t.created_at, t.trajectory_id)):
        session_id = memory_session_id(run, scope, trajectory.trajectory_id)
        for chunk in trajectory_chunks(trajectory):
            seq = len(adds) + 1
            request_id = user_chunk_id(user_id, seq)
            request = AddRequest(
                request_id=request_id, messages=chunk, user_id=user_id, session_id=session_id
            )
            adds.append(
                AddChunk(
                    request_id=request_id,
                    user_id=user_id,
                    session_id=session_id,
                    conversation_id=scope,
                    seq=seq,
                    request=request,
                )
            )
    return adds


def plan_coding_adds(bundle: CodingBundle, run: str, dataset: str) -> list[AddChunk]:
    """All Adds of a coding dataset for one run: task by task, relevant then noisy."""
    return [
        add
        for task in bundle.tasks
        for condition in CONDITIONS
        for add in coding_adds(
            task.task_id, condition, bundle.scope(task.task_id, condition), run=run, dataset=dataset
        )
    ]
