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

**One path.** A bundle's Adds are written only from the registry's dataset
(:mod:`aml_evaluation.coding.dataset` maps the bundle: a conversation per scope, a session per
trajectory, a turn's step kept), chunked by :func:`aml_evaluation.chunker.plan_adds` under
``coding-v1`` (:func:`~aml_evaluation.chunker.coding_steps` and
:func:`~aml_evaluation.chunker.pack_steps`). This module keeps the names the mapping uses.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from aml_contract.participant import memory_user_id
from aml_evaluation.chunker import CODING_CHUNKER_VERSION as CODING_CHUNKER_VERSION  # re-export
from aml_evaluation.coding.bundle import Condition

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def unix_ms(moment: datetime) -> int:
    """Exact Unix milliseconds (no float rounding), sub-millisecond parts dropped."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def scope_key(task_id: str, condition: Condition) -> str:
    """The scope's name inside memory ids: ``<task>:<condition>``."""
    return f"{task_id}:{condition}"


def scope_user_id(run: str, dataset: str, task_id: str, condition: Condition) -> str:
    return memory_user_id(run, dataset, scope_key(task_id, condition))
